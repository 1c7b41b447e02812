"""What a static, compiled step buys a shipped LlamaGen-layout model on this machine (#48).

    python benchmarks/compiled_step.py                     # assets/shapes-t2i, batch 1 and 16, W = 1 and 8
    python benchmarks/compiled_step.py --batch-sizes 1 --windows 1 --threads 1
    python benchmarks/compiled_step.py --device cuda --batch-sizes 1 16 --windows 1 8   # CUDA graphs
    python benchmarks/compiled_step.py --modes python auto python auto   # the C++ wrapper against Python's, twice

For each batch size (guided: twice as many model rows) and window W, at the middle of the image,
it times ``forward_window`` three ways, as medians of ``--repeats`` calls after a warm-up:

- eager: today's step, attending over the cache slots up to the furthest position (one host
  synchronisation a step to read that position);
- static: ``static_step=True``, every cache slot masked instead: fixed shapes, no host
  synchronisation;
- compiled: ``compile_step(True)``, the static step through ``torch.compile`` at the slot bucket
  of the window (half or all of the cache), after ``precompile`` (reported: compiling both slot
  buckets of the window; with torch's on-disk cache warm, much less than a first compile).

It prints milliseconds per forward, the compile time, the largest difference of the logits from
eager's, and the compiled step's arithmetic rate (FLOPs counted by torch's FLOP counter) against
the machine's float32 matmul rate measured on 2048 x 2048 products (on a GPU: 8192 x 8192, and
every timed call is synchronised). The compiled step's modes are ``--modes``, a row each (``auto``:
CUDA graphs on a GPU, inductor's C++ wrapper on a CPU; ``python``: torch's default mode, kernels
called from Python; any other value is torch's mode of that name). The arithmetic of a step is
reported beside them (``--profile``: the time in matmul and attention kernels against the rest).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms, synchronized  # noqa: E402
from visualspec import VisualSpecPipeline  # noqa: E402
from visualspec.core.sampling import SamplingConfig  # noqa: E402
from visualspec.core.window_costs import machine_name, synchronize  # noqa: E402
from visualspec.tools.commands.options import add_device_option  # noqa: E402
from visualspec.tools.loading import default_model, device_name, shipped_or_path  # noqa: E402


def kernel_share(fn, calls: int = 30) -> float:
    """The share of a call's CPU time spent in matmul and attention kernels (torch.profiler)."""
    with torch.profiler.profile() as prof:
        for _ in range(calls):
            fn()
    rows = prof.key_averages()
    total = sum(r.self_cpu_time_total for r in rows)
    kernels = sum(r.self_cpu_time_total for r in rows if r.key in ("aten::mm", "aten::addmm", "aten::bmm")
                  or "scaled_dot_product" in r.key)
    return kernels / total


def matmul_peak_flops(device, n: int = 2048, repeats: int = 10) -> float:
    """The device's float32 matmul rate (FLOP/s): the median of n x n by n x n products."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n ** 3 / (median_ms(synchronized(lambda: a @ b, device), repeats, warmup=2) / 1e3)



def step_flops(fn) -> int:
    """The FLOPs of one call of ``fn`` (torch's FLOP counter: matmuls and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="pipeline folder or shipped name (default: the shipped shapes model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--modes", nargs="+", default=["auto"],
                        help="modes of the compiled step, a row each: auto, python (torch's default) or a torch mode")
    add_device_option(parser)
    parser.add_argument("--profile", action="store_true", help="also the share of matmul and attention kernels")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = shipped_or_path(args.model) if args.model else default_model()[0]
    device = torch.device(device_name(args.device))
    pipe = VisualSpecPipeline.from_pretrained(folder).to(device)
    model = pipe.transformer.eval()
    sampling = SamplingConfig(guidance_scale=pipe.config.default_guidance_scale)
    n = 8192 if device.type == "cuda" else 2048
    peak = matmul_peak_flops(device, n)
    print(f"{folder}: {machine_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"float32 matmul peak {peak / 1e9:.0f} GFLOP/s ({n} x {n} products)")
    print("| batch | W | mode | eager ms | static ms | compiled ms | compile s | max abs diff | kernel share (eager) | "
          "GFLOP/s compiled | share of peak |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with torch.no_grad():
        for batch in args.batch_sizes:
            prefix = pipe._prefix(model, pipe._conditions(["a photo of a red circle"] * batch, None, 1), sampling)
            for W in args.windows:
                rows = prefix[0].shape[0] if isinstance(prefix, tuple) else prefix.shape[0]
                tokens = torch.randint(0, model.config.vocab_size, (rows, W), device=device)
                start = torch.full((rows,), model.config.block_size // 2, device=device)
                step = synchronized(lambda: model.forward_window(tokens, start), device)
                model.static_step = False
                model.prefill(prefix, model.config.block_size)
                eager = model.forward_window(tokens, start)
                flops = step_flops(lambda: model.forward_window(tokens, start))
                eager_ms = median_ms(step, args.repeats)
                share = kernel_share(lambda: model.forward_window(tokens, start)) if args.profile else float("nan")
                model.static_step = True
                model.prefill(prefix, model.config.block_size)
                static_ms = median_ms(step, args.repeats)
                model.static_step = False
                for mode in args.modes:
                    model.compile_step(True, mode=None if mode == "python" else mode)  # static, half the slots a bucket
                    t0 = time.perf_counter()
                    model.precompile(prefix, model.config.block_size, [W])
                    synchronize(device)
                    compile_s = time.perf_counter() - t0
                    model.prefill(prefix, model.config.block_size)
                    out = model.forward_window(tokens, start)
                    compiled_ms = median_ms(step, args.repeats)
                    diff = (out - eager).abs().max().item()
                    model.compile_step(False)
                    rate = flops / (compiled_ms / 1e3)
                    print(f"| {batch} | {W} | {mode} | {eager_ms:.2f} | {static_ms:.2f} | {compiled_ms:.2f} | "
                          f"{compile_s:.1f} | {diff:.1e} | {share:.2f} | {rate / 1e9:.1f} | {rate / peak:.3f} |",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
