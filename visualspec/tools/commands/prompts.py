"""``visualspec prompts``: the shapes world's GenEval evaluation prompts, as a prompt file."""

from __future__ import annotations

import sys

from .options import count_arg


def register(sub, common) -> None:
    pr = sub.add_parser("prompts", parents=[common],
                        help="write the shapes world's GenEval evaluation prompts (for batch and eval geneval)")
    pr.add_argument("--per-task", type=count_arg, default=100, help="prompts per GenEval task (six tasks)")
    pr.add_argument("--seed", type=int, default=0, help="prompt seed (the README's tables use 2000, 3000, 5000)")
    pr.add_argument("-o", "--output", default="prompts.jsonl")
    pr.set_defaults(func=run)


def run(args) -> int:
    """Write the shapes world's GenEval-style evaluation prompts (metadata JSON lines)."""
    from ...worlds.shapes import evaluation_prompts, write_prompt_file

    from ..paths import check_output_file

    check_output_file(args.output, "-o")
    prompts = evaluation_prompts(per_task=args.per_task, seed=args.seed)
    write_prompt_file(args.output, prompts)
    print(f"{args.output}: {len(prompts)} prompts", file=sys.stderr)
    return 0
