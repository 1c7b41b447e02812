"""SJD2 on the shapes model: the target forwards an image takes with Jacobi drafts and with SJD2's
noised drafts, at several windows, on the same prompts and seeds (no timing: counts only).

    python benchmarks/sjd2_shapes.py --model FOLDER                 # the study's selection: 16 prompts of seed 9595
    python benchmarks/sjd2_shapes.py --model FOLDER --windows 16,32 --images 48 --seed 9393   # its report

``--model`` is a shapes pipeline fine-tuned by ``visualspec train-denoising``; ``--base`` the one it
was fine-tuned from (default: the shipped ``assets/shapes-t2i``), whose Jacobi drafts are the
baseline. Batch 1, the folders' sampling settings. Prints, per arm, the fraction of AR's target
forwards (an image is 256 tokens) and the tokens a forward commits
(docs/experiments/2026-12-07-sjd2-shapes.md).
"""

import argparse

import torch

from visualspec.pipelines.llamagen import LlamaGenPipeline
from visualspec.worlds.shapes import evaluation_prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the fine-tuned pipeline folder")
    parser.add_argument("--base", default="assets/shapes-t2i")
    parser.add_argument("--windows", default="8,16,32")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--seed", type=int, default=9595, help="the prompts' seed")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tuned, base = LlamaGenPipeline.from_pretrained(args.model), LlamaGenPipeline.from_pretrained(args.base)
    per_task = max(4, -(-args.images // 6))  # six GenEval tasks
    prompts = [p["prompt"] for p in evaluation_prompts(per_task=per_task, seed=args.seed)][:args.images]
    arms = {}
    for w in (int(x) for x in args.windows.split(",")):
        arms[f"base: sjd, window {w}"] = (base, dict(decoding="sjd", window=w))
        arms[f"tuned: sjd, window {w}"] = (tuned, dict(decoding="sjd", window=w))
        arms[f"tuned: sjd2, window {w}"] = (tuned, dict(decoding="sjd", drafts="denoising", window=w))
    print(f"{'arm':<28} {'of AR forwards':>15} {'tokens / forward':>17}")
    for arm, (pipe, kw) in arms.items():
        forwards = sum(pipe(p, compile=False, seed=i, output_type="latent", **kw).stats.target_forwards
                       for i, p in enumerate(prompts))
        print(f"{arm:<28} {forwards / len(prompts) / 256:15.3f} {256 * len(prompts) / forwards:17.2f}", flush=True)


if __name__ == "__main__":
    main()
