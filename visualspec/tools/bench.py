"""Side-by-side decode benchmark: every mode on the same prompts and seeds, interleaved in one run.

Timings on shared machines drift, so the modes are interleaved image by image (AR, SJD, LANTERN,
AR, SJD, ...) after one warm-up call each, and speed is reported as ratios to AR measured in the
same run. With a ``scorer``, the very images that were timed are also scored for quality.
"""

from __future__ import annotations

import copy
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..core.stats import merge_decode_stats
from ..models.quantized import QUANTIZE_SCHEMES
from ..video import VideoStats


DEFAULT_PROMPTS = [
    "a photo of a red circle",
    "a photo of a blue square and a yellow triangle",
    "a photo of three green circles",
    "a photo of a white triangle left of a black square",
]


def split_quantized(mode: str) -> tuple[str, str | None]:
    """A bench mode and the weights it runs on: ``"sjd+compiled+int8"`` -> ``("sjd+compiled", "int8")``,
    ``"sjd"`` -> ``("sjd", None)`` (the pipeline's own weights); the schemes are
    :data:`~visualspec.models.quantized.QUANTIZE_SCHEMES`."""
    for scheme in QUANTIZE_SCHEMES:
        if mode.endswith("+" + scheme):
            return mode[:-len(scheme) - 1], scheme
    return mode, None


def split_model(mode: str) -> tuple[str | None, str]:
    """A bench mode and the pipeline it runs on: ``"shapes-t2i:sjd+compiled"`` -> ``("shapes-t2i",
    "sjd+compiled")`` (one of ``run_benchmark``'s ``others``), ``"assd"`` -> ``(None, "assd")`` (its ``pipe``)."""
    name, sep, rest = mode.partition(":")
    return (name, rest) if sep else (None, mode)


def run_benchmark(pipe, prompts=None, modes=None, images: int = 4, seed: int = 0,
                  batch_size: int = 1, scorer: Callable[[Path], dict] | None = None, keep_images: str | None = None,
                  progress: bool = False, others: dict | None = None, **kwargs) -> dict:
    """Generate ``images`` images per mode, ``batch_size`` at a time, and summarise cost (and
    quality) per image. As in the batch command, a call holds ``4 * batch_size`` images and a
    finished image's place goes to the next (continuous batching).

    ``modes`` are names of the pipeline's bench modes (:meth:`ImagePipeline.bench_mode`; default:
    its ``default_bench_modes``), AR first, each optionally ``+SCHEME`` to run on a copy of the
    pipeline quantised so (:func:`split_quantized`); ``kwargs`` are call arguments every mode shares.
    ``prompts`` are strings or GenEval metadata dicts (``{"prompt": ..., "tag": ..., ...}``); image i
    uses prompt ``i % len(prompts)`` and its own generator seeded ``seed + i`` in every mode. Modes
    are interleaved call by call after one warm-up call each (which also measures the window costs
    once). With ``scorer``, each mode's images are written in GenEval's layout and
    ``scorer(folder)`` is reported under ``quality``. Ratios are to the fastest AR mode of the run
    (``baseline``: ``ar``, or ``ar+compiled`` where that was timed and won).

    ``others`` (name -> pipeline) adds pipelines to the run: a mode ``NAME:MODE`` runs ``MODE`` on
    ``others[NAME]`` (:func:`split_model`), timed in the same interleaved rounds, e.g. a raster
    model's SJD beside an any-order model's ASSD; the fastest AR of any of them is the baseline.
    """
    models = {None: pipe, **(others or {})}
    modes = list(modes or type(pipe).default_bench_modes)
    unknown = [m for m in modes if split_model(m)[0] not in models]
    if unknown:
        raise ValueError(f"bench modes {unknown} name no pipeline of the run (given: {sorted(n for n in models if n)})")
    weights = {m: (split_model(m)[0], *split_quantized(split_model(m)[1])) for m in modes}
    settings = {m: {**kwargs, **type(models[name]).bench_mode(mode)} for m, (name, mode, _) in weights.items()}
    if "ar" not in modes:  # the pipeline's eager AR is always timed
        modes = ["ar", *modes]
        weights["ar"], settings["ar"] = (None, "ar", None), {**kwargs, **type(pipe).bench_mode("ar")}
    pipes = {(name, None): p for name, p in models.items()}
    for name, _, scheme in weights.values():  # a copy of the pipeline per quantisation, made before any call
        if (name, scheme) not in pipes:
            pipes[name, scheme] = copy.deepcopy(models[name]).quantize(scheme)
    pipe_of = {m: pipes[weights[m][0], weights[m][2]] for m in modes}
    text = getattr(pipe, "is_text_conditional", True)
    if prompts is None:
        prompts = DEFAULT_PROMPTS if text else list(range(4))
    entries = [p if isinstance(p, dict) else {"prompt": p} for p in prompts]
    conditions = [entries[i % len(entries)] for i in range(images)]
    per_call = 4 * batch_size if batch_size > 1 else 1  # as the batch command's chunks: slots refilled
    calls = [list(range(s, min(s + per_call, images))) for s in range(0, images, per_call)]
    # warm-up, never timed: allocations, lazy tables (LANTERN's neighbours) and the window costs of
    # every batch a timed call decodes (the last call may be smaller than the others)
    warm = [calls[0]] + ([calls[-1]] if len(calls[-1]) != len(calls[0]) else [])
    for mode in modes:
        for call in warm:
            pipe_of[mode]([conditions[i]["prompt"] for i in call], seed=seed, output_type="latent",
                          batch_size=batch_size, **settings[mode])
    tmp = None if keep_images else tempfile.TemporaryDirectory()
    root = Path(keep_images or tmp.name)
    rows = {m: {"stats": [], "seconds": 0.0} for m in modes}
    from tqdm.auto import tqdm

    for call in tqdm(calls, desc=f"bench (batch {batch_size})", disable=not progress):
        for mode in modes:
            generators = [torch.Generator().manual_seed(seed + i) for i in call]
            t0 = time.perf_counter()
            out = pipe_of[mode]([conditions[i]["prompt"] for i in call], generator=generators, output_type="pil",
                                batch_size=batch_size, **settings[mode])
            rows[mode]["seconds"] += time.perf_counter() - t0
            rows[mode]["stats"].append(out.stats)
            for i, image in zip(call, out.images):
                folder = root / mode / f"{i:05d}"
                (folder / "samples").mkdir(parents=True, exist_ok=True)
                (folder / "metadata.jsonl").write_text(json.dumps(conditions[i]) + "\n")
                image.save(folder / "samples" / "0000.png")
    stats = {m: merge_decode_stats(r["stats"]) for m, r in rows.items()}
    # the baseline is the fastest AR of the run (eager "ar", or "ar+compiled" where it was timed)
    baseline = min((m for m in modes if settings[m].get("decoding") == "ar"), key=lambda m: rows[m]["seconds"])
    ar_forwards = stats[baseline].forwards_per_sequence
    ar_seconds = rows[baseline]["seconds"]
    results = {}
    for mode, r in rows.items():
        s = stats[mode]
        forwards = s.forwards_per_sequence
        results[mode] = {
            "target_forwards_per_image": round(forwards, 2),
            "mean_accepted_tokens_per_step": round(s.mean_accepted, 3),
            "seconds_per_image": round(r["seconds"] / images, 4),
            "forwards_ratio_to_ar": round(forwards / ar_forwards, 4),
            "speedup_vs_ar": round(ar_seconds / r["seconds"], 3),
        }
        if s.draft_forwards:
            results[mode]["draft_forwards_per_image"] = round(s.draft_forwards / images, 2)
        if s.drafts_proposed:  # continuous tokens: the share of drafts kept, and residuals that ran out
            results[mode]["draft_acceptance"] = round(s.draft_acceptance, 4)
            results[mode]["residual_fallbacks"] = s.residual_fallbacks
        if scorer is not None:
            if progress:
                print(f"bench (batch {batch_size}): scoring {mode}'s {images} images", file=sys.stderr, flush=True)
            quality = scorer(root / mode)
            results[mode]["geneval_overall"] = round(quality["geneval"]["overall"], 4)
            results[mode]["geneval_tasks"] = {k: round(v["accuracy"], 4) for k, v in quality["geneval"]["tasks"].items()}
            results[mode]["fid_shapes"] = round(quality["fid_shapes"], 3)
    if tmp is not None:
        tmp.cleanup()
    return {
        "images_per_mode": images,
        "batch_size": batch_size,
        "settings": {k: v for k, v in kwargs.items()},
        "baseline": baseline,
        "machine": _machine(pipe.device),
        "results": results,
        "table": format_table(results),
    }


def _machine(device: torch.device) -> dict:
    """Where the numbers were measured: the CPU (and GPU, on CUDA), threads and torch."""
    from ..core.window_costs import machine_name

    machine = {"cpu": machine_name(torch.device("cpu")), "threads": torch.get_num_threads(), "torch": torch.__version__}
    if torch.device(device).type != "cpu":
        machine["device"] = machine_name(torch.device(device))
    return machine


def format_table(results: dict) -> str:
    quality = all("geneval_overall" in r for r in results.values())
    width = max(14, *(len(m) + 2 for m in results))
    header = f"{'mode':<{width}}{'forwards/img':>14}{'accepted/step':>15}{'s/img':>10}{'fwd vs AR':>11}{'speedup':>9}"
    if quality:
        header += f"{'GenEval':>9}{'FID-shapes':>12}"
    lines = [header]
    for m, r in results.items():
        line = (f"{m:<{width}}{r['target_forwards_per_image']:>14.1f}{r['mean_accepted_tokens_per_step']:>15.2f}"
                f"{r['seconds_per_image']:>10.3f}{r['forwards_ratio_to_ar']:>11.3f}{r['speedup_vs_ar']:>9.2f}")
        if quality:
            line += f"{r['geneval_overall']:>9.3f}{r['fid_shapes']:>12.2f}"
        lines.append(line)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ video

VIDEO_CONFIGS = {
    # name: (use_teacher, steps, speculate, compiled: the world's step and decoder, NextFramePipeline.compile_worlds,
    #        guard: frames generated ahead that lost the ball refused, the pipeline's default)
    "teacher, 8 Euler steps": (True, 8, 1, False, True),
    "distilled, 4 steps": (False, 4, 1, False, True),
    "distilled, 1 step": (False, 1, 1, False, True),
    "distilled, 1 step, speculate 4": (False, 1, 4, False, True),
    "distilled, 1 step, speculate 4, unguarded": (False, 1, 4, False, False),
    "distilled, 1 step, compiled": (False, 1, 1, True, True),
    "distilled, 1 step, speculate 4, compiled": (False, 1, 4, True, True),
    "distilled, 1 step, speculate 4, compiled, unguarded": (False, 1, 4, True, False),
}


def run_video_benchmark(pipe, frames: int = 300, rounds: int = 3, seed: int = 0, configs: dict | None = None,
                        persistence: float = 0.9, progress: bool = False) -> dict:
    """Frames per second of each configuration at batch 1 on one action script (a person holding
    keys: ``persistence``), interleaved round by round; speedups are ratios to the first config.
    ``progress``: a bar on stderr advancing once per rollout (warm-ups included). A compiled
    configuration compiles in its warm-up (``first_call_s``: that warm-up's seconds, compiling
    included; torch's disk cache makes a later process's shorter)."""
    from tqdm.auto import tqdm

    from ..worlds import arena

    configs = configs or VIDEO_CONFIGS
    actions = list(arena.random_actions(np.random.default_rng([seed, 3]), frames, persistence))
    bar = tqdm(total=len(configs) * (rounds + 1), desc="bench-video (warm-up, then rounds)", disable=not progress)
    first_call = {}
    for name, (use_teacher, steps, speculate, compiled, guard) in configs.items():  # warm-up
        t0 = time.perf_counter()
        pipe.compile_worlds(speculate, enabled=compiled)
        pipe(actions=actions[:8], seed=seed, use_teacher=use_teacher, steps=steps, speculate=speculate, guard=guard)
        first_call[name] = time.perf_counter() - t0
        bar.update()
    runs = {name: [] for name in configs}
    for r in range(rounds):
        for name, (use_teacher, steps, speculate, compiled, guard) in configs.items():
            pipe.compile_worlds(speculate, enabled=compiled)
            out = pipe(actions=actions, seed=seed + r, use_teacher=use_teacher, steps=steps, speculate=speculate,
                       guard=guard)
            runs[name].append(out.stats)
            bar.update()
    bar.close()
    base = None
    results = {}
    for name, stats in runs.items():
        seconds = sum(s.seconds for s in stats)
        fps = sum(s.frames for s in stats) / seconds
        base = base or fps
        ahead = VideoStats(**{count: sum(getattr(s, count) for s in stats) for count in ("hits", "discarded", "refused")})
        results[name] = {
            "fps": round(fps, 1), "ms_per_frame": round(1000 / fps, 2), "speedup": round(fps / base, 2),
            "forwards_per_frame": round(sum(s.model_forwards for s in stats) / sum(s.frames for s in stats), 3),
            "hit_rate": None if np.isnan(ahead.hit_rate) else round(ahead.hit_rate, 3),
            "p95_ms": round(1000 * float(np.percentile(np.concatenate([s.frame_seconds for s in stats]), 95)), 2),
            "first_call_s": round(first_call[name], 1),
        }
    return {"frames": frames, "rounds": rounds, "persistence": persistence,
            "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                        "torch": torch.__version__},
            "results": results, "table": format_video_table(results)}


def run_players_benchmark(pipe, players: int, frames: int = 300, rounds: int = 3, seed: int = 0,
                          speculate: tuple = (1, 4), persistence: float = 0.9, progress: bool = False,
                          guards: tuple = (True,)) -> dict:
    """Several players' worlds (the app's case): frames per second each world gets when all are
    stepped together (:meth:`ArenaSession.step_together`, one batched generation per frame) and
    when they are stepped one after another (a world at a time, as a server without batching
    would), interleaved round by round; each player holds keys of its own script. ``progress``: a
    bar on stderr advancing once per play (warm-ups included). ``guards``: the worlds' guard on their
    speculation (:meth:`NextFramePipeline.interactive`), each speculating setting played with each,
    in the same rounds; speculate 1 has nothing to guard."""
    from tqdm.auto import tqdm

    from ..core.window_costs import machine_name
    from ..pipelines.nfd import ArenaSession
    from ..worlds import arena

    scripts = [list(arena.random_actions(np.random.default_rng([seed, 4, p]), frames, persistence))
               for p in range(players)]

    settings = [(k, guard) for k in speculate for guard in (guards if k > 1 else guards[:1])]

    def play(k: int, guard: bool, together: bool, r: int, length: int) -> float:
        worlds = [pipe.interactive(seed=seed + 100 * r + p, speculate=k, guard=guard) for p in range(players)]
        start = time.perf_counter()
        for t in range(length):
            keys = [script[t] for script in scripts]
            if together:
                ArenaSession.step_together(worlds, keys)
            else:
                for world, key in zip(worlds, keys):
                    world.step(key)
        return time.perf_counter() - start

    bar = tqdm(total=2 * len(settings) * (rounds + 1), desc=f"bench-video --players {players}",
               disable=not progress)
    for k, guard in settings:  # warm-up
        for together in (True, False):
            play(k, guard, together, 0, min(8, frames))
            bar.update()
    seconds = {(k, guard, together): 0.0 for k, guard in settings for together in (False, True)}
    for r in range(rounds):
        for k, guard, together in seconds:
            seconds[k, guard, together] += play(k, guard, together, r, frames)
            bar.update()
    bar.close()
    results = {}
    for k, guard in settings:
        alone, batched = (rounds * frames / seconds[k, guard, together] for together in (False, True))
        name = f"speculate {k}" + (", unguarded" if k > 1 and not guard else "")
        results[name] = {"fps_per_world_one_after_another": round(alone, 1),
                         "fps_per_world_together": round(batched, 1), "speedup": round(batched / alone, 2)}
    lines = [f"{players} worlds{'':<24}{'FPS each, one by one':>22}{'FPS each, together':>20}{'speedup':>9}"]
    for name, r in results.items():
        lines.append(f"{name:<33}{r['fps_per_world_one_after_another']:>22.1f}{r['fps_per_world_together']:>20.1f}"
                     f"{r['speedup']:>9.2f}")
    return {"players": players, "frames": frames, "rounds": rounds, "persistence": persistence,
            "machine": {"cpu": machine_name(torch.device("cpu")), "threads": torch.get_num_threads(),
                        "torch": torch.__version__},
            "results": results, "table": "\n".join(lines)}


def format_video_table(results: dict) -> str:
    lines = [f"{'configuration':<52}{'FPS':>8}{'ms/frame':>10}{'speedup':>9}{'fwd/frame':>11}{'hit rate':>10}"
             f"{'first call s':>14}"]
    for name, r in results.items():
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        first = "-" if r.get("first_call_s") is None else f"{r['first_call_s']:.1f}"
        lines.append(f"{name:<52}{r['fps']:>8.1f}{r['ms_per_frame']:>10.2f}{r['speedup']:>9.2f}"
                     f"{r['forwards_per_frame']:>11.2f}{hit:>10}{first:>14}")
    return "\n".join(lines)
