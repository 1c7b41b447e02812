"""What quantised weights cost in quality on the shipped models (#48): text NLL, greedy tokens.

    python benchmarks/quantized_quality.py                      # int8 and int8-weight
    python benchmarks/quantized_quality.py --schemes int8 --windows 64 --prompts 32

For the shipped text pair's target, on held-out standard-library code:

- NLL (nats per token) over ``--windows`` windows of ``--length`` tokens, float and quantised;
- the share of those positions whose argmax (the greedy token, teacher-forced on the same text)
  is the float model's: the issue's "greedy tokens equal" at every position, without one early
  difference making every later position differ;
- free-running greedy decoding (``--new-tokens`` after each of ``--prompts`` prompts): how many
  continuations are the float model's exactly, and the mean position of the first difference.

For the shipped image model (``assets/shapes-t2i``), greedy AR images of ``--prompts`` GenEval-shapes
prompts: how many are the float model's token for token, and the mean first difference. Its
GenEval-shapes score is measured by ``visualspec bench --quality --quantize int8``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from visualspec.core.window_costs import machine_name  # noqa: E402
from visualspec.models.quantized import quantize_model  # noqa: E402


def first_difference(a: list, b: list) -> int:
    """The first position where ``a`` and ``b`` differ (their length where they do not)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def held_out_windows(folder, tokenizer, count: int, length: int, seed: int = 0) -> torch.Tensor:
    """``count`` windows of ``length`` tokens cut at random from the pair's held-out files."""
    from visualspec.eval.code import held_out_files, read_source

    ids = [tokenizer(read_source(name)).input_ids for name in held_out_files(folder)]
    ids = [x for x in ids if len(x) > length]
    rng = np.random.default_rng(seed)
    windows = []
    for k in range(count):
        doc = ids[rng.integers(len(ids))]
        start = rng.integers(len(doc) - length)
        windows.append(doc[start:start + length])
    return torch.tensor(windows)


@torch.no_grad()
def text_quality(schemes, windows: int, length: int, prompts: int, new_tokens: int) -> dict:
    from visualspec import generate_text
    from visualspec.tools.bench_text import held_out_prompts, load_pair, pair_folder

    folder = pair_folder(None)
    tokenizer, target, _ = load_pair(folder)
    text = held_out_windows(folder, tokenizer, windows, length)
    texts = held_out_prompts(folder, tokenizer, prompts, seed=1)
    models = {"float32": target}
    for scheme in schemes:
        models[scheme] = copy.deepcopy(target)
        quantize_model(models[scheme], scheme)
    out, reference = {}, {}
    for name, model in models.items():
        logits = torch.cat([model(text[i:i + 8]).logits for i in range(0, len(text), 8)])
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), text[:, 1:].flatten())
        greedy = logits.argmax(-1)
        runs = [generate_text(model, tokenizer, p, max_new_tokens=new_tokens, temperature=0,
                              compile=False).token_ids[0] for p in texts]
        if name == "float32":
            reference = {"greedy": greedy, "runs": runs}
        firsts = [first_difference(a, b) for a, b in zip(runs, reference["runs"])]
        out[name] = {"nll": round(float(nll), 4),
                     "teacher_forced_argmax_equal": round(float((greedy == reference["greedy"]).float().mean()), 4),
                     "free_running_equal": f"{sum(f == new_tokens for f in firsts)}/{len(firsts)}",
                     "mean_first_difference": round(float(np.mean(firsts)), 1)}
    return {"windows": windows, "length": length, "prompts": prompts, "new_tokens": new_tokens, "models": out}


@torch.no_grad()
def image_quality(schemes, prompts: int) -> dict:
    from visualspec import VisualSpecPipeline
    from visualspec.tools.loading import shipped_or_path
    from visualspec.worlds.shapes import evaluation_prompts

    texts = [p["prompt"] for p in evaluation_prompts(per_task=max(1, prompts // 6) + 1, seed=7)][:prompts]
    folder = shipped_or_path("shapes-t2i")
    runs = {}
    for scheme in (None, *schemes):
        pipe = VisualSpecPipeline.from_pretrained(folder, quantize=scheme)
        pipe.set_progress_bar_config(disable=True)
        runs[scheme or "float32"] = pipe(texts, seed=0, temperature=0, decoding="ar", compile=False,
                                         output_type="latent", batch_size=16).images.tolist()
    out = {}
    for name, tokens in runs.items():
        firsts = [first_difference(a, b) for a, b in zip(tokens, runs["float32"])]
        out[name] = {"images_equal": f"{sum(f == len(a) for f, a in zip(firsts, tokens))}/{len(tokens)}",
                     "mean_first_difference": round(float(np.mean(firsts)), 1),
                     "tokens_equal": round(float(np.mean([np.mean(np.array(a) == np.array(b))
                                                          for a, b in zip(tokens, runs["float32"])])), 4)}
    return {"prompts": prompts, "models": out}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemes", nargs="+", default=["int8", "int8-weight"])
    parser.add_argument("--windows", type=int, default=64, help="held-out text windows for NLL")
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=32, help="free-running prompts (text and images)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    result = {"machine": machine_name(torch.device("cpu")), "torch": torch.__version__,
              "text": text_quality(args.schemes, args.windows, args.length, args.prompts, args.new_tokens),
              "images": image_quality(args.schemes, args.prompts)}
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
