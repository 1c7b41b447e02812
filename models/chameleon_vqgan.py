"""Meta Chameleon's image tokenizer, the VQGAN that Lumina-mGPT (1.0) also uses, written for diffusers.

Chameleon (Meta, 2024) turns a 512 x 512 image into a 32 x 32 grid of codes from an 8192-entry
codebook of 256-dimensional vectors. The tokenizer is a taming-transformers VQGAN: a convolutional
encoder with 16x downsampling (``ch`` 128, ``ch_mult`` (1, 1, 2, 2, 4), 2 ResNet blocks per level,
self-attention only in the middle blocks), a plain nearest-code quantiser (raw vectors, no L2
normalisation) and a mirrored decoder. The checkpoint is Meta's ``tokenizer/vqgan.ckpt`` (a torch
pickle whose ``"state_dict"`` holds the model under the taming parameter names, plus the training
loss's ``loss.*`` entries), described by ``tokenizer/vqgan.yaml`` (``model.params.ddconfig``,
``n_embed``, ``embed_dim``); :meth:`ChameleonVQGAN.from_original` reads both.

:class:`ChameleonVQGAN` keeps the taming names (``encoder.down.{i}.block.{j}``, ``encoder.mid.block_1``,
``decoder.up.{i}`` with level 0 at full resolution, ``quantize.embedding.weight``, ``quant_conv``,
``post_quant_conv``), so the file loads strictly without renaming, and it takes the tokenizer
interface of LlamaGen's VQ model (:class:`visualspec.models.llamagen_vq.VQTokenizerMixin`:
``encode``, ``decode_code``, ``codebook_vectors``, ``downsample_factor``, ...), so the unified
pipeline can use either.

The pieces shared with SBER-MoVQGAN (:mod:`visualspec.models.movqgan`, whose encoder is the same
taming encoder) live here too: :class:`TamingEncoder`, :class:`TamingDecoder` (its blocks given by
the caller) and :func:`read_original_weights`.
"""

from __future__ import annotations

import os
import pickle
from typing import Callable, Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from .checkpoints import load_state_dict_strict, read_checkpoint
from .llamagen_vq import VQTokenizerMixin, _AttnBlock, _Downsample, _ResnetBlock, _Upsample

__all__ = ["ChameleonVQGAN", "TamingEncoder", "TamingDecoder", "read_original_weights"]

#: Entries of ``vqgan.ckpt`` that belong to training only (LPIPS network and discriminator).
CHAMELEON_TRAINING_PREFIXES = ("loss.",)


# ---------------------------------------------------------------------------
# Encoder and decoder (taming-transformers layout)
# ---------------------------------------------------------------------------


class _Stage(nn.Module):
    """One resolution level under the taming names: ResNet blocks ``block.{j}``, each followed by
    ``attn.{j}`` when the level has attention, then an optional resampler registered as
    ``downsample`` or ``upsample``. Extra arguments of ``forward`` (MoVQ's quantised latent) go to
    every block and attention, not to the resampler."""

    def __init__(self, blocks, attns, resample_name: Optional[str] = None, resample: Optional[nn.Module] = None):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attns)
        self._resample_name = resample_name
        if resample_name is not None:
            self.add_module(resample_name, resample)

    def forward(self, x: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        for j, block in enumerate(self.block):
            x = block(x, *cond)
            if len(self.attn) > 0:
                x = self.attn[j](x, *cond)
        if self._resample_name is not None:
            x = getattr(self, self._resample_name)(x)
        return x


class _Middle(nn.Module):
    """``block_1`` (ResNet), ``attn_1`` (attention), ``block_2`` (ResNet) at the lowest resolution."""

    def __init__(self, block_1: nn.Module, attn_1: nn.Module, block_2: nn.Module):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = block_1, attn_1, block_2

    def forward(self, x: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x, *cond), *cond), *cond)


class TamingEncoder(nn.Module):
    """``(B, in_channels, H, W) -> (B, z_channels, H/f, W/f)`` with ``f = 2 ** (len(ch_mult) - 1)``.

    Level ``i`` has ``num_res_blocks`` ResNet blocks of ``ch * ch_mult[i]`` channels, with attention
    after each when that level's nominal size (``resolution / 2**i``) is in ``attn_resolutions``;
    every level but the last ends with a stride-2 convolution. Then ResNet, attention, ResNet, and
    GroupNorm, SiLU, 3x3 conv to ``z_channels``.
    """

    def __init__(self, in_channels: int, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int,
                 attn_resolutions: Sequence[int], resolution: int, dropout: float, groups: int, eps: float):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, kernel_size=3, padding=1)
        self.down = nn.ModuleList()
        block_in, size = ch, resolution
        for i, mult in enumerate(ch_mult):
            blocks, attns = [], []
            for _ in range(num_res_blocks):
                blocks.append(_ResnetBlock(block_in, ch * mult, dropout, groups, eps))
                block_in = ch * mult
                if size in attn_resolutions:
                    attns.append(_AttnBlock(block_in, groups, eps))
            if i < len(ch_mult) - 1:
                self.down.append(_Stage(blocks, attns, "downsample", _Downsample(block_in)))
                size //= 2
            else:
                self.down.append(_Stage(blocks, attns))
        self.mid = _Middle(_ResnetBlock(block_in, block_in, dropout, groups, eps), _AttnBlock(block_in, groups, eps),
                           _ResnetBlock(block_in, block_in, dropout, groups, eps))
        self.norm_out = nn.GroupNorm(groups, block_in, eps=eps)
        self.conv_out = nn.Conv2d(block_in, z_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for stage in self.down:
            h = stage(h)
        h = self.mid(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class TamingDecoder(nn.Module):
    """``(B, z_channels, h, w) [, cond] -> (B, out_channels, h*f, w*f)``: the encoder mirrored.

    ``up.{i}`` is level ``i`` counted from full resolution (as in the checkpoints), run from the
    lowest level up; each has ``num_res_blocks + 1`` ResNet blocks of ``ch * ch_mult[i]`` channels,
    attention where the nominal size is in ``attn_resolutions``, and all but level 0 end with a
    nearest-neighbour 2x upsample and a 3x3 conv. The blocks come from the caller:
    ``resnet(in_ch, out_ch)``, ``attention(ch)`` and ``norm(ch)`` (the final norm); whatever extra
    tensors ``forward`` gets (MoVQ's quantised latent) are passed to every one of them.
    """

    def __init__(self, z_channels: int, ch: int, ch_mult: Sequence[int], num_res_blocks: int, out_channels: int,
                 attn_resolutions: Sequence[int], resolution: int, resnet: Callable[[int, int], nn.Module],
                 attention: Callable[[int], nn.Module], norm: Callable[[int], nn.Module]):
        super().__init__()
        levels = len(ch_mult)
        block_in, size = ch * ch_mult[-1], resolution // 2 ** (levels - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, kernel_size=3, padding=1)
        self.mid = _Middle(resnet(block_in, block_in), attention(block_in), resnet(block_in, block_in))
        stages = {}
        for i in reversed(range(levels)):
            blocks, attns = [], []
            for _ in range(num_res_blocks + 1):
                blocks.append(resnet(block_in, ch * ch_mult[i]))
                block_in = ch * ch_mult[i]
                if size in attn_resolutions:
                    attns.append(attention(block_in))
            if i > 0:
                stages[i] = _Stage(blocks, attns, "upsample", _Upsample(block_in))
                size *= 2
            else:
                stages[i] = _Stage(blocks, attns)
        self.up = nn.ModuleList(stages[i] for i in range(levels))
        self.norm_out = norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, padding=1)

    def forward(self, z: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z), *cond)
        for stage in reversed(self.up):
            h = stage(h, *cond)
        return self.conv_out(F.silu(self.norm_out(h, *cond)))


class _Codebook(nn.Module):
    """``embedding.weight``: the ``(K, C)`` code vectors (the taming quantiser's only state)."""

    def __init__(self, codebook_size: int, embed_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(codebook_size, embed_dim)


def _refuse_l2_norm(codebook_l2_norm: bool, name: str) -> None:
    if codebook_l2_norm:
        raise ValueError(f"{name}'s quantiser compares raw code vectors; codebook_l2_norm must be False")


# ---------------------------------------------------------------------------
# Reading original checkpoints
# ---------------------------------------------------------------------------


def read_original_weights(path: str, drop_prefixes: Sequence[str],
                          key: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """The tensors of an original checkpoint (``torch.load(..., weights_only=True)``), taken from
    ``ckpt[key]`` (or the first of ``"model"``, ``"ema"``, ``"module"``, ``"state_dict"``, or the
    file itself when it is a plain state dict), without the entries whose names start with one of
    ``drop_prefixes`` (training-only state)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint file at {path!r}")
    try:
        state = read_checkpoint(path, key)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path} holds objects that torch.load(weights_only=True) refuses to unpickle; "
                         f"re-save just its state dict ({err})") from err
    return {k: v for k, v in state.items() if not k.startswith(tuple(drop_prefixes))}


def chameleon_config_from_yaml(path: str) -> dict:
    """Keyword arguments of :class:`ChameleonVQGAN` from Chameleon's ``vqgan.yaml``
    (``model.params``: ``n_embed``, ``embed_dim`` and ``ddconfig``)."""
    import yaml  # installed with transformers

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no VQGAN config file at {path!r}")
    with open(path) as f:
        config = yaml.safe_load(f)
    try:
        params = config["model"]["params"]
        dd = params["ddconfig"]
        out = dict(codebook_size=params["n_embed"], codebook_embed_dim=params["embed_dim"], ch=dd["ch"],
                   ch_mult=tuple(dd["ch_mult"]), num_res_blocks=dd["num_res_blocks"], z_channels=dd["z_channels"],
                   attn_resolutions=tuple(dd.get("attn_resolutions") or ()), resolution=dd["resolution"],
                   in_channels=dd.get("in_channels", 3), out_channels=dd.get("out_ch", 3),
                   dropout=dd.get("dropout", 0.0))
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a taming VQGAN config (model.params.ddconfig, n_embed, embed_dim): "
                         f"missing {err}") from err
    if dd.get("double_z", False):
        raise ValueError(f"{path}: ddconfig.double_z is true, which is a KL autoencoder, not a VQGAN")
    if dd.get("attn_type", "vanilla") != "vanilla":
        raise ValueError(f"{path}: attn_type {dd['attn_type']!r} is not supported (only 'vanilla')")
    return out


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class ChameleonVQGAN(VQTokenizerMixin, ModelMixin, ConfigMixin):
    r"""Chameleon's VQGAN: images ``(B, 3, H, W)`` in ``[-1, 1]`` <-> code grids ``(B, H/16, W/16)``.

    Args:
        codebook_size: number of codes ``K`` (``n_embed``, 8192).
        codebook_embed_dim: width ``C`` of a code vector (``embed_dim``, 256).
        codebook_l2_norm: must be False (the quantiser uses raw vectors); kept as a config field for
            the tokenizer interface.
        ch: base channel count (128).
        ch_mult: channel multiplier per level; the downsample factor is ``2 ** (len(ch_mult) - 1)``.
        num_res_blocks: ResNet blocks per encoder level (the decoder has one more).
        z_channels: channels of the encoder output / decoder input (256).
        attn_resolutions: nominal sizes whose levels get attention (none in Chameleon: only the
            middle blocks attend).
        resolution: nominal image size the levels' sizes are counted from (512).
        in_channels, out_channels: image channels (3).
        dropout: dropout in the ResNet blocks.
        norm_groups, norm_eps: GroupNorm groups and epsilon (32, 1e-6).
    """

    @register_to_config
    def __init__(
        self,
        codebook_size: int = 8192,
        codebook_embed_dim: int = 256,
        codebook_l2_norm: bool = False,
        ch: int = 128,
        ch_mult: Sequence[int] = (1, 1, 2, 2, 4),
        num_res_blocks: int = 2,
        z_channels: int = 256,
        attn_resolutions: Sequence[int] = (),
        resolution: int = 512,
        in_channels: int = 3,
        out_channels: int = 3,
        dropout: float = 0.0,
        norm_groups: int = 32,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        _refuse_l2_norm(codebook_l2_norm, "Chameleon's VQGAN")
        ch_mult, attn_resolutions = tuple(ch_mult), tuple(attn_resolutions)
        self.encoder = TamingEncoder(in_channels, ch, ch_mult, num_res_blocks, z_channels, attn_resolutions,
                                     resolution, dropout, norm_groups, norm_eps)
        self.decoder = TamingDecoder(
            z_channels, ch, ch_mult, num_res_blocks, out_channels, attn_resolutions, resolution,
            resnet=lambda i, o: _ResnetBlock(i, o, dropout, norm_groups, norm_eps),
            attention=lambda c: _AttnBlock(c, norm_groups, norm_eps),
            norm=lambda c: nn.GroupNorm(norm_groups, c, eps=norm_eps),
        )
        self.quantize = _Codebook(codebook_size, codebook_embed_dim)
        self.quant_conv = nn.Conv2d(z_channels, codebook_embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(codebook_embed_dim, z_channels, kernel_size=1)

    @classmethod
    def from_original(cls, ckpt_path: str, yaml_path: Optional[str] = None, **config) -> "ChameleonVQGAN":
        """Load Meta's ``vqgan.ckpt`` strictly, its config from ``vqgan.yaml`` (the defaults, which
        are the released model's, when ``yaml_path`` is None) overridden by ``config``. The
        checkpoint's training-only entries (``loss.*``) are left out; any other missing or
        unexpected entry raises a ValueError naming it."""
        base = chameleon_config_from_yaml(yaml_path) if yaml_path is not None else {}
        state = read_original_weights(ckpt_path, CHAMELEON_TRAINING_PREFIXES, key="state_dict")
        model = cls(**{**base, **config})
        load_state_dict_strict(model, state, f"{ckpt_path} (loaded as Chameleon's VQGAN)")
        return model.eval()
