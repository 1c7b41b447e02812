"""Choose STAND's default ``draft_stop_below``: its chain ends where its memory is unsure.

    python benchmarks/stand_stop.py                      # the study's rule: 12 prompts of seed 29, 2 rounds
    python benchmarks/stand_stop.py --prompts 4 --rounds 1 --stops 0.3

Greedy, 128 new tokens, ``drafter="stand"`` at windows 6 and 11, eager and compiled, each
``--stops`` threshold against none (``draft_stop_below=0``), every configuration alternated prompt
by prompt, the order reversed each round, after a warm-up call each. Prints tokens per second,
tau and outputs equal to ``generate``'s, and each threshold's speed over none: per configuration
and their geometric mean (docs/experiments/2026-12-07-stand-stop-below.md).
"""

import argparse
import itertools
import math
import time

import torch

from visualspec.text import generate_text
from visualspec.tools.bench_text import PROMPT_TOKENS, held_out_prompts, load_pair, pair_folder

NEW_TOKENS = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stops", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--windows", type=int, nargs="+", default=[6, 11])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = pair_folder()
    tokenizer, target, _ = load_pair(folder)
    texts = held_out_prompts(folder, tokenizer, args.prompts, PROMPT_TOKENS, seed=args.seed)
    settings = [(compiled, window) for compiled in (False, True) for window in args.windows]
    stops = [0.0, *args.stops]
    configs = list(itertools.product(settings, stops))

    def call(prompt, config):
        (compiled, window), stop = config
        return generate_text(target, tokenizer, prompt, drafter="stand", window=window, compile=compiled,
                             draft_stop_below=stop, max_new_tokens=NEW_TOKENS, temperature=0)

    reference = [generate_text(target, tokenizer, p, max_new_tokens=NEW_TOKENS, temperature=0).token_ids[0]
                 for p in texts]
    for config in configs:
        call(texts[0], config)
    rows = {config: {"seconds": 0.0, "tokens": 0, "forwards": 0, "equal": 0} for config in configs}
    for r in range(args.rounds):
        for prompt, ref in zip(texts, reference):
            for config in (configs if r % 2 == 0 else configs[::-1]):
                t0 = time.perf_counter()
                out = call(prompt, config)
                row = rows[config]
                row["seconds"] += time.perf_counter() - t0
                ids = out.token_ids[0]
                row["tokens"] += len(ids)
                row["forwards"] += out.stats.target_forwards
                row["equal"] += ids == ref
    speed = {c: r["tokens"] / r["seconds"] for c, r in rows.items()}
    calls = args.rounds * len(texts)
    for config, r in rows.items():
        (compiled, window), stop = config
        mode = "compiled" if compiled else "eager"
        print(f"{mode:8} window {window:<3} stop {stop:<4} {speed[config]:8.1f} tokens/s "
              f"tau {r['tokens'] / r['forwards']:.2f} equal {r['equal']}/{calls} "
              f"vs none {speed[config] / speed[(compiled, window), 0.0]:.3f}")
    for stop in args.stops:
        ratios = [speed[s, stop] / speed[s, 0.0] for s in settings]
        print(f"stop {stop}: geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}, "
              f"lowest {min(ratios):.3f}")


if __name__ == "__main__":
    main()
