"""A per-frame convolutional autoencoder: 64x64 RGB frames <-> a small continuous latent grid.

Next-frame video models (NFD, Oasis, Matrix-Game) denoise in the latent space of an image-level
autoencoder. This one is deliberately small: three stride-2 stages take a (3, 64, 64) frame in
[-1, 1] to a (latent_channels, 8, 8) grid, and the decoder mirrors them. ``scaling_factor`` (set
after training to 1 / std of the latents, as in diffusers' VAEs) makes :meth:`encode` return
roughly unit-variance latents, which is what the diffusion model expects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.compiled import dense, step_compiler


class ResBlock(nn.Module):
    def __init__(self, channels: int, groups: int = 8):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class FrameAutoencoder(ModelMixin, ConfigMixin):
    """(B, 3, H, W) frames in [-1, 1] <-> (B, latent_channels, H / 2**len(channels), ...) latents."""

    @register_to_config
    def __init__(self, in_channels: int = 3, channels: tuple = (32, 64, 64), latent_channels: int = 8,
                 scaling_factor: float = 1.0):
        super().__init__()
        channels = list(channels)
        self.encoder = nn.Sequential(nn.Conv2d(in_channels, channels[0], 3, padding=1))
        previous = channels[0]
        for width in channels:
            self.encoder.extend([ResBlock(previous), nn.Conv2d(previous, width, 3, stride=2, padding=1)])
            previous = width
        self.encoder.extend([ResBlock(previous), nn.GroupNorm(8, previous), nn.SiLU(),
                             nn.Conv2d(previous, latent_channels, 1)])

        self.decoder = nn.Sequential(nn.Conv2d(latent_channels, channels[-1], 3, padding=1))
        previous = channels[-1]
        for width in reversed(channels):
            self.decoder.extend([ResBlock(previous), nn.Upsample(scale_factor=2, mode="nearest"),
                                 nn.Conv2d(previous, width, 3, padding=1)])
            previous = width
        self.decoder.extend([ResBlock(previous), nn.GroupNorm(8, previous), nn.SiLU(),
                             nn.Conv2d(previous, in_channels, 3, padding=1)])
        self._compiler, self._compiled = None, False  # the compiled decoder (compile_step), off by default

    @property
    def downsample(self) -> int:
        return 2 ** len(self.config.channels)

    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames (B, 3, H, W) in [-1, 1] -> scaled latents (B, C, H/f, W/f)."""
        return self.encoder(frames) * self.config.scaling_factor

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents (any float type) -> frames in [-1, 1] (not clamped) in the weights' type;
        through the compiled decoder for the shapes :meth:`precompile` compiled, while
        :meth:`compile_step` is on."""
        z = latents.to(self.decoder[0].weight.dtype) / self.config.scaling_factor  # not self.dtype: it walks every module
        if self._compiled and not torch.is_grad_enabled():
            return self._compiler((tuple(z.shape), z.dtype, z.device), dense(z), compile_new=False)
        return self.decoder(z.contiguous(memory_format=torch.channels_last))

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """Decode through ``torch.compile`` (``enabled=False``: eagerly), for the shapes
        :meth:`precompile` compiled; any other stays eager, and nothing compiles later. ``mode``:
        ``torch.compile``'s ("auto": CUDA graphs on a GPU)."""
        self._compiled = bool(enabled)
        if enabled:
            self._compiler = step_compiler(self._compiler, self.decoder, f"the {type(self).__name__} decoder",
                                           lambda key: f"{key[0][0]} latents", mode, self.decoder[0].weight.device)

    @torch.no_grad()
    def precompile(self, batch_sizes, latent_size: int) -> None:
        """Compile the decoder for each of ``batch_sizes`` latents of ``latent_size`` squared,
        announcing each compile once."""
        if not self._compiled:
            raise RuntimeError("precompile() compiles the compiled decoder: call compile_step() first")
        weight = self.decoder[0].weight
        for batch in batch_sizes:
            z = torch.zeros(batch, self.config.latent_channels, latent_size, latent_size, dtype=weight.dtype,
                            device=weight.device)
            self._compiler((tuple(z.shape), z.dtype, z.device), z)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(frames))
