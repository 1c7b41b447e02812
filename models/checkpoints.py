"""Reading the official checkpoint files of public models (safely, with ``weights_only=True``)."""

from __future__ import annotations

import argparse
import contextlib

import torch

# keys some training set-ups add in front of every parameter name
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")
# state that is rebuilt at load time and never belongs to the weights
_TRANSIENT_KEYS = ("freqs_cis", ".kv_cache.", "causal_mask")


def read_checkpoint(path: str, key: str | None = None) -> dict[str, torch.Tensor]:
    """The weights in an official training checkpoint (LlamaGen's, MAR's), as a plain state dict.

    Handles every layout LlamaGen publishes: DDP training files ``{"model": ..., "optimizer": ...,
    "steps": ..., "args": Namespace}`` (plus ``"ema"``), DeepSpeed ``{"module": ...}``, and the raw
    full state dicts written by FSDP (the released XXL and 3B files). With ``key=None`` the first of
    ``"model"``, ``"ema"``, ``"module"``, ``"state_dict"`` present is used (the sampling scripts'
    order). The file is read with ``weights_only=True``; only ``argparse.Namespace`` (the stored
    training arguments) is allow-listed.
    """
    safe_globals = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    allow = safe_globals([argparse.Namespace]) if safe_globals else contextlib.nullcontext()
    with allow:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path}: expected a dict of weights, got {type(ckpt).__name__}")
    if key is None:
        key = next((k for k in ("model", "ema", "module", "state_dict") if isinstance(ckpt.get(k), dict)), None)
    elif key not in ckpt:
        raise ValueError(f"{path} has no {key!r} entry (it has {sorted(ckpt)[:8]})")
    state = ckpt if key is None else ckpt[key]
    out = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor) or any(t in name for t in _TRANSIENT_KEYS):
            continue
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        out[name] = value
    if not out:
        raise ValueError(f"{path} holds no tensors under {key!r}")
    return out


def load_state_dict_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``model.load_state_dict(state, strict=True)`` with an error that names what does not match."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and state[k].shape != own[k].shape]
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if items:
            problems.append(f"{len(items)} {label} ({', '.join(items[:4])}{', ...' if len(items) > 4 else ''})")
    if problems:
        raise ValueError(f"{source} does not fit {type(model).__name__}: " + "; ".join(problems))
    model.load_state_dict(state, strict=True)
