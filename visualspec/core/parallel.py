"""Parallel decoding of an any-order model without verification (RandAR's schedule): the lossy baseline of ASSD."""

from __future__ import annotations

import math
import time

import torch

from .checks import check_positive_int
from .sampling import Generator, SamplingConfig, row_generators
from .stats import DecodeStats


def cosine_schedule(num_tokens: int, steps: int) -> list[int]:
    """Tokens drawn at each of ``steps`` steps, after the first token (the prefill's), as RandAR's
    cosine schedule spaces them: by step t the first 1 + C_t tokens are drawn, with
    C_t = round((num_tokens - 1) * (1 - cos(pi t / (2 steps)))), few at first and many at the end,
    every step drawing at least one (so ``steps`` is at most num_tokens - 1)."""
    check_positive_int("steps", steps)
    rest = num_tokens - 1
    if steps > rest:
        raise ValueError(f"{steps} steps for {rest} tokens after the first: at most one step per token")
    drawn, counts = 0, []
    for t in range(1, steps + 1):
        target = round(rest * (1 - math.cos(math.pi * t / (2 * steps))))
        count = max(1, min(target - drawn, rest - drawn - (steps - t)))  # leave a token for every later step
        counts.append(count)
        drawn += count
    return counts


@torch.no_grad()
def decode_parallel(target, prefix, num_tokens: int, sampling: SamplingConfig, steps: int,
                    generator: Generator = None, mode: str = "parallel", progress=None) -> tuple[torch.Tensor, DecodeStats]:
    """Draw ``num_tokens`` tokens per row in 1 + ``steps`` forwards of an any-subset ``target``
    (``prefill`` and ``forward_queries``, e.g. :class:`visualspec.models.any_order.AnyOrderGPT`):
    the prefill's first token, then at each step the next c_t positions of the order
    (:func:`cosine_schedule`) all drawn at once, each from its distribution given only the tokens
    drawn before the step (the forward that writes the last step's tokens also predicts them).

    **Lossy**: tokens drawn in one step are independent given the earlier ones, so the output is
    not the model's law along the order (RandAR's parallel decoding; ASSD verifies the same drafts
    instead, :class:`visualspec.drafters.AnySubsetDrafter`). Returns ``(tokens (B, num_tokens), stats)``."""
    t0 = time.perf_counter()
    counts = cosine_schedule(num_tokens, steps)
    logits = target.prefill(prefix, num_tokens)
    rows = logits.shape[0] // sampling.model_rows_per_sample
    gens = row_generators(generator, torch.arange(rows))
    first = sampling.draw(sampling.probs(logits), gens)
    tokens = first.new_empty(rows, num_tokens)
    tokens[:, 0] = first
    fixed_at = torch.empty(rows, num_tokens, dtype=torch.long)
    fixed_at[:, 0] = 1
    if progress is not None:
        progress(rows)
    n, new = 1, tokens[:, :1]
    for step, count in enumerate(counts, start=2):
        logits = target.forward_queries(sampling.model_batch(new), torch.full((rows * sampling.model_rows_per_sample,), n,
                                                                               device=new.device), count)
        new = sampling.draw(sampling.probs(logits), gens)
        tokens[:, n:n + count] = new
        fixed_at[:, n:n + count] = step
        n += count
        if progress is not None:
            progress(rows * count)
    stats = DecodeStats(mode=mode, batch_size=rows, num_tokens=num_tokens, target_forwards=1 + len(counts),
                        accepted_lengths=[c for c in counts for _ in range(rows)], fixed_at=fixed_at,
                        row_forwards=torch.full((rows,), 1 + len(counts), dtype=torch.long), slots=rows)
    stats.wall_time_s = time.perf_counter() - t0
    return tokens, stats
