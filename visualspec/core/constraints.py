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
        free filler positions), -1 where the model samples (:func:`forced_at`)."""
        return forced_at(self.forced.to(positions.device), positions)

    def guidance_at(self, positions: torch.Tensor) -> torch.Tensor | None:
        """(…, 1): the guidance scale at each of ``positions`` (positions past the end take the last
        one), ready to broadcast over the vocabulary; None when the sampling's scale holds."""
        return None if self.guidance is None else scales_at(self.guidance.to(positions.device), positions)

    def allowed_mask(self, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(…, V) bool: the tokens each of ``positions`` may take (just its token where forced)."""
        return allowed_at(self.at(positions), self._free(vocab_size, positions.device))

    def force_drafts(self, drafts: torch.Tensor, draft_probs: torch.Tensor | None, positions: torch.Tensor,
                     vocab_size: int):
        """Put each forced position's token in ``drafts`` (B, K) at ``positions`` (B, K), with a point
        mass as its draft law; other drafts are left as they are (:func:`pin_drafts`)."""
        return pin_drafts(drafts, draft_probs, self.at(positions), vocab_size)

    def _free(self, vocab_size: int, device=None) -> torch.Tensor:
        """(V,) bool: the tokens a sampled position may take."""
        return (self.allowed.to(device) if self.allowed is not None
                else torch.ones(vocab_size, dtype=torch.bool, device=device))

    @property
    def step(self) -> "StepConstraints":
        """What a compiled step must know of these constraints (the tables go in as arguments:
        :meth:`tables`)."""
        return StepConstraints(self.num_tokens, None if self.guidance is None else self.guidance.dtype)

    def tables(self, rows: int, vocab_size: int, device=None) -> tuple:
        """The constraints as a step's arguments, one row per model row: ``forced`` (rows, N),
        the free tokens (rows, V) bool and the guidance scales (rows, N) (None without them);
        contiguous, so a compiled step takes them as they are."""
        def per_row(table):
            return None if table is None else table.to(device)[None].expand(rows, -1).contiguous()
        return per_row(self.forced), per_row(self._free(vocab_size, device)), per_row(self.guidance)

    def count(self, start: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Forced positions among each row's committed positions ``start[b] .. start[b] + counts[b] - 1``
        (a 0-d tensor on their device: read it once, when the counts are summed)."""
        pinned = torch.cat([torch.zeros(1, dtype=torch.long), (self.forced >= 0).long().cumsum(0)]).to(start.device)
        end = (start + counts).clamp(max=self.num_tokens)
        return (pinned[end] - pinned[start.clamp(max=self.num_tokens)]).sum()


def forced_at(forced: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The forced token at each position: ``forced[p]`` for a table ``forced`` (N,) and positions
    of any shape, or ``forced[b, p]`` for one table per row (B, N) and positions (B, L); -1 at
    positions >= N (fillers past a row's end) and where the table says -1 (the model samples)."""
    values = _lookup(forced, positions)
    return torch.where(positions < forced.shape[-1], values, torch.full_like(values, -1))


def scales_at(guidance: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(…, 1): the guidance scale at each position, ``guidance[min(p, N - 1)]`` for a table (N,),
    or ``guidance[b, min(p, N - 1)]`` for one per row (B, N) and positions (B, L)."""
    return _lookup(guidance, positions)[..., None]


def _lookup(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``table[min(p, N - 1)]`` at each position for a table (N,), or ``table[b, min(p, N - 1)]`` for
    one table per row (B, N) and positions (B, L)."""
    at = positions.clamp(0, table.shape[-1] - 1)
    return table[at] if table.dim() == 1 else table.gather(1, at)


def allowed_at(forced: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """(…, V) bool: at a forced position (``forced`` >= 0, shape (…)) its token alone, elsewhere
    the ``free`` tokens ((V,), or anything that broadcasts to (…, V)). No host read: the same work
    at every step."""
    point = torch.zeros(*forced.shape, free.shape[-1], dtype=torch.bool, device=forced.device)
    point.scatter_(-1, forced.clamp(min=0)[..., None], True)
    return torch.where((forced >= 0)[..., None], point, free)


def pin_drafts(drafts: torch.Tensor, draft_probs: torch.Tensor | None, forced: torch.Tensor, vocab_size: int):
    """``drafts`` (B, K) with the forced token put in where ``forced`` (B, K) is >= 0, and their
    laws ``draft_probs`` (B, K, V) or None with a point mass there: ``(drafts, draft_probs)``."""
    pinned = forced >= 0
    drafts = torch.where(pinned, forced, drafts)
    if draft_probs is not None:
        one_hot = torch.nn.functional.one_hot(drafts, vocab_size).to(draft_probs.dtype)
        draft_probs = torch.where(pinned[..., None], one_hot, draft_probs)
    return drafts, draft_probs


@dataclass(frozen=True)
class StepConstraints:
    """What a token model's compiled step knows of :class:`TokenConstraints`, hashable so that it
    can key the step's graphs: the positions the tables cover and the dtype of the per-position
    guidance scales (None: none). The tables themselves are the step's arguments
    (:meth:`TokenConstraints.tables`), so one graph serves every set of constraints of that shape."""

    num_tokens: int
    scale_dtype: torch.dtype | None = None

    def law(self, positions: torch.Tensor, forced: torch.Tensor, free: torch.Tensor, guidance: torch.Tensor | None):
        """At ``positions`` (R, L) of each model row, from that row's tables: the allowed tokens
        (R, L, V) bool and the guidance scales (R, L, 1) (None without per-position scales), as
        :meth:`TokenConstraints.allowed_mask` and :meth:`TokenConstraints.guidance_at` give them."""
        allowed = allowed_at(forced_at(forced, positions), free[:, None])
        return allowed, None if guidance is None else scales_at(guidance, positions)

    def example_tables(self, rows: int, vocab_size: int, device=None) -> tuple:
        """Tables of the shapes and dtypes :meth:`TokenConstraints.tables` gives (to compile a step
        before decoding)."""
        return (torch.full((rows, self.num_tokens), -1, dtype=torch.long, device=device),
                torch.ones(rows, vocab_size, dtype=torch.bool, device=device),
                None if self.scale_dtype is None else torch.ones(rows, self.num_tokens, dtype=self.scale_dtype,
                                                                  device=device))
