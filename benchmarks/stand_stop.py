"""Choose STAND's default ``draft_stop_below``: its chain ends where its memory is unsure.

    python benchmarks/stand_stop.py                      # the study's rule: 12 prompts of seed 29, 2 rounds
    python benchmarks/stand_stop.py --prompts 4 --rounds 1 --stops 0.3

Greedy, 128 new tokens, ``drafter="stand"`` at windows 6 and 11, eager and compiled, each
``--stops`` threshold against none (``draft_stop_below=0``), every configuration alternated prompt
by prompt, the order reversed each round, after a warm-up call each. Prints tokens per second,
tau and outputs equal to ``generate``'s, and each threshold's speed over none: per configuration
and their geometric mean (docs/experiments/2026-12-07-stand-stop-below.md).
"""

import itertools
import math
import sys
from pathlib import Path


from visualspec.text import generate_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import alternated_rounds, greedy_references, text_study_pair, text_study_parser  # noqa: E402

NEW_TOKENS = 128


def main():
    parser = text_study_parser(__doc__, seed=29, prompts=12)
    parser.add_argument("--stops", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--windows", type=int, nargs="+", default=[6, 11])
    args = parser.parse_args()
    _, tokenizer, target, texts = text_study_pair(args)
    settings = [(compiled, window) for compiled in (False, True) for window in args.windows]
    stops = [0.0, *args.stops]
    configs = list(itertools.product(settings, stops))

    def call(prompt, config):
        (compiled, window), stop = config
        return generate_text(target, tokenizer, prompt, drafter="stand", window=window, compile=compiled,
                             draft_stop_below=stop, max_new_tokens=NEW_TOKENS, temperature=0)

    reference = greedy_references(target, tokenizer, texts, NEW_TOKENS, compile=False)
    rows = alternated_rounds(configs, call, texts, reference, args.rounds)
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
