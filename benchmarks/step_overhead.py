"""What a decode step costs beside its target forward, eager and compiled (#48).

    python benchmarks/step_overhead.py                       # shapes model, batch 1, 4 and 16
    python benchmarks/step_overhead.py --batch-sizes 1 --modes ar sjd --images 8
    python benchmarks/step_overhead.py --device cuda --batch-sizes 1 16 --window 8    # one window to compile
    python benchmarks/step_overhead.py --model shapes-lumina               # the Lumina-layout model
    python benchmarks/step_overhead.py --model shapes-any-order --modes ar assd
    python benchmarks/step_overhead.py --text --modes ar ngram stand --images 8   # assets/text-pair, window 6

For each batch size and mode (a bench mode of the pipeline: ``ar``, ``sjd``, ...; each eager and
``+compiled``), it generates ``--images`` images (after one untimed warm-up call that measures the
window costs and compiles), timing two things inside the same calls:

- the decode loop (``visualspec.core.engine.decode``: prefill, every step, the commits), and the
  prefills inside it (the target's ``prefill`` and ``refill``: the prompt's forward, once per
  request), which are no step: a step's time is the loop's less its prefills';
- the target's forwards inside it (``forward_window``; an any-order model's draft forward
  ``forward_queries`` too, which its ASSD steps run besides).

It prints per image the seconds, target forwards and prefill milliseconds, and per step the
milliseconds of the whole step, of its forward, and their ratio (the engine's own work is the
rest: drafting, the rule, bookkeeping). A forward may hold more than the model's: the sampling and
the rule inside a compiled step, or a whole fused Jacobi step (the drafts, the rule, the commit).
So right after each timed call it replays every window forward that call made, at the same shapes
and positions, bare (the model alone, no sampling, rule or drafts), and prints the step against
that bare forward: over all calls, and the median (and range) of the calls' own ratios, which a
machine whose speed drifts between calls moves least. The issue's target is a step of at most
1.15x the bare forward of its window. On a GPU (``--device cuda``) each timed forward waits for
its kernels, so that its time is the forward's own; that adds a synchronisation a step, which the
engine's rule makes anyway where it reads acceptance.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from visualspec import VisualSpecPipeline  # noqa: E402
from visualspec.core.window_costs import machine_name, synchronize  # noqa: E402
from visualspec.tools.commands.options import add_device_option, window_arg  # noqa: E402
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
    within it (``prefill``, ``refill``) and inside its forwards (``forward_window``, and an any-order
    model's draft forward ``forward_queries``), with the count of window forwards (one a step).
    ``events`` records each prefill's arguments and each window forward's shape and start, in
    order, for :meth:`bare_s`."""

    def __init__(self, pipe, device, family=None, cls=None):
        self.decode_s = self.forward_s = self.prefill_s = 0.0
        self.forwards, self.decoding = 0, False
        family = family or sys.modules[type(pipe).__module__]  # the module whose ``decode`` a call runs
        cls = cls or target_class(pipe)
        def add_forward(seconds, step=True):
            self.forward_s += seconds
            self.forwards += step

        def add_prefill(seconds):
            self.prefill_s += seconds

        def add_query(seconds):
            add_forward(seconds, False)
            self.query_s += seconds

        self.query_s, self.events = 0.0, []  # the draft forwards' seconds; ("prefill" | "window", model, ...)
        forward_window = cls.forward_window
        window_forward = timed(forward_window, add_forward, device)

        def decode(*args, **kwargs):
            self.decoding, t0 = True, time.perf_counter()
            try:
                return family_decode(*args, **kwargs)
            finally:
                self.decoding = False
                self.decode_s += time.perf_counter() - t0

        def recorded(model, tokens, start, *args, **kwargs):
            if not self.decoding:  # a pipeline's precompile runs windows too, before its decode
                return forward_window(model, tokens, start, *args, **kwargs)
            self.events.append(("window", model, tokens.shape, start.clone() if torch.is_tensor(start) else start))
            return window_forward(model, tokens, start, *args, **kwargs)

        def prefill_of(name):
            before = getattr(cls, name)
            prefill = timed(before, add_prefill, device)

            def call(model, *args, **kwargs):
                if not self.decoding:  # a pipeline's precompile prefills too: no step, not the decode's
                    return before(model, *args, **kwargs)
                if name == "prefill":
                    self.events.append(("prefill", model, args, kwargs))
                return prefill(model, *args, **kwargs)
            return call

        family_decode = family.decode
        patched = [(family, "decode", decode), (cls, "forward_window", recorded)]
        patched += [(cls, name, prefill_of(name)) for name in ("prefill", "refill") if hasattr(cls, name)]
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
    def bare_s(self, device, passes: int = 1) -> float:
        """Seconds of every recorded window forward run again bare, at its shape and positions (the
        draft forwards as they were timed), in the last of ``passes`` passes (an earlier one compiles
        what a compiled model lacks: its bare graphs). Untimed around them, the decode's own cache
        moves are made again: each prefill (with its arguments), each drop of finished rows (to the
        next window's rows), and before each window a crop to its start (a static cache crops
        nothing; the transformers adapters' cache would otherwise hold every replayed window's
        columns). The calls it replays refill no rows. The cache holds the last decode's keys,
        which a forward's cost does not depend on."""
        for _ in range(passes):
            seconds, rows = 0.0, None
            for kind, model, *event in self.events:
                if kind == "prefill":
                    args, kwargs = event
                    model.prefill(*args, **kwargs)
                    rows = None
                    continue
                shape, start = event
                if rows is not None and shape[0] < rows:  # rows that finished left the batch here
                    model.select(torch.arange(shape[0], device=device))
                rows = shape[0]
                model.crop(start)
                tokens = torch.zeros(shape, dtype=torch.long, device=device)
                t0 = time.perf_counter()
                model.forward_window(tokens, start)
                synchronize(device)
                seconds += time.perf_counter() - t0
        return seconds + self.query_s


def timed_calls(pipe, prompts: list, batch: int, settings: dict, device,
                text=None) -> list[tuple[Timers, float, float]]:
    """One warm-up call (window costs measured, graphs compiled, bare ones too), then a call per
    ``batch`` prompts, each timed and followed at once by the bare replay of its forwards: a list of
    (timers, the call's seconds, its bare seconds). Replaying each call right after it puts both
    in the same state of a machine whose speed drifts from minute to minute. ``text``: a
    ``(model, tokenizer)`` pair decoded by ``generate_text(..., **settings)`` instead of ``pipe``."""
    from visualspec.models.hf import HFCausalLM
    from visualspec.text import generate, generate_text

    def call(start: int, seed: int) -> tuple[Timers, float]:
        timers = Timers(pipe, device) if text is None else Timers(None, device, generate, HFCausalLM)
        try:
            t0 = time.perf_counter()
            if text is None:
                pipe(prompts[start:start + batch], batch_size=batch, seed=seed, output_type="latent", **settings)
            else:
                generate_text(*text, prompts[start:start + batch], seed=seed, **settings)
            return timers, time.perf_counter() - t0
        finally:
            timers.close()

    call(0, 0)[0].bare_s(device, passes=2)  # warm-up, untimed
    out = []
    for start in range(0, len(prompts), batch):
        timers, seconds = call(start, start)
        out.append((timers, seconds, timers.bare_s(device)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="pipeline folder or shipped name (default: the shipped shapes model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--modes", nargs="+", default=["ar", "sjd"])
    parser.add_argument("--images", type=int, default=8,
                        help="images per mode and batch size (rounded up to whole calls of the batch size)")
    parser.add_argument("--window", type=window_arg, default=None,
                        help="the window of the modes that draft (default: the pipeline's own, 'auto'), e.g. 8: "
                             "one window to compile where each costs a compile, as CUDA graphs do")
    parser.add_argument("--text", action="store_true",
                        help="assets/text-pair's target through generate_text (modes ar, ngram, stand, jacobi; "
                             "greedy, 128 tokens, window 6 or --window; held-out prompts of seed 17); "
                             "--images counts prompts")
    add_device_option(parser)
    args = parser.parse_args(argv)
    device = torch.device(device_name(args.device))
    if args.text:
        return text_main(args, device)
    folder = shipped_or_path(args.model) if args.model else default_model()[0]
    pipe = VisualSpecPipeline.from_pretrained(folder).to(device)
    pipe.set_progress_bar_config(disable=True)
    print(f"{folder}: {machine_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print_header()
    for batch in args.batch_sizes:
        images = -(-args.images // batch) * batch  # whole calls only: a smaller last call would measure its tables
        prompts = [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(images)]
        for mode in [m + suffix for m in args.modes for suffix in ("", "+compiled")]:
            settings = type(pipe).bench_mode(mode)
            if args.window is not None and settings.get("decoding", "ar") != "ar":
                settings["window"] = args.window
            print_row(batch, mode, images, timed_calls(pipe, prompts, batch, settings, device))
    return 0


def print_header() -> None:
    print("| batch | mode | s/image | forwards/image | prefill ms/image | step ms | forward ms | step / forward "
          "| bare forward ms | step / bare forward | per call: median (range) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def print_row(batch: int, mode: str, images: int, calls) -> None:
    """One table row of :func:`timed_calls`' calls (per image, or per text prompt)."""
    seconds, bare = (sum(c[i] for c in calls) for i in (1, 2))
    step_s, prefill_s, forward_s, steps = (sum(getattr(c[0], name) for c in calls)
                                           for name in ("step_s", "prefill_s", "forward_s", "forwards"))
    ratios = [timers.step_s / bare_s for timers, _, bare_s in calls]
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else "-"
    print(f"| {batch} | {mode} | {seconds / images:.3f} | {steps * batch / images:.1f} | "
          f"{prefill_s / images * 1e3:.1f} | {step_s / steps * 1e3:.2f} | {forward_s / steps * 1e3:.2f} | "
          f"{step_s / forward_s:.2f} | {bare / steps * 1e3:.2f} | {step_s / bare:.2f} | "
          f"**{statistics.median(ratios):.2f}** ({spread}) |", flush=True)


def text_main(args, device) -> int:
    """The table for assets/text-pair's target: each mode eager and compiled, at batch 1 only
    (generate_text's calls are one prompt each here)."""
    from visualspec.tools.bench_text import PROMPT_TOKENS, held_out_prompts, load_pair, pair_folder

    folder = pair_folder()
    tokenizer, target, _ = load_pair(folder)
    prompts = held_out_prompts(folder, tokenizer, args.images, PROMPT_TOKENS, seed=17)
    print(f"{folder}: {machine_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print_header()
    for mode in args.modes:
        for compiled in (False, True):
            settings = dict(max_new_tokens=128, temperature=0, compile=compiled,
                            drafter=None if mode == "ar" else mode, window=1 if mode == "ar" else args.window or 6)
            calls = timed_calls(None, prompts, 1, settings, device, text=(target, tokenizer))
            print_row(1, mode + ("+compiled" if compiled else ""), len(prompts), calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
