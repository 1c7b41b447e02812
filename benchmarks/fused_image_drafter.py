"""Does EAGLE-3's multi-layer fusion pay on the shapes model? Its shipped feature drafter against one
that fuses several of the GPT's hidden states (``train-drafter --model ... --feature-layers``).

    python benchmarks/fused_image_drafter.py --fused FOLDER      # the study's rule: 32 prompts of seed 9393, 2 rounds
    python benchmarks/fused_image_drafter.py --fused FOLDER --images 2 --rounds 1

``assets/shapes-t2i`` at batch 1, compiled, ``decoding="feature"`` at fixed windows (4 and 8) and
the hybrid drafts (``drafts="hybrid"``, the folder's depth) at window 16, each drafter on the same
prompts and seeds, alternated image by image, the order reversed each round, after a warm-up call
each. Prints seconds an image and the fraction of AR's target forwards (an image is 256 tokens)
(docs/experiments/2026-12-07-fused-feature-drafter.md).
"""

import argparse
import time

import torch

from visualspec.models.feature_drafter import load_draft_model
from visualspec.pipelines.llamagen import LlamaGenPipeline
from visualspec.worlds.shapes import evaluation_prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fused", required=True, help="the fusing drafter's folder")
    parser.add_argument("--model", default="assets/shapes-t2i")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=9393, help="the held-out prompts' seed")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pipe = LlamaGenPipeline.from_pretrained(args.model)
    drafters = {"shipped": pipe.feature_drafter, "fused": load_draft_model(args.fused, torch_dtype=torch.float32).eval()}
    prompts = [p["prompt"] for p in evaluation_prompts(per_task=8, seed=args.seed)][:args.images]
    arms = {f"{name}: {label}": (drafter, kw) for name, drafter in drafters.items() for label, kw in (
        ("feature, window 4", dict(decoding="feature", window=4)),
        ("feature, window 8", dict(decoding="feature", window=8)),
        ("hybrid, window 16", dict(decoding="sjd", drafts="hybrid", window=16)))}

    def call(prompt, arm, seed):
        drafter, kw = arms[arm]
        pipe.feature_drafter = drafter
        return pipe(prompt, compile=True, seed=seed, output_type="latent", **kw).stats

    for arm in arms:
        call(prompts[0], arm, 0)
    rows = {arm: {"seconds": 0.0, "forwards": 0, "images": 0} for arm in arms}
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                t0 = time.perf_counter()
                stats = call(prompt, arm, 1000 * r + i)
                rows[arm]["seconds"] += time.perf_counter() - t0
                rows[arm]["forwards"] += stats.target_forwards
                rows[arm]["images"] += 1
    print(f"{'arm':<28} {'s / image':>9} {'of AR forwards':>15}")
    for arm, row in rows.items():
        print(f"{arm:<28} {row['seconds'] / row['images']:9.3f} {row['forwards'] / row['images'] / 256:15.3f}")


if __name__ == "__main__":
    main()
