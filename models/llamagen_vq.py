"""LlamaGen's VQ image tokenizer (VQ-16 / VQ-8), written for diffusers.

LlamaGen ("Autoregressive Model Beats Diffusion", Sun et al. 2024) turns an
image into a grid of discrete codes with a VQGAN-style convolutional
autoencoder and a 16384 x 8 codebook whose vectors (and the encoder outputs)
are L2-normalised before the nearest-code search.

This module re-implements that tokenizer so that

* the parameter and buffer names and shapes of :class:`LlamaGenVQModel` equal
  those of the official ``VQModel`` (``encoder.*``, ``decoder.*``,
  ``quantize.embedding.weight``, ``quantize.codebook_used``, ``quant_conv.*``,
  ``post_quant_conv.*``), so an official checkpoint's ``ckpt["model"]`` loads
  with ``load_state_dict(strict=True)``;
* the forward computation matches the official one, so real weights produce
  real images;
* the model is a diffusers ``ModelMixin``/``ConfigMixin`` and can be saved and
  loaded with ``save_pretrained``/``from_pretrained``.

Shape conventions used in the docstrings:

* ``B`` batch, ``H, W`` image size, ``h, w = H // f, W // f`` the code grid
  for the downsample factor ``f = 2 ** (len(ch_mult) - 1)`` (16 for VQ-16,
  8 for VQ-8);
* ``C = codebook_embed_dim`` (8), ``N = codebook_size`` (16384).

It also provides :func:`nearest_codes`, a chunked k-nearest-neighbour table
over a codebook (used by LANTERN-style relaxed acceptance).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from visualspec.core.checks import check_int

from .checkpoints import load_state_dict_strict, read_checkpoint

__all__ = ["LlamaGenVQModel", "nearest_codes", "LLAMAGEN_VQ_CONFIGS"]


#: Keyword arguments of :class:`LlamaGenVQModel` for the released tokenizers.
LLAMAGEN_VQ_CONFIGS: Dict[str, dict] = {
    "VQ-16": {"ch_mult": (1, 1, 2, 2, 4)},
    "VQ-8": {"ch_mult": (1, 2, 2, 4)},
}


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------


def _group_norm(channels: int, groups: int, eps: float) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=eps, affine=True)


class _ResnetBlock(nn.Module):
    """Pre-activation residual block: (GroupNorm, SiLU, 3x3 conv) twice.

    ``(B, in_ch, H, W) -> (B, out_ch, H, W)``. When the channel count changes,
    the skip path goes through a 1x1 conv named ``nin_shortcut``.
    """

    def __init__(self, in_ch: int, out_ch: int, dropout: float, groups: int, eps: float):
        super().__init__()
        self.norm1 = _group_norm(in_ch, groups, eps)
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
        self.norm2 = _group_norm(out_ch, groups, eps)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size=3, padding=1)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, kernel_size=1)
        else:
            self.nin_shortcut = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class _AttnBlock(nn.Module):
    """Single-head self-attention over all spatial positions, with a residual.

    ``(B, c, H, W) -> (B, c, H, W)``; queries, keys, values and the output
    projection are 1x1 convs, the softmax scale is ``c ** -0.5``.
    """

    def __init__(self, channels: int, groups: int, eps: float):
        super().__init__()
        self.norm = _group_norm(channels, groups, eps)
        self.q = nn.Conv2d(channels, channels, kernel_size=1)
        self.k = nn.Conv2d(channels, channels, kernel_size=1)
        self.v = nn.Conv2d(channels, channels, kernel_size=1)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        y = self.norm(x)
        # (B, c, H, W) -> (B, 1, H*W, c): one attention head of width c.
        q, k, v = (t.flatten(2).transpose(1, 2).unsqueeze(1) for t in (self.q(y), self.k(y), self.v(y)))
        out = F.scaled_dot_product_attention(q, k, v)  # default scale = c ** -0.5
        out = out.squeeze(1).transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class _Downsample(nn.Module):
    """Halve H and W: zero-pad one row/column at the bottom/right, then a
    3x3 stride-2 conv without padding. ``(B, c, H, W) -> (B, c, H/2, W/2)``."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0.0))


class _Upsample(nn.Module):
    """Double H and W: nearest-neighbour upsampling then a 3x3 conv.
    ``(B, c, H, W) -> (B, c, 2H, 2W)``."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: ``res`` blocks, each followed by the attention
    block of the same index when ``attn`` is non-empty, then an optional
    resampler (``downsample`` in the encoder, ``upsample`` in the decoder)."""

    def __init__(
        self,
        res: List[nn.Module],
        attn: List[nn.Module],
        resample_name: Optional[str] = None,
        resample: Optional[nn.Module] = None,
    ):
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)
        # The resampler is registered under its checkpoint name ("downsample"
        # or "upsample"); only that name is remembered here.
        self._resample_name = resample_name
        if resample_name is not None:
            self.add_module(resample_name, resample)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            x = block(x)
            if len(self.attn) > 0:
                x = self.attn[i](x)
        if self._resample_name is not None:
            x = getattr(self, self._resample_name)(x)
        return x


def _mid_blocks(channels: int, dropout: float, groups: int, eps: float) -> nn.ModuleList:
    """Middle of encoder/decoder: ResNet block, attention, ResNet block."""
    return nn.ModuleList(
        [
            _ResnetBlock(channels, channels, dropout, groups, eps),
            _AttnBlock(channels, groups, eps),
            _ResnetBlock(channels, channels, dropout, groups, eps),
        ]
    )


class _Encoder(nn.Module):
    """``(B, in_channels, H, W) -> (B, z_channels, H/f, W/f)``.

    Level ``i`` has ``num_res_blocks`` ResNet blocks with ``ch * ch_mult[i]``
    output channels; only the last (lowest-resolution) level has attention
    blocks, and every level but the last ends with a downsample.
    """

    def __init__(self, in_channels, ch, ch_mult, num_res_blocks, z_channels, dropout, groups, eps):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, kernel_size=3, padding=1)
        self.conv_blocks = nn.ModuleList()
        block_in = ch
        last = len(ch_mult) - 1
        for i_level, mult in enumerate(ch_mult):
            block_out = ch * mult
            res, attn = [], []
            for _ in range(num_res_blocks):
                res.append(_ResnetBlock(block_in, block_out, dropout, groups, eps))
                block_in = block_out
                if i_level == last:
                    attn.append(_AttnBlock(block_in, groups, eps))
            if i_level != last:
                self.conv_blocks.append(_Level(res, attn, "downsample", _Downsample(block_in)))
            else:
                self.conv_blocks.append(_Level(res, attn))
        self.mid = _mid_blocks(block_in, dropout, groups, eps)
        self.norm_out = _group_norm(block_in, groups, eps)
        self.conv_out = nn.Conv2d(block_in, z_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class _Decoder(nn.Module):
    """``(B, z_channels, h, w) -> (B, out_channels, h*f, w*f)``.

    Mirror of the encoder: ``conv_blocks[0]`` is the lowest resolution
    (``ch_mult[-1]``, with attention unless ``attention=False``), ``conv_blocks[-1]`` the highest
    (``ch_mult[0]``). Each level has ``num_res_blocks + 1`` ResNet blocks and
    every level but the last ends with an upsample.
    """

    def __init__(self, z_channels, ch, ch_mult, num_res_blocks, out_channels, dropout, groups, eps,
                 attention: bool = True):
        super().__init__()
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, kernel_size=3, padding=1)
        self.mid = _mid_blocks(block_in, dropout, groups, eps)
        self.conv_blocks = nn.ModuleList()
        top = len(ch_mult) - 1
        for i_level in reversed(range(len(ch_mult))):
            block_out = ch * ch_mult[i_level]
            res, attn = [], []
            for _ in range(num_res_blocks + 1):
                res.append(_ResnetBlock(block_in, block_out, dropout, groups, eps))
                block_in = block_out
                if i_level == top and attention:
                    attn.append(_AttnBlock(block_in, groups, eps))
            if i_level != 0:
                self.conv_blocks.append(_Level(res, attn, "upsample", _Upsample(block_in)))
            else:
                self.conv_blocks.append(_Level(res, attn))
        self.norm_out = _group_norm(block_in, groups, eps)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class _Quantizer(nn.Module):
    """Holds the codebook.

    ``embedding.weight`` is the ``(N, C)`` codebook; ``codebook_used`` is a
    float buffer holding the most recent code indices seen in training (a
    rolling window used to measure codebook usage). Both names match the
    official checkpoint.
    """

    def __init__(self, codebook_size: int, embed_dim: int, l2_norm: bool, usage_window: int):
        super().__init__()
        self.embedding = nn.Embedding(codebook_size, embed_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / codebook_size, 1.0 / codebook_size)
            if l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, p=2, dim=-1))
        self.register_buffer("codebook_used", torch.zeros(usage_window))


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class VQTokenizerMixin:
    """The image-tokenizer interface every VQ model here offers (LlamaGen's, Chameleon's VQGAN,
    MoVQGAN): codebook lookup, ``encode``, ``decode`` and ``decode_code``. It needs ``encoder``,
    ``quant_conv``, ``quantize.embedding``, ``post_quant_conv``, ``decoder`` and the config fields
    ``codebook_size``, ``codebook_embed_dim``, ``codebook_l2_norm`` and ``ch_mult``."""

    # -- basic properties -------------------------------------------------

    @property
    def downsample_factor(self) -> int:
        """Image pixels per code along each side: ``2 ** (len(ch_mult) - 1)``."""
        return 2 ** (len(self.config.ch_mult) - 1)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    def codebook_vectors(self) -> torch.Tensor:
        """The codebook as actually used for lookup: ``(N, C)``, L2-normalised
        when ``codebook_l2_norm`` is set, else the raw embedding weights."""
        weight = self.quantize.embedding.weight
        return F.normalize(weight, p=2, dim=-1) if self.config.codebook_l2_norm else weight

    # -- quantisation -----------------------------------------------------

    def _prepare_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``(B, C, h, w)`` pre-quantisation latents -> ``(B, h, w, C)``,
        L2-normalised along ``C`` when ``codebook_l2_norm``."""
        z = latents.permute(0, 2, 3, 1)
        return F.normalize(z, p=2, dim=-1) if self.config.codebook_l2_norm else z

    @staticmethod
    def _squared_distances(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
        """``(M, C), (N, C) -> (M, N)`` squared Euclidean distances."""
        return (
            z.pow(2).sum(dim=1, keepdim=True)
            + codebook.pow(2).sum(dim=1)[None, :]
            - 2.0 * z @ codebook.t()
        )

    def _nearest(self, z: torch.Tensor, codebook: torch.Tensor, chunk_size: int = 4096) -> torch.Tensor:
        """Index of the nearest code for each row: ``(M, C) -> (M,)`` long.
        Rows are processed in chunks to bound the ``(M, N)`` distance matrix;
        distances are computed in at least float32."""
        dtype = torch.promote_types(z.dtype, torch.float32)
        z, codebook = z.detach().to(dtype), codebook.detach().to(dtype)
        out = [self._squared_distances(part, codebook).argmin(dim=1) for part in z.split(chunk_size)]
        return torch.cat(out) if out else z.new_zeros(0, dtype=torch.long)

    def quantize_indices(self, latents: torch.Tensor) -> torch.Tensor:
        """Nearest-code indices for pre-quantisation latents.

        Args:
            latents: ``(B, C, h, w)`` output of ``quant_conv`` (not yet
                normalised).

        Returns:
            ``(B, h, w)`` long tensor: ``argmin_j ||z - e_j||^2`` where ``z`` and
            the codebook vectors ``e_j`` are L2-normalised when
            ``codebook_l2_norm``.
        """
        z = self._prepare_latents(latents)
        b, h, w, c = z.shape
        return self._nearest(z.reshape(-1, c), self.codebook_vectors()).view(b, h, w)

    def get_codebook_entry(
        self, indices: torch.Tensor, shape: Optional[Sequence[int]] = None
    ) -> torch.Tensor:
        """Look up code vectors.

        Args:
            indices: ``(B, h, w)`` or ``(B, h*w)`` code indices (any int dtype),
                or a flat ``(B*h*w,)`` tensor when ``shape`` is given.
            shape: optional ``[B, C, h, w]`` like LlamaGen's ``qzshape``; needed
                to unflatten non-square ``(B, h*w)`` grids. Without it a
                ``(B, L)`` input must have a square ``L``.

        Returns:
            ``(B, C, h, w)`` latents (L2-normalised code vectors when
            ``codebook_l2_norm``), ready for :meth:`decode`.
        """
        indices = indices.long()
        if shape is not None:
            b, c, h, w = (int(s) for s in shape)
            if c != self.config.codebook_embed_dim:
                raise ValueError(f"shape[1]={c} != codebook_embed_dim={self.config.codebook_embed_dim}")
            indices = indices.reshape(b, h, w)
        elif indices.dim() == 2:
            side = math.isqrt(indices.shape[1])
            if side * side != indices.shape[1]:
                raise ValueError(
                    f"cannot infer a square grid from {indices.shape[1]} codes; pass shape=[B, C, h, w]"
                )
            indices = indices.reshape(indices.shape[0], side, side)
        elif indices.dim() != 3:
            raise ValueError(f"indices must be (B, h, w) or (B, h*w), got {tuple(indices.shape)}")
        vectors = F.embedding(indices, self.codebook_vectors())  # (B, h, w, C)
        return vectors.permute(0, 3, 1, 2).contiguous()

    # -- encode / decode --------------------------------------------------

    def encode_latents(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, in_channels, H, W)`` images in ``[-1, 1]`` -> ``(B, C, h, w)``
        continuous pre-quantisation latents (encoder + ``quant_conv``)."""
        return self.quant_conv(self.encoder(images))

    def encode(self, images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Tokenise images.

        Args:
            images: ``(B, in_channels, H, W)`` in ``[-1, 1]``; ``H`` and ``W``
                divisible by :attr:`downsample_factor`.

        Returns:
            ``(quantized, indices)``: ``(B, C, h, w)`` code vectors (exactly
            ``get_codebook_entry(indices)``) and ``(B, h, w)`` long indices.
        """
        indices = self.quantize_indices(self.encode_latents(images))
        return self.get_codebook_entry(indices), indices

    def decode(self, latents: torch.Tensor, clamp: bool = False) -> torch.Tensor:
        """``(B, C, h, w)`` quantised latents -> ``(B, out_channels, h*f, w*f)``
        images, nominally in ``[-1, 1]``. Not clamped unless ``clamp=True``
        (the raw output keeps gradients, as in training)."""
        images = self.decoder(self.post_quant_conv(latents))
        return images.clamp(-1.0, 1.0) if clamp else images

    def decode_code(
        self,
        indices: torch.Tensor,
        shape: Optional[Sequence[int]] = None,
        clamp: bool = False,
    ) -> torch.Tensor:
        """Code indices ``(B, h*w)`` or ``(B, h, w)`` (optional LlamaGen-style
        ``shape=[B, C, h, w]``) -> images ``(B, out_channels, h*f, w*f)``.
        Same as ``decode(get_codebook_entry(indices, shape))``."""
        return self.decode(self.get_codebook_entry(indices, shape), clamp=clamp)



class LlamaGenVQModel(VQTokenizerMixin, ModelMixin, ConfigMixin):
    r"""LlamaGen VQ tokenizer: images ``(B, 3, H, W)`` in ``[-1, 1]`` <-> code
    grids ``(B, H/f, W/f)`` of indices into an ``N``-entry codebook.

    Args:
        codebook_size: number of codes ``N`` (16384).
        codebook_embed_dim: width ``C`` of a code vector (8).
        codebook_l2_norm: L2-normalise both the encoder output and the codebook
            vectors before the nearest-code search and lookup (True for all
            released LlamaGen tokenizers).
        ch: base channel count of encoder and decoder.
        ch_mult: channel multiplier per resolution level; the downsample factor
            is ``2 ** (len(ch_mult) - 1)``. ``(1, 1, 2, 2, 4)`` is VQ-16,
            ``(1, 2, 2, 4)`` is VQ-8.
        z_channels: channels of the encoder output / decoder input.
        num_res_blocks: ResNet blocks per encoder level (the decoder uses one
            more per level).
        in_channels: image channels fed to the encoder.
        out_channels: image channels produced by the decoder.
        dropout: dropout probability inside the ResNet blocks.
        norm_groups: number of GroupNorm groups (32 in LlamaGen).
        norm_eps: GroupNorm epsilon (1e-6 in LlamaGen).
        commit_loss_beta: weight of the commitment loss (training only).
        entropy_loss_ratio: weight of the codebook entropy loss (0 disables it).
        codebook_usage_window: length of the ``quantize.codebook_used`` buffer
            (65536 in the official checkpoints; must match to load them).
    """

    config_name = "config.json"

    @register_to_config
    def __init__(
        self,
        codebook_size: int = 16384,
        codebook_embed_dim: int = 8,
        codebook_l2_norm: bool = True,
        ch: int = 128,
        ch_mult: Sequence[int] = (1, 1, 2, 2, 4),
        z_channels: int = 256,
        num_res_blocks: int = 2,
        in_channels: int = 3,
        out_channels: int = 3,
        dropout: float = 0.0,
        norm_groups: int = 32,
        norm_eps: float = 1e-6,
        commit_loss_beta: float = 0.25,
        entropy_loss_ratio: float = 0.0,
        codebook_usage_window: int = 65536,
    ):
        super().__init__()
        ch_mult = tuple(int(m) for m in ch_mult)
        self.encoder = _Encoder(
            in_channels, ch, ch_mult, num_res_blocks, z_channels, dropout, norm_groups, norm_eps
        )
        self.decoder = _Decoder(
            z_channels, ch, ch_mult, num_res_blocks, out_channels, dropout, norm_groups, norm_eps
        )
        self.quantize = _Quantizer(codebook_size, codebook_embed_dim, codebook_l2_norm, codebook_usage_window)
        self.quant_conv = nn.Conv2d(z_channels, codebook_embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(codebook_embed_dim, z_channels, kernel_size=1)

    # -- training ---------------------------------------------------------

    def _entropy_loss(self, z_flat: torch.Tensor, codebook: torch.Tensor, temperature: float = 0.01):
        """Per-sample entropy minus entropy of the mean code distribution,
        with code probabilities ``softmax(-distance / temperature)``."""
        logits = -self._squared_distances(z_flat.float(), codebook.float()) / temperature
        log_probs = F.log_softmax(logits, dim=-1)
        probs = log_probs.exp()
        sample_entropy = -(probs * log_probs).sum(dim=-1).mean()
        mean_probs = probs.mean(dim=0)
        mean_entropy = -(mean_probs * torch.log(mean_probs + 1e-5)).sum()
        return sample_entropy - mean_entropy

    def _record_usage(self, indices: torch.Tensor) -> None:
        """Push the newest indices into the rolling ``codebook_used`` window."""
        flat = indices.reshape(-1).to(self.quantize.codebook_used.dtype)
        used = self.quantize.codebook_used
        n = min(flat.numel(), used.numel())
        if n == 0:
            return
        with torch.no_grad():
            used.copy_(torch.cat([used[n:], flat[-n:]]))

    def codebook_usage(self) -> float:
        """Fraction of the codebook among the indices recorded in training
        (a new model's zero-filled window counts as code 0 only)."""
        return torch.unique(self.quantize.codebook_used).numel() / self.config.codebook_size

    def forward(
        self, images: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        """Reconstruct images through the quantiser (straight-through estimator).

        Args:
            images: ``(B, in_channels, H, W)`` in ``[-1, 1]``.

        Returns:
            ``(reconstruction, indices, losses)``: ``(B, out_channels, H, W)``
            unclamped reconstruction, ``(B, h, w)`` long indices, and a dict
            with scalar tensors ``codebook_loss`` (``mean((e - sg[z])^2)``,
            trains the codebook), ``commitment_loss``
            (``beta * mean((sg[e] - z)^2)``, trains the encoder) and
            ``entropy_loss`` (``entropy_loss_ratio`` times the entropy loss; 0
            when disabled). ``z`` is the (normalised) encoder latent and ``e``
            its nearest code vector. The caller adds the reconstruction /
            perceptual / adversarial losses.
        """
        z = self._prepare_latents(self.encode_latents(images))  # (B, h, w, C)
        b, h, w, c = z.shape
        codebook = self.codebook_vectors()
        indices = self._nearest(z.reshape(-1, c), codebook).view(b, h, w)
        z_q = F.embedding(indices, codebook)  # (B, h, w, C), differentiable w.r.t. the codebook

        losses = {
            "codebook_loss": F.mse_loss(z_q, z.detach()),
            "commitment_loss": self.config.commit_loss_beta * F.mse_loss(z, z_q.detach()),
        }
        if self.config.entropy_loss_ratio > 0:
            losses["entropy_loss"] = self.config.entropy_loss_ratio * self._entropy_loss(z.reshape(-1, c), codebook)
        else:
            losses["entropy_loss"] = z.new_zeros(())
        if self.training:
            self._record_usage(indices)

        z_st = z + (z_q - z).detach()  # value of z_q, gradient of z
        reconstruction = self.decode(z_st.permute(0, 3, 1, 2))
        return reconstruction, indices, losses

    # -- official checkpoints --------------------------------------------

    @classmethod
    def from_llamagen_checkpoint(
        cls, path: str, variant: str = "VQ-16", key: Optional[str] = None, **config
    ) -> "LlamaGenVQModel":
        """Build ``variant`` ("VQ-16" or "VQ-8") and load an official LlamaGen
        tokenizer checkpoint with ``strict=True`` (file layouts: see
        :func:`visualspec.models.checkpoints.read_checkpoint`).
        Extra keyword arguments override the config.
        """
        if variant not in LLAMAGEN_VQ_CONFIGS:
            raise ValueError(f"unknown VQ variant {variant!r}; choose one of {sorted(LLAMAGEN_VQ_CONFIGS)}")
        state_dict = read_checkpoint(path, key)
        model = cls(**{**LLAMAGEN_VQ_CONFIGS[variant], **config})
        load_state_dict_strict(model, state_dict, f"{path} (loaded as {variant})")
        return model.eval()


# ---------------------------------------------------------------------------
# Codebook neighbourhoods
# ---------------------------------------------------------------------------


def nearest_codes(
    codebook: torch.Tensor,
    k: int,
    l2_normalize: bool = False,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """The ``k`` nearest *other* codes of every code, by Euclidean distance.

    Distances are computed in float64, ``chunk_size`` rows at a time, so the
    peak temporary is ``(chunk_size, N)`` rather than ``(N, N)``.

    Args:
        codebook: ``(N, C)`` code vectors.
        k: neighbours per code, ``1 <= k <= N - 1``.
        l2_normalize: L2-normalise the vectors first (use True for LlamaGen's
            raw ``quantize.embedding.weight``, or pass
            :meth:`LlamaGenVQModel.codebook_vectors`, which is already
            normalised).
        chunk_size: rows per distance block.

    Returns:
        ``(N, k)`` int64 tensor on ``codebook``'s device; row ``i`` lists the
        neighbours of code ``i`` from nearest to farthest and never contains
        ``i`` itself. Callers may cast to a smaller int dtype.
    """
    if codebook.dim() != 2:
        raise ValueError(f"codebook must be (N, C), got {tuple(codebook.shape)}")
    n = codebook.shape[0]
    check_int("k", k, 1, high=n - 1)
    vectors = codebook.detach().to(torch.float64)
    if l2_normalize:
        vectors = F.normalize(vectors, p=2, dim=-1)
    sq_norms = vectors.pow(2).sum(dim=1)
    out = torch.empty(n, k, dtype=torch.long, device=codebook.device)
    for start in range(0, n, chunk_size):
        rows = vectors[start : start + chunk_size]
        m = rows.shape[0]
        dist = sq_norms[start : start + m, None] + sq_norms[None, :] - 2.0 * rows @ vectors.t()
        self_idx = torch.arange(start, start + m, device=codebook.device)
        dist[torch.arange(m, device=codebook.device), self_idx] = float("inf")
        out[start : start + m] = dist.topk(k, dim=1, largest=False, sorted=True).indices
    return out
