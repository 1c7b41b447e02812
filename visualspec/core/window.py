"""How many tokens each decode step feeds the target: the window W.

A step with window W feeds the last committed token and W - 1 drafts and costs c(W) seconds (one
target forward at the current model batch). If draft i (1-based) is accepted with probability
alpha_i given that drafts 1..i-1 were, a row commits on average

    E(W) = 1 + sum_{i=1}^{W-1} prod_{j=1}^{i} alpha_j        tokens per step,

so decoding runs at E(W) / c(W) tokens per second (per row; the batch size is the same for every
W). Plain autoregressive decoding is W = 1: E(1) = 1 token for c(1). Choosing

    W* = argmax_W E(W) / c(W)        over windows that include W = 1

is therefore never slower than AR under the estimates. The costs depend on the machine and the
batch: at batch 1, or on a GPU, c(W) barely grows with W, while on a CPU at batch 16 a W-token
forward costs several times a 1-token one, and speculation only pays with high acceptance.

This module is the choice: :class:`WindowPolicy` holds the cost tables, and its
:class:`WindowSearch` picks each step's W in a decode call from the tokens per step each window
has given so far (:func:`choose_window` is the same choice for a constant acceptance). The tables
are measured, and kept on disk per model, machine, thread count and batch size, by
:mod:`visualspec.core.window_costs`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .checks import check_positive_int

WINDOWS = (1, 2, 4, 8, 16, 32)  # the candidates (docs/experiments/2026-11-25-window-search.md)
SPECULATION_MARGIN = 0.0  # how far a re-timed table's speed-up moves (docs/experiments/2026-11-28-as-ar-margin.md)


# ---------------------------------------------------------------------------- choosing W

def _alphas(acceptance, n: int) -> list[float]:
    """alpha_1..alpha_n from a constant, or a sequence (whose last value is reused beyond its end)."""
    if n <= 0:
        return []
    if isinstance(acceptance, (int, float)):
        values = [float(acceptance)]
    else:
        values = [float(a) for a in acceptance]
    if not values:
        raise ValueError("the acceptance profile is empty")
    if any(not 0.0 <= a <= 1.0 for a in values):
        raise ValueError(f"acceptance probabilities must lie in [0, 1], got {values}")
    return (values + [values[-1]] * n)[:n]


def expected_tokens(acceptance, window: int) -> float:
    """Expected tokens one step with window W commits per row:
    ``E(W) = 1 + sum_{i=1}^{W-1} prod_{j=1}^{i} alpha_j``.

    ``acceptance`` is alpha_1, alpha_2, ... (a sequence; positions beyond it reuse its last
    value), or one constant alpha.
    """
    check_positive_int("window", window)
    total, run = 1.0, 1.0
    for a in _alphas(acceptance, window - 1):
        run *= a
        total += run
    return total


def choose_window(costs: Mapping[int, float], acceptance, max_window: int | None = None) -> int:
    """The W of ``costs`` (W -> seconds per step) with the most tokens per second,
    ``argmax_W E(W) / c(W)`` (:func:`expected_tokens`); ties (to a relative 1e-9) go to the
    smaller W. ``costs`` must hold W = 1, the AR baseline, so the choice is never expected to be
    slower than AR. ``max_window`` leaves out larger windows (e.g. near the end of a sequence).

    The costs should be whole steps: a measured table holds the target forward only, which is
    the step for Jacobi drafts (SJD, LANTERN); a draft model's own forwards would have to be added.
    """
    if 1 not in costs:
        raise ValueError("costs must include W = 1 (plain AR), the baseline a window must beat")
    if any(not c > 0 for c in costs.values()):
        raise ValueError(f"costs must be positive seconds, got {dict(costs)}")
    windows = sorted(w for w in costs if max_window is None or w <= max_window)
    alphas = _alphas(acceptance, windows[-1] - 1)
    best, best_rate = 1, 1.0 / costs[1]
    for w in windows[1:]:
        rate = expected_tokens(alphas[:w - 1], w) / costs[w]
        if rate > best_rate and not math.isclose(rate, best_rate, rel_tol=1e-9):
            best, best_rate = w, rate
    return best


def interpolated_cost(costs: Mapping[int, float], tokens: int) -> float:
    """The cost of a forward of ``tokens`` tokens from a table of window costs: linear between the
    measured windows around it, and past the largest along the slope of its last two."""
    windows = sorted(costs)
    if tokens in costs:
        return costs[tokens]
    above = [w for w in windows if w > tokens]
    hi = above[0] if above else windows[-1]
    below = [w for w in windows if w < hi]
    if not below:
        return costs[hi]
    lo = below[-1]
    return costs[lo] + (costs[hi] - costs[lo]) * (tokens - lo) / (hi - lo)


def best_fixed_window(costs: Mapping[int, float], tokens: Mapping[int, float]) -> int:
    """The window whose decode at that fixed window committed tokens fastest:
    ``argmax_W tokens[W] / costs[W]`` over the W of ``costs`` (seconds per step) with ``tokens``
    (a row's tokens per step of that decode, the steps it waited for other rows included; W = 1
    commits 1), ties to the smaller W."""
    return max(sorted(w for w in costs if w in tokens or w == 1), key=lambda w: _committed(tokens, w) / costs[w])


def _committed(tokens: Mapping[int, float], window: int) -> float:
    """Tokens per row-step at ``window``: as seen, and 1 at W = 1, which commits one token a step."""
    return tokens.get(window, 1.0) if window == 1 else tokens[window]


def speculation_pays(costs: Mapping[int, float], tokens: Mapping[int, float], ar_cost: float,
                     margin: float = 0.0) -> bool:
    """Whether some window that drafts is expected to commit tokens faster than decoding without
    a drafter, by more than ``margin``: ``max_{W > 1} tokens[W] / costs[W] > (1 + margin) / ar_cost``,
    where ``costs[W]`` are the seconds of a step of the speculative decode at the fixed window W,
    ``tokens[W]`` a row's tokens per step of it, and ``ar_cost`` the seconds of a step of
    plain AR (no drafter, no rule). ``margin`` is how far timed tables of the same decode differ on
    this kind of machine (:data:`SPECULATION_MARGIN`): a gain inside it is not told from noise, and
    AR is never slower than itself. W = 1 does not count: its step is plain AR's with the drafter's
    upkeep besides, so a table where it came out cheaper than AR's step says only how noisy the
    two timings were. Without tokens for any window beyond 1 nothing is known yet, and the search
    is left to find out (True)."""
    drafting = [w for w in costs if w > 1 and w in tokens]
    if not drafting:
        return True
    return max(tokens[w] / costs[w] for w in drafting) * ar_cost > 1.0 + margin


def split_steps(committed, window: int) -> int:
    """The steps of window ``w`` that steps of a larger window would have taken for the same
    tokens: ``sum_r ceil(c_r / w)``, where ``c_r`` is what each row-step committed.

    A step that committed c tokens had its first c - 1 drafts accepted. At w the first w - 1 of
    them are the same drafts (for drafts made afresh each step from the committed tokens: n-gram,
    STAND, a draft model, a feature drafter), and the next step, w tokens on, drafts from the very
    context the larger step's later drafts were drawn after (its accepted drafts are the committed
    tokens), so the c tokens take ceil(c / w) steps. Exact for a greedy draft model; measured
    within 3 % of real decodes at w for n-gram, STAND and the feature drafter, where ``min(c, w)``
    tokens a step (one step per step) read 2-22 % low
    (docs/experiments/2026-12-07-window-guard.md). Not for drafts carried between steps
    (Jacobi's), whose first drafts depend on the window the steps before used."""
    check_positive_int("window", window)
    committed = torch.as_tensor(committed, dtype=torch.long)
    return int(((committed + window - 1) // window).sum())


def pooled_tokens(tokens: Mapping[int, float], pool: Mapping[int, tuple[float, int]],
                  new_tokens: int) -> dict[int, float]:
    """A table's tokens per row-step with later calls pooled in:
    ``t(W) = (N + S_W) / (N / t_0(W) + n_W)``, where ``t_0(W)`` is the table's own (its decode of
    ``N = new_tokens`` tokens a row counts as one call, of N / t_0(W) steps) and ``pool[W] =
    (S_W, n_W)`` are the tokens the calls since committed at W or a larger window and the row-steps
    of W they stand for (:func:`split_steps`). A window above every pooled one, which no call ran
    at, is the table's scaled as the pool moved the largest pooled window w*:
    ``t(W) = t_0(W) t(w*) / t_0(w*)``, within [1, W]
    (docs/experiments/2026-12-07-pool-above-the-calls.md); without pooled steps, t_0."""
    pooled = dict(tokens)
    seen = [w for w in tokens if w > 1 and pool.get(w, (0.0, 0))[1] > 0]
    for w in seen:
        made, steps = pool[w]
        pooled[w] = (new_tokens + made) / (new_tokens / tokens[w] + steps)
    if seen:
        top = max(seen)
        for w, t in tokens.items():
            if w > top:
                pooled[w] = min(float(w), max(1.0, t * pooled[top] / tokens[top]))
    return pooled


class CallPool:
    """The yield of the calls a fixed policy ran in this process, per table (``key``): each call
    at window W adds, for every w <= W of ``windows``, its tokens and the row-steps of w they
    stand for (:func:`split_steps`, for drafts made afresh each step), so the next call's policy
    (:func:`pooled_tokens`) weighs the table's one decode against every call since. Kept in
    memory: a new process starts from the table again."""

    _pools: dict[str, dict[int, list]] = {}

    def __init__(self, key: str, windows):
        self.key, self.windows = key, sorted(int(w) for w in windows)

    @property
    def pool(self) -> dict[int, tuple[float, int]]:
        """W -> (tokens, row-steps of W) of the calls pooled so far."""
        return {w: (made, steps) for w, (made, steps) in self._pools.get(self.key, {}).items()}

    def add(self, window: int, committed) -> None:
        """A call at ``window`` whose row-steps committed ``committed`` tokens each."""
        committed = torch.as_tensor(committed, dtype=torch.long)
        if not committed.numel():
            return
        pool = self._pools.setdefault(self.key, {})
        for w in self.windows:
            if 1 < w <= window:
                made, steps = pool.get(w, (0.0, 0))
                pool[w] = [made + float(committed.sum()), steps + split_steps(committed, w)]

    @classmethod
    def clear(cls) -> None:
        """Forget every call pooled in this process."""
        cls._pools.clear()


class FixedWindow:
    """The search of a ``fixed`` :class:`WindowPolicy`: every step takes :func:`best_fixed_window`
    of the table at the step's model rows, whatever the steps commit."""

    def __init__(self, policy: "WindowPolicy"):
        self.policy = policy

    def option(self, model_rows: int, extra=None) -> tuple[int, bool]:
        return best_fixed_window(self.policy.costs(model_rows), self.policy.tokens), False

    def window(self, model_rows: int) -> int:
        return self.option(model_rows)[0]

    def observe(self, window: int, committed, tree: bool = False) -> None:
        """Nothing to learn: the window was chosen from whole decodes at each fixed window."""


class WindowSearch:
    """The window of each step of one decode call, learned as the call goes.

    For every window W of the cost table, ``t(W)`` is the mean tokens a row committed per step
    in the steps that used W (a running mean, whose weight on a new step never falls below
    ``rate``, so it follows the image); a window not used yet has the geometric estimate of
    :func:`expected_tokens` with a constant acceptance ``prior``. Each step takes
    ``argmax_W t(W) / c(W)`` (ties to the smaller W), except that every ``probe_every`` steps it
    tries the chosen window's neighbour in the table (alternately the next larger and the next
    smaller) for ``probe_steps`` steps, so the windows around the choice stay measured and the
    search cannot stick where it started. With sibling trees (:meth:`option`) each window is also
    offered with its tree; probes then stay among windows of the chosen kind, and every third one
    tries the other kind at the chosen window.

    Jacobi acceptance is not stationary in W: a larger window carries more predicted positions
    into the next step, so the first step after the window grew commits less than that window
    will once warm. t(W) is therefore measured per window (not extrapolated from per-position
    acceptance), and a step whose window is larger than the previous step's is not counted
    (``carried=False``, for drafts made afresh each step, counts it).
    Deterministic: it depends only on the committed counts it was shown.
    """

    def __init__(self, policy: "WindowPolicy", prior: float = 0.7, rate: float = 0.1, probe_every: int = 8,
                 probe_steps: int = 3, carried: bool = True):
        if not 0.0 <= prior < 1.0:
            raise ValueError(f"prior must be in [0, 1), got {prior}")
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        if not 2 <= probe_steps < probe_every:
            raise ValueError(f"need 2 <= probe_steps < probe_every, got {probe_steps} and {probe_every}")
        self.policy, self.prior, self.rate, self.probe_every = policy, prior, rate, probe_every
        self.probe_steps, self.carried = probe_steps, carried
        self.tokens: dict[int, float] = dict(policy.tokens)  # W -> tokens per row-step seen with W (a
        # policy's expected tokens seed it; the first step seen with W replaces the seed)
        self.seen: dict[int, int] = {}  # W -> steps that used W
        self.steps = 0
        self.probe: list[int] = []  # windows still to take in the current probe
        self.previous = None  # the window of the step before

    def estimate(self, option) -> float:
        """t(W): measured tokens per row-step with this window (or tree option), else the prior's
        estimate for its window."""
        return self.tokens.get(option, expected_tokens(self.prior, _width(option)))

    def window(self, model_rows: int) -> int:
        """The window of the next step at ``model_rows`` model rows."""
        return self.option(model_rows)[0]

    def option(self, model_rows: int, extra=None) -> tuple[int, bool]:
        """The next step's ``(W, tree)``. Without ``extra`` every option is a chain window. With
        ``extra(W)``, the nodes a sibling tree adds to a window of W, each window W > 1 is also
        offered with its tree, priced by the policy's tree table (a whole tree step measured:
        forward, walk and cache moves) or else by :func:`interpolated_cost` of its forward alone,
        and its tokens measured apart, so trees are taken only where their extra tokens pay for
        their extra cost."""
        costs = self.policy.costs(model_rows)
        options = dict(costs)
        if extra is not None:
            trees = self.policy.tree_costs(model_rows)
            options.update({("tree", w): trees[w] if w in trees else interpolated_cost(costs, w + extra(w))
                            for w in costs if extra(w) > 0})
        order = sorted(options, key=lambda o: (_width(o), o != _width(o)))  # 1, 2, tree 2, 4, tree 4, ...
        best = max(order, key=lambda o: (self.estimate(o) / options[o], -_width(o)))
        self.steps += 1
        if self.steps % self.probe_every == 0:
            neighbour = self._neighbour(best, order, self.steps // self.probe_every)
            self.probe = [] if neighbour is None else [neighbour] * self.probe_steps
        chosen = self.probe.pop(0) if self.probe else best
        return _width(chosen), chosen != _width(chosen)

    @staticmethod
    def _neighbour(best, order: list, turn: int):
        """The option a probe tries: alternately the next larger and the next smaller window of the
        same kind as ``best`` (chain or tree), and, when trees are offered, every third probe the
        other kind at the same window. None when there is no such option."""
        tree = best != _width(best)
        kinds = {o != _width(o) for o in order}
        if len(kinds) > 1 and turn % 3 == 0:
            other = ("tree", best) if not tree else _width(best)
            return other if other in order else None
        same = [o for o in order if (o != _width(o)) == tree]
        i = same.index(best) + (1 if turn % 2 else -1)
        return same[i] if 0 <= i < len(same) else None

    def observe(self, window: int, committed, tree: bool = False) -> None:
        """A step with ``window`` (and a sibling tree when ``tree``) committed ``committed`` (b,)
        tokens in its rows."""
        cold, self.previous = self.carried and self.previous is not None and window > self.previous, window
        if cold:  # the window just grew: its carried drafts are not warm yet
            return
        key = ("tree", window) if tree else window
        mean = float(torch.as_tensor(committed, dtype=torch.float64).mean())
        n = self.seen[key] = self.seen.get(key, 0) + 1
        old = self.tokens.get(key, mean)
        self.tokens[key] = old + max(1.0 / n, self.rate) * (mean - old)


def _width(option) -> int:
    """The window of a search option: W, or ("tree", W)."""
    return option[1] if isinstance(option, tuple) else option


def _nearest(tables: Mapping[int, dict], model_rows: int) -> dict:
    """The table of the nearest measured batch at or above ``model_rows``, else the largest."""
    above = [r for r in tables if r >= model_rows]
    return tables[min(above) if above else max(tables)]


class WindowPolicy:
    """Picks each step's window from measured cost tables, ``{model_rows: {W: seconds}}``.

    ``model_rows`` is the model batch (2B rows with classifier-free guidance). A batch that was not
    measured uses the table of the nearest measured batch at or above it, else the largest one.
    A user-fixed window simply does not use a policy. ``tokens`` (optional, ``{W: tokens per
    row-step}``, e.g. what decodes at each fixed window committed while their costs were timed)
    replaces the search's prior for each W until a step with W is seen. ``as_ar`` says that no
    window is expected to beat plain AR's step (:func:`speculation_pays`): a decode given this
    policy runs without its drafter (:func:`visualspec.core.engine.decode`). ``fixed`` (for tables
    and tokens of whole decodes at each fixed window) skips the search: every step takes
    :func:`best_fixed_window` (:class:`FixedWindow`), which on the shapes model committed tokens
    faster than a search that mixes windows
    (docs/experiments/2026-11-28-fixed-window-vs-search.md). ``pool`` (a :class:`CallPool`, with
    ``fixed``) takes each call's yield once it has run (:meth:`pool_call`), for the next call's
    policy.
    """

    def __init__(self, tables: Mapping[int, Mapping[int, float]],
                 tree_tables: Mapping[int, Mapping[int, float]] | None = None,
                 tokens: Mapping[int, float] | None = None, as_ar: bool = False, fixed: bool = False,
                 pool: CallPool | None = None):
        self.as_ar, self.fixed, self.pool = bool(as_ar), bool(fixed), pool
        self.tokens = {int(w): float(t) for w, t in (tokens or {}).items()}
        if not tables:
            raise ValueError("a window policy needs at least one cost table")
        self.tables = {int(r): {int(w): float(c) for w, c in t.items()} for r, t in tables.items()}
        self.tree_tables = {int(r): {int(w): float(c) for w, c in t.items()} for r, t in (tree_tables or {}).items()}
        for rows, costs in self.tables.items():
            if 1 not in costs:
                raise ValueError(f"the cost table for {rows} rows lacks W = 1 (plain AR)")

    @classmethod
    def measured(cls, model, prefix: Any, max_new_tokens: int, windows: Sequence[int] = WINDOWS,
                 cache_dir: str | os.PathLike | None = None) -> "WindowPolicy":
        """A policy with one table, for the batch of ``prefix``, from
        :func:`visualspec.core.window_costs.cached_window_costs` (which may run ``prefill``: call it
        before decoding)."""
        from .window_costs import cached_window_costs

        rows = prefix_rows(prefix)
        return cls({rows: cached_window_costs(model, prefix, max_new_tokens, windows, cache_dir)})

    def pool_call(self, stats, model_rows: int) -> None:
        """Hands a finished call's row-steps (``stats.accepted_lengths``) to the policy's ``pool``,
        at the fixed window it ran; nothing where there is no pool, or the call ran as AR."""
        if self.pool is not None and self.fixed and not self.as_ar:
            self.pool.add(best_fixed_window(self.costs(model_rows), self.tokens), stats.accepted_lengths)

    def costs(self, model_rows: int) -> dict[int, float]:
        """The cost table used at ``model_rows`` rows."""
        return _nearest(self.tables, model_rows)

    def tree_costs(self, model_rows: int) -> dict[int, float]:
        """The sibling-tree step costs used at ``model_rows`` rows (empty when none were measured)."""
        return _nearest(self.tree_tables, model_rows) if self.tree_tables else {}

    def search(self, **kwargs) -> "WindowSearch | FixedWindow":
        """A fresh :class:`WindowSearch` over these tables, for one decode call (a
        :class:`FixedWindow` where the policy is ``fixed``)."""
        return FixedWindow(self) if self.fixed else WindowSearch(self, **kwargs)


# ---------------------------------------------------------------------------- the model batch

def prefix_rows(prefix: Any) -> int:
    """The model batch of a prefix: rows of a tensor, or of the first tensor of a tuple, list or dict."""
    if isinstance(prefix, torch.Tensor):
        return int(prefix.shape[0])
    if isinstance(prefix, Mapping) and prefix:
        return prefix_rows(next(iter(prefix.values())))
    if isinstance(prefix, (tuple, list)) and prefix:
        return prefix_rows(prefix[0])
    raise TypeError(f"cannot tell the batch size of a prefix of type {type(prefix).__name__}")
