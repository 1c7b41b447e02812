"""What several commands share: the image options (each named after the pipeline argument it sets),
turning them into a call's arguments for whatever pipeline a folder holds, and writing images.

A pipeline's options are its ``__call__`` arguments (:meth:`ImagePipeline.call_options`): an option
the pipeline does not take is refused by one message naming the pipeline and what it does take.
Parsing imports neither torch nor any pipeline.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...core.precision import DTYPES  # no torch: the command line starts without it

# must match visualspec.drafters.INIT_SCHEMES (tests/tools/test_cli.py checks), so parsing needs no torch
JACOBI_INITS = ("random", "repeat_left", "repeat_above")
# must match visualspec.models.quantized.QUANTIZE_SCHEMES (tests/tools/test_cli.py checks)
QUANTIZE_CHOICES = ("int4-weight", "int8", "int8-weight")


def flag(name: str) -> str:
    """A call argument's option: ``top_k`` -> ``--top-k``."""
    return "--" + name.replace("_", "-")


def int_or_auto(option: str):
    """The parser of an option that takes an integer or ``auto`` (the pipeline names a value below 1)."""
    def parse(text: str):
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be an integer >= 1 or 'auto', got {text!r}") from None
    return parse


window_arg = int_or_auto("--window")


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def compile_arg(text: str):
    if text not in ("on", "off", "auto"):
        raise argparse.ArgumentTypeError(f"--compile takes on, off or auto, got {text!r}")
    return "auto" if text == "auto" else text == "on"


def count_arg(text: str) -> int:
    """A count on the command line: an integer >= 1 (argparse names the option in its message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


# (call argument, type, help); each option's default is None: "the pipeline's own"
IMAGE_OPTIONS = (
    ("guidance_scale", float, "classifier-free guidance (default: the model's own)"),
    ("negative_prompt", str, "unified-vocabulary models: the text guidance steers away from (default: the family's "
                             "own unconditional context)"),
    ("guidance_schedule", str, "unified-vocabulary models: constant, or Lumina-mGPT 2.0's (falls to 4 over the first "
                               "tokens; default: the model's own)"),
    ("temperature", float, "sampling temperature (default 1; 0 = greedy)"),
    ("top_k", int, "default: the model's own (0 = off)"),
    ("top_p", float, "default 1 (off)"),
    ("epsilon_cutoff", float, "drop tokens below this conditional probability before guidance (default: the model's "
                              "own)"),
    ("window", window_arg, "tokens per target forward in speculative modes, or 'auto' (default): chosen each step "
                           "from the measured cost of a window at this batch size on this machine"),
    ("compile", compile_arg, "on, off or auto (default): the target's decode step through torch.compile; auto "
                             "compiles where measurements on this machine say it pays (a first --compile on run "
                             "measures them)"),
    ("drafts", str, "LlamaGen, for sjd, lantern and gsd: jacobi (default), feature (the folder's feature drafter: "
                    "LANTERN or GSD over learned drafts), hybrid (the feature drafter's first --feature-depth drafts, "
                    "Jacobi's past them), draft_model or denoising (SJD2's noised Jacobi drafts, for a model "
                    "fine-tuned by train-denoising; eager, a fixed window)"),
    ("feature_depth", int, "--drafts hybrid: positions the feature drafter drafts in each window (default: the "
                           "model's own)"),
    ("coupling", on_off, "on or off: coupled Jacobi drafts (lossless; default: the model's own)"),
    ("gsd_group_size", int, "GSD group half-width (default: the model's own)"),
    ("siblings", int, "proactive drafting: candidates at each of the first --sibling-depth draft positions, scored "
                      "as a tree (lossless; sjd and speculative; 1 = off; default: the model's own)"),
    ("sibling_depth", int, "draft positions with siblings (default: the model's own)"),
    ("jacobi_init", str, f"how SJD/LANTERN fill fresh window positions: {', '.join(JACOBI_INITS)} (default: the "
                         f"model's own)"),
    ("lantern_k", int, "LANTERN's neighbourhood (default: the model's own)"),
    ("lantern_delta", float, "LANTERN's budget (default: the model's own)"),
    ("judge_threshold", float, "--decoding judge: the judge score above which a draft is kept, in [0, 1] (default: "
                               "the judge's own)"),
    ("k", int_or_auto("--k"), "any-order models, --decoding assd: cells drafted per round, or 'auto': chosen "
                              "per step from measured rounds, AR where none pays (default: the folder's)"),
    ("parallel_steps", int, "any-order models, --decoding parallel: forwards after the prefill (default: RandAR's "
                            "88 per 256 cells)"),
    ("gamma", int, "continuous tokens: drafts per step (default: the folder's)"),
    ("prefill", float, "continuous tokens: share of tokens the target draws alone first (default: the folder's)"),
    ("num_steps", int, "continuous tokens: the diffusion head's sampling steps per token (default: the model's)"),
    ("num_iter", int, "MAR: its AR steps (default: the folder's)"),
    ("cfg_schedule", str, "MAR: linear or constant, how guidance grows over the steps (default: the folder's)"),
)
# options a command offers beside these: the decoding, and the batch that bench and batch set
DECODING = "decoding"


def add_device_option(p) -> None:
    """``--device``, as every command that runs a model offers it (read by :func:`~visualspec.tools.loading.device_name`)."""
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda:$LOCAL_RANK when CUDA is "
                                                  "available, else cpu)")


def add_dtype_option(p, default: str = "float32") -> None:
    """``--dtype``: a world model's float type (:func:`~visualspec.core.precision.resolve_dtype`)."""
    p.add_argument("--dtype", choices=DTYPES, default=default,
                   help=f"the world model's float type (default {default}; auto: bfloat16 where this machine "
                        f"runs it natively)")


def add_image_options(p, decoding: bool = True) -> None:
    """The options every image command shares: model, draft model, seed, and the call options."""
    p.add_argument("--model", help="pipeline folder or shipped model name (default: the shipped model)")
    p.add_argument("--draft-model", metavar="FOLDER",
                   help="for --decoding speculative: a smaller model of the same vocabulary (LlamaGen: its pipeline "
                        "folder, or its GPT folder)")
    if decoding:
        p.add_argument("--decoding", default=None,
                       help="the pipeline's decodings (LlamaGen: sjd, ar, lantern, gsd, judge, speculative, feature; unified: sjd, "
                            "ar, lantern; any-order: assd, ar, parallel; continuous tokens: ar, cspd; MAR: ar); default: the "
                            "model's own")
    for name, kind, text in IMAGE_OPTIONS:
        p.add_argument(flag(name), dest=name, type=kind, default=None, help=text,
                       metavar="{on,off}" if kind is on_off else "{on,off,auto}" if kind is compile_arg else None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                   help="quantise the decoding models' weights with torchao (an optional dependency): int8, int8 "
                        "weights and activations; int8-weight; int4-weight (CUDA)")


def call_options(pipe, args, names=None) -> dict:
    """The call arguments given on the command line for ``pipe`` (every image option that is not
    None), after one generic refusal of those its ``__call__`` does not take; ``names`` restricts
    the options read (default: every image option, and ``--decoding``)."""
    names = names or (DECODING, *(name for name, _, _ in IMAGE_OPTIONS))
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    type(pipe).refuse_options(given, spell=flag, offered=names)
    if DECODING in given:
        pipe.check_decoding(given[DECODING])
    return given


def condition(args):
    """The prompt or the class label of ``generate``, as the pipeline is conditioned."""
    if args.class_label is not None:
        if args.prompt:
            raise ValueError("give a prompt or --class-label, not both")
        return args.class_label
    if not args.prompt:
        raise ValueError("give a prompt (text model) or --class-label N (class model)")
    return args.prompt


def check_image_path(path: str, option: str = "-o") -> str:
    """An output path whose extension Pillow can write, not a folder, else a clear error (before
    any work)."""
    from PIL import Image

    from ..paths import check_output_file

    check_output_file(path, option)
    ext = Path(path).suffix.lower()
    known = Image.registered_extensions()
    if ext not in known or known[ext] not in Image.SAVE:
        usable = ", ".join(e for e in (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif") if e in known)
        raise ValueError(f"cannot write an image to {path!r}: unknown extension {ext or '(none)'!r}; "
                         f"use one of {usable}")
    return path


def atomic_save(image, path: str) -> None:
    """Write ``image`` to ``path`` atomically (:func:`visualspec.tools.paths.atomic_write`), in the
    format its extension names."""
    from PIL import Image

    from ..paths import atomic_write

    image_format = Image.registered_extensions().get(Path(path).suffix.lower(), "PNG")
    atomic_write(path, lambda f: image.save(f, format=image_format))
