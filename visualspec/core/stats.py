"""Decode statistics, returned with every generation call."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch


CONTINUOUS_COUNTS = ("residual_proposals", "residual_fallbacks", "drafts_proposed", "drafts_accepted")


@dataclass
class DecodeStats:
    """What one decode cost and how much speculation paid off.

    - ``batch_size``: sequences generated; ``slots``: how many of them decoded at once.
    - ``target_forwards``: batched forward passes of the target model, prefills included.
    - ``query_forwards``: of those, the forwards in which the target drafted for itself (ASSD's
      draft queries, :attr:`visualspec.core.engine.Drafter.drafts_with_target`); a decode step is
      one of the others.
    - ``row_forwards`` (batch_size,): the target forwards each sequence took part in, its prefill
      included. Plain AR needs exactly ``num_tokens`` per sequence.
    - ``accepted_lengths``: tokens committed by each row in each decode step after its prefill
      (accepted drafts plus the one token the target emits), i.e. Spec-Bench's tau per row-step.
    - ``stopped_tokens``: positions after a sequence's stop token (``decode(..., stop_token=)``), filled
      with it rather than generated; the sequences generated ``num_tokens`` each less these in all.
    - ``fixed_at`` (batch_size, num_tokens): for every generated position of every sequence, that
      sequence's target forward (1-based; its prefill is 1) at which the token was fixed. For an
      image this is the acceptance map.
    """

    mode: str
    batch_size: int
    num_tokens: int
    target_forwards: int = 0
    draft_forwards: int = 0
    query_forwards: int = 0
    wall_time_s: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list)
    fixed_at: torch.Tensor | None = None
    row_forwards: torch.Tensor | None = None
    slots: int | None = None
    residual_proposals: int = 0  # continuous tokens: proposals the residual sampler drew
    residual_fallbacks: int = 0  # continuous tokens: residuals that ran out of proposals (a draw from p)
    drafts_proposed: int = 0  # continuous tokens: drafts the target scored (rows still decoding)
    drafts_accepted: int = 0  # continuous tokens: of those, the drafts kept
    sibling_steps: int = 0  # proactive drafting: row-steps whose accepted path went through a sibling
    structural_tokens: int = 0  # tokens fixed by the layout (row ends, end of image), never drafted freely
    stopped_tokens: int = 0  # positions after a sequence's stop token (text's EOS): filled, not generated
    judged_tokens: int = 0  # judge decoding: drafts kept by the judge alone (the exact rule rejected them)
    judged_at: torch.Tensor | None = None  # judge decoding: (batch_size, num_tokens) bool, where those are

    @property
    def draft_acceptance(self) -> float | None:
        """Share of scored drafts that were kept (continuous tokens; None where nothing was drafted)."""
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else None

    @property
    def steps(self) -> int:
        """Row-steps: decode steps summed over rows."""
        return len(self.accepted_lengths)

    @property
    def mean_accepted(self) -> float:
        """Mean tokens committed per row per decode step (1.0 for AR)."""
        return float(np.mean(self.accepted_lengths)) if self.accepted_lengths else 1.0

    @property
    def forwards_per_sequence(self) -> float:
        """Mean target forwards a sequence took part in (``num_tokens`` for AR)."""
        if self.row_forwards is None:
            return float(self.target_forwards)
        return float(self.row_forwards.double().mean())

    @property
    def tokens_per_sequence(self) -> float:
        """Mean tokens a sequence generated: ``num_tokens`` less its share of ``stopped_tokens``."""
        return self.num_tokens - self.stopped_tokens / max(self.batch_size, 1)

    @property
    def tokens_per_forward(self) -> float:
        """Tokens generated per target forward per sequence (1.0 for AR):
        :attr:`tokens_per_sequence` over :attr:`forwards_per_sequence`, i.e. all sequences' tokens
        over the target forwards each took part in (prefills included), summed over sequences. A
        batched forward counts once for every row in it, so the figure does not grow or shrink
        with the batch size; at batch 1 without a stop it is ``num_tokens / target_forwards``."""
        return self.tokens_per_sequence / max(self.forwards_per_sequence, 1.0)

    @property
    def accepted_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.accepted_lengths).items()))

    def to_dict(self) -> dict:
        """The counts and summaries as JSON-able values (the continuous-token counts only where a
        draft was scored, the sibling and structural counts only where there were any)."""
        skip = ("fixed_at", "accepted_lengths", "row_forwards", "judged_at")
        if not self.drafts_proposed:
            skip += CONTINUOUS_COUNTS
        skip += tuple(name for name in ("query_forwards", "sibling_steps", "structural_tokens", "stopped_tokens",
                                        "judged_tokens") if not getattr(self, name))
        d = {k: v for k, v in asdict(self).items() if k not in skip}
        d.update(
            forwards_per_sequence=round(self.forwards_per_sequence, 3),
            steps=self.steps,
            mean_accepted=round(self.mean_accepted, 4),
            tokens_per_forward=round(self.tokens_per_forward, 4),
            accepted_histogram=self.accepted_histogram,
        )
        return d

    def summary(self) -> str:
        hist = " ".join(f"{k}:{v}" for k, v in self.accepted_histogram.items())
        return (
            f"{self.mode}: {self.num_tokens} tokens x {self.batch_size}"
            f"{f' ({self.stopped_tokens} after stop tokens)' if self.stopped_tokens else ''} in {self.target_forwards} target forwards, "
            f"{self.forwards_per_sequence:.1f} per sequence ({self.tokens_per_forward:.2f} tokens/forward, "
            f"mean accepted {self.mean_accepted:.2f}), "
            f"{self.wall_time_s:.2f} s; accepted-length histogram {hist or '-'}"
        )

    def acceptance_map(self, height: int, width: int, index: int = 0) -> np.ndarray:
        """The forward index at which each token of sequence ``index`` was fixed, as an
        (height, width) int array."""
        if self.fixed_at is None or self.num_tokens != height * width:
            raise ValueError(f"acceptance map needs {height}x{width} tokens, got {self.num_tokens}")
        if not 0 <= index < self.fixed_at.shape[0]:
            raise ValueError(f"no sequence {index} in a batch of {self.fixed_at.shape[0]}")
        return self.fixed_at[index].view(height, width).cpu().numpy()

    def acceptance_map_image(self, height: int, width: int, scale: int = 8, index: int = 0):
        """Render the acceptance map as a PIL image: dark = fixed early, bright = fixed late; under
        judge decoding the drafts the judge alone kept are red.

        Tokens fixed in the same forward as their left neighbour were accepted drafts, so long runs
        of one colour along a row show where speculation paid off.
        """
        from PIL import Image

        m = self.acceptance_map(height, width, index).astype(np.float64)
        m = (m - m.min()) / max(m.max() - m.min(), 1.0)
        # a simple perceptual ramp: dark blue -> teal -> yellow
        stops = np.array([[20, 20, 80], [30, 150, 140], [250, 230, 60]], dtype=np.float64)
        x = m * (len(stops) - 1)
        lo = np.floor(x).astype(int).clip(0, len(stops) - 2)
        t = (x - lo)[..., None]
        rgb = stops[lo] * (1 - t) + stops[lo + 1] * t
        if self.judged_at is not None:
            rgb[self.judged_at[index].view(height, width).cpu().numpy()] = (230, 40, 40)
        img = Image.fromarray(rgb.round().astype(np.uint8), "RGB")
        return img.resize((width * scale, height * scale), Image.NEAREST)


def merge_decode_stats(parts: list[DecodeStats]) -> DecodeStats:
    """One DecodeStats for calls made one after another on consecutive groups of sequences: counts
    and times add up, per-step and per-sequence records are joined in order, ``slots`` is the
    largest, and ``mode`` and ``num_tokens`` are the first call's. Its per-sequence figures
    (``forwards_per_sequence``, ``tokens_per_forward``) are over every sequence of every call."""
    first = parts[0]
    if len(parts) == 1:
        return first
    merged = {}
    for f in fields(DecodeStats):
        values = [getattr(p, f.name) for p in parts]
        if f.name in ("mode", "num_tokens"):
            merged[f.name] = values[0]
        elif f.name == "slots":
            merged[f.name] = max(p.slots or p.batch_size for p in parts)
        elif isinstance(values[0], list):
            merged[f.name] = [x for v in values for x in v]
        elif isinstance(values[0], torch.Tensor) or values[0] is None:
            merged[f.name] = None if values[0] is None else torch.cat(values)
        else:
            merged[f.name] = sum(values)
    return DecodeStats(**merged)
