"""``visualspec bench-text``: text speculative decoding against transformers' own, in one run."""

from __future__ import annotations

import json
from pathlib import Path

from .options import QUANTIZE_CHOICES, count_arg


def register(sub, common) -> None:
    bt = sub.add_parser("bench-text", parents=[common],
                        help="text speculative decoding vs transformers' generate and assisted generation")
    bt.add_argument("--pair", default=None, help="folder written by train-text (default: the shipped pair)")
    bt.add_argument("--prompts", type=count_arg, default=8)
    bt.add_argument("--new-tokens", type=count_arg, default=128)
    bt.add_argument("--window", type=count_arg, default=6, help="tokens per target forward (model-free drafters)")
    bt.add_argument("--draft-window", type=count_arg, default=10, help="the draft model's window (drafts + 1)")
    bt.add_argument("--draft-stop-below", type=float, default=0.2,
                    help="the draft model stops drafting below this confidence")
    bt.add_argument("--compile", choices=("off", "on", "both"), default="both",
                    help="eager rows, compiled rows (static cache, torch.compile; ours and transformers'), or both")
    bt.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                    help="also AR and STAND rows on the target with quantised weights (torchao)")
    bt.add_argument("--feature-window", type=count_arg, default=4,
                    help="the feature drafter's window (drafts + 1), where the pair has one (feature-drafter/); "
                         "4 was chosen on prompts of --seed 1 (docs/experiments/2026-11-27-feature-drafter-text.md)")
    bt.add_argument("--lookup-window", type=count_arg, default=8,
                    help="the window of the feature drafter's + lookup rows; 8 was chosen on prompts of --seed 21 "
                         "(docs/experiments/2026-12-07-lookup-feature-drafter.md)")
    bt.add_argument("--kangaroo-window", type=count_arg, default=4,
                    help="the Kangaroo drafter's window (drafts + 1), where the pair has one (kangaroo/); 4 was "
                         "chosen on prompts of --seed 1 (docs/experiments/2026-11-28-kangaroo-text.md)")
    bt.add_argument("--feature-tree", type=count_arg, nargs=2, metavar=("DEPTH", "WIDTH"), default=None,
                    help="the feature drafter's dynamic tree rows: levels and nodes per level (default: the one "
                         "chosen in docs/experiments/2026-11-28-dynamic-tree-text.md)")
    bt.add_argument("--seed", type=int, default=0,
                    help="which held-out prompts (0: the reported tables'; choices are made on others)")
    bt.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy (every row must equal generate's output); > 0: every row samples at it")
    bt.add_argument("--judge", default=None,
                    help="a judge folder for the target (train-judge --pair): adds the draft model rows under judge "
                         "decoding, prompts from the held-out files the judge did not see, and each row's validity")
    bt.add_argument("--judge-thresholds", type=float, nargs="+", default=None,
                    help="with --judge: thresholds to run (default: the judge's own)")
    bt.add_argument("--only", nargs="+", help="run only these rows (and generate, the reference)")
    bt.add_argument("--multidraft-gap", action="store_true", help="also the multi-draft verifiers vs the optimum")
    bt.add_argument("--json", help="write the results here")
    bt.set_defaults(func=run)


def run(args) -> int:
    from ..bench_text import multidraft_gap, pair_folder, run_text_benchmark

    from ..paths import check_output_file, write_text_atomic

    args.pair = pair_folder(args.pair)  # a missing or wrong folder is named before anything loads
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    if args.json:
        check_output_file(args.json, "--json")
    if args.judge_thresholds and not args.judge:
        raise ValueError("--judge-thresholds needs --judge (a judge folder)")
    for t in args.judge_thresholds or ():
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"--judge-thresholds must be in [0, 1], got {t}")
    if args.judge and not (Path(args.judge) / "config.json").is_file():
        raise ValueError(f"--judge {args.judge!r} is not a judge folder (no config.json); train one with "
                         f"visualspec train-judge --pair")
    result = run_text_benchmark(args.pair, prompts=args.prompts, new_tokens=args.new_tokens, window=args.window,
                                draft_window=args.draft_window, stop_below=args.draft_stop_below,
                                compile=args.compile, quantize=args.quantize, progress=True,
                                feature_window=args.feature_window, seed=args.seed, only=args.only,
                                temperature=args.temperature, kangaroo_window=args.kangaroo_window,
                                judge=args.judge, judge_thresholds=tuple(args.judge_thresholds or (None,)),
                                lookup_window=args.lookup_window,
                                **({"feature_tree": tuple(args.feature_tree)} if args.feature_tree else {}))
    if args.multidraft_gap:
        result["multidraft_gap"] = multidraft_gap(args.pair)
    text = json.dumps(result, indent=1)
    if args.json:
        write_text_atomic(args.json, text + "\n")
    print(text)
    return 0
