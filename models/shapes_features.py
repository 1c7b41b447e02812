"""A small feature network for FID on the shapes world ("FID-shapes").

The standard FID Inception network knows nothing about flat 64x64 shapes, so visualspec ships this
CNN, trained on world images to predict what is in them (how many objects of each shape and colour,
and where). Its ``features`` (the pooled penultimate layer) play the role of Inception's pool3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn


class ShapesFeatureNet(ModelMixin, ConfigMixin):
    """(N, 3, 64, 64) images in [0, 1] -> (N, feature_dim) features; ``head`` predicts scene targets."""

    @register_to_config
    def __init__(self, channels: tuple[int, ...] = (32, 64, 128, 128), feature_dim: int = 128, num_targets: int = 32):
        super().__init__()
        layers, c_in = [], 3
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.GroupNorm(8, c), nn.SiLU(),
                       nn.Conv2d(c, c, 3, stride=2, padding=1), nn.GroupNorm(8, c), nn.SiLU()]
            c_in = c
        self.body = nn.Sequential(*layers)
        self.proj = nn.Linear(c_in, feature_dim)
        self.head = nn.Linear(feature_dim, num_targets)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The features used for FID."""
        x = self.body(images * 2 - 1)
        return F.silu(self.proj(x.mean(dim=(2, 3))))

    def predict_targets(self, images: torch.Tensor) -> torch.Tensor:
        """What the network was trained to predict (see ``visualspec.training.shapes.scene_targets``)."""
        return self.head(self(images))
