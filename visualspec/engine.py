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
from .verify import Verdict, speculative_verify

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
