"""The KL-16 autoencoder of MAR (latent diffusion's KL VAE): images <-> 16-channel latents at 1/16.

The encoder and decoder are LlamaGen's VQ ones (:mod:`visualspec.models.llamagen_vq`; the same
latent-diffusion design), with a Gaussian posterior instead of a codebook: the encoder gives a mean
and a log variance per latent (clamped to [-30, 20]), and MAR scales the latents by 0.2325
(``scale``) before its transformer sees them. The decoder has attention in its middle only.

``kl16.ckpt`` stores the latent-diffusion parameter names (``encoder.down.{i}.block.{j}``,
``mid.block_1``, ``decoder.up.{i}`` with level 0 at full resolution, ...); :func:`to_official` and
:func:`from_official` map between them and this module's, and
:meth:`KLAutoencoder.from_kl16_checkpoint` loads the file strictly, leaving out only the training
loss's ``loss.*`` entries (perceptual network and discriminator), which are not part of the model.
"""

from __future__ import annotations

import re

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.continuous import Gaussian

from .checkpoints import load_state_dict_strict, read_checkpoint
from .llamagen_vq import _Decoder, _Encoder

_MID = {"block_1": "0", "attn_1": "1", "block_2": "2"}


def from_official(key: str, levels: int) -> str:
    """A latent-diffusion parameter name -> this module's."""
    key = re.sub(r"mid\.(block_1|attn_1|block_2)\.", lambda m: f"mid.{_MID[m.group(1)]}.", key)
    key = re.sub(r"^encoder\.down\.(\d+)\.block\.", r"encoder.conv_blocks.\1.res.", key)
    key = re.sub(r"^encoder\.down\.(\d+)\.", r"encoder.conv_blocks.\1.", key)
    m = re.match(r"^decoder\.up\.(\d+)\.(block\.)?", key)
    if m:  # latent diffusion counts decoder levels from full resolution, we from the lowest
        rest = key[m.end():]
        key = f"decoder.conv_blocks.{levels - 1 - int(m.group(1))}.{'res.' if m.group(2) else ''}{rest}"
    return key


def to_official(key: str, levels: int) -> str:
    """This module's parameter name -> latent diffusion's."""
    inverse = {v: k for k, v in _MID.items()}
    key = re.sub(r"mid\.(\d)\.", lambda m: f"mid.{inverse[m.group(1)]}.", key)
    key = re.sub(r"^encoder\.conv_blocks\.(\d+)\.res\.", r"encoder.down.\1.block.", key)
    key = re.sub(r"^encoder\.conv_blocks\.(\d+)\.", r"encoder.down.\1.", key)
    m = re.match(r"^decoder\.conv_blocks\.(\d+)\.(res\.)?", key)
    if m:
        rest = key[m.end():]
        key = f"decoder.up.{levels - 1 - int(m.group(1))}.{'block.' if m.group(2) else ''}{rest}"
    return key


class KLAutoencoder(ModelMixin, ConfigMixin):
    """Images (B, 3, H, W) in [-1, 1] <-> latents (B, embed_dim, H/16, W/16), scaled by ``scale``."""

    @register_to_config
    def __init__(self, embed_dim: int = 16, ch: int = 128, ch_mult: tuple = (1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 scale: float = 0.2325):
        super().__init__()
        ch_mult = tuple(ch_mult)
        self.encoder = _Encoder(3, ch, ch_mult, num_res_blocks, 2 * embed_dim, 0.0, 32, 1e-6)
        self.decoder = _Decoder(embed_dim, ch, ch_mult, num_res_blocks, 3, 0.0, 32, 1e-6, attention=False)
        self.quant_conv = nn.Conv2d(2 * embed_dim, 2 * embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, embed_dim, 1)

    @classmethod
    def from_kl16_checkpoint(cls, path: str, **config) -> "KLAutoencoder":
        """Load MAR's ``kl16.ckpt`` (``{"model": ...}``) strictly, its ``loss.*`` entries left out."""
        model = cls(**config)
        levels = len(model.config.ch_mult)
        state = {from_official(k, levels): v for k, v in read_checkpoint(path, "model").items()
                 if not k.startswith("loss.")}
        load_state_dict_strict(model, state, f"{path} (loaded as the KL-16 autoencoder)")
        return model.eval()

    def encode(self, images: torch.Tensor) -> Gaussian:
        """The posterior over scaled latents: a diagonal Gaussian (mean, std) of (B, embed_dim, h, w)."""
        mean, log_var = self.quant_conv(self.encoder(images)).chunk(2, dim=1)
        std = (0.5 * log_var.clamp(-30.0, 20.0)).exp()
        return Gaussian(mean * self.config.scale, std * self.config.scale)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents (B, embed_dim, h, w) -> images (B, 3, 16 h, 16 w), about [-1, 1]."""
        return self.decoder(self.post_quant_conv(latents / self.config.scale))
