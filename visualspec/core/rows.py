"""The rows in flight and one decode call's run, shared by every decode loop.

:class:`_Rows` holds the per-row state of the rows decoding now (request ids, committed counts,
token buffers, the acceptance map); :class:`_Run` is one call of a decode loop
(:func:`visualspec.core.engine.decode`, :func:`visualspec.core.tree.decode_tree`,
:func:`visualspec.core.continuous.decode_continuous`): it prefills, takes each row's first token,
feeds windows, commits what a step accepted, moves finished rows out (refilling their slots from a
request queue) and gathers the statistics. A loop only drafts, verifies and keeps its model's cache
in step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .checks import check_positive_int
from .constraints import TokenConstraints
from .sampling import Generator, SamplingConfig, StepSampler, row_generators
from .stats import DecodeStats
from .verify import Rule, StepVerifier, Verdict, default_rule, point_mass, rule_uniforms


REPORT_EVERY_S = 0.1  # how often a decode reads its committed count for ``progress``


def per_row(x, rows: int, device=None) -> torch.Tensor:
    """An int or a (rows,) tensor of per-row counts -> a (rows,) long tensor."""
    return torch.as_tensor(x, dtype=torch.long, device=device).expand(rows)


def window_slots(n: torch.Tensor, counts: torch.Tensor, length: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a commit of ``counts`` (b,) tokens at positions ``n`` (b,) writes in buffers of
    ``length`` positions: ``write`` (b, length) bool, true at positions n[b] .. n[b] + counts[b] - 1,
    and ``index`` (b, length), each position's column ``position - n[b]`` in a window of ``window``
    tokens (clamped to 0 .. window - 1)."""
    offset = torch.arange(length, device=n.device)[None] - n[:, None]
    return (offset >= 0) & (offset < counts[:, None]), offset.clamp(0, window - 1)


def commit_window(seq: torch.Tensor, fixed: torch.Tensor, n: torch.Tensor, forwards: torch.Tensor,
                  drafts: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor):
    """One step's commit, a pure function of its tensors (what a compiled step runs): row b's
    window ``[drafts[b, :accepted[b]], emitted[b]]`` written into ``seq`` (b, N, ...) at positions
    n[b]..; ``counts = min(accepted + 1, N - n)`` tokens, so a row never writes past its end; the
    positions written are marked with the row's forward count ``forwards`` (b,) in ``fixed`` (b, N).
    Returns ``(seq, fixed, counts)``."""
    trailing = emitted.shape[1:]  # continuous tokens carry their values along
    candidates = torch.cat([drafts, emitted[:, None]], 1)
    at = accepted.view(-1, 1, *[1] * len(trailing)).expand(-1, 1, *trailing)
    candidates = candidates.scatter(1, at, emitted[:, None])  # (b, K+1): window order
    counts = torch.minimum(accepted + 1, seq.shape[1] - n)
    write, index = window_slots(n, counts, seq.shape[1], candidates.shape[1])
    index = index.view(*index.shape, *[1] * len(trailing)).expand(*index.shape, *trailing)
    seq = torch.where(write.view(*write.shape, *[1] * len(trailing)), candidates.gather(1, index), seq)
    return seq, torch.where(write, forwards[:, None], fixed), counts


def own_rows(values, rows: int) -> list:
    """The first ``rows`` rows of each of ``values``, a step's outputs over the model's rows (more
    rows under guidance, or where the model pads its rows); each as it is where it has no more."""
    return [x if x.shape[0] == rows else x[:rows] for x in values]


def stop_hits(seq: torch.Tensor, token: int, start: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(b, N) bool: where rows just wrote ``token``, at positions ``start`` .. ``start + counts - 1``
    of ``seq`` (b, N)."""
    return (seq == token) & window_slots(start, counts, seq.shape[1], 1)[0]


def stopped_rows(seq: torch.Tensor, fixed: torch.Tensor, forwards: torch.Tensor, token: int, hit: torch.Tensor):
    """Rows with a hit (:func:`stop_hits`) end at their first one: the rest of their buffer ``seq``
    is ``token`` (as transformers pads a finished row with its end token), marked in ``fixed`` with
    the row's forward count where nothing was committed yet. A pure function of its tensors (what a
    compiled step runs). Returns ``(seq, fixed, stopped (b,) bool, filled (b,))``: the positions
    each row filled after its stop token."""
    stopped = hit.any(1)
    after = (hit.long().cumsum(1) > 0) & stopped[:, None]  # from each stopping row's first new end token on
    filled = after.sum(1) - stopped.long()
    return (torch.where(after, torch.full_like(seq, token), seq),
            torch.where(after & (fixed == 0), forwards[:, None], fixed), stopped, filled)


class _Rows:
    """Per-row state of the rows decoding now: request ids, committed counts, token buffers."""

    def __init__(self, requests: torch.Tensor, num_tokens: int, generator: Generator, sampling: SamplingConfig,
                 token_shape: tuple = (), dtype: torch.dtype = torch.long):
        b, device = requests.shape[0], requests.device
        self.N, self.sampling, self.all_generators = num_tokens, sampling, generator
        self.req = requests
        self.req_ids = requests.tolist()  # the same on the host: the rows' generators without a device read
        self.most = 0  # no row has committed more than this many tokens (a host bound on max(n))
        self.n = torch.zeros(b, dtype=torch.long, device=device)
        # token ids (b, N), or continuous tokens (b, N, *token_shape)
        self.seq = torch.zeros(b, num_tokens, *token_shape, dtype=dtype, device=device)
        self.fixed = torch.zeros(b, num_tokens, dtype=torch.long, device=device)
        self.judged = torch.zeros(b, num_tokens, dtype=torch.bool, device=device)  # kept by a judge alone
        self.forwards = torch.ones(b, dtype=torch.long, device=device)

    def __len__(self):
        return self.req.shape[0]

    @property
    def generator(self) -> Generator:
        """The generator(s) of the rows in flight: one per row when one per request was given."""
        return row_generators(self.all_generators, self.req_ids)

    def model(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row values (b, ...) -> per-model-row values (:meth:`SamplingConfig.model_batch`)."""
        return self.sampling.model_batch(x)

    def model_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Row indices -> model row indices (:meth:`SamplingConfig.model_rows`)."""
        return self.sampling.model_rows(rows, len(self))

    def last(self) -> torch.Tensor:
        """Each row's last committed token, x_{n-1}: (b, 1, *token_shape)."""
        return self.seq[torch.arange(len(self), device=self.n.device), self.n - 1][:, None]

    def positions(self, length: int) -> torch.Tensor:
        """The positions n..n+length-1 of each row: (b, length)."""
        return self.n[:, None] + torch.arange(length, device=self.n.device)

    def commit(self, drafts: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
               judged: torch.Tensor | None = None) -> torch.Tensor:
        """Commit, per row, the ``accepted`` first of ``drafts`` (b, K, ...) and then ``emitted``
        (b, ...), at most the tokens the row has left, at its positions n.. (:func:`commit_window`);
        returns the counts (b,). ``judged`` (b, K) bool marks the drafts a judge alone accepted
        (kept in :attr:`judged`)."""
        if drafts.shape[1] == 0 and judged is None:
            return self._commit_one(emitted)
        seq, fixed, counts = commit_window(self.seq, self.fixed, self.n, self.forwards, drafts, accepted, emitted)
        if judged is not None:
            write, index = window_slots(self.n, counts, self.N, drafts.shape[1] + 1)
            self.judged |= write & torch.cat([judged, torch.zeros_like(judged[:, :1])], 1).gather(1, index)
        return self.took(seq, fixed, counts, drafts.shape[1] + 1)

    def took(self, seq: torch.Tensor, fixed: torch.Tensor, counts: torch.Tensor, window: int) -> torch.Tensor:
        """A commit of ``window`` tokens a row at most made ``seq`` and ``fixed`` the rows' buffers,
        ``counts`` (b,) tokens each: keep them, move each row's count on and the host's bound
        :attr:`most` by the window. Returns ``counts``."""
        self.seq, self.fixed = seq, fixed
        self.n = self.n + counts
        self.most = min(self.N, self.most + window)
        return counts

    def _commit_one(self, emitted: torch.Tensor) -> torch.Tensor:
        """:meth:`commit` of a step without drafts: ``emitted`` (b, ...) at each row's position n,
        in rows that have a token left (counts 1; else 0), in a few operations (an AR step): while
        the host's bound :attr:`most` says every row has one left, without reading which."""
        rows, emitted = torch.arange(len(self), device=self.n.device), emitted.to(self.seq.dtype)
        if self.most < self.N:
            counts, at, tokens, marks = torch.ones_like(self.n), self.n, emitted, self.forwards
        else:  # rows that have no token left keep what they hold
            counts, at = (self.n < self.N).long(), self.n.clamp(max=self.N - 1)
            left = counts.bool()
            tokens = torch.where(left.view(-1, *[1] * (emitted.dim() - 1)), emitted, self.seq[rows, at])
            marks = torch.where(left, self.forwards, self.fixed[rows, at])
        return self.took(self.seq.index_put((rows, at), tokens), self.fixed.index_put((rows, at), marks), counts, 1)

    def stop(self, token: int, start: torch.Tensor, counts: torch.Tensor) -> int:
        """Rows that just wrote ``token`` at positions ``start`` .. ``start + counts - 1`` end there
        (:func:`stopped_rows`) and count as done. Returns the positions filled after their stop
        tokens. One read from the device, whether any row stopped (and a second, the count, where
        one did)."""
        hit = stop_hits(self.seq, token, start, counts)
        if not bool(hit.any()):
            return 0
        self.seq, self.fixed, stopped, filled = stopped_rows(self.seq, self.fixed, self.forwards, token, hit)
        return self.ended(stopped, filled)

    def ended(self, stopped: torch.Tensor, filled: torch.Tensor) -> int:
        """Rows ``stopped`` (b,) bool, whose buffers :func:`stopped_rows` filled (``filled`` (b,)
        positions each), count as done. Returns the positions filled, read from the device where a
        row stopped (one read, whether one did)."""
        if not bool(stopped.any()):
            return 0
        self.n = torch.where(stopped, torch.full_like(self.n, self.N), self.n)
        self.most = self.N
        return int(filled.sum())

    def any_done(self) -> bool:
        """Whether some row has committed all N tokens. The counts are read from the device only
        once the host's bound :attr:`most` (raised by each commit's window) reaches N, and the read
        makes the bound exact: so an AR step never waits for the device, and a speculative one
        only near the end."""
        if self.most < self.N or not len(self):
            return False
        self.most = int(self.n.max())
        return self.most >= self.N

    def start(self, rows: torch.Tensor, requests: torch.Tensor, first: torch.Tensor) -> None:
        """Rows ``rows`` begin requests ``requests`` with first tokens ``first`` (one prefill)."""
        self.req[rows] = requests
        for row, request in zip(rows.tolist(), requests.tolist()):
            self.req_ids[row] = request
        self.most = max(self.most, 1)
        self.n[rows] = 1
        self.seq[rows] = 0
        self.seq[rows, 0] = first
        self.fixed[rows] = 0
        self.fixed[rows, 0] = 1
        self.judged[rows] = False
        self.forwards[rows] = 1

    def select(self, rows: torch.Tensor) -> None:
        for name in ("req", "n", "seq", "fixed", "judged", "forwards"):
            setattr(self, name, getattr(self, name)[rows])
        self.req_ids = [self.req_ids[i] for i in rows.tolist()]


@dataclass(frozen=True)
class StepCommitter(StepVerifier):
    """The lossless rule and the commit run inside a token model's step: the
    :class:`~visualspec.core.verify.StepVerifier`'s distributions and verdict, then the rows'
    commit (:func:`commit_window`) and, with a ``stop_token``, the rows that wrote it ended
    (:func:`stop_hits`, :func:`stopped_rows`), in the step's graph instead of a few dozen small
    eager calls after it.

    Called as the verifier is, with the rows' state after the uniforms: ``(logits, partner, drafts,
    draft_probs, u, u_emit, seq (R, N), n (R,), fixed (R, N), forwards (R,), *tables)`` (under
    constraints, their tables: the step reads its positions from ``n``). Returns ``(probs,
    num_accepted, next_tokens, seq, fixed, counts)``, then with a ``stop_token`` ``(stopped,
    filled)``. Frozen and hashable: equal committers share a compiled graph."""

    num_tokens: int = 1  # positions a row generates (its token buffer's length)
    stop_token: int | None = None
    label = "sampling, rule and commit"

    def __call__(self, logits, partner, drafts=None, draft_probs=None, u=None, u_emit=None, seq=None, n=None,
                 fixed=None, forwards=None, *tables):
        constrained = (n, *tables) if self.constraints is not None else ()
        probs, accepted, emitted = super().__call__(logits, partner, drafts, draft_probs, u, u_emit, *constrained)
        drafts = seq.new_empty(seq.shape[0], 0) if drafts is None else drafts
        seq, fixed, counts = commit_window(seq, fixed, n, forwards, drafts, accepted, emitted)
        if self.stop_token is None:
            return probs, accepted, emitted, seq, fixed, counts
        seq, fixed, stopped, filled = stopped_rows(seq, fixed, forwards, self.stop_token,
                                                   stop_hits(seq, self.stop_token, n, counts))
        return probs, accepted, emitted, seq, fixed, counts, stopped, filled

    def cropped(self, out: tuple, length: int) -> tuple:
        """The output of a padded step as a window of ``length`` tokens gives it: the first
        ``length`` distributions, the rest as it is."""
        return (out[0][:, :length], *out[1:])

    def example_args(self, model_rows: int, window: int, vocab_size: int, device=None) -> tuple:
        partner, drafts, draft_probs, u, u_emit, *constrained = super().example_args(model_rows, window, vocab_size,
                                                                                     device)
        tables = constrained[1:]  # the verifier's positions n come first under constraints

        def zeros(*shape):
            return torch.zeros(model_rows, *shape, dtype=torch.long, device=device)
        return (partner, drafts, draft_probs, u, u_emit, zeros(self.num_tokens), zeros(), zeros(self.num_tokens),
                zeros(), *tables)


def feature_request(drafter, rule) -> bool | tuple:
    """What a decode asks its target's forwards to return beside the logits: the ``wants_features``
    of the drafter or of the rule that reads them (True: the last hidden states; a tuple of indices:
    those hidden states side by side), False where neither does. A drafter and a rule asking for
    different ones are an error: one forward returns one kind."""
    drafter_wants = drafter is not None and getattr(drafter, "wants_features", False)
    rule_wants = getattr(rule, "wants_features", False)
    if drafter_wants and rule_wants and drafter_wants != rule_wants:
        raise ValueError(f"{type(drafter).__name__} reads the target's hidden states {drafter_wants} "
                         f"and {type(rule).__name__} its last ones; one forward returns one kind")
    return drafter_wants or rule_wants


def step_sampler(target, sampling: SamplingConfig, *, verifies: bool = False, rule: Rule | None = None,
                 constraints: TokenConstraints | None = None, features: bool | tuple = False,
                 commits: tuple[int, int | None] | None = None):
    """What a decode hands ``target``'s window forward (its ``post``), so that the sampling runs
    inside the target's step, compiled with it: the
    :class:`~visualspec.core.sampling.StepSampler` (the distributions), or with ``verifies`` the
    :class:`~visualspec.core.verify.StepVerifier` (the distributions and the lossless rule's
    verdict), where ``rule`` is the lossless one (``None``: it); with ``commits``, ``(num_tokens,
    stop_token)``, too, the :class:`StepCommitter` (the verdict committed, rows that wrote the stop
    token ended). Under ``constraints`` they take the constraints' tables too
    (:meth:`~visualspec.core.constraints.TokenConstraints.tables`).
    None where the target takes none (no ``takes_post``), where the target's features ride along,
    or (``verifies``) where the rule is another. A pipeline precompiles the graphs of what its
    decode will hand over (:func:`visualspec.core.engine.precompile_decode`)."""
    if not getattr(target, "takes_post", False) or features:
        return None
    step = None if constraints is None else constraints.step
    if not verifies:
        return StepSampler(sampling, step)
    if rule is not None and rule is not default_rule(sampling):
        return None
    return StepVerifier(sampling, step) if commits is None else StepCommitter(sampling, step, *commits)


def fused_step(target, drafter, sampling: SamplingConfig, num_tokens: int, *, rule: Rule | None = None,
               constraints: TokenConstraints | None = None, features: bool | tuple = False):
    """What a decode hands ``target``'s step when the whole drafted step runs inside it, in one
    compiled graph: the drafter's proposal, the forward, the sampling, the lossless rule, the commit
    and the drafter's update (its :meth:`~visualspec.core.engine.Drafter.fused_step`, e.g.
    :class:`visualspec.drafters.JacobiStep`). Only where the target's step is compiled
    (``compiled_step``) and verifies itself (:func:`step_sampler`); else None."""
    if (drafter is None or not getattr(target, "compiled_step", False)
            or step_sampler(target, sampling, verifies=True, rule=rule, constraints=constraints, features=features) is None):
        return None
    return drafter.fused_step(sampling, rule or default_rule(sampling), num_tokens,
                              constraints=None if constraints is None else constraints.step)


def _first_tokens(rule: Rule, p: torch.Tensor, generator) -> torch.Tensor:
    """Token 0 of each row straight from the prefill's distributions ``p`` (b, V): one exact step
    with no drafts."""
    return rule(p.new_empty(p.shape[0], 0, dtype=torch.long), None, p[:, None], generator).next_tokens


class _Run:
    """One call of a decode loop: admits rows, commits, finishes them.

    ``requests`` (a :class:`visualspec.core.engine.Requests`) decodes a queue in place of
    ``prefix``: finished rows' slots go to waiting requests. Finished rows leave the batch when the
    target can drop rows (``select``); else they stay in it, idle, committing nothing.
    """

    def __init__(self, target, prefix: Any, num_tokens: int, sampling: SamplingConfig, *, drafter, rule: Rule | None,
                 generator: Generator, mode: str, progress=None, constraints: TokenConstraints | None = None,
                 requests=None, stop_token: int | None = None):
        check_positive_int("num_tokens", num_tokens)
        if constraints is not None and constraints.num_tokens != num_tokens:
            raise ValueError(f"the constraints cover {constraints.num_tokens} positions, but {num_tokens} tokens "
                             f"are to be generated")
        if constraints is not None and constraints.guidance is not None and not sampling.uses_guidance:
            raise ValueError("the constraints give per-position guidance scales, but the sampling uses no guidance "
                             "(guidance_scale 1): the model batch has no unconditional rows to guide against")
        self.constraints = constraints
        self.t0 = time.perf_counter()
        self.target, self.N, self.sampling, self.drafter = target, num_tokens, sampling, drafter
        self.rule, self.progress, self.requests, self.stop_token = rule, progress, requests, stop_token
        self._counts, self._structural = [], []  # each commit's counts (and forced tokens), on the device
        self._unreported, self._reported_at = None, time.perf_counter()
        if requests is not None:
            for name in ("refill", "select"):
                if not hasattr(target, name):
                    raise TypeError(f"{type(target).__name__} has no {name}(); continuous batching (Requests) "
                                    f"needs a token model that can replace and drop rows")
            prefix = requests.prefix(list(range(min(requests.slots, requests.count))))
        # the target returns its features where the drafter or the rule reads them (wants_features)
        self.features = feature_request(drafter, rule)
        self.drafter_features = drafter is not None and getattr(drafter, "wants_features", False)
        self.rule_features = getattr(rule, "wants_features", False)
        # the target's step samples (and, under the lossless rule, verifies) inside itself, where it can
        self.step_probs = step_sampler(target, sampling, constraints=constraints, features=self.features)
        # and commits, where the step is compiled (eagerly the commit inside costs what it does after)
        commits = (num_tokens, stop_token) if getattr(target, "compiled_step", False) else None
        self.step_verifies = step_sampler(target, sampling, verifies=True, rule=rule, constraints=constraints,
                                          features=self.features, commits=commits)
        self.step_fuses = fused_step(target, drafter, sampling, num_tokens, rule=rule, constraints=constraints,
                                     features=self.features)
        # a drafter with a noised tail (SJD2) feeds unverified noisy inputs after its drafts: an eager step
        self.noised_tail = drafter is not None and getattr(drafter, "noised_tail", False)
        self.tail = None  # the latest proposal's tail (tokens, levels, eps), where the drafter has one
        if self.noised_tail:
            if not getattr(target, "takes_noise", False):
                raise TypeError(f"{type(drafter).__name__} feeds noised inputs after its drafts, but "
                                f"{type(target).__name__}'s forward_window takes no noise=")
            if self.features or constraints is not None:
                raise ValueError(f"{type(drafter).__name__}'s noised tail runs without features and constraints")
            self.step_probs = self.step_verifies = self.step_fuses = None
        self._partner_rows = (None, -1)  # the guidance pairs of the model rows, and the batch size they are for
        self._tables = (None, -1)  # the constraints' tables in the model rows, and how many rows they are for
        if self.features and not hasattr(target, "feature_size"):
            reader = type(drafter if self.drafter_features else rule).__name__
            raise TypeError(f"{reader} reads the target's features, but {type(target).__name__} "
                            f"cannot return them (it has no features=True and feature_size)")
        out = target.prefill(prefix, num_tokens, **self._feature_flag)
        if self.features:
            out, prefix_features = out
        rows_in_model = out.shape[0] // sampling.model_rows_per_sample
        total = requests.count if requests is not None else rows_in_model
        if isinstance(generator, (list, tuple)) and len(generator) != total:
            raise ValueError(f"got {len(generator)} generators for a batch of {total}")
        every = torch.arange(rows_in_model, device=out.device)
        first = self.first_tokens(out, row_generators(generator, every))
        self.rows = _Rows(every.clone(), num_tokens, generator, sampling, first.shape[1:], first.dtype)
        self.next_request = rows_in_model
        self.tokens = first.new_empty(total, num_tokens, *first.shape[1:])
        self.fixed_at = torch.empty(total, num_tokens, dtype=torch.long)
        self.judged_at = torch.zeros(total, num_tokens, dtype=torch.bool) if self.rule_features else None
        self.row_forwards = torch.empty(total, dtype=torch.long)
        self.stats = DecodeStats(mode=mode, batch_size=total, num_tokens=num_tokens, target_forwards=1,
                                 slots=rows_in_model)
        self._start(every, every, first)
        self._count_first(rows_in_model)
        if drafter is not None:
            drafter.start(rows_in_model, num_tokens, sampling)
            if self.drafter_features:
                drafter.prefix_features(prefix_features)
        self._report(torch.ones(rows_in_model, dtype=torch.long))
        self.finish_rows()

    @property
    def _feature_flag(self) -> dict:
        """The keyword that makes the target return its features too, where the drafter or the rule
        reads them (``wants_features``: True for the last hidden states, or a fusing drafter's tuple of
        hidden-state indices); none otherwise, so models without features run as they always did."""
        return {"features": self.features} if self.features else {}

    def first_tokens(self, out: torch.Tensor, generator: Generator) -> torch.Tensor:
        """Token 0 of the rows just prefilled, from the target's output ``out`` for them (logits,
        model rows x V) and their generator(s): one exact step of the rule."""
        return _first_tokens(self.rule, self.probs(out, torch.zeros(out.shape[0] // self.sampling.model_rows_per_sample,
                                                                    dtype=torch.long, device=out.device)), generator)

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
        """Tell ``progress`` the tokens committed: summed on the device, read at most every
        :data:`REPORT_EVERY_S` (a read waits for the device) and at the end."""
        if not self.progress:
            return
        self._unreported = counts.sum() if self._unreported is None else self._unreported + counts.sum()
        if time.perf_counter() - self._reported_at >= REPORT_EVERY_S:
            self._flush_report()

    def _flush_report(self) -> None:
        if self._unreported is not None:
            self.progress(int(self._unreported))
            self._unreported = None
        self._reported_at = time.perf_counter()

    def live(self) -> bool:
        """Whether a row is still decoding (read from the device only near the end: :meth:`_Rows.any_done`)."""
        rows = self.rows
        return len(rows) > 0 and (rows.most < self.N or bool((rows.n < self.N).any()))

    def window_drafts(self, window, search, extra=None) -> tuple[int, bool]:
        """Drafts this step and whether they get a sibling tree: the fixed ``window - 1`` (with a
        tree whenever ``extra`` is given), or the ``search``'s choice (``extra(W)``: the nodes a
        tree adds to a window of W). Not shortened near the end (rows there feed fillers), so a
        row's random draws depend on the window alone."""
        if self.drafter is None:
            return 0, False
        if search is None:
            return window - 1, extra is not None
        w, tree = search.option(len(self.rows) * self.sampling.model_rows_per_sample, extra=extra)
        return w - 1, tree

    def propose(self, k: int):
        """The drafter's (at most) ``k`` drafts for every row and their laws, ``(drafts (b, k'),
        draft_probs (b, k', V) or None)``, with the constraints' forced tokens put in; none
        without a drafter."""
        rows = self.rows
        if self.drafter is None:
            return rows.seq.new_empty(len(rows), 0), None
        drafts, draft_probs = self.drafter.propose(rows.seq, rows.n, k, rows.generator)
        if self.noised_tail:
            self.tail = self.drafter.window_tail()
        if drafts.shape[1] and self.drafter.drafts_with_target:
            self.step_done()  # the drafts cost a forward of the target itself
            self.stats.query_forwards += 1
        if self.constraints is not None:
            drafts, draft_probs = self.constraints.force_drafts(drafts, draft_probs, rows.positions(drafts.shape[1]),
                                                                self.target.vocab_size)
        return drafts, draft_probs

    def forward_window(self, drafts: torch.Tensor, **post):
        """One target forward over each row's window ``[x_{n-1}, drafts]`` at positions n-1..:
        the output (model rows, K+1, ...) at positions n..n+K, and the target's features at
        positions n-1..n+K-1 (model rows, K+1, D) where the drafter reads them (else None).
        ``post`` (``post=``, ``post_args=``) is handed to the target (:func:`step_sampler`)."""
        rows = self.rows
        window = torch.cat([rows.last(), drafts], 1) if drafts.shape[1] else rows.last()
        if self.tail is not None and self.tail[0].shape[1]:  # a noised tail after the drafts (SJD2), unverified
            tail, levels, eps = self.tail
            clean = window.shape[1]
            window = torch.cat([window, tail], 1)
            post = {**post, "noise": (rows.model(torch.cat([levels.new_zeros(len(rows), clean), levels], 1)),
                                      rows.model(torch.cat([eps.new_zeros(len(rows), clean, eps.shape[2]), eps], 1)))}
        out = self.target.forward_window(rows.model(window), rows.model(rows.n - 1), **self._feature_flag, **post)
        return out if self.features else (out, None)

    def forward_probs(self, drafts: torch.Tensor):
        """:meth:`forward_window`, then the target's distributions there: ``(probs (b, K+1, V),
        features or None)``, sampled inside the target's step where it can (:func:`step_sampler`)."""
        if self.step_probs is None:
            logits, features = self.forward_window(drafts)
            return self.probs(logits, self.rows.positions(logits.shape[1])), features
        probs, _ = self.forward_window(drafts, post=self.step_probs,
                                       post_args=(self._partners(), *self._constrained(self.rows.n)))
        return probs[:len(self.rows)], None

    def forward_verify(self, drafts: torch.Tensor, draft_probs: torch.Tensor | None):
        """One target forward whose step runs the lossless rule itself (``step_verifies``), and the
        commit where it is a :class:`StepCommitter`: the uniforms the rule would draw
        (:func:`~visualspec.core.verify.rule_uniforms`), drawn first from the rows' generators, then
        the forward. Returns the rule's verdict, the target's distributions (b, K+1, V) and the
        counts committed (:meth:`commit`'s), as :meth:`forward_probs`, :meth:`verify` and
        :meth:`commit` would."""
        rows, post = self.rows, self.step_verifies
        b, k, greedy = len(rows), drafts.shape[1], self.sampling.greedy
        u, u_emit = (None, None) if greedy else rule_uniforms(b, k, rows.generator, drafts.device)
        if k and not greedy and draft_probs is None:
            draft_probs = point_mass(drafts, self.target.vocab_size)
        rule_args = (drafts if k else None, None if greedy else draft_probs, u, u_emit)  # StepVerifier's order
        if not isinstance(post, StepCommitter):
            (probs, accepted, tokens), _ = self.forward_window(drafts, post=post,
                                                              post_args=self._step_args(rule_args) + self._constrained(rows.n))
            self.step_done()
            return Verdict(accepted[:b], tokens[:b]), probs[:b], self.commit(drafts, accepted[:b], tokens[:b])
        self.step_done()  # the commit inside the step marks the positions with this forward
        state = (*rule_args, rows.seq, rows.n, rows.fixed, rows.forwards)  # StepCommitter's order
        out, _ = self.forward_window(drafts, post=post, post_args=self._step_args(state) + self._constrained())
        probs, accepted, emitted, seq, fixed, counts, *stops = own_rows(out, b)
        start = rows.n
        return Verdict(accepted, emitted), probs, self._committed(start, rows.took(seq, fixed, counts, k + 1), stops)

    def forward_fused(self, k: int) -> tuple[Verdict, torch.Tensor]:
        """One step of ``k`` drafts that runs whole inside the target's step (``step_fuses``): the
        step's uniforms drawn first from the rows' generators (in the unfused step's order), then
        the forward, which proposes, verifies, commits and updates the drafter in its graph. Returns
        the rule's verdict and the counts committed, as :meth:`commit` would."""
        rows, step, b = self.rows, self.step_fuses, len(self.rows)
        self.step_done()  # the commit inside the step marks the positions with this forward
        state = (rows.seq, rows.n, rows.fixed, rows.forwards, *self.drafter.step_state(b, rows.n.device),
                 *step.uniforms(b, k, rows.generator, rows.n.device))
        window = rows.seq.new_zeros(b * self.sampling.model_rows_per_sample, k + 1)  # made inside the step
        out = self.target.forward_window(window, rows.model(rows.n - 1), post=step,
                                         post_args=self._step_args(state) + self._constrained())
        seq, fixed, counts, accepted, emitted, *carry = own_rows(out, b)
        self.drafter.stepped(tuple(carry))
        start = rows.n
        return Verdict(accepted, emitted), self._committed(start, rows.took(seq, fixed, counts, k + 1))

    def _constrained(self, n: torch.Tensor | None = None) -> list:
        """What a step's ``post`` takes after its own arguments under constraints (nothing without
        them): the rows' positions ``n`` (a sampler's; a fused step has its own), then the
        constraints' tables in the model's rows, made once per batch size."""
        if self.constraints is None:
            return []
        rows = len(self.rows) * self.sampling.model_rows_per_sample
        if self._tables[1] != rows:
            self._tables = (self.constraints.tables(rows, self.target.vocab_size, self.rows.n.device), rows)
        return ([] if n is None else [self.rows.model(n)]) + list(self._tables[0])

    def _step_args(self, values) -> list:
        """What a step's ``post`` is handed: the guidance pairs (:meth:`_partners`), then each of
        ``values`` (one row per row, or None) in the model's rows."""
        return [self._partners(), *(None if x is None else self.rows.model(x) for x in values)]

    def _partners(self) -> torch.Tensor:
        """The guidance pairs of the model rows now (:meth:`SamplingConfig.paired_rows`), made once
        per batch size."""
        b = len(self.rows)
        if self._partner_rows[1] != b:
            self._partner_rows = (self.sampling.paired_rows(b, self.rows.n.device), b)
        return self._partner_rows[0]

    def verify(self, drafts: torch.Tensor, draft_probs, target_probs: torch.Tensor, features):
        """The rule's verdict on ``drafts``; a rule that reads the target's features (a judge) gets
        the window's (``features``, model rows) of the sample rows, the conditional half under
        guidance: (b, K + 1, D). Distributions past K + 1 (a noised tail's) are not the rule's."""
        target_probs = target_probs[:, :drafts.shape[1] + 1]
        if not self.rule_features:
            return self.rule(drafts, draft_probs, target_probs, self.rows.generator)
        return self.rule(drafts, draft_probs, target_probs, self.rows.generator,
                         features=features[:len(self.rows)])

    def step_done(self) -> None:
        """A target forward ran: count it, for every row still decoding (every row, while the host's
        bound :attr:`_Rows.most` says so, without comparing)."""
        self.rows.forwards += 1 if self.rows.most < self.N else (self.rows.n < self.N).long()
        self.stats.target_forwards += 1

    def _start(self, rows: torch.Tensor, requests: torch.Tensor, first: torch.Tensor) -> None:
        """Rows ``rows`` begin ``requests`` with their first tokens (:meth:`_Rows.start`); a first
        token that is the stop token ends the row at once."""
        self.rows.start(rows, requests, first)
        if self.stop_token is not None:
            counts = torch.zeros(len(self.rows), dtype=torch.long, device=first.device)
            counts[rows] = 1
            self.stats.stopped_tokens += self.rows.stop(self.stop_token, torch.zeros_like(counts), counts)

    def commit(self, drafts: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
               judged: torch.Tensor | None = None) -> torch.Tensor:
        """The shared commit step (:meth:`_Rows.commit`): tokens, acceptance map (and where a judge
        alone kept drafts), statistics, progress; a row that commits the stop token ends
        (:meth:`_Rows.stop`). Returns the counts (b,)."""
        start = self.rows.n
        return self._committed(start, self.rows.commit(drafts, accepted, emitted, judged))

    def _committed(self, start: torch.Tensor, counts: torch.Tensor, stops=()) -> torch.Tensor:
        """After a commit of ``counts`` (b,) at positions ``start``: stop tokens (found by the step
        itself where it gives ``stops``, :class:`StepCommitter`'s), structural tokens, statistics and
        progress. Returns ``counts``."""
        if self.stop_token is not None:
            self.stats.stopped_tokens += (self.rows.ended(*stops) if stops
                                          else self.rows.stop(self.stop_token, start, counts))
        if self.constraints is not None:
            self._structural.append(self.constraints.count(start, counts))
        self._counts.append(counts)  # read once, at the end
        self._report(counts)
        return counts

    def crop(self, n: torch.Tensor, counts: torch.Tensor) -> None:
        """After a chain step from positions ``n`` that committed ``counts``: the cache keeps
        x_{<n'-1} (n' = n + counts); x_{n'-1} is fed next."""
        self.target.crop(self.rows.model(n + counts - 1))

    def keep(self, path: torch.Tensor, counts: torch.Tensor) -> None:
        """After a tree step: keep the root and the accepted ``path`` (b, >= counts - 1) of tree
        nodes, positions n-1 .. n+counts-2; drop every other node."""
        self.target.keep(self.rows.model(torch.cat([torch.zeros_like(path[:, :1]), path], 1)), self.rows.model(counts))

    @property
    def drops_rows(self) -> bool:
        """Whether finished rows leave the batch (else they stay in it, idle)."""
        return hasattr(self.target, "select")

    def _store(self, rows: torch.Tensor) -> None:
        """Keep the tokens, acceptance map and forwards of the finished rows ``rows``."""
        req = self.rows.req[rows]
        self.tokens[req] = self.rows.seq[rows]
        self.fixed_at[req] = self.rows.fixed[rows].cpu()
        if self.judged_at is not None:
            self.judged_at[req] = self.rows.judged[rows].cpu()
        self.row_forwards[req] = self.rows.forwards[rows].cpu()

    def finish_rows(self) -> None:
        """Move finished rows out; refill their slots from the queue, else drop them."""
        rows = self.rows
        if not rows.any_done():
            return
        self._flush_report()  # a row finished: progress counted by whole sequences moves now
        done = rows.n >= self.N
        finished = done.nonzero()[:, 0]
        self._store(finished)
        waiting = (self.requests.count - self.next_request) if self.requests is not None else 0
        if waiting > 0:
            slots = finished[:waiting]
            ids = list(range(self.next_request, self.next_request + len(slots)))
            self.next_request += len(slots)
            out = self.target.refill(rows.model_rows(slots), self.requests.prefix(ids), **self._feature_flag)
            if self.features:
                out, prefix_features = out
            self.stats.target_forwards += 1
            new = torch.tensor(ids, dtype=torch.long, device=rows.req.device)
            self._start(slots, new, self.first_tokens(out, row_generators(rows.all_generators, ids)))
            self._count_first(len(slots))
            if self.drafter is not None:
                self.drafter.reset(slots, ids)
                if self.drafter_features:
                    self.drafter.prefix_features(prefix_features, slots)
            self._report(torch.ones(len(slots), dtype=torch.long))
            done = rows.n >= self.N
            self._store(slots[done[slots]])  # a request whose first token is the stop token is whole
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]
            if len(keep):
                if self.drops_rows:
                    self.target.select(rows.model_rows(keep))
                    if self.drafter is not None:
                        self.drafter.select(keep)
                    rows.select(keep)
                # a model that cannot drop rows keeps them, idle: they commit nothing more
            else:
                rows.select(keep)

    def result(self) -> tuple[torch.Tensor, DecodeStats]:
        """The tokens of every row (request), in order, and the call's statistics."""
        self._flush_report()
        if self.judged_at is not None:
            self.stats.judged_at, self.stats.judged_tokens = self.judged_at, int(self.judged_at.sum())
        if self._counts:  # finished rows kept idle commit 0
            counts = torch.cat(self._counts)
            self.stats.accepted_lengths.extend(counts[counts > 0].tolist())
        if self._structural:
            self.stats.structural_tokens += int(torch.stack(self._structural).sum())
        self.stats.fixed_at = self.fixed_at
        self.stats.row_forwards = self.row_forwards
        self.stats.draft_forwards = self.drafter.forwards if self.drafter is not None else 0
        self.stats.wall_time_s = time.perf_counter() - self.t0
        return self.tokens, self.stats
