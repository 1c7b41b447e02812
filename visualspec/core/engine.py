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
window at the current batch size and the tokens a step its timed decodes committed (a search
also from the acceptance seen so far in the call), so that speculation is not expected to be
slower than one-token steps.

This module holds :func:`decode` and the protocols it runs on. The rows in flight and the run of
one call (prefill, first tokens, commits, finished rows, statistics) are
:mod:`visualspec.core.rows`'s, shared with the tree loop (:mod:`visualspec.core.tree`) and the
continuous-token loop (:mod:`visualspec.core.continuous`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from .checks import check_int, check_positive_int, is_int
from .compiled import CompileError
from .constraints import TokenConstraints
from .proactive import extra_nodes
from .rows import _Run, fused_step, step_sampler
from .sampling import Generator, SamplingConfig
from .stats import DecodeStats
from .tree import _sibling_step
from .verify import Rule, default_rule


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
        are its distributions at positions n..n+k (and past them, a noised tail's: ``noised_tail``)."""

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

    #: A drafter that reads the target's features sets this: True for the last hidden states, or a
    #: tuple of hidden-state indices to have those side by side (EAGLE-3's fusion). The engine then
    #: asks the target for them (``features=`` this, on ``prefill``, ``forward_window`` and
    #: ``refill``) and hands them over: the prompt's through :meth:`prefix_features`, each verified
    #: window's as ``observe``'s ``features`` (model rows, k+1, D or nD), at positions n-1..n+k-1.
    wants_features = False

    def prefix_features(self, features: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """The target's features of the prompt (model rows, T, D): of every row after the prefill,
        of rows ``rows`` after a refill (continuous batching). Only called when ``wants_features``."""

    #: A drafter whose drafts are the target's own forwards (ASSD's self-drafts from an any-subset
    #: model) sets this: the engine counts each of its proposals as a target forward of every row
    #: still decoding, so speed-ups are counted in the target's forwards, drafts included.
    drafts_with_target = False

    #: A drafter whose drafts carry over from one step to the next (Jacobi's: the target's own
    #: predictions past the committed tokens) sets this. A window search then does not count a step
    #: whose window grew, whose new positions had nothing carried yet; drafts made afresh each step
    #: (a draft model's, n-gram's, STAND's, a feature drafter's) are counted from the first step.
    carries_drafts = False

    #: A drafter that feeds the target unverified noised inputs after its drafts (SJD2's tail) sets
    #: this and offers :meth:`window_tail`. The engine appends them to the window with ``noise=`` (a
    #: target with ``takes_noise``), never shows them to the rule, hands ``observe`` the target's
    #: distributions at their positions after the drafts' and crops their keys and values with the
    #: step. Such steps run eagerly, in a fixed window.
    noised_tail = False

    def window_tail(self):
        """Where ``noised_tail``: what the engine feeds after the latest proposal's drafts,
        ``(tokens (B, t), noise levels (B, t) in [0, 1], eps (B, t, D) standard normal)``."""
        raise NotImplementedError(f"{type(self).__name__} has no noised tail")

    #: A drafter whose drafts cost time of their own (a draft model's forwards, a feature drafter's
    #: steps) sets this and offers :meth:`draft_timer`, so that a window policy prices a step with
    #: its drafts (:func:`visualspec.core.window_costs.drafted_step`); otherwise drafts are free next
    #: to the target's forward (Jacobi, n-gram lookup).
    prices_drafts = False

    def draft_timer(self, batch_size: int, num_tokens: int, sampling: SamplingConfig):
        """A timer (where ``prices_drafts``): called with a generated position n and a count k, it
        makes a proposal of k drafts at n for ``batch_size`` rows as a decode step would (catching up
        the k + 1 tokens the step before committed). It uses the drafter's own state: :meth:`start`
        again before decoding."""
        raise NotImplementedError(f"{type(self).__name__}'s drafts are free: it has no draft timer")

    def fused_step(self, sampling: SamplingConfig, rule: Rule, num_tokens: int, constraints=None):
        """A hashable step object that runs this drafter's proposal and update inside the target's
        compiled step, with the rule and the commit, in one graph (e.g.
        :class:`visualspec.drafters.JacobiStep`), for a decode of ``num_tokens`` tokens verified by
        ``rule`` (under ``constraints``, a :class:`~visualspec.core.constraints.StepConstraints`,
        when the decode has some: the step forces their drafts and takes their tables after its
        state); None (the default) where the drafter has none. Such a step reads the drafter's
        state (:meth:`step_state`) and returns it updated (:meth:`stepped`)."""
        return None

    def step_state(self, rows: int, device=None) -> tuple:
        """The drafter's state a fused step reads: a tuple of (rows, ...) tensors, one row per row
        decoding now (on ``device``)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused step")

    def stepped(self, state: tuple) -> None:
        """The state a fused step returned (:meth:`step_state`'s layout): the drafter's now."""
        raise NotImplementedError(f"{type(self).__name__} has no fused step")

    def cost_tag(self) -> str:
        """What a table of steps with this drafter's drafts is kept under beside the target's own
        (its class and, for a drafter network, a hash of that network's configuration)."""
        return type(self).__name__


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
        (Bm, L, V); column i predicts position start + i + 1. A model that can feed a feature
        drafter also takes ``features=True`` here and in ``prefill`` / ``refill``, and then returns
        ``(logits, features)``: the hidden states (Bm, L, D) its output head reads."""

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
        check_positive_int("Requests.count", self.count)
        check_positive_int("Requests.slots (the batch size)", self.slots)


def precompile_decode(target, prefix: Any, num_tokens: int, sampling: SamplingConfig, windows, *, drafts: bool,
                      rule: Rule | None = None, auto: bool = False, features: bool | tuple = False,
                      drafter: Drafter | None = None, constraints: TokenConstraints | None = None,
                      stop_token: int | None = None) -> None:
    """Compile, before a decode of ``prefix`` on ``target``'s compiled step (its ``precompile``),
    every step graph the decode can take, with what :func:`decode` hands each step
    (:func:`step_sampler`): with ``drafts``, the windows ``windows`` under ``rule`` (``features``:
    steps that return the target's features too), run whole inside the step where ``drafter`` has
    a fused step (:func:`~visualspec.core.rows.fused_step`); and plain AR's step, where there are no drafts or
    the window is ``auto`` (its policy may decode as AR, with the lossless rule). ``constraints``:
    the decode's, if any (their tables are the steps' arguments); ``stop_token``: the decode's,
    which a step that commits inside itself checks for (:class:`~visualspec.core.rows.StepCommitter`).
    Where torch cannot compile a step with its sampling and rule inside, they run after the compiled
    forward instead (:func:`_precompile_with`)."""
    extra, commits = {"features": features} if features else {}, (num_tokens, stop_token)
    if drafts:
        fused = fused_step(target, drafter, sampling, num_tokens, rule=rule, features=features,
                           constraints=constraints)
        if fused is not None:  # a drafted step runs whole inside the target's step (or bare, where that failed)
            _precompile_with(target, prefix, num_tokens, [w for w in windows if w > 1], fused)
            windows = [w for w in windows if w == 1]
        if windows:  # each post is asked for after the last compile: a failed one turns them off
            post = (step_sampler(target, sampling, verifies=True, rule=rule, features=features, constraints=constraints,
                                 commits=commits)
                    or step_sampler(target, sampling, features=features, constraints=constraints))
            _precompile_with(target, prefix, num_tokens, windows, post, **extra)
    if not drafts or auto:
        _precompile_with(target, prefix, num_tokens, [1],
                         step_sampler(target, sampling, verifies=True, constraints=constraints, commits=commits))


def _precompile_with(target, prefix: Any, num_tokens: int, windows, post, **kwargs) -> None:
    """``target.precompile`` of ``windows`` with ``post`` inside each step.
    Where torch cannot compile a step with its ``post`` (:class:`~visualspec.core.compiled.CompileError`),
    it warns, turns the target's ``takes_post`` off (its decodes then run the sampling and rule
    after the compiled forward, as a target without ``takes_post`` does) and compiles the bare
    windows instead. A bare window that cannot compile raises."""
    if post is not None:
        try:
            return target.precompile(prefix, num_tokens, windows, post=post, **kwargs)
        except CompileError as e:
            warnings.warn(f"{e.step}: torch could not compile the step with its {post.label} inside ({e.reason}); "
                          f"they run after the compiled forward instead, for this model from now on", stacklevel=3)
            target.takes_post = False
    target.precompile(prefix, num_tokens, windows, **kwargs)


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
    stop_token: int | None = None,
) -> tuple[torch.Tensor, DecodeStats]:
    """Generate ``num_tokens`` tokens per row. Returns ``(tokens (R, num_tokens), stats)``.

    ``prefix`` is the model's prefix for every row, or :class:`Requests` (continuous batching).
    ``window`` is the number of tokens fed per target forward (drafts = window - 1), or a
    :class:`visualspec.core.window.WindowPolicy` whose search picks it each step; it is ignored
    without a drafter. A policy whose ``as_ar`` is set (no window is expected to beat plain AR's
    step) decodes without the drafter and its rule, one token a forward, and the stats' mode ends
    in ``as AR``. ``rule`` is any
    function of :mod:`visualspec.core.verify` (default:
    :func:`visualspec.core.verify.default_rule`). ``generator`` is one
    generator, or one per row (per request).

    ``siblings`` K > 1 is proactive drafting (:mod:`visualspec.core.proactive`): the first
    ``sibling_depth`` draft positions get K candidates each, fed as a tree (the target must be a
    :class:`TreeTokenModel`) and verified exactly; it needs the lossless rule.

    ``constraints`` (:class:`visualspec.core.constraints.TokenConstraints`) fixes structural tokens
    at their positions and restricts the others to allowed tokens: forced positions are drafted
    with their token and a point mass, so they are accepted with probability 1.

    ``stop_token`` (e.g. a tokenizer's end-of-sequence id) ends a row once it commits that token;
    the rest of its row is that token, as transformers' ``generate`` pads a finished row. Checking
    for it reads the device once a step, as ``generate``'s own stopping check does.

    The rows in flight, their commits and the statistics are the run's
    (:class:`visualspec.core.rows._Run`); a step here drafts, verifies, commits and keeps the
    target's cache and the drafter in step.
    """
    if not hasattr(window, "search") and not (is_int(window) and window >= 1):
        raise ValueError(f"window must be an integer >= 1 or a WindowPolicy, got {window!r}")
    if getattr(window, "as_ar", False):  # the policy found no window that beats plain AR here
        drafter, rule, window = None, None, 1
        mode = (mode or "ar") + " as AR"
    check_int("siblings", siblings, 1)
    check_int("sibling_depth", sibling_depth, 0)
    tree = siblings > 1 and sibling_depth > 0 and drafter is not None
    if tree and rule is not None and rule is not default_rule(sampling):
        raise ValueError("proactive drafting (siblings > 1) is verified exactly; it takes the lossless rule only")
    if tree and getattr(drafter, "wants_features", False):
        raise ValueError(f"{type(drafter).__name__} reads the target's features, which proactive drafting's "
                         f"trees (siblings > 1) do not hand over; use siblings=1")
    if tree and not hasattr(target, "forward_tree"):
        raise TypeError(f"{type(target).__name__} has no forward_tree(); proactive drafting (siblings > 1) "
                        f"needs a token model with tree attention")
    if hasattr(window, "search") and getattr(drafter, "noised_tail", False):
        raise ValueError(f"{type(drafter).__name__} feeds a noised tail after its drafts: give it a fixed window "
                         f"(an integer), not a window policy")
    rule = rule or default_rule(sampling)
    run = _Run(target, prefix, num_tokens, sampling, drafter=drafter, rule=rule, generator=generator,
               mode=mode or ("ar" if drafter is None else type(drafter).__name__), progress=progress,
               constraints=constraints, requests=prefix if isinstance(prefix, Requests) else None,
               stop_token=stop_token)
    search = (window.search(carried=getattr(drafter, "carries_drafts", False))  # fresh per call: its windows
              if hasattr(window, "search") else None)                            # depend on it alone
    extra = (lambda w: extra_nodes(min(sibling_depth, w - 1), siblings)) if tree else None
    while run.live():
        rows, gens = run.rows, run.rows.generator
        # draft
        k, siblings_now = run.window_drafts(window, search, extra)
        n, fused, tree_step = rows.n, k > 0 and not siblings_now and run.step_fuses is not None, False
        if fused:  # draft, verify, commit and update the drafter, all inside the target's step
            verdict, counts = run.forward_fused(k)
        else:
            drafts, draft_probs = run.propose(k)
            k = drafts.shape[1]  # a drafter may stop early (never draft more than k)
            tree_step = siblings_now and k > 0
            # verify: one target forward over the window (or the sibling tree), then the rule
            features = None
            if tree_step:
                verdict, committed, target_probs, path = _sibling_step(run, drafts, draft_probs, siblings,
                                                                       min(sibling_depth, k))
            elif run.step_verifies is not None:  # the lossless rule and the commit run inside the target's step
                verdict, target_probs, counts = run.forward_verify(drafts, draft_probs)
            else:
                target_probs, features = run.forward_probs(drafts)
                verdict, committed = run.verify(drafts, draft_probs, target_probs, features), drafts
            if tree_step or run.step_verifies is None:
                run.step_done()
                # commit the accepted drafts and the emitted token
                counts = run.commit(committed, verdict.num_accepted, verdict.next_tokens, verdict.judged)
        if search is not None:
            search.observe(k + 1, verdict.num_accepted + 1, tree=siblings_now)
        # keep the cache and the drafter in step
        if tree_step:
            run.keep(path, counts)
        elif k or run.tail is not None:  # a step without drafts or a tail keeps every position it fed
            run.crop(n, counts)
        if not fused and drafter is not None:  # a fused step updated the drafter itself
            drafter.observe(n, counts, target_probs, gens, **({"features": features} if features is not None
                                                                and run.drafter_features else {}))
        run.finish_rows()
    return run.result()
