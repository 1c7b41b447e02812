"""Rotary position embedding, shared by the image and video transformers."""

import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of x (..., head_dim) by angles whose cosines and
    sines are ``cos``, ``sin`` (broadcastable to (..., head_dim/2)):
    (x0 cos - x1 sin, x1 cos + x0 sin), computed in at least float32 and returned in x's dtype."""
    xp = x.to(torch.promote_types(cos.dtype, torch.float32)).reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)
    return out.flatten(-2).type_as(x)


def rope_1d(length: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotary table (length, head_dim/2, 2) of (cos, sin) for positions 0..length-1: pair i of a
    head turns by position x ``base ** (-2i / head_dim)``."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(length).float(), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)
