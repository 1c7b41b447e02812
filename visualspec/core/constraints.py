"""Structural tokens: positions whose token is fixed by the sequence's layout, the tokens the
other positions may take, and the guidance scale at each position.

Unified-vocabulary image generators (Lumina-mGPT, Chameleon, Emu3) lay an image out as rows of
image codes, each ending in a row-end token, then an end-of-image token; their vocabulary also
holds text. The layout fixes the row ends and the end, and the codes come from the image part of
the vocabulary only. :class:`TokenConstraints` says both for the generated positions 0..N-1:

- a **forced** position takes its token with probability 1. The engine never drafts it (a draft
  there is replaced by the forced token with a point-mass q), its target law is the same point
  mass, so the rule accepts it with probability 1 (it cannot end a step's accepted run), and it is
  counted apart in the statistics (``DecodeStats.structural_tokens``);
- a **free** position samples from the model's distribution restricted to ``allowed`` tokens,
  applied to the guided logits before the epsilon cut-off, temperature, top-k and top-p (the order
  of Lumina-mGPT's logits processors: guidance, then the image-token mask, then top-k).

Forced positions stay inside a Jacobi window like any other: SJD's window runs across row ends.

A model may also define its guidance scale per position (Lumina-mGPT 2.0 lowers it over an image's
first tokens). The scale is a function of the position alone, so the target law at each position is
still fixed, and drafts and verification read the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenConstraints:
    """``forced`` (N,) long: the token of each generated position, -1 where the model samples;
    ``allowed`` (V,) bool or None: the tokens a sampled position may take (None: every token);
    ``guidance`` (N,) float or None: the guidance scale at each generated position, in place of the
    sampling's one scale (None: that scale everywhere; it needs sampling with guidance)."""

    forced: torch.Tensor
    allowed: torch.Tensor | None = None
    guidance: torch.Tensor | None = None

    def __post_init__(self):
        if self.forced.ndim != 1 or self.forced.dtype != torch.long:
            raise ValueError(f"forced must be a 1-D long tensor of token ids (-1 = sampled), got "
                             f"{tuple(self.forced.shape)} {self.forced.dtype}")
        if self.allowed is not None:
            if self.allowed.ndim != 1 or self.allowed.dtype != torch.bool or not bool(self.allowed.any()):
                raise ValueError("allowed must be a 1-D bool tensor over the vocabulary with at least one True")
            if bool((self.forced >= self.allowed.shape[0]).any()):
                raise ValueError(f"a forced token lies outside the vocabulary of {self.allowed.shape[0]}")
        if self.guidance is not None:
            g = self.guidance
            if g.shape != self.forced.shape or not g.is_floating_point() or bool((g < 0).any()):
                raise ValueError(f"guidance must be a float tensor of {self.num_tokens} scales >= 0, one per "
                                 f"position, got {tuple(g.shape)} {g.dtype}")

    @property
    def num_tokens(self) -> int:
        return int(self.forced.shape[0])

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """The forced token at each of ``positions`` (any shape; positions past the end count as
        free filler positions), -1 where the model samples."""
        inside = positions < self.num_tokens
        forced = self.forced.to(positions.device)[positions.clamp(0, self.num_tokens - 1)]
        return torch.where(inside, forced, torch.full_like(forced, -1))

    def guidance_at(self, positions: torch.Tensor) -> torch.Tensor | None:
        """(…, 1): the guidance scale at each of ``positions`` (positions past the end take the last
        one), ready to broadcast over the vocabulary; None when the sampling's scale holds."""
        if self.guidance is None:
            return None
        return self.guidance.to(positions.device)[positions.clamp(0, self.num_tokens - 1)][..., None]

    def allowed_mask(self, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(…, V) bool: the tokens each of ``positions`` may take (just its token where forced)."""
        forced = self.at(positions)
        free = (self.allowed.to(positions.device) if self.allowed is not None
                else torch.ones(vocab_size, dtype=torch.bool, device=positions.device))
        point = torch.zeros(*positions.shape, vocab_size, dtype=torch.bool, device=positions.device)
        point.scatter_(-1, forced.clamp(min=0)[..., None], True)
        return torch.where((forced >= 0)[..., None], point, free)  # no host read: the same work at every step

    def force_drafts(self, drafts: torch.Tensor, draft_probs: torch.Tensor | None, positions: torch.Tensor,
                     vocab_size: int):
        """Put each forced position's token in ``drafts`` (B, K) at ``positions`` (B, K), with a point
        mass as its draft law; other drafts are left as they are."""
        forced = self.at(positions)
        pinned = forced >= 0
        drafts = torch.where(pinned, forced, drafts)
        if draft_probs is not None:
            one_hot = torch.nn.functional.one_hot(drafts, vocab_size).to(draft_probs.dtype)
            draft_probs = torch.where(pinned[..., None], one_hot, draft_probs)
        return drafts, draft_probs

    def count(self, start: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Forced positions among each row's committed positions ``start[b] .. start[b] + counts[b] - 1``
        (a 0-d tensor on their device: read it once, when the counts are summed)."""
        pinned = torch.cat([torch.zeros(1, dtype=torch.long), (self.forced >= 0).long().cumsum(0)]).to(start.device)
        end = (start + counts).clamp(max=self.num_tokens)
        return (pinned[end] - pinned[start.clamp(max=self.num_tokens)]).sum()
