"""The ``visualspec`` command line, a short dispatcher over ``visualspec/tools/commands/``.

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
    visualspec app --port 7860                                     (the Gradio app on 127.0.0.1)
    visualspec convert-llamagen --gpt c2i_L_256.pt --gpt-model GPT-L --vq vq_ds16_c2i.pt --out llamagen-L
    visualspec convert-mar --checkpoint checkpoint-last.pth --vae kl16.ckpt --name mar_base --out mar-base
    visualspec convert-lumina Lumina-mGPT-7B-768 --vqgan vqgan.ckpt --vqgan-config vqgan.yaml --out lumina-768

Commands know no pipeline class: they read what a pipeline declares (``pipelines/image.py``).
"""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS
from .commands.evaluate import EVAL_HELP
from .commands.options import count_arg


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="visualspec", description="Fast autoregressive image and video generation "
                                     "with speculative decoding.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=count_arg, default=None,
                        help="torch threads (default: torch's own, one per core); on a machine where other "
                             "work is running, fewer threads (often 1) can be several times faster")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub, common)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["eval"] and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        print(EVAL_HELP, file=sys.stdout if len(argv) > 1 else sys.stderr)
        return 0 if len(argv) > 1 else 2
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    from ..models.quantized import MissingDependency

    try:
        return args.func(args)
    except (ValueError, OSError, MissingDependency) as err:  # bad input, a missing file or optional package, ...
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C: one line, saying what was kept where the command knows it
        print(f"\ninterrupted{': ' + str(err) if str(err) else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
