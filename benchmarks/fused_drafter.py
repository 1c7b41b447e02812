"""Does EAGLE-3's multi-layer fusion pay on the text pair? The shipped feature drafter against one
that fuses several of the target's hidden states (``train-drafter --feature-layers``).

    python benchmarks/fused_drafter.py --fused FOLDER            # the study's rule: 16 prompts of seed 47, 2 rounds
    python benchmarks/fused_drafter.py --fused FOLDER --prompts 2 --rounds 1

Compiled, greedy, 128 new tokens; each drafter at the shipped text configuration (copying first:
``lookup=3``, window 8, at most 3 feature drafts a step) and alone at windows 4 and 8, every row
alternated prompt by prompt, the order reversed each round, after a warm-up call each. Prints tokens
per second, tau and outputs equal to compiled AR's, best first
(docs/experiments/2026-12-07-fused-feature-drafter.md).
"""

import sys
from pathlib import Path

import torch

from visualspec.models.feature_drafter import load_draft_model
from visualspec.text import generate_text
from visualspec.tools.bench_text import load_feature_drafter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import (alternated_rounds, greedy_references, print_fastest_first, text_study_pair,  # noqa: E402
                    text_study_parser)

NEW_TOKENS = 128


def main():
    parser = text_study_parser(__doc__, seed=47, prompts=16)
    parser.add_argument("--fused", required=True, help="the fusing drafter's folder")
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 8], help="the drafters' windows alone")
    args = parser.parse_args()
    folder, tokenizer, target, texts = text_study_pair(args)
    drafters = {"shipped": load_feature_drafter(folder),
                "fused": load_draft_model(args.fused, torch_dtype=torch.float32).eval()}

    configs = {}
    for name, drafter in drafters.items():
        configs[f"{name}: lookup 3, window 8"] = dict(drafter=drafter, window=8, lookup=3)
        for window in args.windows:
            configs[f"{name}: window {window}"] = dict(drafter=drafter, window=window)

    def call(prompt, name):
        return generate_text(target, tokenizer, prompt, max_new_tokens=NEW_TOKENS, temperature=0, compile=True,
                             **configs[name])

    rows = alternated_rounds(configs, call, texts, greedy_references(target, tokenizer, texts, NEW_TOKENS),
                             args.rounds)
    print_fastest_first(rows, args.rounds * len(texts), 28)


if __name__ == "__main__":
    main()
