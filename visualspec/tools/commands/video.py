"""``visualspec video`` and ``visualspec bench-video``: the arena world model, played and timed."""

from __future__ import annotations

import json
from pathlib import Path

from ..loading import device_name, world_model
from .options import add_device_option, add_dtype_option, count_arg


def register(sub, common) -> None:
    v = sub.add_parser("video", parents=[common], help="play an action script in the arena world model -> .mp4 / .gif")
    v.add_argument("--model", help="video pipeline folder (default: the shipped arena model)")
    v.add_argument("--actions", help="comma-separated keys (none, up, down, left, right), each optionally with a "
                                     "frame count (right:30); keys without a count share --frames evenly; "
                                     "default: random keys")
    v.add_argument("--frames", type=count_arg, default=None, help="frames to generate")
    v.add_argument("--steps", type=count_arg, default=None)
    v.add_argument("--speculate", type=count_arg, default=4, help="frames generated ahead while the action persists")
    v.add_argument("--no-guard", dest="guard", action="store_false",
                   help="show frames generated ahead even where they lost the ball (guarded by default)")
    v.add_argument("--teacher", action="store_true", help="use the undistilled model")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--stats", action="store_true", help="print the statistics instead of the file name")
    v.add_argument("-o", "--output", default="play.mp4")
    add_dtype_option(v)
    add_device_option(v)
    v.set_defaults(func=run_video)

    bv = sub.add_parser("bench-video", parents=[common],
                        help="world model frames per second: teacher, distilled, speculation, compiled")
    bv.add_argument("--model")
    bv.add_argument("--frames", type=count_arg, default=300)
    bv.add_argument("--rounds", type=count_arg, default=3)
    bv.add_argument("--seed", type=int, default=0)
    bv.add_argument("--quality", action="store_true", help="also one-step PSNR and 60-frame player rollouts")
    bv.add_argument("--episodes", type=count_arg, default=16)
    bv.add_argument("--unguarded", action="store_true",
                    help="also each speculation unguarded (frames generated ahead shown even where they lost the "
                         "ball, as NFD speculates), alternated with the guarded one: with --quality and --players")
    bv.add_argument("--rollout-seed", type=int, default=None,
                    help="with --quality, the first rollout episode's seed (default: the held-out episodes')")
    bv.add_argument("--speculate", type=count_arg, nargs="+", default=[4],
                    help="with --quality: frames speculated ahead in the speculative rollouts, one row each (default 4)")
    bv.add_argument("--players", type=count_arg,
                    help="instead: this many worlds stepped together in batched forwards against one after "
                         "another, at speculate 1 and 4")
    bv.add_argument("--json", help="write the results here")
    add_dtype_option(bv)
    add_device_option(bv)
    bv.set_defaults(func=run_bench_video)


def run_video(args) -> int:
    from ...pipelines import export_video
    from ..paths import check_output_file

    check_output_file(args.output, "-o")
    if Path(args.output).suffix.lower() not in (".mp4", ".gif"):
        raise ValueError(f"-o {args.output!r}: export to .mp4 or .gif")
    actions = action_script(args.actions, args.frames) if args.actions else None
    device = device_name(args.device)
    pipe = world_model(args.model, args.dtype, device)
    pipe.set_progress_bar_config(disable=False, desc="video frames")
    out = pipe(actions=actions, num_frames=args.frames if not actions else None, seed=args.seed, steps=args.steps,
               speculate=args.speculate, use_teacher=args.teacher, guard=args.guard)
    export_video(out.frames, args.output)
    print(json.dumps(out.stats.to_dict(), indent=1) if args.stats else args.output)
    return 0


def action_script(text: str, frames: int | None) -> list[str]:
    """``--actions`` -> one action per frame. ``key:n`` holds a key for n frames; keys without a
    count share the frames left by the counted ones evenly (the earlier keys get one more when they
    do not divide), or take one frame each when ``frames`` is not given.

    ``right,up`` with 60 frames: 30 right, then 30 up; ``right:10,up`` with 60: 10 right, 50 up.
    """
    keys, counts = [], []
    for i, item in enumerate(text.split(","), 1):
        key, _, count = item.strip().partition(":")
        if not key:
            raise ValueError(f"--actions item {i} is empty (got {text!r})")
        if count and (not count.isdigit() or int(count) < 1):
            raise ValueError(f"--actions item {i} ({item!r}): the frame count must be an integer >= 1")
        keys.append(key)
        counts.append(int(count) if count else None)
    free = [i for i, c in enumerate(counts) if c is None]
    fixed = sum(c for c in counts if c is not None)
    if frames is not None and free:
        left = frames - fixed
        if left < len(free):
            raise ValueError(f"--frames {frames} leaves {max(left, 0)} frames for {len(free)} keys without a count")
        for j, i in enumerate(free):
            counts[i] = left // len(free) + (1 if j < left % len(free) else 0)
    counts = [1 if c is None else c for c in counts]
    script = [key for key, c in zip(keys, counts) for _ in range(c)]
    if frames is not None and len(script) != frames:
        raise ValueError(f"--actions gives {len(script)} frames but --frames is {frames}")
    return script


def run_bench_video(args) -> int:
    from ..bench import run_video_benchmark
    from ..paths import check_output_file, write_text_atomic

    if args.json:
        check_output_file(args.json, "--json")
    device = device_name(args.device)
    pipe = world_model(args.model, args.dtype, device)
    guards = (True, False) if args.unguarded else (True,)  # each speculation guarded, and unguarded beside it
    if args.players:
        from ..bench import run_players_benchmark

        result = run_players_benchmark(pipe, args.players, frames=args.frames, rounds=args.rounds, seed=args.seed,
                                       progress=True, guards=guards)
        if args.json:
            write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")
        print(result["table"])
        return 0
    result = run_video_benchmark(pipe, frames=args.frames, rounds=args.rounds, seed=args.seed, progress=True)
    if args.quality:
        from tqdm.auto import tqdm

        from ...eval.video import one_step_psnr, rollout_player_error

        bar = tqdm(total=4 + len(args.speculate) * len(guards),
                   desc="bench-video --quality (PSNR, then rollouts)")

        def counted(row):
            bar.update()
            return row

        episodes = {"episodes": args.episodes, **({} if args.rollout_seed is None else {"seed": args.rollout_seed})}
        result["quality"] = {
            "one_step": [counted(one_step_psnr(pipe, episodes=args.episodes)),
                         counted(one_step_psnr(pipe, args.episodes, use_teacher=True))],
            "rollout_60": [counted(rollout_player_error(pipe, **episodes)),
                           *(counted(rollout_player_error(pipe, **episodes, speculate=k, guard=guard))
                             for k in args.speculate for guard in guards),
                           counted(rollout_player_error(pipe, **episodes, use_teacher=True))],
        }
        bar.close()
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")
    print(result["table"])
    if args.quality:
        print(json.dumps(result["quality"], indent=1))
    return 0
