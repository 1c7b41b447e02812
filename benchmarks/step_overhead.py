"""What a decode step costs beside its target forward, eager and compiled (#48).

    python benchmarks/step_overhead.py                       # shapes model, batch 1, 4 and 16
    python benchmarks/step_overhead.py --batch-sizes 1 --modes ar sjd --images 8
    python benchmarks/step_overhead.py --model shapes-lumina               # the Lumina-layout model
    python benchmarks/step_overhead.py --model shapes-any-order --modes ar assd

For each batch size and mode (a bench mode of the pipeline: ``ar``, ``sjd``, ...; each eager and
``+compiled``), it generates ``--images`` images (after one untimed warm-up call that measures the
window costs and compiles), timing two things inside the same calls:

- the decode loop (``visualspec.core.engine.decode``: prefill, every step, the commits), and the
  prefills inside it (the target's ``prefill`` and ``refill``: the prompt's forward, once per
  request), which are no step: a step's time is the loop's less its prefills';
- the target's forwards inside it (``forward_window``; an any-order model's draft forward
  ``forward_queries`` too, which its ASSD steps run besides).

It prints per image the seconds, target forwards and prefill milliseconds, and per step the
milliseconds of the whole step, of its forward, and their ratio (the engine's own work is the rest: drafting, the rule,
bookkeeping). A forward may hold more than the model's: the sampling and the rule inside a
compiled step, or a whole fused Jacobi step (the drafts, the rule, the commit). So after each
mode's timed calls it replays every window forward those calls made, at the same shapes and
positions, bare (the model alone, no sampling, rule or drafts), and prints the step against that
bare forward too. The issue's target is a step of at most 1.15x the bare forward of its window. On a GPU (``--device
cuda``) each timed forward waits for its kernels, so that its time is the forward's own; that
adds a synchronisation a step, which the engine's rule makes anyway where it reads acceptance.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from visualspec import VisualSpecPipeline  # noqa: E402
from visualspec.core.window_costs import machine_name, synchronize  # noqa: E402
from visualspec.tools.commands.options import add_device_option  # noqa: E402
from visualspec.tools.bench import DEFAULT_PROMPTS  # noqa: E402
from visualspec.tools.loading import default_model, device_name, shipped_or_path  # noqa: E402


def timed(fn, record, device=torch.device("cpu")):
    """``fn``, calling ``record(seconds)`` after each call (and its kernels, on an accelerator)."""
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            synchronize(device)
            record(time.perf_counter() - t0)
    return call


def target_class(pipe) -> type:
    """The class of the token model a decode of ``pipe`` steps through: its transformer's, or for a
    unified pipeline (Lumina-mGPT's layout) its family's token model's."""
    family = getattr(pipe, "family", None)
    return type(family.token_model()) if family is not None else type(pipe.transformer)


class Timers:
    """Seconds inside ``decode`` (as the pipeline's module calls it), inside the target's prefills
    (``prefill``, ``refill``) and inside its forwards (``forward_window``, and an any-order model's
    draft forward ``forward_queries``), with the count of window forwards (one a step)."""

    def __init__(self, pipe, device):
        self.decode_s = self.forward_s = self.prefill_s = 0.0
        self.forwards = 0
        family, cls = sys.modules[type(pipe).__module__], target_class(pipe)

        def add_decode(seconds):
            self.decode_s += seconds

        def add_forward(seconds, step=True):
            self.forward_s += seconds
            self.forwards += step

        def add_prefill(seconds):
            self.prefill_s += seconds

        def add_query(seconds):
            add_forward(seconds, False)
            self.query_s += seconds

        self.query_s, self.windows = 0.0, []  # the draft forwards' seconds; each window forward's (model, shape, start)
        window_forward = timed(cls.forward_window, add_forward, device)

        def recorded(model, tokens, start, *args, **kwargs):
            self.windows.append((model, tokens.shape, start.clone() if torch.is_tensor(start) else start))
            return window_forward(model, tokens, start, *args, **kwargs)

        patched = [(family, "decode", timed(family.decode, add_decode))]
        patched.append((cls, "forward_window", recorded))
        patched += [(cls, name, timed(getattr(cls, name), add_prefill, device)) for name in ("prefill", "refill")
                    if hasattr(cls, name)]
        if hasattr(cls, "forward_queries"):
            patched.append((cls, "forward_queries", timed(cls.forward_queries, add_query, device)))
        self._saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patched]
        for owner, name, fn in patched:
            setattr(owner, name, fn)

    @property
    def step_s(self) -> float:
        """Seconds of the decode's steps: the loop's less its prefills'."""
        return self.decode_s - self.prefill_s

    def close(self):
        for owner, name, before in self._saved:
            if before is None:
                delattr(owner, name)
            else:
                setattr(owner, name, before)

    @torch.no_grad()
    def bare_s(self, device) -> float:
        """Seconds of every recorded window forward run again bare, at its shape and positions (the
        draft forwards as they were timed): all of them once untimed (a compiled model compiles its
        bare graphs there), then again, timed. Before each, the cache is cropped to the window's
        start (untimed; a static cache crops nothing), so that a cache that grows with its columns
        (the transformers adapters') holds what it held in the step. The cache holds the last
        decode's keys, which a forward's cost does not depend on."""
        passes = []
        for _ in range(2):  # the first pass compiles what a compiled model lacks (its bare graphs), untimed
            seconds = 0.0
            for model, shape, start in self.windows:
                model.crop(start)
                tokens = torch.zeros(shape, dtype=torch.long, device=device)
                t0 = time.perf_counter()
                model.forward_window(tokens, start)
                synchronize(device)
                seconds += time.perf_counter() - t0
            passes.append(seconds)
        return passes[-1] + self.query_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="pipeline folder or shipped name (default: the shipped shapes model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--modes", nargs="+", default=["ar", "sjd"])
    parser.add_argument("--images", type=int, default=8, help="images per mode and batch size")
    add_device_option(parser)
    args = parser.parse_args(argv)
    folder = shipped_or_path(args.model) if args.model else default_model()[0]
    device = torch.device(device_name(args.device))
    pipe = VisualSpecPipeline.from_pretrained(folder).to(device)
    pipe.set_progress_bar_config(disable=True)
    print(f"{folder}: {machine_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| batch | mode | s/image | forwards/image | prefill ms/image | step ms | forward ms | step / forward "
          "| bare forward ms | step / bare forward |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in args.batch_sizes:
        images = max(args.images, batch)
        prompts = [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(images)]
        for mode in [m + suffix for m in args.modes for suffix in ("", "+compiled")]:
            settings = type(pipe).bench_mode(mode)
            pipe(prompts[:batch], batch_size=batch, seed=0, output_type="latent", **settings)  # warm-up, untimed
            timers = Timers(pipe, device)
            try:
                t0 = time.perf_counter()
                for s in range(0, images, batch):
                    pipe(prompts[s:s + batch], batch_size=batch, seed=s, output_type="latent", **settings)
                seconds = time.perf_counter() - t0
            finally:
                timers.close()
            steps, bare = timers.forwards, timers.bare_s(device)
            print(f"| {batch} | {mode} | {seconds / images:.3f} | {steps * batch / images:.1f} | "
                  f"{timers.prefill_s / images * 1e3:.1f} | {timers.step_s / steps * 1e3:.2f} | "
                  f"{timers.forward_s / steps * 1e3:.2f} | {timers.step_s / timers.forward_s:.2f} | "
                  f"{bare / steps * 1e3:.2f} | {timers.step_s / bare:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
