"""A compiled decode step: ``torch.compile`` of a model's window forward, one graph per shape bucket.

A token model that can run its window forward at fixed shapes (a static cache, every row at its own
positions, no host read inside) hands that forward to a :class:`StepCompiler`. The compiler keeps
one compiled graph per bucket of shapes (the model's rows, the window, the cache slots attended),
so that a decode never recompiles mid-step (a model compiles its buckets before decoding):

- a bucket's first call compiles it, with one progress line that says so (torch keeps the compiled
  code in its on-disk cache, so a later process compiles faster);
- a known bucket's calls run under ``fail_on_recompile``: if torch ever wanted to recompile one,
  the call fails and names the bucket instead of recompiling silently in a loop;
- past ``max_graphs`` buckets (:data:`MAX_GRAPHS`), new shapes run eagerly, with one warning.

The slot buckets are a small pure rule (:func:`bucket_slots`); whether compiling pays is another
(:func:`compile_pays`), read from measured step costs.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Callable, Hashable

import torch

from .window import prefix_rows
from .window_costs import announce, cached_window_costs, stored_window_costs

COMPILE_CHOICES = (True, False, "auto")
COMPILED_WINDOWS = 32  # the longest window a compiled step takes (the window search's largest); prefills run eagerly
MAX_GRAPHS = 192  # compiled buckets a step keeps before new shapes run eagerly (StepCompiler)


def check_compile(compile: Any) -> None:
    """``compile`` must be True, False or "auto"."""
    if not any(compile is c or (isinstance(c, str) and compile == c) for c in COMPILE_CHOICES):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")


def bucket_slots(needed: int, total: int, parts: int = 2) -> int:
    """The cache slots a step attends: ``needed`` (its furthest position + 1) rounded up to a
    multiple of ``ceil(total / parts)``, at most ``total``. Attention over slots no token has yet
    costs a static step at large batches; ``parts`` buckets of the cache bound that waste to
    ``1 / parts`` of it, at ``parts`` graphs per window."""
    if not 1 <= needed <= total:
        raise ValueError(f"{needed} slots needed of a cache of {total}")
    part = math.ceil(total / parts)
    return min(total, math.ceil(needed / part) * part)


def compile_pays(eager_s: float, compiled_s: float, compile_s: float, steps: int) -> bool:
    """Whether compiling a step pays in one call: ``steps * (eager_s - compiled_s) > compile_s``,
    seconds per eager and compiled step, and what compiling took when it was measured."""
    return steps * (eager_s - compiled_s) > compile_s


def compiled_step(model, compile, prefix_of: Callable[[int], Any], num_tokens: int, sequences: int,
                  slots: int) -> bool:
    """Whether a call runs ``model``'s compiled step (its ``compile_step``), and switch it so.

    ``compile=True`` compiles (an error for a model without a compiled step) and, once per model,
    batch size and machine, measures the one-token step eager and compiled (cached with the window
    costs); ``False`` stays eager; ``"auto"`` compiles only where those stored measurements say it
    pays in this call (:func:`compile_pays`), counting ``num_tokens * ceil(sequences / slots)``
    steps (the AR count: speculative calls take fewer, so this errs towards compiling only for
    long calls) against the compile time of every window measured (a speculative call may use any
    of them). With nothing stored, "auto" stays eager. ``prefix_of(r)`` is the prefix of ``r``
    rows; ``slots`` rows decode at once.
    """
    check_compile(compile)
    if not hasattr(model, "compile_step"):
        if compile is True:
            raise ValueError(f"compile=True: {type(model).__name__} has no compiled step yet; use compile=False")
        return False
    if compile is False:
        model.compile_step(False)
        return False
    prefix = prefix_of(slots)
    if compile == "auto":
        rows = prefix_rows(prefix)
        eager = stored_window_costs(model, rows, num_tokens, compiled=False)
        fast = stored_window_costs(model, rows, num_tokens, compiled=True)
        compile_s = stored_window_costs(model, rows, num_tokens, compiled=True, tag="compile-s")
        steps = num_tokens * -(-sequences // slots)
        compile = (1 in eager and 1 in fast and bool(compile_s)
                   and compile_pays(eager[1], fast[1], sum(compile_s.values()), steps))
    else:
        model.compile_step(False)
        cached_window_costs(model, prefix, num_tokens, windows=(1,))
        model.compile_step(True)
        cached_window_costs(model, prefix, num_tokens, windows=(1,))
    model.compile_step(bool(compile))
    return bool(compile)


CPP_WRAPPER = "cpp-wrapper"  # our name for inductor's C++ wrapper (``options={"cpp_wrapper": True}``), not a torch mode


def compile_mode(mode: str | None, device: torch.device) -> str | None:
    """``torch.compile``'s mode for a step on ``device``. ``"auto"``: ``"reduce-overhead"`` on a CUDA
    device (the step is captured in a CUDA graph and replayed with one launch, as gpt-fast does: a
    decode step of small matrices is bound by launching its kernels); elsewhere :data:`CPP_WRAPPER`,
    inductor's C++ wrapper, which calls a graph's kernels from C++ instead of from Python: a CPU has
    no graph to capture, and a decode step of small matrices is bound there by calling its kernels
    (docs/experiments/2026-11-29-cpu-cpp-wrapper.md); with ``VISUALSPEC_CPP_WRAPPER=0`` in the
    environment, torch's default there instead (``None``: kernels called from Python), e.g. where
    the C++ wrapper will not build. Any other value is passed on as given."""
    if mode == "auto":
        if torch.device(device).type == "cuda":
            return "reduce-overhead"
        return None if os.environ.get("VISUALSPEC_CPP_WRAPPER", "1") == "0" else CPP_WRAPPER
    return mode


def compile_in_mode(fn: Callable, mode: str | None, dynamic: bool = False) -> Callable:
    """``torch.compile(fn)`` in ``mode`` (a torch mode, or :data:`CPP_WRAPPER`)."""
    if mode == CPP_WRAPPER:
        return torch.compile(fn, dynamic=dynamic, options={"cpp_wrapper": True})
    return torch.compile(fn, dynamic=dynamic, mode=mode)


def step_compiler(current: "StepCompiler | None", fn: Callable, name: str, describe: Callable[[Hashable], str],
                  mode: str | None, device) -> "StepCompiler":
    """The compiler of a model's step: ``current`` when it compiles in the mode ``mode`` resolves to
    on ``device`` (:func:`compile_mode`), so its graphs are kept, else a new :class:`StepCompiler`
    of ``fn`` in that mode."""
    mode = compile_mode(mode, device)
    if current is not None and current.mode == mode:
        return current
    return StepCompiler(fn, name, describe=describe, mode=mode)


def dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` with row-major strides, even along size-1 dimensions (a compiled graph's guards
    compare strides: a (1, 1) slice of a wider tensor is contiguous yet strided differently);
    one view where ``x`` has them (a step hands over a dozen such). Always a new tensor object, so
    that two arguments are never the same object in one call and not in another (torch guards on
    that too)."""
    if x.stride() == row_major(x.shape):
        return x.view(x.shape)
    # contiguous() keeps a contiguous tensor's strides along size-1 dimensions (and view() too)
    return x.contiguous().as_strided(x.shape, row_major(x.shape))


def dense_args(args) -> list:
    """:func:`dense` of each tensor of ``args`` (None stays None), without any tensor operation for
    those that are row-major already and not handed over twice in the call: torch guards on two
    arguments being the same object, so a repeat gets a view of its own."""
    seen, out = set(), []
    for x in args:
        if x is not None and (id(x) in seen or x.stride() != row_major(x.shape)):
            x = dense(x)
        elif x is not None:
            seen.add(id(x))
        out.append(x)
    return out


def row_major(shape) -> tuple:
    """The strides of a row-major tensor of ``shape``: each the product of the sizes after it."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def fixed_address(buffer: torch.Tensor) -> torch.Tensor:
    """``buffer``, marked on a GPU as one whose address stays (``torch._dynamo.mark_static_address``,
    as transformers marks its static cache's buffers), so that a CUDA graph of the step may write it
    in place instead of torch skipping the graph."""
    if buffer.device.type == "cuda":
        torch._dynamo.mark_static_address(buffer)
    return buffer


def inductor_cache_dir() -> str:
    """Where torch keeps compiled code across processes (``$TORCHINDUCTOR_CACHE_DIR`` or its
    default under the temporary folder)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or cache_dir()


def skips_guards(key: Hashable, checked: set | None, mode: str | None) -> bool:
    """Whether a call of a compiled bucket ``key`` skips torch's guards
    (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``: only the guards that tell the
    bucket's graph from the others' run): where its guards passed since its owner's last
    :meth:`StepCompiler.recheck` (``checked``), off CUDA graphs (``"reduce-overhead"``: not measured).
    Evaluating every guard cost a compiled call of the shapes GPT 0.08 ms in a decode on the 2-core
    CPU (docs/experiments/2026-11-29-rule-inside-the-step.md). torch's stance is process-wide: steps
    compiled models take in two threads at once share it."""
    return checked is not None and key in checked and mode != "reduce-overhead"


class CompileError(RuntimeError):
    """torch could not compile a step on this machine: no C++ compiler, an unsupported device, or an
    error inside torch's compiler (one seen: torch 2.11's inductor on CUDA, generating the top-k
    softmax over 65,536 logits of a Lumina-shaped step). ``step`` names the step, ``reason`` torch's error."""

    def __init__(self, step: str, reason: str):
        super().__init__(f"{step}: torch could not compile the step on this machine ({reason}); use compile=False")
        self.step, self.reason = step, reason


class StepCompiler:
    """One compiled function, called with a bucket key that names the shapes of its arguments.

    ``name`` describes the step in messages; ``describe(key)`` its bucket; ``mode`` is
    ``torch.compile``'s, or :data:`CPP_WRAPPER`. Under ``"reduce-overhead"`` (CUDA graphs) each call
    starts a new graph step and its output is copied out of the graph's memory, which the next
    replay overwrites.
    ``compile_s`` holds
    each compiled bucket's first-call seconds (the compile), ``eager`` the buckets that ran eagerly
    past ``max_graphs``: :data:`MAX_GRAPHS` by default, enough for one process that benchmarks every
    decoding of a model at three batch sizes (each a plain, a featured, an AR and a fused Jacobi
    step at every window and slot bucket: about 150); 48, the earlier cap, sent a two-batch-size
    bench's second batch size partly eager (2026-12-07).
    """

    def __init__(self, fn: Callable, name: str, describe: Callable[[Hashable], str] = str,
                 max_graphs: int | None = None, mode: str | None = None):
        self.fn, self.name, self.describe, self.mode = fn, name, describe, mode
        self.max_graphs = MAX_GRAPHS if max_graphs is None else max_graphs
        self.compiled = compile_in_mode(fn, mode)
        self.compile_s: dict[Hashable, float] = {}
        self.eager: set[Hashable] = set()
        self.checked: set[Hashable] | None = None  # buckets whose guards passed since recheck(); None: never skip

    def _run(self, *args):
        if self.mode != "reduce-overhead":
            return self.compiled(*args)
        torch.compiler.cudagraph_mark_step_begin()
        out = self.compiled(*args)
        return tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()

    def recheck(self) -> None:
        """Check each bucket's guards again at its next call, and skip them at the calls after it,
        until the next ``recheck()``. An owner calls it wherever its state may have changed (a
        model's prefill: its weights, its cache, the attributes its step reads), so that between
        two calls nothing a guard checks can change without a new bucket key; an owner that never
        calls it keeps every guard (:func:`skips_guards`)."""
        self.checked = set()

    def __call__(self, key: Hashable, *args, compile_new: bool = True):
        """``fn(*args)`` through the graph of bucket ``key``; a new bucket compiles first, announced
        (``compile_new=False``: a new bucket runs eagerly instead, e.g. while callers play in
        threads, where torch must not compile)."""
        if key not in self.compile_s and not compile_new:
            return self.fn(*args)
        if key in self.compile_s:
            # a second try with every guard evaluated: torch's stance is process-wide, and a call in
            # another thread that enters or leaves its own stance meanwhile can fail this call's
            # guards once ("runtime guards failed even though they passed": three players' worlds in
            # two threads, docs/experiments/2026-12-07-browser-fps-repeat.md); inputs that really
            # changed fail again
            for retry in (False, True):
                try:
                    skip = not retry and skips_guards(key, self.checked, self.mode)
                    with torch.compiler.set_stance("fail_on_recompile", skip_guard_eval_unsafe=skip):
                        out = self._run(*args)
                    if self.checked is not None:
                        self.checked.add(key)
                    return out
                except RuntimeError as e:
                    if "recompil" not in str(e).lower():
                        raise
                    if retry:
                        raise RuntimeError(f"{self.name}: torch wanted to recompile the already compiled bucket "
                                           f"{self.describe(key)}; something about its inputs changed (dtype, "
                                           f"device, or a tensor's layout). Call again with compile=False.") from e
        if key in self.eager or len(self.compile_s) >= self.max_graphs:
            if not self.eager:
                warnings.warn(f"{self.name}: {len(self.compile_s)} shape buckets are compiled already; new ones "
                              f"(first: {self.describe(key)}) run eagerly, without compiling", stacklevel=2)
            self.eager.add(key)
            return self.fn(*args)
        announce(f"compiling {self.name} for {self.describe(key)}: once per shape in this process (torch keeps the "
                 f"code in {inductor_cache_dir()}, so later processes compile faster)")
        t0 = time.perf_counter()
        try:
            with torch._dynamo.config.patch(recompile_limit=self.max_graphs + 8,
                                            accumulated_recompile_limit=max(256, 2 * self.max_graphs)):
                out = self._run(*args)
        except Exception as e:  # inductor raises many kinds: no C++ compiler, an unsupported device, ...
            raise CompileError(self.name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        self.compile_s[key] = time.perf_counter() - t0
        return out
