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


def alternated_rounds(configs, call, prompts, references, rounds: int) -> dict:
    """Text decodes timed side by side: for each of ``rounds`` rounds and each prompt, ``call(prompt,
    config)`` (a ``generate_text`` output) for every config in turn, the order reversed every other
    round, after one untimed warm-up call per config on the first prompt. Returns, per config, the
    seconds, tokens, target forwards (prefills included) and calls whose tokens equal the prompt's
    ``references`` entry."""
    configs = list(configs)
    for config in configs:
        call(prompts[0], config)
    rows = {config: {"seconds": 0.0, "tokens": 0, "forwards": 0, "equal": 0} for config in configs}
    for r in range(rounds):
        for prompt, reference in zip(prompts, references):
            for config in (configs if r % 2 == 0 else configs[::-1]):
                t0 = time.perf_counter()
                out = call(prompt, config)
                row = rows[config]
                row["seconds"] += time.perf_counter() - t0
                ids = out.token_ids[0]
                row["tokens"] += len(ids)
                row["forwards"] += out.stats.target_forwards
                row["equal"] += ids == reference
    return rows
