"""``visualspec batch``: many prompts into GenEval's folder layout (resumable, shardable)."""

from __future__ import annotations

import contextlib
import json
import os
import sys

from ..loading import device_name, load_pipeline
from .options import add_device_option, add_image_options, call_options, count_arg


def register(sub, common) -> None:
    bt = sub.add_parser("batch", parents=[common],
                        help="many prompts -> GenEval's folder layout (resumable, shardable)")
    bt.add_argument("--prompts", required=True, metavar="FILE",
                    help="prompt file: .jsonl (GenEval metadata, one object per line) or text (one prompt per line)")
    bt.add_argument("--out", required=True, metavar="DIR", help="output folder (DIR/00000/samples/0000.png ...)")
    bt.add_argument("--images-per-prompt", type=count_arg, default=4)
    bt.add_argument("--batch-size", type=count_arg, default=16,
                    help="images decoding at once; a finished image's place goes to the next (continuous batching)")
    bt.add_argument("--chunk-size", type=count_arg, default=None,
                    help="images per chunk, the unit of resume and sharding (default: 4 x --batch-size); "
                         "with --batch-size, part of what fixes the pixels")
    bt.add_argument("--rank", type=int, default=None, help="this shard (with --world-size; default: from torchrun)")
    bt.add_argument("--world-size", type=int, default=None, help="number of shards (with --rank)")
    add_device_option(bt)
    bt.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_image_options(bt)
    bt.set_defaults(func=run)


def run(args) -> int:
    """Generate the batch; Ctrl-C ends it with one line saying what is saved (exit code 130)."""
    from ..batch import read_prompt_lines, saved_images
    from ..paths import check_output_folder

    lines = read_prompt_lines(args.prompts)  # every rank fails the same way on a bad file, before any rendezvous
    if not lines:
        raise ValueError(f"{args.prompts} has no prompts (blank lines and lines starting with # are skipped); "
                         f"nothing was written")
    check_output_folder(args.out, "--out")
    if (args.rank is None) != (args.world_size is None):
        raise ValueError("give both --rank and --world-size, or neither (torchrun / accelerate set them)")
    if args.world_size is not None and not (args.world_size >= 1 and 0 <= args.rank < args.world_size):
        raise ValueError(f"--rank must be in [0, --world-size), got {args.rank} of {args.world_size}")
    try:
        return _generate(args, lines)
    except KeyboardInterrupt:  # after the process group is gone: no rank waits for this one
        if args.world_size is None and os.environ.get("RANK", "0") not in ("", "0"):
            return 130  # under torchrun every rank is interrupted; rank 0 says it once
        saved, total = saved_images(args.out, len(lines), args.images_per_prompt), len(lines) * args.images_per_prompt
        print(f"interrupted: {saved} of {total} images are saved in {args.out}; run the same command again to "
              f"resume", file=sys.stderr)
        return 130


def _generate(args, lines) -> int:
    from ..batch import (check_prompts, combine_summaries, distributed_context, gather_summaries, generate_batch,
                         rank_zero_first)

    prompts = [meta for _, meta in lines]
    context = (contextlib.nullcontext((args.rank, args.world_size)) if args.world_size is not None
               else distributed_context())
    with context as (rank, world_size):
        with rank_zero_first():  # rank 0 builds the default model's cache once; the others then read it
            pipe = load_pipeline(args.model, args.draft_model, args.quantize, device_name(args.device))
        if not pipe.is_text_conditional:
            raise ValueError(f"batch reads text prompts; {pipe.display_name} ({type(pipe).__name__}) is "
                             f"class-conditional (use generate --class-label)")
        kwargs = call_options(pipe, args)
        check_prompts(pipe, [(f"{args.prompts}, line {number}", meta) for number, meta in lines])
        pipe.to(device_name(args.device))
        decoding = kwargs.pop("decoding", None) or pipe.default_decoding()
        summary = generate_batch(pipe, prompts, args.out, images_per_prompt=args.images_per_prompt,
                                 decoding=decoding, seed=args.seed, batch_size=args.batch_size,
                                 chunk_size=args.chunk_size, rank=rank,
                                 world_size=world_size, progress=not args.no_progress, **kwargs)
        summaries = gather_summaries(summary)  # every rank's, when torchrun / accelerate started the ranks
        if len(summaries) == 1 or rank == 0:
            if not any(s["calls"] for s in summaries):
                which = (f"all {sum(s['skipped'] for s in summaries)} images" if len(summaries) == world_size
                         else f"the {summary['skipped']} images of rank {rank} of {world_size}")
                stats = (f"batch_stats_rank{rank}.json is left as it was" if len(summaries) == 1
                         else "the batch_stats_rank*.json files are left as they were")
                print(f"nothing left to do: {which} are already in {args.out}; {stats}", file=sys.stderr)
            print(json.dumps(summary if len(summaries) == 1 else combine_summaries(summaries, len(prompts))))
    return 0
