"""Speculative Jacobi-Denoising drafts (SJD2, Teng et al. 2025, arXiv 2510.08994): a Jacobi window
whose far half is fed as noised embeddings, for a target fine-tuned to predict the next clean token
from them."""

from __future__ import annotations

import torch

from ..core.checks import check_positive_int
from ..core.engine import Drafter
from ..core.rows import per_row
from ..core.sampling import normal
from .jacobi import JacobiCarry, carried_at, carry_after

BAND = 2.0  # positions a noise level spans past the clean ones (docs/experiments/2026-12-07-sjd2-shapes.md)


def offset_levels(k: int, steps: int, band: float = BAND, device=None) -> torch.Tensor:
    """The noise level (k,) long, in 0..S (S = ``steps``), of each of a window's k drafted positions
    by its offset j = 0..k-1 past the committed tokens: the first ``c = (k + 1) // 2`` are clean,
    then ``min(S, ceil((j + 1 - c) / band))``: one level more every ``band`` positions, up to pure
    noise."""
    clean = (k + 1) // 2
    j = torch.arange(k, device=device, dtype=torch.float64)
    return torch.ceil((j + 1 - clean) / band).clamp(0, steps).long()


class DenoisingJacobiDrafter(JacobiCarry, Drafter):
    """SJD2's drafts, for a target fine-tuned to predict the next clean token from noised inputs
    (``visualspec train-denoising``; its config's ``denoising_steps`` S).

    As in SJD, every position past a row's committed tokens carries the target's latest sample
    there and the law it was drawn from (:func:`~visualspec.drafters.jacobi.carry_after`). The first
    half of each window is drafted as in SJD. The rest is a tail (:meth:`window_tail`) that the
    engine feeds after the drafts and does not verify: each carried token there enters as its
    noised embedding ``(1 - l/S) e(token) + (l/S) sigma eps`` (fresh noise each forward, the
    target's ``embed_noised``) at a level l that rises with its distance from the committed tokens
    (:func:`offset_levels`), and a position nobody has predicted yet as pure noise. The target's
    predictions past a noised input are next-clean-token predictions under uncertain context,
    where SJD's are conditioned on stale drafts; as the committed tokens move on, a position comes
    clean and its latest sample becomes a draft.

    Lossless under the exact rule: a verified position sees only committed tokens and clean drafts
    before it (the attention is causal, the tail comes after it and the engine drops its keys and
    values), and every draft is a sample from the law it reports. The noised inputs only choose
    what is drafted. In a batch, the drafts are as many as the row with the fewest clean positions
    has; the other rows' further clean positions go in the tail, unnoised.
    """

    carries_drafts = True
    noised_tail = True  # the engine feeds :meth:`window_tail` after the drafts, unverified

    def __init__(self, steps: int, dim: int, band: float = BAND):
        check_positive_int("denoising steps (the target's denoising_steps)", steps)
        if not band > 0:
            raise ValueError(f"band (positions a noise level spans) must be > 0, got {band!r}")
        self.steps, self.dim, self.band = steps, dim, band

    @classmethod
    def for_target(cls, target, band: float = BAND) -> "DenoisingJacobiDrafter":
        """The drafter of a target fine-tuned for noised inputs (its config's ``denoising_steps`` > 0)."""
        steps = getattr(getattr(target, "config", None), "denoising_steps", 0)
        if not steps or not hasattr(target, "embed_noised"):
            raise ValueError(f"SJD2's drafts need a target fine-tuned for noisy inputs (visualspec train-denoising); "
                             f"this {type(target).__name__} has no denoising_steps in its config")
        return cls(steps, target.config.dim, band)

    def cost_tag(self):
        return f"{type(self).__name__}[{self.steps}, {self.band}]"

    def start(self, batch_size, num_tokens, sampling):
        self.sampling = sampling
        self.carry = None  # Jacobi's carry: (tokens (B, C), laws (B, C, V), count (B,)) past the committed tokens
        self.tail = None

    def propose(self, tokens, n, k, generator=None):
        B, device = tokens.shape[0], tokens.device
        if self.carry is None:  # nothing predicted yet: the whole window is noise
            has, carried, laws = torch.zeros(B, k, dtype=torch.bool, device=device), tokens.new_zeros(B, k), None
        else:
            has, carried, laws = carried_at(self.carry, k)
        levels = torch.where(has, offset_levels(k, self.steps, self.band, device), self.steps)
        m = int((levels == 0).long().cumprod(1).sum(1).min())  # the clean positions every row has
        q = None if self.sampling.greedy or m == 0 else laws[:, :m].contiguous()
        self.tail = (carried[:, m:], levels[:, m:].float() / self.steps,
                     normal((B, k - m, self.dim), generator, device=device))
        return carried[:, :m], q

    def window_tail(self):
        """What the engine feeds after this proposal's drafts, unverified: ``(tokens (B, t), noise
        levels (B, t) in [0, 1], eps (B, t, D) standard normal)``."""
        return self.tail

    def observe(self, n, committed, target_probs, generator=None):
        # target_probs[:, j]: the target's distribution at position n + j, j = 0..K (drafts and tail)
        B, K1, _ = target_probs.shape
        committed = per_row(committed, B, target_probs.device)
        self.carry = carry_after(self.sampling.draw(target_probs, generator), target_probs, committed, K1)
        self.tail = None
