"""What a target forward of W tokens costs against one of 1 token, per batch size: does speculation pay here?

    python benchmarks/window_cost.py --batch-sizes 1 16 --windows 1 2 4 8 16 32 [--compile]

Loads a pipeline folder (default: the shipped shapes model), builds the real model prefix for B
prompts with classifier-free guidance as the pipeline does (2B model rows), and times
``forward_window`` for each W at the middle of the image (:func:`visualspec.core.window_costs.measure_window_costs`,
the median of ``--repeats`` calls after a warm-up). For each batch size it prints a markdown table
of milliseconds per forward and the ratio to W = 1, and the window
:func:`visualspec.core.window.choose_window` would pick at a few constant acceptance rates alpha
(expected tokens per step ``E(W) = 1 + alpha + ... + alpha**(W-1)``).

With ``--compile`` it also times the shipped compiled step (``compile_step``, a LlamaGen model) for
each W at the same start position: compiling its two slot buckets (seconds; less once torch's
on-disk cache holds them), the steady state (ms), and the largest logit difference from eager. A
failing compile is reported and skipped.

Timings on shared machines are noisy; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from visualspec import SamplingConfig, VisualSpecPipeline  # noqa: E402
from visualspec.assets import SHAPES_T2I  # noqa: E402
from visualspec.core.window import choose_window, prefix_rows  # noqa: E402
from visualspec.core.window_costs import machine_name, measure_window_costs, window_start  # noqa: E402
from visualspec.tools.bench import DEFAULT_PROMPTS  # noqa: E402

ALPHAS = (0.3, 0.5, 0.7, 0.9)


@torch.no_grad()
def model_prefix(pipe, batch_size: int):
    """The transformer's prefix for ``batch_size`` images with the pipeline's default guidance."""
    sampling = SamplingConfig(guidance_scale=pipe.config.default_guidance_scale)
    if pipe.is_text_conditional:
        cond = pipe.encode_prompt([DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(batch_size)])
    else:
        cond = torch.arange(batch_size, device=pipe.device) % pipe.transformer.config.num_classes
    return pipe._prefix(pipe.transformer, cond, sampling)


def fmt(seconds, scale: float = 1.0) -> str:
    return "-" if seconds is None else f"{scale * seconds:.2f}"


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


@torch.no_grad()
def measure_compiled(model, prefix, num_tokens: int, w: int, start: int, repeats: int) -> dict:
    """The shipped compiled step (``compile_step``) at window W: compiling its two slot buckets
    (``precompile``), its steady cost at ``start``, and its largest logit difference from eager."""
    model.compile_step(False)
    first = model.prefill(prefix, num_tokens)
    zeros = lambda n: torch.zeros(first.shape[0], n, dtype=torch.long, device=first.device)  # noqa: E731
    if start:
        model.forward_window(zeros(start), 0)
    tokens = zeros(w)
    eager = model.forward_window(tokens, start)
    model.compile_step(True)
    try:
        _, compile_s = _timed(model.precompile, prefix, num_tokens, [w])
        steady = measure_window_costs(model, prefix, num_tokens, (w,), repeats, start=start)[w]
        model.prefill(prefix, num_tokens)
        if start:
            model.forward_window(zeros(start), 0)
        diff = float((model.forward_window(tokens, start) - eager).abs().max())
    finally:
        model.compile_step(False)
    return dict(compile_s=compile_s, steady_s=steady, diff=diff)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(SHAPES_T2I), help="pipeline folder")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16], help="images per batch (B)")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per W (the median is kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd forward_window")
    parser.add_argument("--device", default="cpu", help="where to run the model (cpu, cuda, ...)")
    parser.add_argument("--quantize", default=None, help="time the model with weights quantised so (int8, ...)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    pipe = VisualSpecPipeline.from_pretrained(args.model).to(args.device)
    if args.quantize:
        pipe.quantize(args.quantize)
    model = pipe.transformer
    num_tokens = model.config.block_size
    windows = sorted({w for w in args.windows if 1 <= w <= num_tokens} | {1})
    start = window_start(num_tokens, windows)
    print(f"machine: {machine_name(pipe.device)} (platform.processor {platform.processor() or '?'}, {platform.machine()}), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"model: {args.model} ({type(model).__name__}, {model.dtype}, weights {args.quantize or 'unquantised'}), "
          f"{num_tokens} tokens, "
          f"guidance {pipe.config.default_guidance_scale}; windows start at position {start}")

    compile_ok = args.compile
    for batch_size in args.batch_sizes:
        prefix = model_prefix(pipe, batch_size)
        costs = measure_window_costs(model, prefix, num_tokens, windows, args.repeats, start=start)
        rows = prefix_rows(prefix)
        print(f"\n### batch {batch_size} ({rows} model rows)\n")
        compiled = {}
        for w in windows if compile_ok else ():
            try:
                compiled[w] = measure_compiled(model, prefix, num_tokens, w, start, args.repeats)
            except Exception as e:  # noqa: BLE001  (any compile failure: report it and go on)
                print(f"torch.compile failed at W={w}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                compile_ok = False
                break
        header = "| W | ms / forward | x W=1 |"
        if compiled:
            header += " compiled ms | x eager | compiled x W=1 | compile s | max abs diff |"
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        for w in windows:
            line = f"| {w} | {1e3 * costs[w]:.2f} | {costs[w] / costs[1]:.2f} |"
            if w in compiled:
                c = compiled[w]
                ratio = c["steady_s"] / compiled[1]["steady_s"] if 1 in compiled else float("nan")
                line += (f" {fmt(c['steady_s'], 1e3)} | {c['steady_s'] / costs[w]:.2f} | {ratio:.2f} |"
                         f" {fmt(c['compile_s'])} | {c['diff']:.1e} |")
            elif compiled:
                line += " - | - | - | - | - |"
            print(line)
        picks = ", ".join(f"alpha {a}: W={choose_window(costs, a)}" for a in ALPHAS)
        print(f"\nchoose_window at constant acceptance: {picks}")


if __name__ == "__main__":
    main()
