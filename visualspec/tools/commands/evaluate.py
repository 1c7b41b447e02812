"""``visualspec eval geneval FOLDER`` and ``visualspec eval fid FOLDER``: score a folder of images."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EVAL_HELP = """usage: visualspec eval {geneval,fid} ...

score a folder of images:
  visualspec eval geneval FOLDER [--outfile FILE] [--json FILE] [--detector {shapes,transformers}] ...
  visualspec eval fid FOLDER [--ref STATS.npz | --ref FOLDER] [--features {shapes,inception}] ...

`visualspec eval geneval --help` and `visualspec eval fid --help` list every option."""


def register(sub, common) -> None:
    e = sub.add_parser("eval", parents=[common], help="score images: geneval FOLDER [...] | fid FOLDER [--ref FILE]",
                       add_help=False)
    e.add_argument("metric", choices=["geneval", "fid"])
    e.add_argument("rest", nargs=argparse.REMAINDER)
    e.set_defaults(func=run)


def geneval_main(argv=None) -> int:
    """``visualspec eval geneval FOLDER ...``: score a GenEval-layout folder and print the summary."""
    from ...eval.detectors import DETECTORS, get_detector
    from ...eval.geneval import DEFAULT_OPTIONS, evaluate_folder, format_summary

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
    from ..paths import check_output_file, write_text_atomic

    for option in ("outfile", "json"):  # before scoring, not after
        if getattr(args, option):
            check_output_file(getattr(args, option), "--" + option)
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
        write_text_atomic(args.json, json.dumps(summary, indent=2) + "\n")
    return 0


FID_FEW_IMAGES = 200  # below this many images an FID estimate is mostly bias


def run(args) -> int:
    if args.metric == "geneval":
        return geneval_main(args.rest)
    from ...eval.fid import fid_from_folder
    from ...eval.inception import inception_extractor

    parser = argparse.ArgumentParser(prog="visualspec eval fid", description="FID of an image folder")
    parser.add_argument("folder", help="image folder, or a GenEval-layout folder (its samples are used)")
    parser.add_argument("--ref", help="reference statistics .npz (mu, sigma) or an image folder "
                                      "(default with --features shapes: the shapes world's statistics)")
    parser.add_argument("--features", default="shapes", choices=["shapes", "inception"])
    parser.add_argument("--inception-weights", help="pt_inception-2015-12-05-6726825d.pth (pytorch-fid's weights)")
    opts = parser.parse_args(args.rest)
    if opts.ref is not None:
        ref = Path(opts.ref)
        if not ref.exists():
            raise ValueError(f"--ref {opts.ref!r} does not exist (give statistics .npz or an image folder)")
        if ref.is_file() and ref.suffix.lower() != ".npz":
            raise ValueError(f"--ref {opts.ref!r} is neither statistics .npz nor an image folder")
    if opts.features == "inception":
        if not opts.inception_weights or not opts.ref:
            raise ValueError("--features inception needs --inception-weights FILE and --ref FILE")
        extractor = inception_extractor(opts.inception_weights)
    else:
        from ...eval.shapes_quality import REFERENCE_STATS, shapes_fid_extractor

        extractor = shapes_fid_extractor()
        opts.ref = opts.ref or str(REFERENCE_STATS)
    from ...eval.fid import IMAGE_EXTENSIONS, list_image_files

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
