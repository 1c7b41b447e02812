"""A Chimera drafter: a trigram encoder, one full-context layer over the target's features, and
several residual heads that draft a few tokens in one pass.

Chimera (Zeng et al. 2024, arXiv 2402.15758) drafts from the target's last-layer representations
with a light model whose bottom layer captures short-range dependencies. Here, at column c:

- the **trigram encoder** reads the target's embeddings of x_{c-2}, x_{c-1}, x_c (3D wide), through
  a residual block ``t + SiLU(W t)`` and a projection to D: the last three tokens, without
  attention;
- the **full-context layer** is the EAGLE layer of
  :class:`visualspec.models.feature_drafter.FeatureDraftModel` (one pre-norm decoder layer with a
  key-value cache) over ``fc([trigram_c; f_{c-1}])``, where f_{c-1} is the target's feature of
  the column before; its output o_c predicts f_c;
- **K residual heads** each map ``[f_{c-1}; o_c]`` to ``o_c + W_i [f_{c-1}; o_c]`` (W_i starts at
  zero), and the target's own frozen LM head on head i gives the draft law of token c + 1 + i.

So one drafter pass after each verification drafts K tokens at once, where an EAGLE drafter runs
one pass per draft; head i does not see the drafts before it (as Medusa's heads), so deeper heads
accept less. The heads share the target's LM head instead of holding K copies of it, which keeps
the model small. The paper's heads read the target's last hidden state beside the fast layer's
output: at decode time the newest feature the target has given is f_{c-1}, so that is what they
read.
"""

from __future__ import annotations

import torch
from diffusers.configuration_utils import register_to_config
from torch import nn

from .feature_drafter import FeatureDraftModel


class _Residual(nn.Module):
    """``x + SiLU(W x)``: Chimera's residual block (Medusa's)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class ChimeraDraftModel(FeatureDraftModel):
    """The EAGLE layer with a trigram encoder in front and ``heads`` residual heads after.

    A pair's token part is the three embeddings of x_{c-2}, x_{c-1}, x_c concatenated (3D); the
    cache, compiled step, ragged rows and ``target_hash`` are the feature drafter's.
    """

    @register_to_config
    def __init__(self, feature_size: int = 256, n_head: int = 4, ffn_hidden: int = 768, max_len: int = 4096,
                 rope_base: float = 10000.0, norm_eps: float = 1e-6, target_hash: str = "", heads: int = 4):
        super().__init__(feature_size, n_head, ffn_hidden, max_len, rope_base, norm_eps, target_hash)
        if heads < 1:
            raise ValueError(f"a Chimera drafter needs at least one head, got heads={heads}")
        D = feature_size
        self.trigram = nn.Sequential(_Residual(3 * D), nn.Linear(3 * D, D))
        self.residual_heads = nn.ModuleList(nn.Linear(2 * D, D) for _ in range(heads))
        for head in self.residual_heads:  # each head starts as the fast layer's own prediction
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)

    @property
    def embedding_width(self) -> int:
        return 3 * self.config.feature_size

    def fuse(self, embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """``fc([trigram(e_{c-2}, e_{c-1}, e_c); f_{c-1}])``."""
        return self.fc(torch.cat([self.trigram(embeddings), features], -1))

    def head_features(self, features: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Head i's predicted feature for token c + 1 + i from a column's input feature f_{c-1}
        and output o_c (..., D) each: (..., K, D)."""
        x = torch.cat([features, out], -1)
        return out[..., None, :] + torch.stack([head(x) for head in self.residual_heads], -2)


def trigrams(tokens: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
    """Each column's last three tokens, ``(B, L) -> (B, L, 3)``: (x_{c-2}, x_{c-1}, x_c). ``before``
    (B, 2) are the two tokens before column 0; without them the first column stands in for them."""
    if before is None:
        before = tokens[:, :1].expand(-1, 2)
    full = torch.cat([before, tokens], 1)
    return torch.stack([full[:, :-2], full[:, 1:-1], full[:, 2:]], -1)
