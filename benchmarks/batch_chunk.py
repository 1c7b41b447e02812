"""One chunk of ``visualspec batch`` at its defaults, per decoding, timed side by side (#52).

    python benchmarks/batch_chunk.py --model assets/shapes-any-order \
        --modes ar assd:k=16 assd:k=auto

``visualspec bench`` times one pipeline call per batch; ``visualspec batch`` calls the pipeline
with a chunk of 4 x batch images and one generator per image, so finished rows are refilled
(continuous batching) and a batch does not wait for its slowest image. This times that call: the
first ``--images`` of the held-out GenEval-shapes prompts ``--per-task``, ``--seed`` at ``--batch-size``, latents only,
each decoding once to warm up (compiles, window tables), then ``--rounds`` interleaved rounds;
the fastest and the median round of each, and their speeds over the first mode's (on a shared
2-core machine the two can disagree by 10 %: report both).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from visualspec import VisualSpecPipeline  # noqa: E402
from visualspec.core.window_costs import machine_name  # noqa: E402
from visualspec.worlds.shapes import evaluation_prompts  # noqa: E402


def mode_kwargs(mode: str) -> dict:
    """``assd:k=16`` -> ``{"decoding": "assd", "k": 16}`` (integers read as such)."""
    decoding, _, rest = mode.partition(":")
    kwargs = {"decoding": decoding}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = int(value) if value.lstrip("-").isdigit() else value
    return kwargs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="assets/shapes-any-order")
    ap.add_argument("--modes", nargs="+", default=["ar", "assd:k=16", "assd:k=auto"])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-task", type=int, default=16, help="the prompt set: bench --quality's --per-task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pipe = VisualSpecPipeline.from_pretrained(args.model)
    pipe.set_progress_bar_config(disable=True)
    prompts = [p["prompt"] for p in evaluation_prompts(per_task=args.per_task, seed=args.seed)][:args.images]

    def call(kwargs):
        gens = [torch.Generator().manual_seed(1000 + i) for i in range(len(prompts))]
        start = time.perf_counter()
        out = pipe(prompts, batch_size=args.batch_size, generator=gens, output_type="latent", compile=True, **kwargs)
        return time.perf_counter() - start, out.stats

    for mode in args.modes:
        call(mode_kwargs(mode))
    times, stats = {mode: [] for mode in args.modes}, {}
    for _ in range(args.rounds):
        for mode in args.modes:
            seconds, stats[mode] = call(mode_kwargs(mode))
            times[mode].append(seconds)
    best = {mode: min(t) for mode, t in times.items()}
    median = {mode: statistics.median(t) for mode, t in times.items()}
    first = args.modes[0]
    print(f"{machine_name()}, {torch.get_num_threads()} threads, {len(prompts)} images at batch {args.batch_size}")
    for mode in args.modes:
        print(f"{mode:16s} {stats[mode].mode:24s} forwards/img {stats[mode].forwards_per_sequence:6.1f}  "
              f"fastest {best[mode] / len(prompts):.4f} s/img {best[first] / best[mode]:.2f}x  "
              f"median {median[mode] / len(prompts):.4f} s/img {median[first] / median[mode]:.2f}x")
    print(json.dumps({m: [round(t / len(prompts), 4) for t in times[m]] for m in args.modes}))


if __name__ == "__main__":
    main()
