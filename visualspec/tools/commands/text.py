"""``visualspec bench-text``: text speculative decoding against transformers' own, in one run."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub, common) -> None:
    bt = sub.add_parser("bench-text", parents=[common],
                        help="text speculative decoding vs transformers' generate and assisted generation")
    bt.add_argument("--pair", default=None, help="folder written by train-text (default: the shipped pair)")
    bt.add_argument("--prompts", type=int, default=8)
    bt.add_argument("--new-tokens", type=int, default=128)
    bt.add_argument("--window", type=int, default=6, help="tokens per target forward (model-free drafters)")
    bt.add_argument("--draft-window", type=int, default=10, help="the draft model's window (drafts + 1)")
    bt.add_argument("--draft-stop-below", type=float, default=0.2,
                    help="the draft model stops drafting below this confidence")
    bt.add_argument("--compile", choices=("off", "on", "both"), default="both",
                    help="eager rows, compiled rows (static cache, torch.compile; ours and transformers'), or both")
    bt.add_argument("--multidraft-gap", action="store_true", help="also the multi-draft verifiers vs the optimum")
    bt.add_argument("--json", help="write the results here")
    bt.set_defaults(func=run)


def run(args) -> int:
    from ...assets import TEXT_PAIR
    from ..bench_text import multidraft_gap, run_text_benchmark

    args.pair = args.pair or str(TEXT_PAIR)
    result = run_text_benchmark(args.pair, prompts=args.prompts, new_tokens=args.new_tokens, window=args.window,
                                draft_window=args.draft_window, stop_below=args.draft_stop_below,
                                compile=args.compile)
    if args.multidraft_gap:
        result["multidraft_gap"] = multidraft_gap(args.pair)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0
