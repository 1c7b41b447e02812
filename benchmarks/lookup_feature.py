"""Choose ``generate_text(..., lookup=)``: copy drafts where the context repeats, the feature drafter elsewhere.

    python benchmarks/lookup_feature.py                 # the study's rule: 16 prompts of seed 21, 2 rounds
    python benchmarks/lookup_feature.py --prompts 4 --rounds 1 --lookups 2 --windows 6

Compiled, greedy, 128 new tokens, every configuration (``lookup`` x fixed window x the feature
drafter's cap of drafts a step) alternated prompt by prompt, the order reversed each round, after
a warm-up call each. Prints tokens per second, tau and outputs equal to compiled AR's, best first
(docs/experiments/2026-12-07-lookup-feature-drafter.md).
"""

import itertools
import sys
from pathlib import Path


import visualspec.text.generate as generate
from visualspec.text import generate_text
from visualspec.tools.bench_text import load_feature_drafter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import (alternated_rounds, greedy_references, print_fastest_first, text_study_pair,  # noqa: E402
                    text_study_parser)

NEW_TOKENS = 128


def main():
    parser = text_study_parser(__doc__, seed=21, prompts=16)
    parser.add_argument("--lookups", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 6, 8, 12])
    parser.add_argument("--caps", type=int, nargs="+", default=[3, 0],
                        help="the feature drafter's drafts a step (0: the window's)")
    args = parser.parse_args()
    folder, tokenizer, target, texts = text_study_pair(args)
    feature = load_feature_drafter(folder)

    configs = {}
    for lookup, window, cap in itertools.product(args.lookups, args.windows, args.caps):
        cap = cap or None
        if cap is not None and cap >= window - 1:
            continue  # the same as not capped
        configs[f"lookup {lookup}, window {window}, cap {cap or '-'}"] = (dict(drafter=feature, window=window,
                                                                              lookup=lookup), cap)
    configs["(feature drafter, window 4)"] = (dict(drafter=feature, window=4), None)
    configs["(n-gram, window 6)"] = (dict(drafter="ngram", window=6), None)
    configs["(STAND, window 6)"] = (dict(drafter="stand", window=6), None)

    def call(prompt, name):
        kw, cap = configs[name]
        generate.LOOKUP_FEATURE_DRAFTS = cap
        return generate_text(target, tokenizer, prompt, max_new_tokens=NEW_TOKENS, temperature=0, compile=True, **kw)

    rows = alternated_rounds(configs, call, texts, greedy_references(target, tokenizer, texts, NEW_TOKENS),
                             args.rounds)
    print_fastest_first(rows, args.rounds * len(texts), 34)


if __name__ == "__main__":
    main()
