"""``VisualSpecPipeline``: the one entry point, dispatching a folder to the pipeline that saved it."""

from __future__ import annotations

import json
import os

from diffusers import DiffusionPipeline

_PIPELINES: dict[str, type] = {}


def register_pipeline(cls):
    """Class decorator: make ``VisualSpecPipeline.from_pretrained`` able to load ``cls`` folders.
    The package's ``__init__`` imports every pipeline module, so all are registered before any
    folder is loaded; this module imports none of them."""
    _PIPELINES[cls.__name__] = cls
    return cls


class VisualSpecPipeline(DiffusionPipeline):
    """Base class of every visualspec pipeline (a diffusers ``DiffusionPipeline``).

    ``VisualSpecPipeline.from_pretrained(folder)`` reads ``model_index.json`` and returns the
    pipeline class that saved the folder (image or video), like transformers' Auto classes. Weights
    load from safetensors only (``use_safetensors=True`` unless the caller says otherwise): a folder
    whose ``.safetensors`` file is missing is refused with that file's name, even if a pickled
    ``.bin`` lies beside it.
    """

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        path = os.fspath(pretrained_model_name_or_path)
        index_file = os.path.join(path, "model_index.json")
        if os.path.isdir(path):
            if not os.path.isfile(index_file):
                raise ValueError(f"{path} is not a visualspec pipeline folder: it has no model_index.json")
            try:
                with open(index_file) as f:
                    class_name = json.load(f).get("_class_name")
            except (OSError, json.JSONDecodeError) as err:
                raise ValueError(f"{index_file} is not valid JSON: {err}") from err
        elif os.path.exists(path):
            raise ValueError(f"{path} is a file, not a visualspec pipeline folder")
        else:  # a hub id: let diffusers fetch it (this needs a network)
            class_name = None
        target = cls
        if class_name is not None and cls is VisualSpecPipeline:
            if class_name not in _PIPELINES:
                raise ValueError(f"{index_file} names pipeline class {class_name!r}, which visualspec does not "
                                 f"know (known: {sorted(_PIPELINES)})")
            target = _PIPELINES[class_name]
        elif class_name is not None and class_name != cls.__name__:
            raise ValueError(f"{path} holds a {class_name}, not a {cls.__name__}")
        kwargs.setdefault("trust_remote_code", False)
        kwargs.setdefault("use_safetensors", True)  # never a pickle: a missing .safetensors is an error naming it
        try:
            return super(VisualSpecPipeline, target).from_pretrained(path, **kwargs)
        except (RuntimeError, ValueError, OSError) as err:
            raise ValueError(f"could not load the pipeline in {path}: {_first_line(err)}") from err


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
