"""``visualspec bench``: a pipeline's decodings side by side in one run (ratios to AR)."""

from __future__ import annotations

import json
from pathlib import Path

from ..loading import device_name, load_pipeline
from .options import add_device_option, add_image_options, call_options, count_arg, flag


def register(sub, common) -> None:
    b = sub.add_parser("bench", parents=[common], help="AR vs SJD vs LANTERN, side by side in one run")
    b.add_argument("--prompt", action="append", help="prompt (repeatable; default: a built-in list)")
    b.add_argument("--modes", default=None,
                   help="comma-separated, the pipeline's bench modes (default: its own list); token models: ar, sjd, "
                        "sjd+coupling, sjd+pd, sjd+coupling+pd, lantern, gsd, judge (a judge in the folder), speculative, "
                        "feature (a feature drafter in the folder), lantern+feature and gsd+feature (the relaxed rules "
                        "over its drafts), sjd+hybrid (its first drafts, Jacobi's past them), lantern@DELTA and judge@THRESHOLD (another budget or threshold), "
                        "each also +compiled (the "
                        "compiled step; otherwise eager); continuous-token models: ar, cspd, cspd+flat, each "
                        "optionally @STEPS for that many diffusion-head steps; any mode +int8 (or another --quantize scheme) "
                        "runs on quantised weights. Speed-ups are over the fastest AR mode")
    b.add_argument("--with-model", action="append", metavar="FOLDER",
                   help="another pipeline timed in the same run (repeatable); its modes are spelled NAME:MODE with "
                        "NAME the folder's name, e.g. --with-model assets/shapes-t2i --modes assd,shapes-t2i:sjd")
    b.add_argument("--batch-sizes", type=count_arg, nargs="+", default=[1],
                   help="images per call; each batch size is its own side-by-side run (ratios to AR at that size)")
    b.add_argument("--images", type=count_arg, default=4, help="images per mode")
    b.add_argument("--json", help="also write the results to this JSON file")
    b.add_argument("--quality", action="store_true",
                   help="shapes world: benchmark on GenEval-shapes prompts and score GenEval-shapes and FID-shapes")
    b.add_argument("--per-task", type=count_arg, default=20, help="with --quality: prompts per GenEval task")
    b.add_argument("--keep-images", metavar="DIR", help="keep the generated images here (one folder per mode)")
    add_device_option(b)
    add_image_options(b, decoding=False)
    b.set_defaults(func=run)


def run(args) -> int:
    from ...models.quantized import check_quantize
    from ..bench import run_benchmark, split_model, split_quantized
    from ..paths import check_output_file, check_output_folder, write_text_atomic

    if args.json:
        check_output_file(args.json, "--json")
    if args.keep_images:
        check_output_folder(args.keep_images, "--keep-images")
    given = None if args.modes is None else [m.strip() for m in args.modes.split(",") if m.strip()]
    if given == []:
        raise ValueError(f"--modes names no mode ({args.modes!r}); give comma-separated modes, e.g. ar,sjd")
    device = device_name(args.device)
    check_quantize(args.quantize, device)
    pipe = load_pipeline(args.model, args.draft_model)
    others = {}
    for folder in args.with_model or ():
        other = load_pipeline(folder)
        name = Path(folder).name
        if name in others:
            raise ValueError(f"--with-model names two pipelines {name!r}; give folders of different names")
        others[name] = other
    cls = type(pipe)
    given = list(given or cls.default_bench_modes)
    if args.quantize:  # each mode twice: the pipeline's weights, then the quantised ones
        given += [f"{m}+{args.quantize}" for m in given if split_quantized(m)[1] is None]
    missing = [m for m in given if split_model(m)[0] is not None and split_model(m)[0] not in others]
    if missing:
        raise ValueError(f"bench modes {missing} name a pipeline not given with --with-model "
                         f"(given: {sorted(others) or 'none'})")
    modes = {m: (others[split_model(m)[0]] if split_model(m)[0] else pipe).bench_mode(
        split_quantized(split_model(m)[1])[0]) for m in given}
    kwargs = call_options(pipe, args)
    by_mode = sorted({k for settings in modes.values() for k in settings} & set(kwargs))
    if by_mode:
        raise ValueError(f"bench sets {', '.join(map(flag, by_mode))} in its modes ({', '.join(modes)}); "
                         f"choose modes with --modes instead")
    pipe.to(device)
    for other in others.values():
        other.to(device)
    prompts, scorer = args.prompt or None, None
    if args.quality:
        from ...eval.shapes_quality import score_shapes_folder
        from ...worlds.shapes import evaluation_prompts

        prompts = evaluation_prompts(per_task=args.per_task, seed=args.seed)
        args.images = len(prompts)
        scorer = score_shapes_folder
    results = []
    for batch_size in args.batch_sizes:
        keep = None if args.keep_images is None else str(Path(args.keep_images) / f"batch{batch_size}")
        result = run_benchmark(pipe, prompts=prompts, modes=list(modes), images=args.images, seed=args.seed,
                               batch_size=batch_size, scorer=scorer, keep_images=keep, progress=True, others=others,
                               **kwargs)
        results.append(result)
        print(f"batch {batch_size}, {result['images_per_mode']} images per mode, speed-ups over {result['baseline']}, "
              f"{result['machine']}")
        print(result["table"], flush=True)
    if args.json:
        write_text_atomic(args.json, json.dumps(results if len(results) > 1 else results[0], indent=2) + "\n")
    return 0
