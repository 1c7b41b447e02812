"""The ``visualspec`` command line.

    visualspec generate "a photo of a red circle" --decoding sjd --seed 0 -o out.png --stats
    visualspec batch --prompts prompts.jsonl --out images/        (torchrun / accelerate launch shard it)
    visualspec prompts --per-task 100 --seed 2000 -o prompts.jsonl   (the shapes world's evaluation prompts)
    visualspec eval geneval images/          visualspec eval fid images/ --ref stats.npz
    visualspec bench --images 4 --json bench.json
    visualspec train-shapes --out assets/shapes-t2i
    visualspec train-continuous --out continuous-shapes
    visualspec train-unified --out unified-shapes
    visualspec video --actions right,right,up --frames 60 -o play.mp4
    visualspec bench-video --quality
    visualspec train-arena --out assets/arena-nfd
    visualspec train-text --out assets/text-pair
    visualspec convert-llamagen --gpt c2i_L_256.pt --gpt-model GPT-L --vq vq_ds16_c2i.pt --out llamagen-L
    visualspec convert-mar --checkpoint checkpoint-last.pth --vae kl16.ckpt --name mar_base --out mar-base
    visualspec convert-lumina Lumina-mGPT-7B-768 --vqgan vqgan.ckpt --vqgan-config vqgan.yaml --out lumina-768
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# literal copies of the pipeline's names, so that parsing arguments needs no torch import;
# tests/test_cli.py checks them against their sources
MODES = ("ar", "sjd", "lantern", "gsd", "speculative")
JACOBI_INITS = ("random", "repeat_left", "repeat_above")


def cache_dir() -> Path:
    return Path(os.environ.get("VISUALSPEC_HOME", Path.home() / ".cache" / "visualspec"))


def default_model() -> tuple[str, str]:
    """(folder, description) of the default model: the shipped one. A missing shipped model is an
    error that says so; the tiny random model (tests only) is never substituted for it."""
    from ..assets import SHAPES_T2I as shipped

    if not (shipped / "model_index.json").is_file():
        raise SystemExit(f"error: the shipped model is missing from this installation ({shipped} has no "
                         f"model_index.json); reinstall visualspec, or pass --model FOLDER")
    return str(shipped), "shipped shapes model"


def shipped_or_path(model: str) -> str:
    """``model`` as given, or the shipped folder of that name (``shapes-lumina``) when no such path
    exists here."""
    from ..assets import ASSETS

    if not Path(model).exists() and "/" not in model and (ASSETS / model / "model_index.json").is_file():
        return str(ASSETS / model)
    return model


def tiny_random_folder() -> str:
    """The tiny random model's folder in the cache, built offline on first use."""
    from ..pipelines.tiny import tiny_random_pipeline

    folder = cache_dir() / "tiny-random-llamagen"
    if not (folder / "model_index.json").is_file():
        tiny_random_pipeline(seed=0).save_pretrained(folder)
    return str(folder)


def load_pipeline(model: str | None, draft_model: str | None = None):
    """The image pipeline in ``model`` (default: the shipped one), with the draft model of
    ``draft_model`` (a LlamaGen GPT folder, or a pipeline folder whose transformer drafts)."""
    from ..pipelines import (ContinuousARPipeline, LlamaGenPipeline, MARPipeline, UnifiedARPipeline,
                             VisualSpecPipeline)

    folder, description = (shipped_or_path(model), model) if model else default_model()
    print(f"model: {description}", file=sys.stderr)
    pipe = VisualSpecPipeline.from_pretrained(folder)
    if draft_model and isinstance(pipe, (MARPipeline, ContinuousARPipeline, UnifiedARPipeline)):
        raise SystemExit("error: --draft-model is for LlamaGen folders")
    if not isinstance(pipe, (LlamaGenPipeline, MARPipeline, ContinuousARPipeline, UnifiedARPipeline)):
        raise SystemExit(f"error: {folder} holds a {type(pipe).__name__}, not an image pipeline"
                         + (" (a video model: use `visualspec video --model`)" if hasattr(pipe, "interactive") else ""))
    if draft_model:
        pipe.register_modules(draft_model=_draft_transformer(draft_model))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _draft_transformer(folder: str):
    from ..models.llamagen import LlamaGenGPT
    from ..pipelines import LlamaGenPipeline

    if (Path(folder) / "model_index.json").is_file():
        return LlamaGenPipeline.from_pretrained(folder).transformer
    if (Path(folder) / "config.json").is_file():
        return LlamaGenGPT.from_pretrained(folder).eval()
    raise SystemExit(f"error: --draft-model {folder} is neither a pipeline folder nor a LlamaGen GPT folder")


def check_image_path(path: str) -> str:
    """An output path whose extension Pillow can write, else a clear error (before any work)."""
    from PIL import Image

    ext = Path(path).suffix.lower()
    known = Image.registered_extensions()
    if ext not in known or known[ext] not in Image.SAVE:
        usable = ", ".join(e for e in (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif") if e in known)
        raise SystemExit(f"error: cannot write an image to {path!r}: unknown extension {ext or '(none)'!r}; "
                         f"use one of {usable}")
    return path


def _prompt_or_labels(args):
    if args.class_label is not None:
        if args.prompt:
            raise SystemExit("error: give a prompt or --class-label, not both")
        return args.class_label
    if not args.prompt:
        raise SystemExit("error: give a prompt (text model) or --class-label N (class model)")
    return args.prompt


def _window_arg(text: str):
    if text == "auto":
        return text
    try:
        return int(text)  # the pipeline names a value below 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window must be an integer >= 1 or 'auto', got {text!r}") from None


UNIFIED_ONLY = ("negative_prompt", "guidance_schedule")  # options only unified-vocabulary pipelines have


def _decode_kwargs(args, unified: bool = False) -> dict:
    given = [f"--{name.replace('_', '-')}" for name in UNIFIED_ONLY if getattr(args, name, None) is not None]
    if given and not unified:
        raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for unified-vocabulary models "
                         f"(Lumina-mGPT, Emu3, Janus) only")
    kw = dict(guidance_scale=args.guidance_scale, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, epsilon_cutoff=args.epsilon_cutoff, window=args.window, jacobi_init=args.jacobi_init)
    if args.coupling is not None:
        kw["coupling"] = args.coupling == "on"
    if args.gsd_group_size is not None:
        kw["gsd_group_size"] = args.gsd_group_size
    if args.siblings is not None:
        kw["siblings"] = args.siblings
    if args.sibling_depth is not None:
        kw["sibling_depth"] = args.sibling_depth
    if args.lantern_k is not None:
        kw["lantern_k"] = args.lantern_k
    if args.lantern_delta is not None:
        kw["lantern_delta"] = args.lantern_delta
    return kw


def _continuous_kwargs(args, mar: bool) -> dict:
    """The options of a continuous-token pipeline (MAR's sampler, or AR/CSpD) from the command line;
    the token pipelines' options, and the other kind's, are refused by name."""
    refused = {"--top-k": args.top_k, "--top-p": None if args.top_p == 1.0 else args.top_p,
               "--epsilon-cutoff": args.epsilon_cutoff, "--window": None if args.window == "auto" else args.window,
               "--coupling": args.coupling, "--gsd-group-size": args.gsd_group_size,
               "--siblings": args.siblings, "--sibling-depth": args.sibling_depth,
               "--jacobi-init": args.jacobi_init, "--lantern-k": args.lantern_k, "--lantern-delta": args.lantern_delta,
               "--negative-prompt": args.negative_prompt, "--guidance-schedule": args.guidance_schedule}
    own_of = lambda name: getattr(args, name, None)  # noqa: E731 (batch has no MAR options)
    refused.update({"--gamma": own_of("gamma"), "--prefill": own_of("prefill"), "--num-steps": own_of("num_steps")}
                   if mar else
                   {"--num-iter": own_of("num_iter"), "--cfg-schedule": own_of("cfg_schedule")})
    given = [name for name, value in refused.items() if value is not None]
    own = "--num-iter, --guidance-scale, --cfg-schedule, --temperature" if mar else \
        "--decoding ar|cspd, --gamma, --prefill, --num-steps, --guidance-scale, --temperature"
    kind = "MAR" if mar else "a continuous-token model"
    if given:
        raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not an option of {kind}: "
                         f"it takes {own}")
    allowed = (None, "ar") if mar else (None, "ar", "cspd")
    decoding = own_of("decoding")
    if decoding not in allowed:
        raise ValueError(f"{kind} decodes with --decoding {' or '.join(a for a in allowed if a)}; "
                         f"{decoding} is not built for it")
    kw = dict(guidance_scale=args.guidance_scale, temperature=args.temperature)
    names = ("num_iter", "cfg_schedule") if mar else ("decoding", "gamma", "prefill", "num_steps")
    kw.update({name: own_of(name) for name in names if own_of(name) is not None})
    return kw


def _unified_kwargs(args) -> dict:
    """The options of a unified-vocabulary pipeline (Lumina-mGPT's layout) from the command line;
    the options it does not have are refused by name."""
    kw = _decode_kwargs(args, unified=True)
    kw.update({name: getattr(args, name) for name in UNIFIED_ONLY if getattr(args, name, None) is not None})
    given = [f"--{name.replace('_', '-')}" for name in ("gsd_group_size", "siblings", "sibling_depth")
             if kw.pop(name, None) is not None]
    others = (("--class-label", getattr(args, "class_label", None)),
              ("--acceptance-map", getattr(args, "acceptance_map", None)))
    given += [name for name, value in others if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not built for unified-vocabulary "
                         f"models yet")
    return {**kw, "decoding": getattr(args, "decoding", None) or "sjd"}


def cmd_generate(args) -> int:
    check_image_path(args.output)
    if args.acceptance_map:
        check_image_path(args.acceptance_map)
    if args.decoding == "speculative" and not args.draft_model:
        raise SystemExit("error: --decoding speculative needs --draft-model FOLDER (a smaller LlamaGen of the same "
                         "vocabulary), or use --decoding sjd")
    pipe = load_pipeline(args.model, args.draft_model)
    from ..pipelines import ContinuousARPipeline, MARPipeline, UnifiedARPipeline

    if isinstance(pipe, UnifiedARPipeline):
        kwargs = _unified_kwargs(args)
        if not args.prompt:
            raise SystemExit("error: give a prompt")
        out = pipe(args.prompt, seed=args.seed, num_images_per_prompt=args.num_images, **kwargs)
    elif isinstance(pipe, (MARPipeline, ContinuousARPipeline)):  # continuous tokens: their own options
        mar = isinstance(pipe, MARPipeline)
        if args.acceptance_map and mar:
            raise ValueError("--acceptance-map is for the raster-order pipelines; MAR's masked sampler has none")
        out = pipe(_prompt_or_labels(args), seed=args.seed, num_images_per_prompt=args.num_images,
                   **_continuous_kwargs(args, mar))
    else:
        out = pipe(_prompt_or_labels(args), decoding=args.decoding or "sjd", seed=args.seed,
                   num_images_per_prompt=args.num_images, **_decode_kwargs(args))
    paths = [args.output] if len(out.images) == 1 else [
        str(Path(args.output).with_name(f"{Path(args.output).stem}_{i}{Path(args.output).suffix}"))
        for i in range(len(out.images))]
    for image, path in zip(out.images, paths):
        _atomic_save(image, path)
        print(path)
    if args.stats:
        print(out.stats.summary())
        print(json.dumps(out.stats.to_dict()))
    if args.acceptance_map:
        g = pipe.transformer.grid_size
        _atomic_save(out.stats.acceptance_map_image(g, g), args.acceptance_map)
    return 0


def _atomic_save(image, path: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    from PIL import Image

    image.save(tmp, format=Image.registered_extensions().get(path.suffix.lower(), "PNG"))
    os.replace(tmp, path)


def _device(device: str | None) -> str:
    """``--device``, or by default cuda:$LOCAL_RANK when CUDA is available, else cpu."""
    if device is not None:
        return device
    import torch

    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


def cmd_bench(args) -> int:
    from ..pipelines.unified import UNIFIED_DECODING_MODES
    from .bench import mode_kwargs, run_benchmark

    pipe = load_pipeline(args.model, args.draft_model)
    from ..pipelines import UnifiedARPipeline

    unified = isinstance(pipe, UnifiedARPipeline)
    pipe.to(_device(args.device))
    prompts, scorer = args.prompt or None, None
    if args.quality:
        from ..eval.shapes_quality import score_shapes_folder
        from ..worlds.shapes import evaluation_prompts

        prompts = evaluation_prompts(per_task=args.per_task, seed=args.seed)
        args.images = len(prompts)
        scorer = score_shapes_folder
    from ..pipelines import ContinuousARPipeline, MARPipeline

    if isinstance(pipe, MARPipeline):
        raise ValueError("bench compares decodings of one model; a MAR folder has one (its sampler): time it with "
                         "generate --stats")
    continuous = isinstance(pipe, ContinuousARPipeline)
    if continuous:
        kwargs = _continuous_kwargs(args, mar=False)
    elif unified:
        kwargs = _unified_kwargs(args)
        kwargs.pop("coupling", None)  # a mode of its own: sjd+coupling
        for mode in filter(None, (args.modes or "").split(",")):
            settings = mode_kwargs(mode)
            if set(settings) - {"decoding", "coupling"} or settings["decoding"] not in UNIFIED_DECODING_MODES:
                raise ValueError(f"bench mode {mode!r} is not built for unified-vocabulary models; they take "
                                 f"{', '.join(UNIFIED_DECODING_MODES)}, each optionally +coupling")
    else:
        kwargs = _decode_kwargs(args)
        kwargs.pop("coupling", None)  # a mode of its own: sjd+coupling
        if "siblings" in kwargs or "sibling_depth" in kwargs:
            raise SystemExit("error: bench runs proactive drafting as modes of their own (sjd+pd, sjd+coupling+pd: "
                             "3 candidates at the first 2 draft positions); --siblings is for generate and batch")
    kwargs.pop("decoding", None)  # each mode sets its own
    modes = args.modes or ("ar,cspd,cspd+flat" if continuous else "ar,sjd,sjd+coupling,lantern" if unified
                           else "ar,sjd,sjd+coupling,lantern,gsd")
    results = []
    for batch_size in args.batch_sizes:
        keep = None if args.keep_images is None else str(Path(args.keep_images) / f"batch{batch_size}")
        result = run_benchmark(pipe, prompts=prompts, modes=modes.split(","), images=args.images, seed=args.seed,
                               batch_size=batch_size, scorer=scorer, keep_images=keep, progress=True, **kwargs)
        results.append(result)
        print(f"batch {batch_size}, {result['images_per_mode']} images per mode, {result['machine']}")
        print(result["table"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results if len(results) > 1 else results[0], indent=2) + "\n")
    return 0


def cmd_convert_llamagen(args) -> int:
    from ..pipelines.convert_llamagen import convert_llamagen

    convert_llamagen(args.gpt, args.vq, args.out, gpt_model=args.gpt_model, vq_model=args.vq_model,
                     image_size=args.image_size, text_encoder=args.text_encoder, key=args.key)
    print(args.out)
    return 0


def cmd_convert_lumina(args) -> int:
    from ..pipelines.convert_lumina import convert_lumina

    convert_lumina(args.model, args.out, vqgan=args.vqgan, vqgan_config=args.vqgan_config, movqgan=args.movqgan,
                   size=args.size, tokenizer_dir=args.tokenizer)
    print(args.out)
    return 0


def cmd_convert_mar(args) -> int:
    from ..pipelines.mar import convert_mar

    convert_mar(args.checkpoint, args.vae, args.out, name=args.name, key=args.key)
    print(args.out)
    return 0


def cmd_batch(args) -> int:
    import contextlib

    from .batch import (check_prompts, combine_summaries, distributed_context, gather_summaries, generate_batch,
                        rank_zero_first, read_prompt_lines)

    lines = read_prompt_lines(args.prompts)  # every rank fails the same way on a bad file, before any rendezvous
    prompts = [meta for _, meta in lines]
    if (args.rank is None) != (args.world_size is None):
        raise ValueError("give both --rank and --world-size, or neither (torchrun / accelerate set them)")
    if args.world_size is not None and not (args.world_size >= 1 and 0 <= args.rank < args.world_size):
        raise ValueError(f"--rank must be in [0, --world-size), got {args.rank} of {args.world_size}")
    context = (contextlib.nullcontext((args.rank, args.world_size)) if args.world_size is not None
               else distributed_context())
    with context as (rank, world_size):
        with rank_zero_first():  # rank 0 builds the default model's cache once; the others then read it
            pipe = load_pipeline(args.model, args.draft_model)
        check_prompts(pipe, [(f"{args.prompts}, line {number}", meta) for number, meta in lines])
        pipe.to(_device(args.device))
        from ..pipelines import ContinuousARPipeline, MARPipeline, UnifiedARPipeline

        if isinstance(pipe, MARPipeline):
            raise ValueError("batch reads text prompts; MAR is class-conditional (use generate --class-label)")
        if isinstance(pipe, ContinuousARPipeline):  # continuous tokens: their own options
            kwargs = _continuous_kwargs(args, mar=False)
            decoding = kwargs.pop("decoding", None) or ("cspd" if pipe.draft_model is not None else "ar")
        elif isinstance(pipe, UnifiedARPipeline):
            kwargs = _unified_kwargs(args)
            decoding = kwargs.pop("decoding")
        else:
            kwargs, decoding = _decode_kwargs(args), args.decoding or "sjd"
        summary = generate_batch(pipe, prompts, args.out, images_per_prompt=args.images_per_prompt,
                                 decoding=decoding, seed=args.seed, batch_size=args.batch_size,
                                 chunk_size=args.chunk_size, rank=rank,
                                 world_size=world_size, progress=not args.no_progress, **kwargs)
        summaries = gather_summaries(summary)  # every rank's, when torchrun / accelerate started the ranks
        if len(summaries) == 1:
            print(json.dumps(summary))
        elif rank == 0:
            print(json.dumps(combine_summaries(summaries, len(prompts))))
    return 0


def geneval_main(argv=None) -> int:
    """``visualspec eval geneval FOLDER ...``: score a GenEval-layout folder and print the summary."""
    from ..eval.detectors import DETECTORS, get_detector
    from ..eval.geneval import DEFAULT_OPTIONS, evaluate_folder, format_summary

    parser = argparse.ArgumentParser(prog="visualspec eval geneval",
                                     description="Score a GenEval-layout image folder.")
    parser.add_argument("folder")
    parser.add_argument("--detector", default="shapes", choices=sorted(DETECTORS))
    parser.add_argument("--detector-path")
    parser.add_argument("--clip-path")
    parser.add_argument("--outfile")
    parser.add_argument("--json", help="also write the summary as JSON here")
    parser.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE",
                        help=f"GenEval options: {', '.join(DEFAULT_OPTIONS)}")
    args = parser.parse_args(argv)
    try:
        options = dict(opt.split("=", 1) for opt in args.options)
    except ValueError:
        parser.error("--options take KEY=VALUE")
    kwargs = {}
    if args.detector == "transformers":
        kwargs = {"detector_path": args.detector_path, "clip_path": args.clip_path}
    try:
        summary = evaluate_folder(args.folder, get_detector(args.detector, **kwargs), args.outfile, **options)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


FID_FEW_IMAGES = 200  # below this many images an FID estimate is mostly bias


def cmd_eval(args) -> int:
    if args.metric == "geneval":
        return geneval_main(args.rest)
    from ..eval.fid import fid_from_folder
    from ..eval.inception import inception_extractor

    parser = argparse.ArgumentParser(prog="visualspec eval fid", description="FID of an image folder")
    parser.add_argument("folder", help="image folder, or a GenEval-layout folder (its samples are used)")
    parser.add_argument("--ref", help="reference statistics .npz (mu, sigma) or an image folder "
                                      "(default with --features shapes: the shapes world's statistics)")
    parser.add_argument("--features", default="shapes", choices=["shapes", "inception"])
    parser.add_argument("--inception-weights", help="pt_inception-2015-12-05-6726825d.pth (pytorch-fid's weights)")
    opts = parser.parse_args(args.rest)
    if opts.features == "inception":
        if not opts.inception_weights or not opts.ref:
            raise ValueError("--features inception needs --inception-weights FILE and --ref FILE")
        extractor = inception_extractor(opts.inception_weights)
    else:
        from ..eval.shapes_quality import REFERENCE_STATS, shapes_fid_extractor

        extractor = shapes_fid_extractor()
        opts.ref = opts.ref or str(REFERENCE_STATS)
    from ..eval.fid import IMAGE_EXTENSIONS, list_image_files

    folder = Path(opts.folder)
    if folder.is_dir() and any(p.is_dir() and p.name.isdigit() for p in folder.iterdir()):
        # a batch folder: its samples, whatever its prompts' metadata holds (FID needs no tags)
        images = sorted(p for d in folder.iterdir() if d.is_dir() and d.name.isdigit()
                        for p in (d / "samples").glob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
        if not images:
            raise ValueError(f"no images in the samples folders of {folder}")
    else:
        images = list_image_files(folder)
    if len(images) < FID_FEW_IMAGES:
        print(f"warning: FID of only {len(images)} images is dominated by its estimation bias and means little; "
              f"use {FID_FEW_IMAGES} or more (the shapes benchmarks use 600 and more)", file=sys.stderr)
    print(json.dumps({"fid": fid_from_folder(images, opts.ref, extractor), "features": opts.features,
                      "reference": opts.ref}))
    return 0


def cmd_prompts(args) -> int:
    """Write the shapes world's GenEval-style evaluation prompts (metadata JSON lines)."""
    from ..worlds.shapes import evaluation_prompts, write_prompt_file

    if args.per_task < 1:
        raise ValueError(f"--per-task must be >= 1, got {args.per_task}")
    prompts = evaluation_prompts(per_task=args.per_task, seed=args.seed)
    write_prompt_file(args.output, prompts)
    print(f"{args.output}: {len(prompts)} prompts", file=sys.stderr)
    return 0


def cmd_train_shapes(args) -> int:
    from ..training.shapes import ShapesTrainingConfig, train_feature_net, train_shapes

    if args.features_out:
        train_feature_net(args.features_out)
        print(args.features_out)
    if args.out:
        options = {k: getattr(args, k) for k in ("seed", "caption_order", "caption_positions", "text_steps")}
        cfg = ShapesTrainingConfig(**{k: v for k, v in options.items() if v is not None})
        train_shapes(args.out, args.work_dir, cfg)
        print(args.out)
    return 0


def cmd_train_continuous(args) -> int:
    from ..training.continuous import ContinuousShapesConfig, train_continuous_shapes

    cfg = ContinuousShapesConfig(**({} if args.seed is None else {"seed": args.seed}))
    train_continuous_shapes(args.out, args.work_dir, cfg)
    print(args.out)
    return 0


def cmd_train_unified(args) -> int:
    from ..training.unified import UnifiedShapesConfig, train_unified_shapes

    cfg = UnifiedShapesConfig(**({} if args.seed is None else {"seed": args.seed}))
    train_unified_shapes(args.out, args.work_dir, cfg)
    print(args.out)
    return 0


def world_model(folder: str | None):
    """The video pipeline: ``folder`` or the shipped arena world."""
    from ..pipelines import NextFramePipeline
    from ..assets import ARENA_NFD

    if folder is None and not (ARENA_NFD / "model_index.json").is_file():
        raise SystemExit(f"error: the shipped world model is missing from this installation ({ARENA_NFD} has no "
                         f"model_index.json); reinstall visualspec, or pass --model FOLDER")
    folder = Path(folder) if folder else ARENA_NFD
    if not (folder / "model_index.json").is_file():
        raise SystemExit(f"error: no video pipeline in {folder} "
                         f"(train one with `visualspec train-arena --out {folder}`)")
    pipe = NextFramePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def cmd_video(args) -> int:
    from ..pipelines import export_video

    actions = action_script(args.actions, args.frames) if args.actions else None
    pipe = world_model(args.model)
    out = pipe(actions=actions, num_frames=args.frames if not actions else None, seed=args.seed, steps=args.steps,
               speculate=args.speculate, use_teacher=args.teacher)
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


def cmd_bench_video(args) -> int:
    from .bench import run_video_benchmark

    pipe = world_model(args.model)
    result = run_video_benchmark(pipe, frames=args.frames, rounds=args.rounds, seed=args.seed)
    if args.quality:
        from ..eval.video import one_step_psnr, rollout_player_error

        result["quality"] = {
            "one_step": [one_step_psnr(pipe, episodes=args.episodes), one_step_psnr(pipe, args.episodes, use_teacher=True)],
            "rollout_60": [rollout_player_error(pipe, episodes=args.episodes),
                           rollout_player_error(pipe, episodes=args.episodes, speculate=4),
                           rollout_player_error(pipe, episodes=args.episodes, use_teacher=True)],
        }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    if args.quality:
        print(json.dumps(result["quality"], indent=1))
    return 0


def cmd_train_arena(args) -> int:
    from ..training.arena import train_arena

    train_arena(args.out, args.work_dir)
    print(args.out)
    return 0


def cmd_bench_text(args) -> int:
    from ..assets import TEXT_PAIR
    from .bench_text import multidraft_gap, run_text_benchmark

    args.pair = args.pair or str(TEXT_PAIR)
    result = run_text_benchmark(args.pair, prompts=args.prompts, new_tokens=args.new_tokens, window=args.window,
                                draft_window=args.draft_window, stop_below=args.draft_stop_below)
    if args.multidraft_gap:
        result["multidraft_gap"] = multidraft_gap(args.pair)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def cmd_train_text(args) -> int:
    from ..training.text import train_text_pair

    train_text_pair(args.out, args.work_dir)
    print(args.out)
    return 0


def _add_decoding_args(p):
    p.add_argument("--model", help="pipeline folder (default: the shipped model)")
    p.add_argument("--draft-model", metavar="FOLDER",
                   help="for --decoding speculative: a smaller LlamaGen of the same vocabulary (its pipeline folder, "
                        "or its GPT folder)")
    p.add_argument("--guidance-scale", type=float, default=None)
    p.add_argument("--negative-prompt", default=None,
                   help="unified-vocabulary models: the text guidance steers away from (default: the family's own "
                        "unconditional context)")
    p.add_argument("--guidance-schedule", default=None,
                   help="unified-vocabulary models: constant, or Lumina-mGPT 2.0's (falls to 4 over the first "
                        "tokens; default: the model's own)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None, help="default: the model's own (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--epsilon-cutoff", type=float, default=None,
                   help="drop tokens below this conditional probability before guidance (default: the model's own)")
    p.add_argument("--window", type=_window_arg, default="auto",
                   help="tokens per target forward in speculative modes, or 'auto' (default): chosen each step from "
                        "the measured cost of a window at this batch size on this machine")
    p.add_argument("--coupling", choices=("on", "off"), default=None,
                   help="coupled Jacobi drafts (lossless; default: the model's own)")
    p.add_argument("--gsd-group-size", type=int, default=None, help="GSD group half-width (default: the model's own)")
    p.add_argument("--siblings", type=int, default=None,
                   help="proactive drafting: candidates at each of the first --sibling-depth draft positions, scored "
                        "as a tree (lossless; sjd and speculative; 1 = off; default: the model's own)")
    p.add_argument("--sibling-depth", type=int, default=None, help="draft positions with siblings (default: the "
                   "model's own)")
    p.add_argument("--jacobi-init", default=None, choices=JACOBI_INITS,
                   help="how SJD/LANTERN fill fresh window positions (default: the model's own)")
    p.add_argument("--lantern-k", type=int, default=None, help="default: the model's own")
    p.add_argument("--lantern-delta", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)


def _threads_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--threads must be an integer >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="visualspec", description=__doc__.split("\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=_threads_arg, default=None,
                        help="torch threads (default: torch's own, one per core); on a machine where other "
                             "work is running, fewer threads (often 1) can be several times faster")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", parents=[common], help="generate an image")
    g.add_argument("prompt", nargs="?", help="text prompt (text-conditional models)")
    g.add_argument("--class-label", type=int, default=None, help="class label (class-conditional models)")
    g.add_argument("--decoding", default=None, choices=MODES + ("cspd",),
                   help="default: sjd (token models), cspd (continuous-token models with a draft), ar (MAR)")
    g.add_argument("-o", "--output", default="out.png")
    g.add_argument("--num-images", type=int, default=1)
    g.add_argument("--stats", action="store_true", help="print the decode statistics")
    g.add_argument("--acceptance-map", metavar="FILE", help="write the per-token acceptance iteration as a picture")
    g.add_argument("--num-iter", type=int, default=None, help="MAR: its AR steps (default: the folder's)")
    g.add_argument("--gamma", type=int, default=None, help="continuous tokens: drafts per step (default: the folder's)")
    g.add_argument("--prefill", type=float, default=None,
                   help="continuous tokens: share of tokens the target draws alone first (default: the folder's)")
    g.add_argument("--num-steps", type=int, default=None,
                   help="continuous tokens: the diffusion head's sampling steps per token (default: the model's)")
    g.add_argument("--cfg-schedule", choices=("linear", "constant"), default=None,
                   help="MAR: how guidance grows over the steps (default: the folder's)")
    _add_decoding_args(g)
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", parents=[common], help="AR vs SJD vs LANTERN, side by side in one run")
    b.add_argument("--prompt", action="append", help="prompt (repeatable; default: a built-in list)")
    b.add_argument("--modes", default=None,
                   help="comma-separated; token models: ar, sjd, sjd+coupling, sjd+pd, sjd+coupling+pd, lantern, "
                        "gsd, speculative (default: ar, sjd, sjd+coupling, lantern, gsd); continuous-token models: "
                        "ar, cspd, cspd+flat, each optionally @STEPS for that many diffusion-head steps (default: "
                        "ar,cspd,cspd+flat)")
    b.add_argument("--gamma", type=int, default=None, help="continuous tokens: drafts per step (default: the folder's)")
    b.add_argument("--prefill", type=float, default=None,
                   help="continuous tokens: share of tokens the target draws alone first (default: the folder's)")
    b.add_argument("--batch-sizes", type=int, nargs="+", default=[1],
                   help="images per call; each batch size is its own side-by-side run (ratios to AR at that size)")
    b.add_argument("--images", type=int, default=4, help="images per mode")
    b.add_argument("--json", help="also write the results to this JSON file")
    b.add_argument("--quality", action="store_true",
                   help="shapes world: benchmark on GenEval-shapes prompts and score GenEval-shapes and FID-shapes")
    b.add_argument("--per-task", type=int, default=20, help="with --quality: prompts per GenEval task")
    b.add_argument("--keep-images", metavar="DIR", help="keep the generated images here (one folder per mode)")
    b.add_argument("--device", default=None, help="default: cuda when CUDA is available, else cpu")
    _add_decoding_args(b)
    b.set_defaults(func=cmd_bench)

    bt = sub.add_parser("batch", parents=[common],
                        help="many prompts -> GenEval's folder layout (resumable, shardable)")
    bt.add_argument("--prompts", required=True, metavar="FILE",
                    help="prompt file: .jsonl (GenEval metadata, one object per line) or text (one prompt per line)")
    bt.add_argument("--out", required=True, metavar="DIR", help="output folder (DIR/00000/samples/0000.png ...)")
    bt.add_argument("--images-per-prompt", type=int, default=4)
    bt.add_argument("--decoding", default=None, choices=MODES + ("cspd",),
                    help="default: sjd (token models), cspd (continuous-token models with a draft)")
    bt.add_argument("--gamma", type=int, default=None, help="continuous tokens: drafts per step")
    bt.add_argument("--prefill", type=float, default=None,
                    help="continuous tokens: share of tokens the target draws alone first")
    bt.add_argument("--num-steps", type=int, default=None,
                    help="continuous tokens: the diffusion head's sampling steps per token")
    bt.add_argument("--batch-size", type=int, default=16,
                    help="images decoding at once; a finished image's place goes to the next (continuous batching)")
    bt.add_argument("--chunk-size", type=int, default=None,
                    help="images per chunk, the unit of resume and sharding (default: 4 x --batch-size); "
                         "with --batch-size, part of what fixes the pixels")
    bt.add_argument("--rank", type=int, default=None, help="this shard (with --world-size; default: from torchrun)")
    bt.add_argument("--world-size", type=int, default=None, help="number of shards (with --rank)")
    bt.add_argument("--device", default=None, help="default: cuda:$LOCAL_RANK when CUDA is available, else cpu")
    bt.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_decoding_args(bt)
    bt.set_defaults(func=cmd_batch)

    e = sub.add_parser("eval", parents=[common], help="score images: geneval FOLDER [...] | fid FOLDER [--ref FILE]",
                       add_help=False)
    e.add_argument("metric", choices=["geneval", "fid"])
    e.add_argument("rest", nargs=argparse.REMAINDER)
    e.set_defaults(func=cmd_eval)

    pr = sub.add_parser("prompts", parents=[common],
                        help="write the shapes world's GenEval evaluation prompts (for batch and eval geneval)")
    pr.add_argument("--per-task", type=int, default=100, help="prompts per GenEval task (six tasks)")
    pr.add_argument("--seed", type=int, default=0, help="prompt seed (the README's tables use 2000, 3000, 5000)")
    pr.add_argument("-o", "--output", default="prompts.jsonl")
    pr.set_defaults(func=cmd_prompts)

    for name, func, what, out in (
            ("train-continuous", cmd_train_continuous, "a continuous-token target and draft on the shapes world (CSpD)",
             "pipeline folder to write (target, draft, KL autoencoder, text encoder)"),
            ("train-unified", cmd_train_unified, "a Lumina-layout model (transformers' Chameleon) on the shapes world",
             "pipeline folder to write")):
        tr = sub.add_parser(name, parents=[common], help=f"train {what}")
        tr.add_argument("--out", required=True, help=out)
        tr.add_argument("--work-dir", default=str(cache_dir() / name), help="checkpoints; rerun to resume")
        tr.add_argument("--seed", type=int, help="default: the recipe's (0)")
        tr.set_defaults(func=func)

    t = sub.add_parser("train-shapes", parents=[common],
                       help="train the shapes-world model (and the FID-shapes features)")
    t.add_argument("--out", help="pipeline folder to write (e.g. assets/shapes-t2i)")
    t.add_argument("--features-out", help="also train the FID-shapes feature network into this folder")
    t.add_argument("--work-dir", default=str(cache_dir() / "train-shapes"), help="checkpoints; rerun to resume")
    # defaults (None) come from ShapesTrainingConfig, the shipped recipe
    t.add_argument("--seed", type=int, help="the model's seed (the shipped run's: 0); the FID-shapes network's is fixed")
    t.add_argument("--caption-order", choices=["raster", "random"],
                   help="name two objects in the order they are drawn (the shipped model's recipe) or in either order")
    t.add_argument("--caption-positions", action=argparse.BooleanOptionalAction,
                   help="give the GPT's caption prefix a learned embedding per slot (the shipped recipe)")
    t.add_argument("--text-steps", type=int,
                   help="first train the text encoder this many steps to predict each word's neighbours, so its "
                        "features carry word order, then freeze it (the shipped recipe: 500; 0: no text stage, "
                        "the encoder trains with the GPT)")
    t.set_defaults(func=cmd_train_shapes)

    v = sub.add_parser("video", parents=[common], help="play an action script in the arena world model -> .mp4 / .gif")
    v.add_argument("--model", help="video pipeline folder (default: the shipped arena model)")
    v.add_argument("--actions", help="comma-separated keys (none, up, down, left, right), each optionally with a "
                                     "frame count (right:30); keys without a count share --frames evenly; "
                                     "default: random keys")
    v.add_argument("--frames", type=int, default=None, help="frames to generate")
    v.add_argument("--steps", type=int, default=None)
    v.add_argument("--speculate", type=int, default=4, help="frames generated ahead while the action persists")
    v.add_argument("--teacher", action="store_true", help="use the undistilled model")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--stats", action="store_true", help="print the statistics instead of the file name")
    v.add_argument("-o", "--output", default="play.mp4")
    v.set_defaults(func=cmd_video)

    bv = sub.add_parser("bench-video", parents=[common],
                        help="world model frames per second: teacher, distilled, speculation")
    bv.add_argument("--model")
    bv.add_argument("--frames", type=int, default=300)
    bv.add_argument("--rounds", type=int, default=3)
    bv.add_argument("--seed", type=int, default=0)
    bv.add_argument("--quality", action="store_true", help="also one-step PSNR and 60-frame player rollouts")
    bv.add_argument("--episodes", type=int, default=16)
    bv.add_argument("--json", help="write the results here")
    bv.set_defaults(func=cmd_bench_video)

    ta = sub.add_parser("train-arena", parents=[common], help="train the arena-world video model")
    ta.add_argument("--out", required=True, help="pipeline folder to write (e.g. assets/arena-nfd)")
    ta.add_argument("--work-dir", default=str(cache_dir() / "train-arena"), help="checkpoints; rerun to resume")
    ta.set_defaults(func=cmd_train_arena)

    bt = sub.add_parser("bench-text", parents=[common],
                        help="text speculative decoding vs transformers' generate and assisted generation")
    bt.add_argument("--pair", default=None, help="folder written by train-text (default: the shipped pair)")
    bt.add_argument("--prompts", type=int, default=8)
    bt.add_argument("--new-tokens", type=int, default=128)
    bt.add_argument("--window", type=int, default=6, help="tokens per target forward (model-free drafters)")
    bt.add_argument("--draft-window", type=int, default=10, help="the draft model's window (drafts + 1)")
    bt.add_argument("--draft-stop-below", type=float, default=0.2,
                    help="the draft model stops drafting below this confidence")
    bt.add_argument("--multidraft-gap", action="store_true", help="also the multi-draft verifiers vs the optimum")
    bt.add_argument("--json", help="write the results here")
    bt.set_defaults(func=cmd_bench_text)

    tt = sub.add_parser("train-text", parents=[common],
                        help="train a target and draft LM pair on the Python standard library")
    tt.add_argument("--out", required=True, help="folder to write (tokenizer/, target/, draft/)")
    tt.add_argument("--work-dir", default=str(cache_dir() / "train-text"), help="checkpoints; rerun to resume")
    tt.set_defaults(func=cmd_train_text)

    c = sub.add_parser("convert-llamagen", parents=[common], help="official LlamaGen checkpoints -> pipeline folder")
    c.add_argument("--gpt", required=True, help="GPT checkpoint (.pt / consolidated.pth)")
    c.add_argument("--gpt-model", required=True, help="size: GPT-B, GPT-L, GPT-XL, GPT-XXL, GPT-3B")
    c.add_argument("--vq", required=True, help="VQ tokenizer checkpoint (vq_ds16_c2i.pt ...)")
    c.add_argument("--vq-model", default="VQ-16", choices=["VQ-16", "VQ-8"])
    c.add_argument("--image-size", type=int, default=256)
    c.add_argument("--text-encoder", help="local flan-t5-xl folder (text-conditional models)")
    c.add_argument("--key", help="checkpoint entry holding the weights (default: model, ema, module, state_dict)")
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_convert_llamagen)

    lu = sub.add_parser("convert-lumina", parents=[common],
                        help="a Lumina-mGPT (1 or 2.0) transformers folder and its image tokenizer -> pipeline folder")
    lu.add_argument("model", help="the Lumina-mGPT checkpoint folder (transformers format, model_type chameleon)")
    lu.add_argument("--vqgan", help="Lumina-mGPT 1: Chameleon's tokenizer/vqgan.ckpt")
    lu.add_argument("--vqgan-config", help="Lumina-mGPT 1: Chameleon's tokenizer/vqgan.yaml")
    lu.add_argument("--movqgan", help="Lumina-mGPT 2.0: movqgan_270M.ckpt")
    lu.add_argument("--size", type=int, default=768, help="the checkpoint's image size in pixels (512, 768, 1024)")
    lu.add_argument("--tokenizer", help="folder with the text tokenizer (default: the model folder)")
    lu.add_argument("--out", required=True)
    lu.set_defaults(func=cmd_convert_lumina)

    m = sub.add_parser("convert-mar", parents=[common], help="official MAR checkpoints -> pipeline folder")
    m.add_argument("--checkpoint", required=True, help="MAR's checkpoint-last.pth")
    m.add_argument("--vae", required=True, help="MAR's KL-16 autoencoder, kl16.ckpt")
    m.add_argument("--name", required=True, choices=("mar_base", "mar_large", "mar_huge"))
    m.add_argument("--key", default="model_ema", help="checkpoint entry holding the weights (default: model_ema)")
    m.add_argument("--out", required=True)
    m.set_defaults(func=cmd_convert_mar)
    return parser


EVAL_HELP = """usage: visualspec eval {geneval,fid} ...

score a folder of images:
  visualspec eval geneval FOLDER [--outfile FILE] [--json FILE] [--detector {shapes,transformers}] ...
  visualspec eval fid FOLDER [--ref STATS.npz | --ref FOLDER] [--features {shapes,inception}] ...

`visualspec eval geneval --help` and `visualspec eval fid --help` list every option."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["eval"] and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        print(EVAL_HELP, file=sys.stdout if len(argv) > 1 else sys.stderr)
        return 0 if len(argv) > 1 else 2
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
