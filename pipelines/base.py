"""``VisualSpecPipeline``: the one entry point, dispatching a folder to the pipeline that saved it."""

from __future__ import annotations

import json
import os

import torch
from diffusers import DiffusionPipeline

from ..models.quantized import QUANTIZE_SCHEMES, check_quantize, quantize_model

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

    ``quantize="int8"`` (or another of :data:`~visualspec.models.quantized.QUANTIZE_SCHEMES`)
    quantises the decoding models' weights once loaded (:meth:`quantize`; torchao, an optional
    dependency).
    """

    #: the components that decode, and so are quantised (those a pipeline has)
    decoding_components = ("transformer", "draft_model", "teacher")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, quantize: str | None = None, **kwargs):
        check_quantize(quantize)  # before anything loads
        pipe = cls._load(pretrained_model_name_or_path, **kwargs)
        if quantize is not None:
            pipe.quantize(quantize)
        return pipe

    def quantize(self, scheme: str) -> "VisualSpecPipeline":
        """Quantise, in place, the weights of the models that decode (the transformer, and the
        draft model and the teacher where the pipeline has them; not the image decoder or the text
        encoder) with ``scheme`` (:data:`~visualspec.models.quantized.QUANTIZE_SCHEMES`), and return
        the pipeline. Call it again after loading a draft model to quantise that too; a model
        quantised with another scheme is an error. Greedy tokens may differ from the float
        model's; speculation stays lossless with respect to the quantised target. A quantised
        pipeline is not saved (:meth:`save_pretrained` refuses it)."""
        check_quantize(scheme, self.device)
        for name in self.decoding_components:
            model = getattr(self, name, None)
            if not isinstance(model, torch.nn.Module):
                continue
            done = getattr(model, "visualspec_quantize", None)
            if done is None:
                quantize_model(model, scheme)
            elif done != scheme:
                raise ValueError(f"the pipeline's {name} is quantised with {done!r}, not {scheme!r}; load it again")
        return self

    def save_pretrained(self, save_directory, **kwargs):
        quantized = [name for name in self.decoding_components
                     if getattr(getattr(self, name, None), "visualspec_quantize", None) is not None]
        if quantized:
            raise ValueError(f"this pipeline's {', '.join(quantized)} has quantised weights, which are not saved; "
                             f"save the float pipeline and pass quantize= when loading it "
                             f"(one of {sorted(QUANTIZE_SCHEMES)})")
        return super().save_pretrained(save_directory, **kwargs)

    @classmethod
    def _load(cls, pretrained_model_name_or_path, **kwargs):
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
