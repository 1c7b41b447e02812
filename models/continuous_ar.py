"""A causal continuous-token image model: LlamaGen's transformer with MAR's diffusion head.

Tokens are D-dimensional vectors (a KL autoencoder's latents on a grid), generated left to right
in raster order, one per position, with the static KV cache of :class:`LlamaGenGPT`: a token goes
in through a linear map instead of an embedding table (or, with ``input_codes`` K > 0, through a
soft code lookup, :class:`SoftCodeInput`), and the transformer's normalised output z at each
position conditions the diffusion head (:class:`DiffusionHead`), which draws the next token. This is the form in which CSpD runs as true left-to-right speculation through the one
engine (:func:`visualspec.core.continuous.decode_continuous`).

The token-model protocol is LlamaGen's (``prefill``, ``forward_window``, ``crop``, ``refill``,
``select``), returning z (…, dim) where LlamaGen returns logits.
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.continuous import Gaussian

from .diffusion_head import DiffusionHead
from .llamagen import LlamaGenGPT


class SoftCodeInput(nn.Module):
    """A continuous token in through a soft code lookup: ``softmax(mlp(x)) @ embedding``.

    ``mlp`` (D -> ``hidden`` -> K) scores K codes and ``embedding`` (K x dim) holds one vector per
    code. Started from a token model (:func:`visualspec.training.continuous.start_from_token_model`),
    the MLP is fitted to classify a latent into the token model's code for the same image patch and
    the embedding is that model's table, so the transformer sees the inputs it was trained on.
    """

    def __init__(self, token_dim: int, hidden: int, codes: int, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(token_dim, hidden), nn.GELU(), nn.Linear(hidden, codes))
        self.embedding = nn.Parameter(torch.randn(codes, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).softmax(-1) @ self.embedding


class ContinuousARTransformer(ModelMixin, ConfigMixin):
    """Raster-order continuous-token AR model: ``backbone`` (LlamaGen's transformer) and
    ``diffloss`` (MAR's head). ``token_dim`` is D; ``head_depth``, ``head_width``,
    ``num_sampling_steps`` and ``prediction_type`` (``"epsilon"`` as MAR, or ``"v_prediction"``)
    are the head's; ``input_codes`` K > 0 (with ``input_hidden``) takes tokens in through a soft
    lookup of K codes (:class:`SoftCodeInput`) instead of a linear map."""

    @register_to_config
    def __init__(
        self,
        token_dim: int = 16,
        dim: int = 256,
        n_layer: int = 6,
        n_head: int = 4,
        multiple_of: int = 64,
        norm_eps: float = 1e-5,
        model_type: str = "t2i",
        num_classes: int = 1000,
        caption_dim: int = 128,
        class_dropout_prob: float = 0.1,
        cls_token_num: int = 16,
        block_size: int = 256,
        prefix_rope: str = "identity",
        caption_positions: bool = True,
        head_depth: int = 3,
        head_width: int = 256,
        num_sampling_steps: int = 100,
        prediction_type: str = "epsilon",
        input_codes: int = 0,
        input_hidden: int = 128,
    ):
        super().__init__()
        self.backbone = LlamaGenGPT(
            vocab_size=1, dim=dim, n_layer=n_layer, n_head=n_head, multiple_of=multiple_of, norm_eps=norm_eps,
            model_type=model_type, num_classes=num_classes, caption_dim=caption_dim,
            class_dropout_prob=class_dropout_prob, cls_token_num=cls_token_num, block_size=block_size,
            prefix_rope=prefix_rope, caption_positions=caption_positions)
        self.backbone.tok_embeddings = (SoftCodeInput(token_dim, input_hidden, input_codes, dim) if input_codes
                                        else nn.Linear(token_dim, dim))  # continuous tokens in
        self.backbone.output = nn.Identity()  # z out: the head turns it into a token
        self.diffloss = DiffusionHead(token_dim, dim, head_depth, head_width, num_sampling_steps, prediction_type)

    @property
    def token_dim(self) -> int:
        return self.config.token_dim

    @property
    def grid_size(self) -> int:
        return self.backbone.grid_size

    @property
    def _float_dtype(self) -> torch.dtype:
        """The first floating-point parameter's type, as diffusers' ``dtype`` finds it, without its walk
        over every module (0.36 ms a call: too much for a decode step)."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    # the token-model protocol, returning z (the head's condition) instead of logits
    def prefill(self, prefix, max_new_tokens: int) -> torch.Tensor:
        return self.backbone.prefill(prefix, max_new_tokens)

    def refill(self, rows, prefix) -> torch.Tensor:
        return self.backbone.refill(rows, prefix)

    def forward_window(self, tokens: torch.Tensor, start) -> torch.Tensor:
        if tokens.ndim != 3 or tokens.shape[-1] != self.token_dim:
            raise ValueError(f"continuous tokens must be (B, L, {self.token_dim}), got {tuple(tokens.shape)}")
        return self.backbone.forward_window(tokens.to(self._float_dtype), start)

    def crop(self, lengths) -> None:
        self.backbone.crop(lengths)

    def select(self, rows) -> None:
        self.backbone.select(rows)

    def embed_condition(self, cond, drop=None):
        return self.backbone.embed_condition(cond, drop)

    def null_condition(self, batch_size: int):
        return self.backbone.null_condition(batch_size)

    def draw(self, z: torch.Tensor, noise: dict, temperature: float = 1.0,
             guidance: float = 1.0) -> tuple[torch.Tensor, Gaussian]:
        """Tokens (N, D) and their last-step Gaussians from z (N rows, or [cond; uncond] 2N rows
        with ``guidance`` != 1), with the given noise (``DiffusionHead.noise``)."""
        return self.diffloss.sample(z, noise, temperature=temperature, guidance=guidance)

    def forward(self, cond, tokens, cond_mask=None, drop_condition=None) -> torch.Tensor:
        """Teacher forcing: z (B, N, dim) for tokens (B, N, D), row i conditioning token i."""
        return self.backbone(cond, tokens.to(self.dtype), cond_mask, drop_condition)
