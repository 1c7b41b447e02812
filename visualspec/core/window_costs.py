"""Measuring the cost of a decode window, and keeping the measurements on disk.

:func:`measure_window_costs` times ``forward_window`` for each window W (the seconds per target
forward that :mod:`visualspec.core.window` chooses from); :func:`cached_window_costs` keeps those
tables in ``window_costs.json`` (:func:`cache_path`), per model, machine, thread count and batch
size (:func:`cost_signature`).

Only the token-model protocol of :class:`visualspec.core.engine.TokenModel` is used (``prefill``,
``forward_window``, ``crop``). Measuring runs ``prefill``, so it resets the model's cache: measure
before decoding, never in the middle of it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from .checks import check_positive_int
from .home import home
from .proactive import tree_step_timer
from .window import (SPECULATION_MARGIN, WINDOWS, CallPool, WindowPolicy, best_fixed_window, pooled_tokens, prefix_rows,
                     speculation_pays)

CACHE_FILE = "window_costs.json"
_clock = time.perf_counter  # one name, so tests can swap in a fake clock
STEP_ROUNDS = 3  # rounds of timed decodes per window (docs/experiments/2026-11-28-as-ar-margin.md)


def announce(line: str) -> None:
    """One progress line on standard error for one-time work (measuring window costs), so that a
    first call that takes longer says why."""
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- measuring costs

def window_start(max_new_tokens: int, windows: Sequence[int]) -> int:
    """The generated position the timed windows start at: the middle of the sequence, moved back
    so that the largest window fits, ``max(0, min(N // 2, N - max(windows)))``."""
    return max(0, min(max_new_tokens // 2, max_new_tokens - max(windows)))


def quarter_starts(max_new_tokens: int, windows: Sequence[int]) -> list[int]:
    """Where a compiled step's windows are timed: at a quarter and at three quarters of the
    sequence, each moved back so that the largest window fits. A compiled step attends a bucket of
    the cache (half or all of it), so its cost jumps halfway; the mean of the two is its cost over
    a whole sequence, where the middle alone would price every step at the larger bucket."""
    last = max(0, max_new_tokens - max(windows))
    return sorted({min(max_new_tokens // 4, last), min(3 * max_new_tokens // 4, last)})


@torch.no_grad()
def measure_window_costs(model, prefix: Any, max_new_tokens: int, windows: Sequence[int] = WINDOWS,
                         repeats: int = 5, forward: Callable | None = None,
                         start: int | None = None, warmup: dict | None = None) -> dict[int, float]:
    """Seconds per ``forward_window`` call for each window W <= ``max_new_tokens`` of ``windows``.

    The model batch is the one ``prefix`` gives (with guidance, the doubled batch). The cache is
    filled up to ``start`` (default :func:`window_start`) once, then each W gets one warm-up call
    and ``repeats`` timed calls of W tokens (all token id 0) at that start, in rounds over all W,
    each call followed by ``crop(start)``; the cost is the median of the timed calls. ``forward`` (default
    ``model.forward_window``) is the callable timed instead, e.g. a ``torch.compile``'d one; the
    cache is always filled by ``model.forward_window``. ``warmup``, if given, receives each W's
    warm-up seconds (with a compiled step: its compile). Leaves junk in the model's cache: prefill
    again before decoding.
    """
    windows = sorted({int(w) for w in windows if 1 <= w <= max_new_tokens})
    if not windows:
        raise ValueError(f"no window in 1..{max_new_tokens} (max_new_tokens) to measure")
    check_positive_int("repeats", repeats)
    start = window_start(max_new_tokens, windows) if start is None else start
    if not 0 <= start <= max_new_tokens - windows[-1]:
        raise ValueError(f"start {start} leaves no room for W = {windows[-1]} in {max_new_tokens} tokens")
    forward = forward or model.forward_window
    first = model.prefill(prefix, max_new_tokens)
    rows, device = first.shape[0], first.device
    if start:
        model.forward_window(torch.zeros(rows, start, dtype=torch.long, device=device), 0)
    times = {w: [] for w in windows}
    for _ in range(repeats + 1):  # round one is the warm-up; rounds interleave the windows, so a
        for w in windows:         # passing slowdown of a shared machine hits them all alike
            tokens = torch.zeros(rows, w, dtype=torch.long, device=device)
            synchronize(device)
            t0 = _clock()
            forward(tokens, start)
            synchronize(device)
            times[w].append(_clock() - t0)
            model.crop(start)
    if warmup is not None:
        warmup.update({w: t[0] for w, t in times.items()})
    return {w: statistics.median(t[1:]) for w, t in times.items()}


def drafted_step(model, make_timer: Callable[[], Callable[[int, int], Any]], features: bool | tuple = False) -> Callable:
    """A stand-in for one decode step with a drafter's drafts, to time with
    :func:`measure_window_costs` (``forward=``): called with tokens (model rows, W) and a start, the
    target's window forward (``features``: the drafter's ``wants_features``, where it reads them), then the drafter's
    proposal of W - 1 drafts at that position (``timer(max(start, 1), W - 1)``, the timer that
    ``make_timer()`` returns, e.g. from :meth:`visualspec.core.engine.Drafter.draft_timer`; made at
    the first call, so a table read from the cache sets up nothing). W = 1 is the forward alone: a
    plain AR step. The cost of a window is then c(W) = forward(W) + drafts(W - 1), the whole step
    the window policy must weigh against AR's."""
    timer = None

    def step(tokens: torch.Tensor, start) -> None:
        nonlocal timer
        model.forward_window(tokens, start, **({"features": features} if features else {}))
        if tokens.shape[1] > 1:
            timer = timer or make_timer()
            timer(max(int(start), 1), tokens.shape[1] - 1)  # a proposal follows >= 1 committed token

    return step


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on an accelerator (CUDA, MPS, XPU); nothing on a CPU."""
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize()


# ---------------------------------------------------------------------------- the disk cache

def machine_name(device: torch.device | str = "cpu") -> str:
    """The accelerator's name; for a CPU its model name (``/proc/cpuinfo``, else
    ``platform.processor()`` or ``platform.machine()``) with the vector instructions torch uses on
    it and its core count. Virtual machines often report one model name ("AMD EPYC") for CPUs of
    different generations, whose window costs differ: the instruction set tells them apart."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    name = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown"
    return f"{name} ({torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores)"


def _modules(model) -> list[Any]:
    """The model and the object it wraps (adapters such as HFCausalLM keep it as ``.model``)."""
    inner = getattr(model, "model", None)
    return [model] if inner is None else [model, inner]


def _config_text(model) -> str:
    """A stable text of the model's configuration (``config`` as a dict, keys starting with '_'
    left out), else of its parameter shapes."""
    for obj in _modules(model):
        config = getattr(obj, "config", None)
        if hasattr(config, "to_dict"):
            config = config.to_dict()
        if isinstance(config, Mapping):
            return json.dumps({k: v for k, v in config.items() if not str(k).startswith("_")},
                              sort_keys=True, default=str)
    for obj in _modules(model):
        if isinstance(obj, torch.nn.Module):
            return repr([(name, tuple(p.shape)) for name, p in obj.named_parameters()])
    return ""


def config_hash(model) -> str:
    """The first 16 hex digits of the SHA-256 of :func:`_config_text` (the model's configuration,
    else its parameter shapes): equal for models whose steps cost the same."""
    return hashlib.sha256(_config_text(model).encode()).hexdigest()[:16]


def first_parameter(model) -> torch.Tensor | None:
    """The first parameter of the model or of the module it wraps (:func:`_modules`), else None."""
    return next((p for obj in _modules(model) if isinstance(obj, torch.nn.Module) for p in obj.parameters()), None)


STEP_CODE = ("visualspec.core", "visualspec.drafters", "visualspec.models")  # what a decode step runs


@functools.cache
def code_version() -> str:
    """A hash of the source of the packages a decode step runs (:data:`STEP_CODE`): a table timed
    by other code (an older visualspec, a changed checkout) is not read as this code's."""
    digest = hashlib.sha256()
    for package in STEP_CODE:
        spec = importlib.util.find_spec(package)
        for folder in spec.submodule_search_locations or ():
            for path in sorted(Path(folder).glob("*.py")):
                digest.update(path.name.encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cost_signature(model, rows: int, max_new_tokens: int, compiled: bool | None = None) -> str:
    """The cache key of a cost table: model class, a hash of its config, parameter dtype, device
    type, machine, torch threads, torch and visualspec code versions (:func:`code_version`), model
    batch rows and ``max_new_tokens``, and ``|compiled`` for a compiled step (default: whether the
    model's ``compiled_step`` is on), which also names the automatic compile mode in force
    (:func:`visualspec.core.compiled.compile_mode`: ``VISUALSPEC_CPP_WRAPPER=0`` times its own)."""
    if compiled is None:
        compiled = bool(getattr(model, "compiled_step", False))
    param = first_parameter(model)
    dtype, device = (str(param.dtype), param.device) if param is not None else ("unknown", torch.device("cpu"))
    mode = []
    if compiled:
        from .compiled import compile_mode  # that module reads this one's tables

        mode = [f"mode={compile_mode('auto', device)}"]
    return "|".join([type(model).__name__, f"config={config_hash(model)}", dtype.replace("torch.", ""), device.type,
                     machine_name(device), platform.machine(), f"threads={torch.get_num_threads()}",
                     f"torch={torch.__version__}", f"code={code_version()}", *mode, f"rows={rows}",
                     f"new={max_new_tokens}"] + (["compiled"] if compiled else []))


def cache_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """``window_costs.json`` under ``cache_dir``, else under visualspec's home (:func:`home`)."""
    return Path(cache_dir or home()) / CACHE_FILE


_READ: dict[Path, tuple[tuple, dict]] = {}  # path -> (the file's stamp, its tables) as last parsed


def _read_tables(path: Path) -> dict[str, dict[int, float]]:
    """The cost tables stored at ``path`` (each caller gets its own copy); a missing or corrupt file
    or entry reads as nothing. The file is parsed again only when it changed (:func:`file_stamp`):
    a call reads it a few times, and a file that many code versions wrote into takes a millisecond
    to parse."""
    stamp = file_stamp(path)
    if stamp is None:
        return {}
    if path not in _READ or _READ[path][0] != stamp:
        _READ[path] = (stamp, _parse_tables(path))
    return {key: dict(table) for key, table in _READ[path][1].items()}


def file_stamp(path: Path) -> tuple | None:
    """What tells a file's versions apart: its inode (an atomic rewrite makes a new one), size and
    modification time in nanoseconds; None where it cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _parse_tables(path: Path) -> dict[str, dict[int, float]]:
    """:func:`_read_tables` from the file itself."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    tables = {}
    for key, table in data.items() if isinstance(data, dict) else ():
        try:
            table = {int(w): float(c) for w, c in table.items()}
        except (AttributeError, TypeError, ValueError):
            continue
        if table and all(w >= 0 and c > 0 for w, c in table.items()):  # W = 0: plain AR's step
            tables[key] = table
    return tables


def _write_tables(path: Path, tables: Mapping[str, Mapping[int, float]]) -> None:
    """Write atomically: a temporary file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({k: {str(w): c for w, c in sorted(t.items())} for k, t in sorted(tables.items())},
                      f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stored_window_costs(model, rows: int, max_new_tokens: int, compiled: bool | None = None,
                        tag: str | None = None, cache_dir: str | os.PathLike | None = None) -> dict[int, float]:
    """The table :func:`cached_window_costs` keeps for these arguments, without measuring: ``{}``
    if none is stored."""
    key = cost_signature(model, rows, max_new_tokens, compiled) + (f"|{tag}" if tag else "")
    return _read_tables(cache_path(cache_dir)).get(key, {})


def cached_window_costs(model, prefix: Any, max_new_tokens: int, windows: Sequence[int] = WINDOWS,
                        cache_dir: str | os.PathLike | None = None, repeats: int = 5,
                        forward: Callable | None = None, tag: str | None = None) -> dict[int, float]:
    """:func:`measure_window_costs`, kept in ``window_costs.json`` (:func:`cache_path`) under the
    key :func:`cost_signature` (with ``|tag`` appended when given: a table of another step, timed
    through ``forward``, such as a sibling tree's). A stored table that holds every wanted W is
    returned without measuring; otherwise all wanted W are measured together (one consistent
    table), and the file is rewritten atomically. A corrupt file is ignored and replaced; a failed
    write only warns.
    """
    wanted = sorted({int(w) for w in windows if 1 <= w <= max_new_tokens})
    path = cache_path(cache_dir)
    key = cost_signature(model, prefix_rows(prefix), max_new_tokens) + (f"|{tag}" if tag else "")
    stored = _read_tables(path).get(key, {})
    if wanted and all(w in stored for w in wanted):
        return {w: stored[w] for w in wanted}
    rows = prefix_rows(prefix)
    what = f"{type(model).__name__} at {rows} model row{'s' if rows > 1 else ''}" + (f", {tag}" if tag else "")
    announce(f"window costs: measuring {what} on this machine, once (kept in {path})")
    t0 = _clock()
    warmup = {}
    if getattr(model, "compiled_step", False) and forward is None:
        starts = quarter_starts(max_new_tokens, wanted)
        firsts = [{} for _ in starts]  # each start's first calls compile its slot bucket: their sum
        parts = [measure_window_costs(model, prefix, max_new_tokens, wanted, repeats, start=start, warmup=first)
                 for start, first in zip(starts, firsts)]
        measured = {w: statistics.mean(part[w] for part in parts) for w in wanted}
        warmup = {w: sum(first[w] for first in firsts) for w in wanted}
    else:
        measured = measure_window_costs(model, prefix, max_new_tokens, wanted, repeats, forward=forward,
                                        warmup=warmup)
    announce(f"window costs: {what} measured in {_clock() - t0:.1f} s")
    updates = {key: measured}
    if getattr(model, "compiled_step", False) and not tag:
        seen = _read_tables(path).get(key + "|compile-s", {})  # the longest first call: a bucket compiled
        updates[key + "|compile-s"] = {w: max(t, seen.get(w, 0.0)) for w, t in warmup.items()}  # already costs 0
    _store_tables(path, updates)
    return measured


def _store_tables(path: Path, updates: Mapping[str, Mapping[int, float]]) -> None:
    """Merge ``updates`` (key -> {W: value}) into the tables at ``path``, read again first (another
    process may have written meanwhile) and written atomically; a failed write only warns."""
    tables = _read_tables(path)
    for key, table in updates.items():
        tables[key] = {**tables.get(key, {}), **table}
    try:
        _write_tables(path, tables)
    except OSError as e:
        warnings.warn(f"could not write the window cost cache {path}: {e}")


def steps_key(model, rows: int, max_new_tokens: int, tag: str) -> str:
    """The cache key of a table of whole decode steps (:func:`decode_step_costs`), and of the calls
    pooled into it (:func:`step_policy`): :func:`cost_signature` with ``|steps=tag``."""
    return cost_signature(model, rows, max_new_tokens) + f"|steps={tag}"


def decode_step_costs(model, decode_at: Callable[[int, int], Any], max_new_tokens: int, rows: int, tag: str,
                      windows: Sequence[int] = WINDOWS, repeats: int | None = None,
                      cache_dir: str | os.PathLike | None = None,
                      ar_at: Callable[[], Any] | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds per target forward of whole decode steps, for each window W <= ``max_new_tokens``:
    ``decode_at(W, seed)`` runs a real decode at the fixed window W, its randomness from ``seed``,
    and returns its stats (with
    ``target_forwards``), so the cost holds everything a step does, the drafter's proposal, the
    forward, the rule and the commit, where :func:`measure_window_costs` holds the forward alone.
    The decode is the call's whole length: a shorter one would size its cache (and a compiled
    step's cache bucket) otherwise.

    The decodes run in ``repeats`` rounds (default :data:`STEP_ROUNDS`) over every W (with
    ``ar_at``, a decode without a drafter, timed as one more window, kept as W = 0), so a passing
    slowdown of a shared machine hits them all alike; each cost is the fastest of its rounds, its
    seconds over its steps, the target forwards less those that only drafted (ASSD's queries,
    ``query_forwards``: their time is part of the step they draft for), the prefill counted as
    one step: the first round warms what a new window shape needs (the
    caller has compiled every window already), and the minimum drops it, so no separate warm-up
    decode is spent. Kept in ``window_costs.json`` under :func:`cost_signature` with
    ``|steps=tag`` appended (``tag`` names what else sets a step's cost: the drafter, the rule,
    greedy or sampled); a stored table that holds every wanted W is returned without decoding.
    Returns ``(costs, tokens)``: ``tokens`` are the tokens a row generated in W's timed decodes
    over their steps (the prefill one of each; plain AR: 1), pooled over the rounds, each of which
    decodes at its own seed (round r: seed r), so that a yield is not one image's
    (docs/experiments/2026-12-07-window-tables-seeded-rounds.md); kept beside under
    ``|tokens``, so that ``tokens[W] / costs[W]`` is the rate the whole decode reached. At a batch
    it is below the mean tokens a row committed per step (``accepted_lengths``): a step runs for
    every row until the last one finishes, and rows that accept more wait for the others (at batch
    16, ASSD's rows commit 8.5 cells a round while the batch takes 50 % more rounds than the mean
    row: docs/experiments/2026-11-29-assd-batch-aware-k.md). These are a search's first estimate
    of each window (:class:`visualspec.core.window.WindowPolicy`'s ``tokens``) and what the
    policy's AR fallback and fixed window are chosen by."""
    wanted = sorted({int(w) for w in windows if 1 <= w <= max_new_tokens} | ({0} if ar_at is not None else set()))
    repeats = STEP_ROUNDS if repeats is None else check_positive_int("repeats", repeats)
    path = cache_path(cache_dir)
    key = steps_key(model, rows, max_new_tokens, tag)
    tables = _read_tables(path)
    stored, seen = tables.get(key, {}), tables.get(key + "|tokens", {})
    if wanted and all(w in stored and w in seen for w in wanted):
        return {w: stored[w] for w in wanted}, {w: seen[w] for w in wanted}
    announce(f"window costs: timing whole decode steps of {type(model).__name__} at {rows} model rows, {tag}, "
             f"on this machine, once (kept in {path})")
    t0, measured, made, taken = _clock(), {}, dict.fromkeys(wanted, 0.0), dict.fromkeys(wanted, 0)
    for seed in range(repeats):
        for w in wanted:
            start = _clock()
            stats = ar_at() if w == 0 else decode_at(w, seed)
            steps = max(int(stats.target_forwards) - int(stats.query_forwards), 1)
            seconds = (_clock() - start) / steps
            measured[w] = min(seconds, measured.get(w, seconds))
            made[w] += stats.tokens_per_sequence
            taken[w] += steps
    tokens = {w: made[w] / taken[w] for w in wanted}
    announce(f"window costs: whole decode steps measured in {_clock() - t0:.1f} s")
    _store_tables(path, {key: measured, key + "|tokens": tokens})
    return measured, tokens


def rule_tag(rule) -> str:
    """A rule's name with the plain settings it was bound with (a ``functools.partial``'s numbers,
    strings and flags; a tensor by its last dimension, e.g. LANTERN's neighbours k), so that steps
    under LANTERN at delta 0.05 and at 0.4 are kept apart: ``name(key=value,...)``."""
    func = getattr(rule, "func", rule)
    name = getattr(func, "__name__", type(func).__name__)
    settings = []
    for key, value in sorted(getattr(rule, "keywords", {}).items()):
        if isinstance(value, torch.Tensor):
            value = value.shape[-1] if value.dim() else value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            settings.append(f"{key}={value}")
    return name + (f"({','.join(settings)})" if settings else "")


def step_tag(drafter, rule, sampling) -> str:
    """What sets the cost and the yield of a decode step beside the target, the key its table of
    whole steps is kept under: ``<drafter's cost_tag>|rule=<rule_tag>|greedy`` (or ``sampled``)."""
    return f"{drafter.cost_tag()}|rule={rule_tag(rule)}|{'greedy' if sampling.greedy else 'sampled'}"


def step_policy(model, decode_at: Callable[[int, int], Any], max_new_tokens: int, rows: int, tag: str,
                windows: Sequence[int] = WINDOWS, cache_dir: str | os.PathLike | None = None,
                ar_at: Callable[[], Any] | None = None, fixed: bool = False, pooled: bool = False) -> WindowPolicy:
    """The policy of ``window="auto"`` for a decode that speculates: one table of whole decode
    steps at ``rows`` model rows, each window's own cost and the tokens its decode committed as the
    search's first estimate (:func:`decode_step_costs`). A step that does not pay for itself,
    drafts, rule and commit included, is not taken: speculation falls back to W = 1.

    With ``ar_at`` (a decode of the same rows without a drafter), the windows that draft are
    weighed against plain AR's step, timed in the same rounds (kept as W = 0 of the table): where
    none is expected to beat it by more than :data:`visualspec.core.window.SPECULATION_MARGIN`
    (:func:`visualspec.core.window.speculation_pays`), the policy's ``as_ar`` is set, and the
    engine decodes without drafts. ``fixed``: the policy takes the best
    of those fixed windows at every step, with no search (:class:`visualspec.core.window.FixedWindow`);
    where that is W = 1 it decodes as AR too.

    ``pooled`` (for drafts made afresh each step, with ``fixed``): the table's tokens are pooled
    with those of this process's earlier calls on the same table
    (:func:`visualspec.core.window.pooled_tokens`), and the policy's ``pool``
    (:class:`visualspec.core.window.CallPool`) takes this call's once it has run
    (:meth:`WindowPolicy.pool_call`). A greedy text table is one prompt's yield (nothing random to
    pool over), so a first prompt that repeats itself more than later ones would otherwise hold
    every call at a window they do not repay (docs/experiments/2026-12-07-window-guard.md)."""
    costs, tokens = decode_step_costs(model, decode_at, max_new_tokens, rows, tag, windows, cache_dir=cache_dir,
                                      ar_at=ar_at)
    pool = None
    if pooled:
        pool = CallPool(steps_key(model, rows, max_new_tokens, tag), [w for w in costs if w])
        tokens = {**tokens, **pooled_tokens({w: t for w, t in tokens.items() if w}, pool.pool, max_new_tokens)}
    as_ar = False
    if ar_at is not None:
        as_ar = not speculation_pays({w: c for w, c in costs.items() if w}, tokens, costs.pop(0),
                                     margin=SPECULATION_MARGIN)
        tokens.pop(0)
    # a fixed policy whose best window is W = 1 would run plain AR's step with the drafter's upkeep
    as_ar |= fixed and best_fixed_window(costs, tokens) == 1
    return WindowPolicy({rows: costs}, tokens=tokens, as_ar=as_ar, fixed=fixed, pool=pool)


# ---------------------------------------------------------------------------- the policy of window="auto"

def window_policy(model, prefix_of: Callable[[int], Any], num_tokens: int, slots: int, siblings: int = 1,
                  sibling_depth: int = 2, drafter=None, sampling=None):
    """The :class:`visualspec.core.window.WindowPolicy` of ``window="auto"`` at ``slots`` samples
    (images, or rows of text), for every pipeline and :func:`visualspec.text.generate_text`: cost
    tables at slots, slots/2, ..., 1 samples (the batch shrinks as samples finish), measured once
    per model and batch size on this machine and cached on disk; ``prefix_of(r)`` is the prefix
    of the first r samples; with
    ``siblings`` > 1 also the cost of whole sibling-tree steps
    (:func:`visualspec.core.proactive.tree_step_timer`). A compiled step runs every cache row
    however many samples are left, so its table at ``slots`` samples serves the whole call.

    A ``drafter`` whose drafts cost time (its ``draft_timer``: a draft model, a feature drafter)
    is priced with them: each table is of whole steps, the window's forward and the W - 1 drafts
    (:func:`drafted_step`, under ``sampling``), so the policy takes
    W = 1, plain AR, wherever the drafts cost more than they save."""
    tables, trees, rows = {}, {}, slots
    while True:
        prefix = prefix_of(rows)
        model_rows = prefix_rows(prefix)
        forward, tag = None, None  # the target's forward alone
        if getattr(drafter, "prices_drafts", False):
            forward = drafted_step(model, partial(drafter.draft_timer, rows, num_tokens, sampling),
                                   features=getattr(drafter, "wants_features", False))
            tag = f"drafts={drafter.cost_tag()}"
        tables[model_rows] = cached_window_costs(model, prefix, num_tokens, forward=forward, tag=tag)
        if siblings > 1 and sibling_depth > 0:
            step = tree_step_timer(model, model_rows // rows, siblings, sibling_depth)
            trees[model_rows] = cached_window_costs(model, prefix, num_tokens, forward=step,
                                                    tag=f"tree={siblings}x{sibling_depth}")
        if rows == 1 or getattr(model, "compiled_step", False):
            return WindowPolicy(tables, trees)
        rows = max(1, rows // 2)
