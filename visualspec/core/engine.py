"""The one decode engine, shared by every token model (images and text).

A target model only has to implement the small :class:`TokenModel` protocol. One decode step
feeds each row the window ``[x_{n-1}, d_n, ..., d_{n+K-1}]`` (its last committed token and K
drafts), gets the target distributions at positions n..n+K in one forward pass, lets a
verification rule decide how many drafts to accept, and commits the accepted drafts plus one token
from the target. Plain autoregressive decoding is the case K = 0.

**Ragged batches.** Every row keeps its own committed count ``n_b`` and commits its own
``a_b + 1`` tokens per step: no row waits for another, and a row's tokens have exactly the law the
rule gives that row alone. All rows of a step feed windows of one length, each at its own
positions (the model keeps per-row positions in its cache); a row near its end feeds filler
positions that no committed token ever reads.

**Continuous batching.** With :class:`Requests`, at most ``slots`` rows decode at once; a row
that finishes leaves the batch and the next waiting request takes its slot (one prefill of that
row), so a long queue keeps the batch full. When nothing waits, finished rows are dropped from the
batch (the model and drafter keep only the live rows).

**Window.** ``window`` is a fixed number of tokens per forward, or a
:class:`visualspec.core.window.WindowPolicy` that picks it each step from the measured cost of a
window at the current batch size and the acceptance seen so far, so that speculation is never
slower than one-token steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from .constraints import TokenConstraints
from .continuous import Gaussian, continuous_verify, head_noise
from .proactive import draw_siblings, extra_nodes, sibling_layout, verify_sibling_tree
from .sampling import Generator, SamplingConfig, normal
from .stats import DecodeStats
from .verify import Verdict, greedy_verify, point_mass, speculative_verify

Rule = Callable[..., Verdict]


class Drafter:
    """Interface of a drafter; the decode engine calls these in order for every step.

    Rows are ragged: ``n`` (B,) is each row's committed count, and ``committed`` (B,) what each
    row committed in a step. ``generator`` is that step's randomness (one generator, or one per
    row). With continuous batching the engine also drops rows (:meth:`select`) and starts new
    sequences in rows (:meth:`reset`).
    """

    def start(self, batch_size: int, num_tokens: int, sampling: SamplingConfig) -> None:
        """A new decode of ``num_tokens`` tokens per row begins."""

    def propose(self, tokens: torch.Tensor, n: torch.Tensor, k: int, generator: Generator = None):
        """Draft positions n[b]..n[b]+k-1 of each row b given ``tokens[b, :n[b]]`` (committed).

        Returns ``(drafts (B, k) long, draft_probs (B, k, V) float or None)``.
        """
        raise NotImplementedError

    def observe(self, n: torch.Tensor, committed: torch.Tensor, target_probs: torch.Tensor,
                generator: Generator = None) -> None:
        """The target verified the last proposal at positions n.. and row b committed
        ``committed[b]`` tokens (positions n[b]..n[b]+committed[b]-1); ``target_probs`` (B, k+1, V)
        are its distributions at positions n..n+k."""

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (in that order) and drop the others."""
        raise NotImplementedError(f"{type(self).__name__} cannot drop rows")

    def reset(self, rows: torch.Tensor, requests: list[int]) -> None:
        """Rows ``rows`` start new sequences (requests ``requests``) after their first token."""
        raise NotImplementedError(f"{type(self).__name__} cannot start new sequences mid-decode")

    @property
    def forwards(self) -> int:
        """Forward passes of a draft model so far (0 for model-free drafters)."""
        return 0


def per_row(x, rows: int, device=None) -> torch.Tensor:
    """An int or a (rows,) tensor of per-row counts -> a (rows,) long tensor."""
    return torch.as_tensor(x, dtype=torch.long, device=device).expand(rows)


class TokenModel(Protocol):
    """What the engine needs from a model that predicts the next token.

    Positions are indices into the generated tokens (0 = first generated token); the model maps
    them past its own conditioning prefix. Positions and lengths are per model row, (Bm,) long
    tensors. With classifier-free guidance the engine doubles the batch itself
    (``[cond; uncond]``), so models never need to know about guidance.
    """

    vocab_size: int

    def prefill(self, prefix: Any, max_new_tokens: int) -> torch.Tensor:
        """Reset the cache, run the conditioning prefix; return logits (Bm, V) for position 0."""

    def forward_window(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Run tokens (Bm, L): row b at positions start[b]..start[b]+L-1, against the cache (which
        must hold that row's positions < start[b]) and store their keys and values. Returns logits
        (Bm, L, V); column i predicts position start + i + 1."""

    def crop(self, lengths: torch.Tensor) -> None:
        """Keep only positions < lengths[b] of each row b in the cache."""


class BatchingTokenModel(TokenModel, Protocol):
    """A token model whose rows can be replaced and dropped (continuous batching)."""

    def refill(self, rows: torch.Tensor, prefix: Any) -> torch.Tensor:
        """Start new sequences in model rows ``rows`` (r,): reset them and run ``prefix`` (r rows);
        return logits (r, V) for their position 0."""

    def select(self, rows: torch.Tensor) -> None:
        """Keep model rows ``rows`` (in that order) and drop the others."""


class TreeTokenModel(TokenModel, Protocol):
    """A token model that can also verify a draft tree in one forward pass (tree attention)."""

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     start: torch.Tensor) -> torch.Tensor:
        """Run the flattened tree tokens (B, N): node i of row b sits at position
        ``start[b] + depths[i]`` and attends to the cache and to the nodes j with
        ``ancestors[i, j]``. Returns logits (B, N, V) (node i predicts the next position)."""

    def keep(self, nodes: torch.Tensor, counts: torch.Tensor) -> None:
        """After :meth:`forward_tree`: keep, of the tree's nodes, only ``nodes[b, :counts[b]]`` of
        each row b (they are that row's next positions in order); drop every other node."""


@dataclass
class Requests:
    """``count`` sequences decoded at most ``slots`` at a time (continuous batching).

    ``prefix(indices)`` returns the model prefix for those request indices (doubled as
    ``[cond; uncond]`` under guidance, as a plain prefix would be). With one generator per
    request, each request's tokens depend only on its prefix and its generator (and on the
    window the engine picks), not on which requests share its batch.
    """

    count: int
    prefix: Callable[[list[int]], Any]
    slots: int

    def __post_init__(self):
        if not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"Requests.count must be an integer >= 1, got {self.count!r}")
        if not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"Requests.slots (the batch size) must be an integer >= 1, got {self.slots!r}")


def default_rule(sampling: SamplingConfig) -> Rule:
    """The lossless rule for ``sampling``: argmax matching when greedy, else speculative sampling."""
    return greedy_verify if sampling.greedy else speculative_verify


# ----------------------------------------------------------------------------------------------
# Rows in flight
# ----------------------------------------------------------------------------------------------


class _Rows:
    """Per-row state of the rows decoding now: request ids, committed counts, token buffers."""

    def __init__(self, requests: torch.Tensor, num_tokens: int, generator: Generator, sampling: SamplingConfig,
                 token_shape: tuple = (), dtype: torch.dtype = torch.long):
        b, device = requests.shape[0], requests.device
        self.N, self.sampling, self.all_generators = num_tokens, sampling, generator
        self.req = requests
        self.n = torch.zeros(b, dtype=torch.long, device=device)
        # token ids (b, N), or continuous tokens (b, N, *token_shape)
        self.seq = torch.zeros(b, num_tokens, *token_shape, dtype=dtype, device=device)
        self.fixed = torch.zeros(b, num_tokens, dtype=torch.long, device=device)
        self.forwards = torch.ones(b, dtype=torch.long, device=device)

    def __len__(self):
        return self.req.shape[0]

    @property
    def generator(self) -> Generator:
        """The generator(s) of the rows in flight: one per row when one per request was given."""
        g = self.all_generators
        return [g[i] for i in self.req.tolist()] if isinstance(g, (list, tuple)) else g

    def model(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row values (b, ...) -> per-model-row values (:meth:`SamplingConfig.model_batch`)."""
        return self.sampling.model_batch(x)

    def model_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Row indices -> model row indices (:meth:`SamplingConfig.model_rows`)."""
        return self.sampling.model_rows(rows, len(self))

    def commit(self, candidates: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """Commit, per row, the first ``min(accepted + 1, remaining)`` of ``candidates`` (b, K+1)
        (accepted drafts, then the emitted token) at its positions n..; returns the counts (b,)."""
        remaining = self.N - self.n
        counts = torch.minimum(accepted + 1, remaining)
        offset = torch.arange(self.N, device=self.n.device)[None] - self.n[:, None]  # (b, N): window index
        write = (offset >= 0) & (offset < counts[:, None])
        index = offset.clamp(0, candidates.shape[1] - 1)
        trailing = candidates.shape[2:]  # continuous tokens carry their values along
        index = index.view(*index.shape, *[1] * len(trailing)).expand(*index.shape, *trailing)
        values = candidates.gather(1, index)
        self.seq = torch.where(write.view(*write.shape, *[1] * len(trailing)), values, self.seq)
        self.fixed = torch.where(write, self.forwards[:, None], self.fixed)
        self.n = self.n + counts
        return counts

    def start(self, rows: torch.Tensor, requests: torch.Tensor, first: torch.Tensor) -> None:
        """Rows ``rows`` begin requests ``requests`` with first tokens ``first`` (one prefill)."""
        self.req[rows] = requests
        self.n[rows] = 1
        self.seq[rows] = 0
        self.seq[rows, 0] = first
        self.fixed[rows] = 0
        self.fixed[rows, 0] = 1
        self.forwards[rows] = 1

    def select(self, rows: torch.Tensor) -> None:
        for name in ("req", "n", "seq", "fixed", "forwards"):
            setattr(self, name, getattr(self, name)[rows])


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


def _first_tokens(rule: Rule, p: torch.Tensor, generator) -> torch.Tensor:
    """Token 0 of each row straight from the prefill's distributions ``p`` (b, V): one exact step
    with no drafts."""
    return rule(p.new_empty(p.shape[0], 0, dtype=torch.long), None, p[:, None], generator).next_tokens


class _Run:
    """One call of :func:`decode` or :func:`decode_tree`: admits rows, commits, finishes them."""

    def __init__(self, target, prefix, num_tokens, sampling, drafter, rule, generator, mode, progress,
                 constraints: TokenConstraints | None = None):
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if constraints is not None and constraints.num_tokens != num_tokens:
            raise ValueError(f"the constraints cover {constraints.num_tokens} positions, but {num_tokens} tokens "
                             f"are to be generated")
        if constraints is not None and constraints.guidance is not None and not sampling.uses_guidance:
            raise ValueError("the constraints give per-position guidance scales, but the sampling uses no guidance "
                             "(guidance_scale 1): the model batch has no unconditional rows to guide against")
        self.constraints = constraints
        self.t0 = time.perf_counter()
        self.target, self.N, self.sampling, self.drafter = target, num_tokens, sampling, drafter
        self.rule, self.progress = rule, progress
        self.requests = prefix if isinstance(prefix, Requests) else None
        if self.requests is not None:
            first_ids = list(range(min(self.requests.slots, self.requests.count)))
            for name in ("refill", "select"):
                if not hasattr(target, name):
                    raise TypeError(f"{type(target).__name__} has no {name}(); continuous batching (Requests) "
                                    f"needs a token model that can replace and drop rows")
            logits = target.prefill(self.requests.prefix(first_ids), num_tokens)
        else:
            logits = target.prefill(prefix, num_tokens)
        rows_in_model = logits.shape[0] // sampling.model_rows_per_sample
        total = self.requests.count if self.requests is not None else rows_in_model
        if isinstance(generator, (list, tuple)) and len(generator) != total:
            raise ValueError(f"got {len(generator)} generators for a batch of {total}")
        device = logits.device
        self.rows = _Rows(torch.arange(rows_in_model, device=device), num_tokens, generator, sampling)
        self.next_request = rows_in_model
        self.tokens = torch.empty(total, num_tokens, dtype=torch.long, device=device)
        self.fixed_at = torch.empty(total, num_tokens, dtype=torch.long)
        self.row_forwards = torch.empty(total, dtype=torch.long)
        self.stats = DecodeStats(mode=mode, batch_size=total, num_tokens=num_tokens, target_forwards=1,
                                 slots=rows_in_model)
        every = torch.arange(rows_in_model, device=device)
        self.rows.start(every, every, _first_tokens(rule, self.probs(logits, torch.zeros_like(every)),
                                                    self.rows.generator))
        self._count_first(rows_in_model)
        if drafter is not None:
            drafter.start(rows_in_model, num_tokens, sampling)
        self._report(torch.ones(rows_in_model, dtype=torch.long))
        self.finish_rows()

    def _count_first(self, rows: int) -> None:
        """Structural tokens among ``rows`` first tokens (position 0, from a prefill)."""
        if self.constraints is not None and int(self.constraints.forced[0]) >= 0:
            self.stats.structural_tokens += rows

    def probs(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The target's distributions at ``positions`` (b, ...) from its ``logits``: the sampling's,
        with the constraints' allowed tokens and guidance scales at those positions, if any."""
        if self.constraints is None:
            return self.sampling.probs(logits)
        return self.sampling.probs(logits, self.constraints.allowed_mask(positions, self.target.vocab_size),
                                   self.constraints.guidance_at(positions))

    def _report(self, counts: torch.Tensor) -> None:
        if self.progress:
            self.progress(int(counts.sum()))

    def commit(self, candidates, accepted) -> torch.Tensor:
        """The shared commit step: tokens, acceptance map, statistics, cache, drafter."""
        start = self.rows.n
        counts = self.rows.commit(candidates, accepted)
        if self.constraints is not None:
            self.stats.structural_tokens += self.constraints.count(start, counts)
        self.stats.accepted_lengths.extend(counts[counts > 0].tolist())  # finished rows kept idle commit 0
        self._report(counts)
        return counts

    def finish_rows(self) -> None:
        """Move finished rows out; refill their slots from the queue, else drop them."""
        rows = self.rows
        done = rows.n >= self.N
        if not bool(done.any()):
            return
        finished = done.nonzero()[:, 0]
        req = rows.req[finished]
        self.tokens[req] = rows.seq[finished]
        self.fixed_at[req] = rows.fixed[finished].cpu()
        self.row_forwards[req] = rows.forwards[finished].cpu()
        waiting = (self.requests.count - self.next_request) if self.requests is not None else 0
        if waiting > 0:
            slots = finished[:waiting]
            ids = list(range(self.next_request, self.next_request + len(slots)))
            self.next_request += len(slots)
            logits = self.target.refill(rows.model_rows(slots), self.requests.prefix(ids))
            self.stats.target_forwards += 1
            new = torch.tensor(ids, dtype=torch.long, device=rows.req.device)
            gens = self.rows.all_generators
            gens = [gens[i] for i in ids] if isinstance(gens, (list, tuple)) else gens
            rows.start(slots, new, _first_tokens(self.rule, self.probs(logits, torch.zeros_like(slots)), gens))
            self._count_first(len(slots))
            if self.drafter is not None:
                self.drafter.reset(slots, ids)
            self._report(torch.ones(len(slots), dtype=torch.long))
            done = rows.n >= self.N
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]
            if len(keep):
                if hasattr(self.target, "select"):
                    self.target.select(rows.model_rows(keep))
                    if self.drafter is not None:
                        self.drafter.select(keep)
                    rows.select(keep)
                # a model that cannot drop rows keeps them, idle: they commit nothing more
            else:
                rows.select(keep)

    def live(self) -> bool:
        return len(self.rows) > 0 and bool((self.rows.n < self.N).any())

    def step_done(self) -> None:
        self.rows.forwards += 1
        self.stats.target_forwards += 1

    def result(self) -> tuple[torch.Tensor, DecodeStats]:
        self.stats.fixed_at = self.fixed_at
        self.stats.row_forwards = self.row_forwards
        self.stats.draft_forwards = self.drafter.forwards if self.drafter is not None else 0
        self.stats.wall_time_s = time.perf_counter() - self.t0
        return self.tokens, self.stats


def _window_drafts(window, rows: _Rows, drafter, search, extra=None) -> tuple[int, bool]:
    """Drafts this step and whether they get a sibling tree: the fixed ``window - 1`` (with a tree
    whenever ``extra`` is given), or the search's choice (``extra(W)``: the nodes a tree adds to a
    window of W). Not shortened near the end (rows there feed fillers), so a row's random draws
    depend on the window alone."""
    if drafter is None:
        return 0, False
    if search is None:
        return window - 1, extra is not None
    w, tree = search.option(len(rows) * rows.sampling.model_rows_per_sample, extra=extra)
    return w - 1, tree


@torch.no_grad()
def decode(
    target: TokenModel,
    prefix: Any,
    num_tokens: int,
    sampling: SamplingConfig,
    *,
    drafter: Drafter | None = None,
    rule: Rule | None = None,
    window=1,
    generator: Generator = None,
    mode: str = "",
    progress: Callable[[int], None] | None = None,
    siblings: int = 1,
    sibling_depth: int = 2,
    constraints: TokenConstraints | None = None,
) -> tuple[torch.Tensor, DecodeStats]:
    """Generate ``num_tokens`` tokens per row. Returns ``(tokens (R, num_tokens), stats)``.

    ``prefix`` is the model's prefix for every row, or :class:`Requests` (continuous batching).
    ``window`` is the number of tokens fed per target forward (drafts = window - 1), or a
    :class:`visualspec.core.window.WindowPolicy` whose search picks it each step; it is ignored
    without a drafter. ``rule`` is any
    function of :mod:`visualspec.core.verify` (default: :func:`default_rule`). ``generator`` is one
    generator, or one per row (per request).

    ``siblings`` K > 1 is proactive drafting (:mod:`visualspec.core.proactive`): the first
    ``sibling_depth`` draft positions get K candidates each, fed as a tree (the target must be a
    :class:`TreeTokenModel`) and verified exactly; it needs the lossless rule.

    ``constraints`` (:class:`visualspec.core.constraints.TokenConstraints`) fixes structural tokens
    at their positions and restricts the others to allowed tokens: forced positions are drafted
    with their token and a point mass, so they are accepted with probability 1.
    """
    if isinstance(window, bool) or (isinstance(window, int) and window < 1):
        raise ValueError(f"window must be an integer >= 1 or a WindowPolicy, got {window!r}")
    if not isinstance(window, int) and not hasattr(window, "search"):
        raise ValueError(f"window must be an integer >= 1 or a WindowPolicy, got {window!r}")
    for name, value in (("siblings", siblings), ("sibling_depth", sibling_depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "siblings" else 0):
            raise ValueError(f"{name} must be an integer >= {1 if name == 'siblings' else 0}, got {value!r}")
    tree = siblings > 1 and sibling_depth > 0 and drafter is not None
    if tree and rule is not None and rule is not default_rule(sampling):
        raise ValueError("proactive drafting (siblings > 1) is verified exactly; it takes the lossless rule only")
    if tree and not hasattr(target, "forward_tree"):
        raise TypeError(f"{type(target).__name__} has no forward_tree(); proactive drafting (siblings > 1) "
                        f"needs a token model with tree attention")
    rule = rule or default_rule(sampling)
    run = _Run(target, prefix, num_tokens, sampling, drafter, rule, generator,
               mode or ("ar" if drafter is None else type(drafter).__name__), progress, constraints)
    search = None if isinstance(window, int) else window.search()  # fresh per call: its windows depend on it alone
    extra = (lambda w: extra_nodes(min(sibling_depth, w - 1), siblings)) if tree else None
    rows = run.rows
    while run.live():
        rows = run.rows
        k, siblings_now = _window_drafts(window, rows, drafter, search, extra)
        gens = rows.generator
        if drafter is not None:
            drafts, draft_probs = drafter.propose(rows.seq, rows.n, k, gens)
            k = drafts.shape[1]  # a drafter may stop early (never draft more than k)
            if constraints is not None:
                drafts, draft_probs = constraints.force_drafts(drafts, draft_probs, rows.n[:, None] + torch.arange(
                    k, device=drafts.device), target.vocab_size)
        else:
            drafts, draft_probs = rows.seq.new_empty(len(rows), 0), None
        last = rows.seq.gather(1, (rows.n - 1)[:, None])
        n = rows.n
        if siblings_now and k > 0:
            verdict, committed, target_probs, path = _sibling_step(target, sampling, rows, last, drafts, draft_probs,
                                                                   siblings, min(sibling_depth, k), gens, run)
        else:
            logits = target.forward_window(rows.model(torch.cat([last, drafts], 1)), rows.model(n - 1))
            target_probs = run.probs(logits, n[:, None] + torch.arange(k + 1, device=n.device))
            verdict, committed = rule(drafts, draft_probs, target_probs, gens), drafts
        run.step_done()
        candidates = torch.cat([committed, verdict.next_tokens[:, None]], 1)
        candidates.scatter_(1, verdict.num_accepted[:, None], verdict.next_tokens[:, None])
        counts = run.commit(candidates, verdict.num_accepted)
        if search is not None:
            search.observe(k + 1, verdict.num_accepted + 1, tree=siblings_now)
        if siblings_now and k > 0:  # keep the root and the accepted path: positions n-1 .. n+counts-2
            run.stats.sibling_steps += int((path > k).any(1).sum())  # nodes past the chain are siblings
            target.keep(rows.model(torch.cat([torch.zeros_like(n)[:, None], path], 1)), rows.model(counts))
        else:
            target.crop(rows.model(n + counts - 1))  # the cache keeps x_{<n'-1}; x_{n'-1} is fed next
        if drafter is not None:
            drafter.observe(n, counts, target_probs, gens)
        run.finish_rows()
    return run.result()


def _sibling_step(target, sampling, rows, last, drafts, draft_probs, siblings, depth, gens, run):
    """One proactive-drafting step: draw the siblings, score the tree in one forward, walk it.
    Returns the verdict, the committed candidates (b, k), the target's distributions along the
    chain (b, k+1, V) for the drafter, as a chain step would give them, and the accepted path's
    nodes (b, k)."""
    k, device = drafts.shape[1], drafts.device
    layout = sibling_layout(k, depth, siblings)
    q = point_mass(drafts[:, :depth], target.vocab_size) if draft_probs is None else draft_probs[:, :depth]
    candidates = draw_siblings(drafts[:, :depth], q, siblings, gens)
    depths = layout.depths.to(device)
    off = slice(k + 1, None)  # the nodes after the root and the chain: level depths[i], candidate choice[i]
    flat = torch.cat([last, drafts, candidates[:, depths[off] - 1, layout.choice.to(device)[off]]], 1)
    logits = target.forward_tree(rows.model(flat), depths, layout.ancestors.to(device), rows.model(rows.n - 1))
    p = run.probs(logits, rows.n[:, None] + depths)  # (b, N, V)
    verdict, committed, path = verify_sibling_tree(layout, candidates, q, drafts, draft_probs, p, gens)
    return verdict, committed, p[:, :k + 1], path


@torch.no_grad()
def decode_tree(
    target: TreeTokenModel,
    prefix: Any,
    num_tokens: int,
    sampling: SamplingConfig,
    drafter,
    *,
    branches: int,
    depth: int,
    rule: Callable,
    generator: Generator = None,
    mode: str = "",
) -> tuple[torch.Tensor, DecodeStats]:
    """Multi-draft decoding: each step the drafter proposes ``branches`` chains of ``depth`` tokens
    (:class:`visualspec.core.multidraft.DraftTree`), the target scores the whole tree in one forward, and

    1. the multi-draft ``rule`` (:mod:`visualspec.core.multidraft`, matching the drafter's scheme) picks
       at most one of the first tokens, or emits a residual sample;
    2. the picked chain's remaining drafts are verified by the lossless chain rule
       (:func:`default_rule`), which emits the next token after them.

    Lossless when the rule is lossless for the drafter's scheme: the first emitted token has law p
    whatever was drafted, and given the picked first token its chain was drafted from the chain's
    own q, which step 2 verifies exactly. Rows commit their own counts, as in :func:`decode`.
    """
    if not isinstance(branches, int) or branches < 1:
        raise ValueError(f"branches (k) must be an integer >= 1, got {branches!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    if sampling.uses_guidance:
        raise ValueError("tree decoding does not support classifier-free guidance")
    chain_rule = default_rule(sampling)
    run = _Run(target, prefix, num_tokens, sampling, drafter, chain_rule, generator,
               mode or f"tree {branches}x{depth}", None)
    while run.live():
        rows = run.rows
        n, gens = rows.n, rows.generator
        L = depth  # rows near their end draft past it (fillers): a row's draws depend on the tree alone
        tree = drafter.propose_tree(rows.seq, n, branches, L, gens)
        depths, ancestors = tree.layout()
        flat = torch.cat([rows.seq.gather(1, (n - 1)[:, None]), tree.tokens.flatten(1)], dim=1)
        p = sampling.probs(target.forward_tree(flat, depths, ancestors, n - 1))  # (b, 1 + k L, V)
        run.step_done()

        first_verdict = rule(tree.tokens[:, :, 0], tree.first_q, p[:, 0], gens)
        b = len(rows)
        idx = torch.arange(b, device=flat.device)
        picked = first_verdict.index.clamp(min=0)  # rows that rejected every candidate use chain 0 (unused)
        chain = tree.tokens[idx, picked]  # (b, L)
        nodes = 1 + picked[:, None] * L + torch.arange(L, device=flat.device)  # the chain's nodes
        chain_p = p[idx[:, None], nodes]  # (b, L, V): p after each chain token
        chain_q = None if tree.chain_q is None else tree.chain_q[idx, picked]
        rest = chain_rule(chain[:, 1:], chain_q, chain_p, gens)
        hit = first_verdict.index >= 0
        accepted = torch.where(hit, 1 + rest.num_accepted, torch.zeros_like(rest.num_accepted))
        emitted = torch.where(hit, rest.next_tokens, first_verdict.token)
        candidates = torch.cat([chain, emitted[:, None]], 1).scatter(1, accepted[:, None], emitted[:, None])
        counts = run.commit(candidates, accepted)
        # keep the root and the accepted chain nodes: positions n-1 .. n+counts-2
        target.keep(torch.cat([torch.zeros_like(nodes[:, :1]), nodes], dim=1), counts)
        drafter.observe(n, counts, torch.cat([p[:, :1], chain_p], dim=1), gens)
        run.finish_rows()
    return run.result()


class PositionNoise:
    """The diffusion-head noise of every position of every row, drawn once when decoding starts:
    ``x_T`` and one eps per denoising step, (rows, N, steps + 1, D), from each row's generator.

    The draft and the target head read the same noise at a position (CSpD's trajectory
    alignment), however many times the position is drafted or verified; AR reads it too, so AR and
    speculation with a draft identical to the target give the same tokens."""

    def __init__(self, rows: int, num_tokens: int, steps: int, dim: int, generator: Generator, device=None):
        self.draws = normal((rows, num_tokens, steps + 1, dim), generator, device)

    def at(self, positions: torch.Tensor) -> dict:
        """Noise for the positions (B, L) of rows 0..B-1, flattened to B*L tokens in row order."""
        b = torch.arange(positions.shape[0], device=positions.device)[:, None]
        d = self.draws[b, positions.clamp(max=self.draws.shape[1] - 1)].flatten(0, 1)  # (B L, steps + 1, D)
        return head_noise(d)


def head_rows(z: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Model output (model rows, L, dim) -> one row per token, [cond tokens; uncond tokens] under
    guidance, as a guided head takes them."""
    if not sampling.uses_guidance:
        return z.flatten(0, 1)
    cond, uncond = z.chunk(2)
    return torch.cat([cond.flatten(0, 1), uncond.flatten(0, 1)])


@torch.no_grad()
def decode_continuous(
    target,
    prefix: Any,
    num_tokens: int,
    *,
    drafter=None,
    gamma: int = 4,
    guidance_scale: float = 1.0,
    temperature: float = 1.0,
    generator: Generator = None,
    max_proposals: int = 1024,
    prefill: float = 0.0,
    flatten: float = 1.0,
    mode: str = "",
) -> tuple[torch.Tensor, DecodeStats]:
    """Continuous-token generation: AR, or CSpD with a draft model. Returns ``(tokens (R, N, D), stats)``.

    ``target`` is a continuous token model (:class:`visualspec.models.continuous_ar.ContinuousARTransformer`:
    the token-model protocol returning the head's condition z, and ``draw(z, noise, temperature,
    guidance)``). With ``drafter`` (:class:`visualspec.drafters.ContinuousDraftModelDrafter`) each
    step drafts ``gamma`` tokens, the target scores them in one forward, and
    :func:`visualspec.core.continuous.continuous_verify` keeps a prefix and emits one more token;
    each row commits its own count. Every position's head noise is drawn once
    (:class:`PositionNoise`) and shared by draft and target. Rows that finish stay in the batch
    idle. ``guidance_scale`` is MAR's (on the head's eps); ``temperature`` scales the head's noise.
    ``prefill`` is CSpD's token pre-filling: the first ``floor(prefill * N)`` tokens come from the
    target alone (every row is there at the same step, since rows start together). ``flatten`` > 1
    is the released code's flattened ratio (lossy; see :func:`continuous_verify`).
    """
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (drafts per step) must be an integer >= 1, got {gamma!r}")
    if not 0.0 <= prefill < 1.0:
        raise ValueError(f"the pre-fill fraction must lie in [0, 1), got {prefill!r}")
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    t0 = time.perf_counter()
    sampling = SamplingConfig(guidance_scale=guidance_scale)
    z = target.prefill(prefix, num_tokens)
    B = z.shape[0] // sampling.model_rows_per_sample
    if isinstance(generator, (list, tuple)) and len(generator) != B:
        raise ValueError(f"got {len(generator)} generators for a batch of {B}")
    D, device = target.token_dim, z.device
    noise = PositionNoise(B, num_tokens, len(target.diffloss.schedule), D, generator, device)
    draw = lambda z, positions: target.draw(head_rows(z, sampling), noise.at(positions),  # noqa: E731
                                            temperature, guidance_scale)
    rows = _Rows(torch.arange(B, device=device), num_tokens, generator, sampling, token_shape=(D,), dtype=z.dtype)
    every = torch.arange(B, device=device)
    first, _ = draw(z[:, None], torch.zeros(B, 1, dtype=torch.long, device=device))
    rows.start(every, every, first)
    stats = DecodeStats(mode=mode or ("ar" if drafter is None else "cspd"), batch_size=B, num_tokens=num_tokens,
                        target_forwards=1, slots=B)
    if drafter is not None:
        drafter.start(B, num_tokens, sampling)
    while bool((rows.n < num_tokens).any()):
        n, live = rows.n, rows.n < num_tokens
        prefilling = bool((n < int(prefill * num_tokens)).any())  # rows move together until then
        k = gamma if drafter is not None and not prefilling else 0
        if k:
            drafts, q = drafter.propose(rows.seq, n, k, noise, temperature)
        else:
            drafts = rows.seq.new_empty(B, 0, D)
            q = Gaussian(drafts, torch.ones_like(drafts))
        last = rows.seq[every, (n - 1).clamp(max=num_tokens - 1)]
        zs = target.forward_window(sampling.model_batch(torch.cat([last[:, None], drafts], 1)), sampling.model_batch(n - 1))
        positions = n[:, None] + torch.arange(k + 1, device=device)
        tokens, p = draw(zs, positions)
        tokens, p = tokens.view(B, k + 1, D), Gaussian(p.mean.view(B, k + 1, D), p.std.view(B, k + 1, D))
        stats.target_forwards += 1
        rows.forwards += live.long()
        verdict = continuous_verify(drafts, q, p, rows.generator, bonus=tokens[:, k], max_proposals=max_proposals,
                                    flatten=flatten)
        stats.residual_proposals += int(verdict.proposals[live].sum())
        stats.residual_fallbacks += int(verdict.fallbacks[live].sum())
        stats.drafts_proposed += k * int(live.sum())
        stats.drafts_accepted += int(verdict.num_accepted[live].sum())
        candidates = torch.cat([drafts, verdict.next_tokens[:, None]], 1)
        candidates.scatter_(1, verdict.num_accepted[:, None, None].expand(B, 1, D), verdict.next_tokens[:, None])
        counts = rows.commit(candidates, verdict.num_accepted)
        stats.accepted_lengths.extend(counts[counts > 0].tolist())
        if k:
            drafter.observe(n, counts)
    stats.fixed_at, stats.row_forwards = rows.fixed.cpu(), rows.forwards.cpu()
    stats.draft_forwards = drafter.forwards if drafter is not None else 0
    stats.wall_time_s = time.perf_counter() - t0
    return rows.seq, stats
