"""Jacobi self-drafting (Speculative Jacobi Decoding) and coupled Jacobi drafts."""

from __future__ import annotations

import torch

from ..core.engine import Drafter
from ..core.rows import per_row
from ..core.sampling import Generator, sample, uniform
from ..core.verify import point_mass, residual

INIT_SCHEMES = ("random", "repeat_left", "repeat_above")


def coupled_redraft(drafts: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                    generator: Generator = None) -> torch.Tensor:
    """Maximal coupling of each old draft x ~ q with a new draw from p (SCD, "speculative coupled
    decoding"): keep x with probability ``min(1, p(x) / q(x))``, else draw from the residual
    ``norm(max(p - q, 0))``. The result has law exactly p, and equals x with probability
    ``sum min(p, q)``, the largest any coupling of q and p allows, so when p barely moved the draft
    stays. ``drafts`` (B, K), ``draft_probs`` (B, K, V) or None (point masses), ``target_probs``
    (B, K, V) -> (B, K) long.
    """
    if drafts.shape[1] == 0:
        return drafts
    q = point_mass(drafts, target_probs.shape[-1]) if draft_probs is None else draft_probs
    q_x = q.gather(-1, drafts[..., None])[..., 0].double()
    p_x = target_probs.gather(-1, drafts[..., None])[..., 0].double()
    u = uniform(drafts.shape, generator, device=drafts.device)
    keep = (q_x > 0) & (u * q_x < p_x)
    return torch.where(keep, drafts, sample(residual(target_probs, q), generator))


class JacobiDrafter(Drafter):
    """Jacobi self-drafting, as in Speculative Jacobi Decoding (Teng et al. 2024).

    Each step the target predicts every position of its window at once. After verification, the
    target's samples at the positions past each row's committed ones become the next drafts, with
    draft distribution q = the target's distribution there in that iteration: this is SJD's
    probabilistic Jacobi criterion when verified by :func:`visualspec.core.verify.speculative_verify`.
    With ``coupling=True`` the next draft at a position that already held a draft is the maximal
    coupling of that draft with the new distribution (:func:`coupled_redraft`), so it stays where
    the distribution barely changed; its law, and so its q, is still the new distribution, which
    keeps verification lossless. Positions nobody has predicted yet are filled by an
    initialisation scheme and are point masses:

    - ``random``: uniform over the vocabulary (or ``init_vocab``: token ids ``[lo, hi)``),
    - ``repeat_left``: the token one position to the left,
    - ``repeat_above``: the token one row above in a ``grid_width``-wide image (vertical repeat;
      the first row repeats left).
    """

    carries_drafts = True

    def __init__(self, vocab_size: int, init: str = "random", grid_width: int | None = None,
                 init_vocab: tuple[int, int] | None = None, coupling: bool = False):
        if init not in INIT_SCHEMES:
            raise ValueError(f"unknown Jacobi init scheme {init!r}; choose one of {INIT_SCHEMES}")
        if init == "repeat_above" and not grid_width:
            raise ValueError("init='repeat_above' needs grid_width (tokens per image row)")
        self.vocab_size = vocab_size
        self.init = init
        self.grid_width = grid_width
        self.init_vocab = init_vocab or (0, vocab_size)
        self.coupling = coupling

    def cost_tag(self):
        return type(self).__name__ + ("+coupling" if self.coupling else "")

    def start(self, batch_size, num_tokens, sampling):
        self.sampling = sampling
        self.carried = None  # (B, C) tokens predicted by the target past each row's committed prefix
        self.carried_probs = None  # (B, C, V) the distributions they were sampled from
        self.count = torch.zeros(batch_size, dtype=torch.long)  # valid carried tokens per row
        self.proposed = None  # (drafts, q) of the latest proposal, for coupling

    def propose(self, tokens, n, k, generator=None):
        B, device = tokens.shape[0], tokens.device
        n = per_row(n, B, device)
        offsets = torch.arange(k, device=device)
        count = self.count.to(device)
        carried = (offsets[None] < count[:, None]) if self.carried is not None else offsets[None].expand(B, k) < 0
        from_carry = tokens.new_zeros(B, k)
        if self.carried is not None:
            index = offsets.clamp(max=self.carried.shape[1] - 1)[None].expand(B, k)
            from_carry = self.carried.gather(1, index)
        if self.init == "random":  # k draws per row, whatever it carries
            lo, hi = self.init_vocab
            u = uniform((B, k), generator, device=device)
            fresh = (lo + (u * (hi - lo)).long().clamp(max=hi - lo - 1)).to(tokens.dtype)
            drafts = torch.where(carried, from_carry, fresh)
        else:
            drafts = self._repeat(tokens, n[:, None] + offsets, carried, from_carry)
        q = None
        if self.carried is not None and bool(carried.any()):
            index = offsets.clamp(max=self.carried.shape[1] - 1)[None, :, None].expand(B, k, self.vocab_size)
            q = torch.where(carried[..., None], self.carried_probs.gather(1, index), point_mass(drafts, self.vocab_size))
        self.proposed = (drafts, q)
        return drafts, q

    def _repeat(self, tokens, pos, carried, from_carry):
        """Drafts at positions ``pos`` (B, k) by ``repeat_left`` / ``repeat_above``: a carried
        position keeps its carried token, a fresh one copies its source position (one to the left,
        or one image row up), which may itself be a fresh position of this window. Sources are
        followed to their end by pointer jumping (log2 k gathers, no loop over the window)."""
        B, k = pos.shape
        if self.init == "repeat_above":
            src = torch.where(pos >= self.grid_width, pos - self.grid_width, pos - 1)
        else:
            src = pos - 1
        length = tokens.shape[1] + k  # room for window positions past the end (fillers)
        values = torch.cat([tokens, tokens.new_zeros(B, k)], dim=1).scatter(1, pos, from_carry)
        pointer = torch.arange(length, device=pos.device).expand(B, length).clone()
        pointer.scatter_(1, pos, torch.where(carried, pos, src.clamp(min=0)))
        for _ in range(k.bit_length()):  # 2 ** rounds > k, the longest chain
            pointer = pointer.gather(1, pointer)
        return values.gather(1, pointer.gather(1, pos))

    def observe(self, n, committed, target_probs, generator=None):
        # target_probs[:, j] is the target's distribution at position n + j; keep, per row, the
        # ones past its committed prefix, with a fresh (or coupled) sample from each (the Jacobi update)
        B, K1, V = target_probs.shape
        committed = per_row(committed, B, target_probs.device)
        new = self.sampling.draw(target_probs, generator)
        if self.coupling and not self.sampling.greedy and self.proposed is not None and K1 > 1:
            drafts, q = self.proposed
            new[:, :K1 - 1] = coupled_redraft(drafts, q, target_probs[:, :K1 - 1], generator)
        index = (committed[:, None] + torch.arange(K1, device=new.device)).clamp(max=K1 - 1)
        self.carried = new.gather(1, index)
        self.carried_probs = target_probs.gather(1, index[..., None].expand(B, K1, V))
        self.count = (K1 - committed).clamp(min=0).cpu()
        self.proposed = None

    def select(self, rows):
        self.count = self.count[rows.cpu()]
        if self.carried is not None:
            self.carried, self.carried_probs = self.carried[rows], self.carried_probs[rows]

    def reset(self, rows, requests):
        self.count[rows.cpu()] = 0
