"""Models by name for the commands and the app: a folder, a shipped model's name, or the default."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.home import home


def quiet_loaders() -> None:
    """No loading bars from diffusers and transformers ("Loading pipeline components", "Loading
    weights"): a command prints one progress line per unit of its own work, not theirs."""
    import diffusers.utils.logging
    import transformers.utils.logging

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()


def default_model() -> tuple[str, str]:
    """(folder, description) of the default model: the shipped one. A missing shipped model is an
    error that says so; the tiny random model (tests only) is never substituted for it."""
    from ..assets import SHAPES_T2I as shipped

    if not (shipped / "model_index.json").is_file():
        raise ValueError(f"the shipped model is missing from this installation ({shipped} has no "
                         f"model_index.json); reinstall visualspec, or pass --model FOLDER")
    return str(shipped), "shipped shapes model"


def shipped_folder(name) -> Path | None:
    """The shipped folder ``name`` means where no such path exists here: ``shapes-lumina`` or
    ``assets/shapes-lumina`` (as the docs write it), from any working folder; else None."""
    from ..assets import ASSETS

    path = Path(name)
    if path.exists() or path.parts not in ((path.name,), ("assets", path.name)):
        return None
    folder = ASSETS / path.name
    return folder if folder.is_dir() else None


def shipped_names() -> list[str]:
    """The names of the shipped pipeline folders (``shapes-t2i``, ``arena-nfd``, ...)."""
    from ..assets import ASSETS

    return sorted(p.name for p in ASSETS.iterdir() if (p / "model_index.json").is_file())


def shipped_or_path(model: str) -> str:
    """``model`` as given where such a path exists, or the shipped pipeline folder it names
    (:func:`shipped_folder`); anything else is an error listing the shipped names (a mistyped name
    must not become a download)."""
    if Path(model).exists():
        return model
    folder = shipped_folder(model)
    if folder is not None and (folder / "model_index.json").is_file():
        return str(folder)
    raise ValueError(f"--model {model}: neither a folder here nor a shipped model "
                     f"(shipped: {', '.join(shipped_names())})")


def tiny_random_folder() -> str:
    """The tiny random model's folder in the cache, built offline on first use."""
    from ..pipelines.tiny import tiny_random_pipeline

    folder = home() / "tiny-random-llamagen"
    if not (folder / "model_index.json").is_file():
        tiny_random_pipeline(seed=0).save_pretrained(folder)
    return str(folder)


def load_pipeline(model: str | None, draft_model: str | None = None, quantize: str | None = None,
                  device: str | None = None):
    """The image pipeline in ``model`` (default: the shipped one), with the draft model in the
    folder ``draft_model`` loaded the pipeline's own way (:meth:`ImagePipeline.load_draft_model`).
    With ``quantize``, the pipeline is moved to ``device`` and its decoding models quantised there
    (:meth:`VisualSpecPipeline.quantize`); a scheme the device lacks is refused before loading."""
    from ..models.quantized import check_quantize
    from ..pipelines import ImagePipeline, VisualSpecPipeline

    check_quantize(quantize, device)

    folder, description = (shipped_or_path(model), model) if model else default_model()
    print(f"model: {description}", file=sys.stderr)
    quiet_loaders()
    pipe = VisualSpecPipeline.from_pretrained(folder)
    if not isinstance(pipe, ImagePipeline):
        raise ValueError(f"{folder} holds a {type(pipe).__name__}, not an image pipeline"
                         + (" (a video model: use `visualspec video --model`)" if hasattr(pipe, "interactive") else ""))
    if draft_model:
        pipe.load_draft_model(draft_model)
    pipe.set_progress_bar_config(disable=True)
    if quantize:
        pipe.to(device or "cpu").quantize(quantize)
        print(f"quantized: {quantize} weights in the decoding models", file=sys.stderr)
    return pipe


def world_model(folder: str | None, dtype: str = "float32", device: str = "cpu"):
    """The video pipeline: ``folder`` or the shipped arena world, on ``device`` in the float type
    ``dtype`` asks for there (:func:`~visualspec.core.precision.resolve_dtype`: "auto" is bfloat16
    where the machine runs it natively)."""
    from ..assets import ARENA_NFD
    from ..core.precision import resolve_dtype
    from ..pipelines import NextFramePipeline

    if folder is None and not (ARENA_NFD / "model_index.json").is_file():
        raise ValueError(f"the shipped world model is missing from this installation ({ARENA_NFD} has no "
                         f"model_index.json); reinstall visualspec, or pass --model FOLDER")
    folder = Path(shipped_or_path(folder)) if folder else ARENA_NFD
    if not (folder / "model_index.json").is_file():
        raise ValueError(f"no video pipeline in {folder} (train one with `visualspec train-arena --out {folder}`)")
    quiet_loaders()
    torch_dtype = resolve_dtype(dtype, device)  # before loading: an unknown name is an error naming it
    pipe = NextFramePipeline.from_pretrained(folder, dtype=torch_dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def device_name(device: str | None) -> str:
    """``--device``, checked (a name torch knows, and CUDA only where it is available), or by
    default cuda:$LOCAL_RANK when CUDA is available, else cpu."""
    import torch

    if device is None:
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"--device {device}: not a device name torch knows (e.g. cpu, cuda, cuda:1, mps)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: MPS is not available here; use --device cpu")
    return device
