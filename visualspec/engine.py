"""The one decode engine, shared by every token model (images and text).

A target model only has to implement the small :class:`TokenModel` protocol. One decode step
feeds the window ``[x_{n-1}, d_n, ..., d_{n+K-1}]`` (the last committed token and K drafts),
gets the target distributions at positions n..n+K in one forward pass, lets a verification rule
decide how many drafts to accept, and commits the accepted drafts plus one token from the target.
Plain autoregressive decoding is the case K = 0.

Batches stay aligned: every row commits the batch-minimum ``m + 1`` tokens per step. A row that
accepted more drafts still commits its accepted draft at position n+m (not a fresh sample), so each
row keeps exactly the law the rule gives it, and all rows share one cache length.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import torch

from .drafters import Drafter
from .sampling import Generator, SamplingConfig
from .stats import DecodeStats
from .verify import Verdict, greedy_verify, speculative_verify

Rule = Callable[..., Verdict]


class TokenModel(Protocol):
    """What the engine needs from a model that predicts the next token.

    Positions are indices into the generated tokens (0 = first generated token); the model maps
    them past its own conditioning prefix. With classifier-free guidance the engine doubles the
    batch itself (``[cond; uncond]``), so models never need to know about guidance.
    """

    vocab_size: int

    def prefill(self, prefix: Any, max_new_tokens: int) -> torch.Tensor:
        """Reset the cache, run the conditioning prefix; return logits (Bm, V) for position 0."""

    def forward_window(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Run tokens (Bm, L) at positions start..start+L-1 against the cache (which must hold
        positions < start) and store their keys and values. Returns logits (Bm, L, V); row i
        predicts position start + i + 1."""

    def crop(self, length: int) -> None:
        """Keep only positions < length in the cache."""


class TreeTokenModel(TokenModel, Protocol):
    """A token model that can also verify a draft tree in one forward pass (tree attention)."""

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     start: int) -> torch.Tensor:
        """Run the flattened tree tokens (B, N): node i sits at position ``start + depths[i]`` and
        attends to the cache and to the nodes j with ``ancestors[i, j]``. Stores every node's keys
        and values after the cache; returns logits (B, N, V) (row i predicts the next position)."""

    def keep(self, start: int, nodes: torch.Tensor) -> None:
        """Keep positions < start in the cache, followed by the tree nodes ``nodes`` (B, m) in
        order (they become positions start..start + m - 1); drop every other tree node."""


@torch.no_grad()
def decode(
    target: TokenModel,
    prefix: Any,
    num_tokens: int,
    sampling: SamplingConfig,
    *,
    drafter: Drafter | None = None,
    rule: Rule = speculative_verify,
    window: int = 1,
    generator: Generator = None,
    mode: str = "",
    progress: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, DecodeStats]:
    """Generate ``num_tokens`` tokens per row. Returns ``(tokens (B, num_tokens), stats)``.

    ``window`` is the number of tokens fed per target forward (drafts = window - 1); it is ignored
    without a drafter. ``rule`` is any function of :mod:`visualspec.verify`.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    t0 = time.perf_counter()
    max_drafts = window - 1 if drafter is not None else 0

    first = sampling.probs(target.prefill(prefix, num_tokens))
    B = first.shape[0]
    stats = DecodeStats(mode=mode or ("ar" if drafter is None else type(drafter).__name__),
                        batch_size=B, num_tokens=num_tokens, target_forwards=1)
    fixed_at = torch.empty(num_tokens, dtype=torch.long)
    tokens = torch.empty(B, num_tokens, dtype=torch.long, device=first.device)
    # the first token comes straight from the prefill: one exact step with no drafts
    tokens[:, 0] = rule(tokens[:, :0], None, first[:, None], generator).next_tokens
    fixed_at[0] = 1
    n = 1
    if progress:
        progress(1)
    if drafter is not None:
        drafter.start(B, num_tokens, sampling, generator)

    while n < num_tokens:
        k = min(max_drafts, num_tokens - 1 - n)
        if drafter is not None:
            drafts, draft_probs = drafter.propose(tokens, n, k)
            k = drafts.shape[1]  # a drafter may stop early (never draft more than k)
        else:
            drafts, draft_probs = tokens.new_empty(B, 0), None
        window_tokens = torch.cat([tokens[:, n - 1:n], drafts], dim=1)
        if sampling.uses_guidance:
            window_tokens = torch.cat([window_tokens, window_tokens])
        target_probs = sampling.probs(target.forward_window(window_tokens, n - 1))  # (B, k+1, V)
        stats.target_forwards += 1

        verdict = rule(drafts, draft_probs, target_probs, generator)
        m = int(verdict.num_accepted.min())
        last = verdict.next_tokens
        if m < k:  # rows that accepted past the batch minimum keep their accepted draft at n+m
            last = torch.where(verdict.num_accepted > m, drafts[:, m], last)
        tokens[:, n:n + m] = drafts[:, :m]
        tokens[:, n + m] = last
        fixed_at[n:n + m + 1] = stats.target_forwards
        target.crop(n + m)  # cache keeps x_{<n+m}; x_{n+m} is fed next
        if drafter is not None:
            drafter.observe(n, m + 1, target_probs)
        stats.accepted_lengths.append(m + 1)
        n += m + 1
        if progress:
            progress(m + 1)

    stats.fixed_at = fixed_at
    stats.draft_forwards = drafter.forwards if drafter is not None else 0
    stats.wall_time_s = time.perf_counter() - t0
    return tokens, stats


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
    (:class:`visualspec.multidraft.DraftTree`), the target scores the whole tree in one forward, and

    1. the multi-draft ``rule`` (:mod:`visualspec.multidraft`, matching the drafter's scheme) picks
       at most one of the first tokens, or emits a residual sample;
    2. the picked chain's remaining drafts are verified by speculative sampling (greedy matching at
       temperature 0), which emits the next token after them.

    Lossless when the rule is lossless for the drafter's scheme: the first emitted token has law p
    whatever was drafted, and given the picked first token its chain was drafted from the chain's
    own q, which step 2 verifies exactly. Batches stay aligned as in :func:`decode`.
    """
    if not isinstance(branches, int) or branches < 1:
        raise ValueError(f"branches (k) must be an integer >= 1, got {branches!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if sampling.uses_guidance:
        raise ValueError("tree decoding does not support classifier-free guidance")
    t0 = time.perf_counter()
    chain_rule = greedy_verify if sampling.greedy else speculative_verify
    first = sampling.probs(target.prefill(prefix, num_tokens))
    B = first.shape[0]
    stats = DecodeStats(mode=mode or f"tree {branches}x{depth}", batch_size=B, num_tokens=num_tokens,
                        target_forwards=1)
    fixed_at = torch.empty(num_tokens, dtype=torch.long)
    tokens = torch.empty(B, num_tokens, dtype=torch.long, device=first.device)
    tokens[:, 0] = chain_rule(tokens[:, :0], None, first[:, None], generator).next_tokens
    fixed_at[0] = 1
    n = 1
    drafter.start(B, num_tokens, sampling, generator)
    rows = torch.arange(B, device=first.device)
    while n < num_tokens:
        L = min(depth, num_tokens - 1 - n)
        if L == 0:  # the last token: a plain step
            p = sampling.probs(target.forward_window(tokens[:, n - 1:n], n - 1))
            stats.target_forwards += 1
            tokens[:, n] = chain_rule(tokens[:, :0], None, p, generator).next_tokens
            target.crop(n)
            drafter.observe(n, 1, p)
            stats.accepted_lengths.append(1)
            fixed_at[n] = stats.target_forwards
            n += 1
            continue
        tree = drafter.propose_tree(tokens, n, branches, L)
        depths, ancestors = tree.layout()
        flat = torch.cat([tokens[:, n - 1:n], tree.tokens.flatten(1)], dim=1)
        p = sampling.probs(target.forward_tree(flat, depths, ancestors, n - 1))  # (B, 1 + k L, V)
        stats.target_forwards += 1

        first_verdict = rule(tree.tokens[:, :, 0], tree.first_q, p[:, 0], generator)
        picked = first_verdict.index.clamp(min=0)  # rows that rejected every candidate use chain 0 (unused)
        chain = tree.tokens[rows, picked]  # (B, L)
        nodes = 1 + picked[:, None] * L + torch.arange(L, device=flat.device)  # the chain's nodes
        chain_p = p[rows[:, None], nodes]  # (B, L, V): p after each chain token
        chain_q = None if tree.chain_q is None else tree.chain_q[rows, picked]
        rest = chain_rule(chain[:, 1:], chain_q, chain_p, generator)
        hit = first_verdict.index >= 0
        accepted = torch.where(hit, 1 + rest.num_accepted, torch.zeros_like(rest.num_accepted))
        emitted = torch.where(hit, rest.next_tokens, first_verdict.token)

        m = int(accepted.min())
        last = torch.where(accepted > m, chain[:, m], emitted) if m < L else emitted
        tokens[:, n:n + m] = chain[:, :m]
        tokens[:, n + m] = last
        fixed_at[n:n + m + 1] = stats.target_forwards
        target.keep(n - 1, torch.cat([torch.zeros_like(nodes[:, :1]), nodes[:, :m]], dim=1))
        drafter.observe(n, m + 1, torch.cat([p[:, :1], chain_p[:, :m]], dim=1))
        stats.accepted_lengths.append(m + 1)
        n += m + 1

    stats.fixed_at = fixed_at
    stats.draft_forwards = drafter.forwards
    stats.wall_time_s = time.perf_counter() - t0
    return tokens, stats
