"""Decode statistics, returned with every generation call."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import torch


@dataclass
class DecodeStats:
    """What one decode cost and how much speculation paid off.

    - ``target_forwards``: forward passes of the target model, the prefill included. Plain AR
      needs exactly ``num_tokens`` of them.
    - ``accepted_lengths``: tokens committed by each decode step after the prefill (accepted
      drafts plus the one token the target emits), i.e. Spec-Bench's tau per step.
    - ``fixed_at``: for every generated position, the target forward (1-based; the prefill is 1)
      at which its token was fixed. For an image this is the acceptance map.
    """

    mode: str
    batch_size: int
    num_tokens: int
    target_forwards: int = 0
    draft_forwards: int = 0
    wall_time_s: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list)
    fixed_at: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return len(self.accepted_lengths)

    @property
    def mean_accepted(self) -> float:
        """Mean tokens committed per decode step (1.0 for AR)."""
        return float(np.mean(self.accepted_lengths)) if self.accepted_lengths else 1.0

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / max(self.target_forwards, 1)

    @property
    def accepted_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.accepted_lengths).items()))

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("fixed_at", "accepted_lengths")}
        d.update(
            steps=self.steps,
            mean_accepted=round(self.mean_accepted, 4),
            tokens_per_forward=round(self.tokens_per_forward, 4),
            accepted_histogram=self.accepted_histogram,
        )
        return d

    def summary(self) -> str:
        hist = " ".join(f"{k}:{v}" for k, v in self.accepted_histogram.items())
        return (
            f"{self.mode}: {self.num_tokens} tokens x {self.batch_size} in {self.target_forwards} target forwards "
            f"({self.tokens_per_forward:.2f} tokens/forward, mean accepted {self.mean_accepted:.2f}), "
            f"{self.wall_time_s:.2f} s; accepted-length histogram {hist or '-'}"
        )

    def acceptance_map(self, height: int, width: int) -> np.ndarray:
        """The forward index at which each token was fixed, as an (height, width) int array."""
        if self.fixed_at is None or self.fixed_at.numel() != height * width:
            raise ValueError(f"acceptance map needs {height}x{width} tokens, got {self.num_tokens}")
        return self.fixed_at.view(height, width).cpu().numpy()

    def acceptance_map_image(self, height: int, width: int, scale: int = 8):
        """Render the acceptance map as a PIL image: dark = fixed early, bright = fixed late.

        Tokens fixed in the same forward as their left neighbour were accepted drafts, so long runs
        of one colour along a row show where speculation paid off.
        """
        from PIL import Image

        m = self.acceptance_map(height, width).astype(np.float64)
        m = (m - m.min()) / max(m.max() - m.min(), 1.0)
        # a simple perceptual ramp: dark blue -> teal -> yellow
        stops = np.array([[20, 20, 80], [30, 150, 140], [250, 230, 60]], dtype=np.float64)
        x = m * (len(stops) - 1)
        lo = np.floor(x).astype(int).clip(0, len(stops) - 2)
        t = (x - lo)[..., None]
        rgb = stops[lo] * (1 - t) + stops[lo + 1] * t
        img = Image.fromarray(rgb.round().astype(np.uint8), "RGB")
        return img.resize((width * scale, height * scale), Image.NEAREST)
