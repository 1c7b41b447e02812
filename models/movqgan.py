"""SBER-MoVQGAN 270M, the image tokenizer of Lumina-mGPT 2.0, written for diffusers.

MoVQGAN (ai-forever, after "MoVQ: Modulating Quantized Vectors", Zheng et al. 2022) turns an image
into a grid of codes at 1/8 of its size, from a 16384-entry codebook of 4-dimensional vectors. The
encoder and the nearest-code quantiser (raw vectors, no L2 normalisation) are taming-transformers'
(:class:`visualspec.models.chameleon_vqgan.TamingEncoder`); the 270M model has ``ch`` 256,
``ch_mult`` (1, 2, 2, 4), 2 ResNet blocks per level, ``z_channels`` 4 and attention at nominal
size 32 (the lowest level of a 256 px image) besides the middle blocks.

The decoder is where MoVQ differs: every normalisation in it is a *spatial norm* conditioned on the
quantised latent ``zq`` (the code vectors, before ``post_quant_conv``). It group-normalises the
feature map ``f``, resizes ``zq`` to ``f``'s height and width (nearest neighbour), and returns
``GroupNorm(f) * conv_y(zq) + conv_b(zq)`` with 1x1 convolutions ``conv_y``, ``conv_b`` from the
code width to ``f``'s channels: a per-pixel scale and shift taken from the codes.

The checkpoint is ``movqgan_270M.ckpt`` from the Hugging Face repository ``ai-forever/MoVQGAN``
(the file Lumina-mGPT 2.0 downloads), a state dict of the ``MOVQ`` module under its own names
(``decoder.up.{i}.block.{j}.norm1.norm_layer.weight``, ``....norm1.conv_y.weight``, ...), which
:class:`MoVQGAN` keeps; :meth:`MoVQGAN.from_original` loads it strictly.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from .chameleon_vqgan import TamingDecoder, TamingEncoder, _Codebook, _refuse_l2_norm, read_original_weights
from .llamagen_vq import VQTokenizerMixin
from .checkpoints import load_state_dict_strict

__all__ = ["MoVQGAN", "SpatialNorm"]

#: Entries a MOVQ training checkpoint may hold besides the model: the loss (LPIPS network and
#: discriminator) and the LitEma shadow copies of each part.
MOVQ_TRAINING_PREFIXES = ("loss.", "ema_encoder.", "ema_decoder.", "ema_quantize.", "ema_quant_conv.",
                          "ema_post_quant_conv.")


class SpatialNorm(nn.Module):
    """``(f (B, c, H, W), zq (B, C, h, w)) -> GroupNorm(f) * conv_y(zq') + conv_b(zq')`` where
    ``zq'`` is ``zq`` resized to ``(H, W)`` by nearest-neighbour interpolation. ``norm_layer`` is an
    affine GroupNorm; ``conv_y`` and ``conv_b`` are 1x1 convs from ``C`` to ``c`` channels."""

    def __init__(self, channels: int, zq_channels: int, groups: int, eps: float):
        super().__init__()
        self.norm_layer = nn.GroupNorm(groups, channels, eps=eps, affine=True)
        self.conv_y = nn.Conv2d(zq_channels, channels, kernel_size=1)
        self.conv_b = nn.Conv2d(zq_channels, channels, kernel_size=1)

    def forward(self, f: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class _SpatialResnetBlock(nn.Module):
    """Taming's pre-activation ResNet block with both norms spatial: ``(x, zq) -> x' + h`` where
    ``h = conv2(dropout(SiLU(norm2(conv1(SiLU(norm1(x, zq))), zq))))`` and ``x'`` is ``x`` through
    the 1x1 ``nin_shortcut`` when the channel count changes."""

    def __init__(self, in_ch: int, out_ch: int, zq_channels: int, dropout: float, groups: int, eps: float):
        super().__init__()
        self.norm1 = SpatialNorm(in_ch, zq_channels, groups, eps)
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
        self.norm2 = SpatialNorm(out_ch, zq_channels, groups, eps)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size=3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, kernel_size=1) if in_ch != out_ch else None

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x, zq)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h, zq))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class _SpatialAttnBlock(nn.Module):
    """Single-head self-attention over all positions (1x1 ``q``, ``k``, ``v``, ``proj_out``, scale
    ``c ** -0.5``) after a spatial norm, with a residual: ``(x, zq) -> x + proj_out(attn)``."""

    def __init__(self, channels: int, zq_channels: int, groups: int, eps: float):
        super().__init__()
        self.norm = SpatialNorm(channels, zq_channels, groups, eps)
        self.q = nn.Conv2d(channels, channels, kernel_size=1)
        self.k = nn.Conv2d(channels, channels, kernel_size=1)
        self.v = nn.Conv2d(channels, channels, kernel_size=1)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        y = self.norm(x, zq)
        # (B, c, H, W) -> (B, 1, H*W, c): one head as wide as the feature map
        q, k, v = (t.flatten(2).transpose(1, 2).unsqueeze(1) for t in (self.q(y), self.k(y), self.v(y)))
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class MoVQGAN(VQTokenizerMixin, ModelMixin, ConfigMixin):
    r"""SBER-MoVQGAN: images ``(B, 3, H, W)`` in ``[-1, 1]`` <-> code grids ``(B, H/8, W/8)``.

    Args:
        codebook_size: number of codes ``K`` (``n_embed``, 16384).
        codebook_embed_dim: width ``C`` of a code vector (``embed_dim``, 4); also the channels the
            decoder's spatial norms read.
        codebook_l2_norm: must be False (the quantiser uses raw vectors); kept as a config field for
            the tokenizer interface.
        ch: base channel count (256 for the 270M model).
        ch_mult: channel multiplier per level; the downsample factor is ``2 ** (len(ch_mult) - 1)``.
        num_res_blocks: ResNet blocks per encoder level (the decoder has one more).
        z_channels: channels of the encoder output / decoder input (4).
        attn_resolutions: nominal sizes whose levels get attention ((32,)).
        resolution: nominal image size the levels' sizes are counted from (256).
        in_channels, out_channels: image channels (3).
        dropout: dropout in the ResNet blocks.
        norm_groups, norm_eps: GroupNorm groups and epsilon, plain and spatial norms alike (32, 1e-6).
    """

    @register_to_config
    def __init__(
        self,
        codebook_size: int = 16384,
        codebook_embed_dim: int = 4,
        codebook_l2_norm: bool = False,
        ch: int = 256,
        ch_mult: Sequence[int] = (1, 2, 2, 4),
        num_res_blocks: int = 2,
        z_channels: int = 4,
        attn_resolutions: Sequence[int] = (32,),
        resolution: int = 256,
        in_channels: int = 3,
        out_channels: int = 3,
        dropout: float = 0.0,
        norm_groups: int = 32,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        _refuse_l2_norm(codebook_l2_norm, "MoVQGAN")
        ch_mult, attn_resolutions = tuple(ch_mult), tuple(attn_resolutions)
        zq = codebook_embed_dim
        self.encoder = TamingEncoder(in_channels, ch, ch_mult, num_res_blocks, z_channels, attn_resolutions,
                                     resolution, dropout, norm_groups, norm_eps)
        self.decoder = TamingDecoder(
            z_channels, ch, ch_mult, num_res_blocks, out_channels, attn_resolutions, resolution,
            resnet=lambda i, o: _SpatialResnetBlock(i, o, zq, dropout, norm_groups, norm_eps),
            attention=lambda c: _SpatialAttnBlock(c, zq, norm_groups, norm_eps),
            norm=lambda c: SpatialNorm(c, zq, norm_groups, norm_eps),
        )
        self.quantize = _Codebook(codebook_size, codebook_embed_dim)
        self.quant_conv = nn.Conv2d(z_channels, codebook_embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(codebook_embed_dim, z_channels, kernel_size=1)

    def decode(self, latents: torch.Tensor, clamp: bool = False) -> torch.Tensor:
        """``(B, C, h, w)`` quantised latents -> ``(B, out_channels, 8h, 8w)`` images, nominally in
        ``[-1, 1]`` (clamped only if ``clamp``). The decoder reads ``post_quant_conv(latents)`` as its
        input and ``latents`` themselves in every spatial norm."""
        images = self.decoder(self.post_quant_conv(latents), latents)
        return images.clamp(-1.0, 1.0) if clamp else images

    @classmethod
    def from_original(cls, ckpt_path: str, **config) -> "MoVQGAN":
        """Load ``movqgan_270M.ckpt`` (a plain state dict, or one under ``"state_dict"``) strictly into
        a model built from ``config`` (defaults: the 270M model). Training-only entries (``loss.*``
        and the ``ema_*`` shadow copies) are left out; any other missing or unexpected entry raises
        a ValueError naming it."""
        state = read_original_weights(ckpt_path, MOVQ_TRAINING_PREFIXES)
        model = cls(**config)
        load_state_dict_strict(model, state, f"{ckpt_path} (loaded as MoVQGAN)")
        return model.eval()
