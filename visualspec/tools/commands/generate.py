"""``visualspec generate PROMPT``: one image (or ``--num-images``) from any image pipeline folder."""

from __future__ import annotations

import json
from pathlib import Path

from ..loading import device_name, load_pipeline
from .options import add_device_option, add_image_options, atomic_save, call_options, check_image_path, condition, count_arg


def register(sub, common) -> None:
    g = sub.add_parser("generate", parents=[common], help="generate an image")
    g.add_argument("prompt", nargs="?", help="text prompt (text-conditional models)")
    g.add_argument("--class-label", type=int, default=None, help="class label (class-conditional models)")
    g.add_argument("-o", "--output", default="out.png")
    g.add_argument("--num-images", type=count_arg, default=1)
    g.add_argument("--stats", action="store_true", help="print the decode statistics")
    g.add_argument("--acceptance-map", metavar="FILE", help="write the per-token acceptance iteration as a picture")
    add_device_option(g)
    add_image_options(g)
    g.set_defaults(func=run)


def run(args) -> int:
    check_image_path(args.output)
    if args.acceptance_map:
        check_image_path(args.acceptance_map, "--acceptance-map")
    if args.decoding == "speculative" and not args.draft_model:
        raise ValueError("--decoding speculative needs --draft-model FOLDER (a smaller model of the same "
                         "vocabulary), or use --decoding sjd")
    device = device_name(args.device)  # a wrong device is named before the model loads
    pipe = load_pipeline(args.model, args.draft_model, args.quantize, device)
    kwargs = call_options(pipe, args)
    pipe.to(device)
    if args.acceptance_map:
        pipe.raster_grid()  # refused before any work where the pipeline has no acceptance map
    out = pipe(condition(args), seed=args.seed, num_images_per_prompt=args.num_images, **kwargs)
    paths = [args.output] if len(out.images) == 1 else [
        str(Path(args.output).with_name(f"{Path(args.output).stem}_{i}{Path(args.output).suffix}"))
        for i in range(len(out.images))]
    for image, path in zip(out.images, paths):
        atomic_save(image, path)
        print(path)
    if args.stats:
        print(out.stats.summary())
        print(json.dumps(out.stats.to_dict()))
    if args.acceptance_map:
        atomic_save(pipe.acceptance_map(out.stats), args.acceptance_map)
    return 0
