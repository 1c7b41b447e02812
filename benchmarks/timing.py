"""The one timing rule of the step benchmarks: the median of ``repeats`` calls after a warm-up."""

from __future__ import annotations

import argparse
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


def text_study_parser(doc: str, seed: int, prompts: int) -> argparse.ArgumentParser:
    """A text study's command line (its description: ``doc``'s first line): ``--seed`` of its
    held-out prompts (``seed``: one no reported table uses), ``--prompts``, ``--rounds`` (2) and
    ``--threads`` (2); a study adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def text_study_pair(args):
    """For a study's parsed ``args`` (:func:`text_study_parser`): torch's threads set, and the
    shipped text pair's folder, tokenizer and target with ``--prompts`` held-out prompts of
    ``--seed``."""
    import torch

    from visualspec.tools.bench_text import PROMPT_TOKENS, held_out_prompts, load_pair, pair_folder

    torch.set_num_threads(args.threads)
    folder = pair_folder()
    tokenizer, target, _ = load_pair(folder)
    return folder, tokenizer, target, held_out_prompts(folder, tokenizer, args.prompts, PROMPT_TOKENS, seed=args.seed)


def greedy_references(target, tokenizer, texts, new_tokens: int, compile: bool = True) -> list:
    """Each prompt's greedy AR tokens (``generate_text`` without a drafter; compiled unless told
    otherwise): what every lossless row of a text study must equal."""
    from visualspec.text import generate_text

    return [generate_text(target, tokenizer, p, max_new_tokens=new_tokens, temperature=0,
                          compile=compile).token_ids[0] for p in texts]


def print_fastest_first(rows: dict, calls: int, width: int) -> None:
    """The rows of :func:`alternated_rounds`, fastest first: tokens per second, tau (tokens per
    target forward) and the calls whose output equalled the reference, of ``calls``."""
    print(f"{'configuration':<{width}} {'tokens/s':>9} {'tau':>6} {'equal':>7}")
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["tokens"] / kv[1]["seconds"]):
        print(f"{name:<{width}} {r['tokens'] / r['seconds']:9.1f} {r['tokens'] / r['forwards']:6.2f} "
              f"{r['equal']:>3}/{calls}")
