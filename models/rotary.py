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
