"""Quantised weights for a target or a drafter, through torchao (an optional dependency).

``quantize_model(module, scheme)`` replaces the weights of ``module``'s linear layers in place with
torchao's quantised tensors; the model keeps its interface, so the engine, the compiled step and the
verification rules run on it unchanged. Speculation stays lossless with respect to the quantised
model: it is the target that the rules sample from.

The schemes (:data:`QUANTIZE_SCHEMES`), measured in ``docs/experiments/2026-11-27-int8-cpu.md``:

- ``"int8"``: int8 weights and dynamically quantised int8 activations (int8 matmuls). On a CPU
  with VNNI or AMX, compiled, it made a 144 M-parameter Chameleon's step 1.6-3.3x faster; on the
  4 M shipped models it is slower (the activations' quantisation costs more than their matmuls).
- ``"int8-weight"``: int8 weights, float activations (the weights are dequantised in the matmul:
  less memory, and faster only where reading the weights bounds the step, as on a GPU).
- ``"int4-weight"``: int4 weights in groups of 128, bfloat16 activations; CUDA only. The weights are
  packed for torch's own tinygemm kernel (``aten._weight_int4pack_mm``, what gpt-fast uses), not
  torchao's default packing, whose kernel comes from a separate CUDA library. On an H200 (torch 2.11,
  torchao 0.18) both weight-only schemes made a 7B step slower than bfloat16 (int4 2.1x, int8 10x;
  ``docs/experiments/2026-11-27-gpu-h200-engine-step-int4.md``): they save memory there, not time.
"""

from __future__ import annotations

import types

import torch

QUANTIZE_SCHEMES = {
    "int8": "int8 weights and int8 activations (int8 matmuls)",
    "int8-weight": "int8 weights, float activations",
    "int4-weight": "int4 weights in groups of 128 (CUDA, bfloat16)",
}
_DEVICES = {"int8": ("cpu", "cuda"), "int8-weight": ("cpu", "cuda"), "int4-weight": ("cuda",)}
INSTALL_HINT = "pip install 'visualspec[quantize]' (or pip install torchao)"


class MissingDependency(ImportError):
    """An optional dependency a requested feature needs is not installed (the message says how to install it)."""


def check_quantize(scheme, device=None) -> None:
    """``scheme`` must be None or a key of :data:`QUANTIZE_SCHEMES` that runs on ``device``'s type
    (int4 weights need CUDA), with torchao installed."""
    if scheme is None:
        return
    if scheme not in QUANTIZE_SCHEMES:
        raise ValueError(f"quantize must be None or one of {sorted(QUANTIZE_SCHEMES)}, got {scheme!r}")
    kind = torch.device(device).type if device is not None else "cpu"
    if kind not in _DEVICES[scheme]:
        raise ValueError(f"quantize={scheme!r} ({QUANTIZE_SCHEMES[scheme]}) does not run on {kind}: "
                         f"it needs {' or '.join(_DEVICES[scheme])}")
    try:
        import torchao  # noqa: F401
    except ImportError as err:
        raise MissingDependency(f"quantize={scheme!r} needs torchao, which is not installed: {INSTALL_HINT}") from err


def torchao_config(scheme: str):
    """torchao's configuration object for ``scheme``."""
    from torchao.quantization import (Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig)

    return {"int8": Int8DynamicActivationInt8WeightConfig, "int8-weight": Int8WeightOnlyConfig,
            "int4-weight": lambda: Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"),
            }[scheme]()


def quantizable(layer: torch.nn.Module, scheme: str) -> bool:
    """Whether ``layer`` gets quantised weights: a ``torch.nn.Linear`` whose input width torchao's
    kernels take (a multiple of 16 for int8, of 128 for int4's groups)."""
    multiple = 128 if scheme == "int4-weight" else 16
    return isinstance(layer, torch.nn.Linear) and layer.in_features % multiple == 0


def quantize_model(module: torch.nn.Module, scheme: str) -> int:
    """Quantise ``module``'s linear layers in place with ``scheme`` (see :data:`QUANTIZE_SCHEMES`)
    and return how many were quantised. The module stays on its device; int4 weights also turn it
    to bfloat16. A module already quantised, or with no layer to quantise, is an error naming it."""
    device = next(module.parameters()).device
    check_quantize(scheme, device)
    done = getattr(module, "visualspec_quantize", None)
    if done is not None:
        raise ValueError(f"{type(module).__name__} is already quantised ({done!r}); load it again to change that")
    names = [name for name, layer in module.named_modules() if quantizable(layer, scheme)]
    if not names:
        raise ValueError(f"{type(module).__name__} has no linear layer that quantize={scheme!r} can take")
    if scheme == "int4-weight":
        module.to(torch.bfloat16)
    from torchao.quantization import quantize_

    quantize_(module, torchao_config(scheme), filter_fn=lambda layer, _: quantizable(layer, scheme))
    if scheme == "int8":
        for name in names:
            layer = module.get_submodule(name)
            layer.forward = types.MethodType(_linear_on_rows, layer)
    module.visualspec_quantize = scheme
    return len(names)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` stores: numel x element size for a plain tensor; for a quantised weight
    (a tensor subclass), the sum over the plain tensors it is made of (packed codes, scales, zero points)."""
    if hasattr(tensor, "__tensor_flatten__") and type(tensor) is not torch.nn.Parameter:
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def _linear_on_rows(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """An int8 linear layer's forward on its input flattened to (rows, in_features). Compiled on a
    CPU (torch 2.13, torchao 0.18), int8 activations of shape (1, 1, in_features), one token of one
    row as an AR step feeds them, come out wrong by orders of magnitude; every 2-D shape and every
    other 3-D one comes out right (``tests/models/test_quantized.py`` checks both ways)."""
    out = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])
