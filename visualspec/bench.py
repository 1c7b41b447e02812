"""Side-by-side decode benchmark: every mode on the same prompts and seeds, interleaved in one run.

Timings on shared machines drift, so the modes are interleaved image by image (AR, SJD, LANTERN,
AR, SJD, ...) after one warm-up call each, and speed is reported as ratios to AR measured in the
same run.
"""

from __future__ import annotations

import platform
import time

import numpy as np
import torch

DEFAULT_PROMPTS = [
    "a photo of a red circle",
    "a photo of a blue square and a yellow triangle",
    "a photo of three green circles",
    "a photo of a white triangle left of a black square",
]


def run_benchmark(pipe, prompts=None, modes=("ar", "sjd", "lantern"), images: int = 4, seed: int = 0, **kwargs) -> dict:
    """Generate ``images`` images per mode (batch 1) and summarise cost per image."""
    if "ar" not in modes:
        modes = ("ar", *modes)
    text = getattr(pipe, "is_text_conditional", True)
    if prompts is None:
        prompts = DEFAULT_PROMPTS if text else list(range(4))
    conditions = [prompts[i % len(prompts)] for i in range(images)]
    for mode in modes:  # warm-up (allocations, lazy tables such as LANTERN's neighbours)
        pipe(conditions[0], decoding=mode, seed=seed, output_type="latent", **kwargs)
    rows = {m: {"forwards": [], "accepted": [], "seconds": []} for m in modes}
    for i, cond in enumerate(conditions):
        for mode in modes:
            t0 = time.perf_counter()
            out = pipe(cond, decoding=mode, seed=seed + i, output_type="pil", **kwargs)
            rows[mode]["seconds"].append(time.perf_counter() - t0)
            rows[mode]["forwards"].append(out.stats.target_forwards)
            rows[mode]["accepted"].append(out.stats.mean_accepted)
    ar_forwards = np.mean(rows["ar"]["forwards"])
    ar_seconds = np.mean(rows["ar"]["seconds"])
    results = {}
    for mode, r in rows.items():
        forwards, seconds = float(np.mean(r["forwards"])), float(np.mean(r["seconds"]))
        results[mode] = {
            "target_forwards_per_image": round(forwards, 2),
            "mean_accepted_tokens_per_step": round(float(np.mean(r["accepted"])), 3),
            "seconds_per_image": round(seconds, 4),
            "forwards_ratio_to_ar": round(forwards / ar_forwards, 4),
            "speedup_vs_ar": round(ar_seconds / seconds, 3),
        }
    header = f"{'mode':<12}{'forwards/img':>14}{'accepted/step':>15}{'s/img':>10}{'fwd vs AR':>11}{'speedup':>9}"
    lines = [header] + [
        f"{m:<12}{r['target_forwards_per_image']:>14.1f}{r['mean_accepted_tokens_per_step']:>15.2f}"
        f"{r['seconds_per_image']:>10.3f}{r['forwards_ratio_to_ar']:>11.3f}{r['speedup_vs_ar']:>9.2f}"
        for m, r in results.items()
    ]
    return {
        "images_per_mode": images,
        "settings": {k: v for k, v in kwargs.items()},
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "results": results,
        "table": "\n".join(lines),
    }
