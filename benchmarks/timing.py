"""The one timing rule of the step benchmarks: the median of ``repeats`` calls after a warm-up."""

from __future__ import annotations

import statistics
import time


def median_ms(fn, repeats: int, warmup: int = 10) -> float:
    """Milliseconds of the median call of ``fn`` over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def synchronized(fn, device):
    """``fn``, then a wait for the device's queued kernels (so that a timing counts them)."""
    from visualspec.core.window_costs import synchronize

    def call():
        out = fn()
        synchronize(device)
        return out
    return call
