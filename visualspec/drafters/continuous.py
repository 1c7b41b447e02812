"""Drafting continuous tokens with a smaller continuous-token model (CSpD's draft)."""

from __future__ import annotations

import torch

from ..core.continuous import Gaussian, PositionNoise, head_rows
from ..core.sampling import SamplingConfig


class ContinuousDraftModelDrafter:
    """CSpD's draft: a smaller continuous-token model of the same token dimension, run
    autoregressively for ``gamma`` tokens with its own KV cache, each token drawn by its head with
    the position's shared noise (so its trajectory is aligned with the target's). It reports, per
    draft, the Gaussian of the head's last step it was drawn from; after verification its cache
    rolls back to the accepted prefix. ``prefix`` is the draft model's prefix for the rows."""

    def __init__(self, model, prefix):
        self.model, self.prefix = model, prefix
        self._forwards = 0

    @property
    def forwards(self) -> int:
        return self._forwards

    def start(self, batch_size: int, num_tokens: int, sampling: SamplingConfig) -> None:
        self.sampling = sampling
        self.model.prefill(self.prefix, num_tokens)
        self._forwards = 1
        self.consumed = torch.zeros(batch_size, dtype=torch.long)  # positions [0, consumed) are in the cache

    def _forward(self, tokens, start):
        self._forwards += 1
        return self.model.forward_window(self.sampling.model_batch(tokens), self.sampling.model_batch(start))

    def propose(self, tokens: torch.Tensor, n: torch.Tensor, k: int, noise: PositionNoise, temperature: float = 1.0):
        """``k`` drafts (B, k, D) after the committed ``tokens[b, :n[b]]`` and their Gaussians."""
        B, N, D = tokens.shape
        consumed = self.consumed.to(n.device)
        need = n - consumed  # >= 1: at least the last committed token
        index = (consumed[:, None] + torch.arange(int(need.max()), device=n.device)).clamp(max=N - 1)
        z = self._forward(tokens.gather(1, index[..., None].expand(-1, -1, D)), consumed)  # fillers after n-1
        z = z.gather(1, self.sampling.model_batch(need - 1)[:, None, None].expand(-1, 1, z.shape[-1]))
        drafts, means, stds = [], [], []
        for j in range(k):
            token, q = self.model.draw(head_rows(z, self.sampling), noise.at((n + j)[:, None]), temperature,
                                       self.sampling.guidance_scale)
            drafts.append(token)
            means.append(q.mean)
            stds.append(q.std)
            if j + 1 < k:
                z = self._forward(token[:, None], n + j)
        self.consumed = (n + k - 1).cpu()
        return torch.stack(drafts, 1), Gaussian(torch.stack(means, 1), torch.stack(stds, 1))

    def observe(self, n: torch.Tensor, committed: torch.Tensor) -> None:
        """Drafts at n .. n + committed - 2 were kept; the cache keeps the committed prefix's part."""
        self.consumed = torch.minimum(self.consumed, (n + committed - 1).cpu())
