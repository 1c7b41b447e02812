"""Which float type a model runs in: bfloat16 where this machine runs it natively, else float32.

torch is imported where a function needs it, so that the command line can offer :data:`DTYPES`
without loading torch.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: the ``dtype`` options of the commands that take one ("auto": :func:`resolve_dtype`)
DTYPES = ("auto", "float32", "bfloat16")


@functools.lru_cache(maxsize=None)
def bfloat16_speedup_on_cpu(size: int = 256, repeats: int = 20) -> float:
    """A float32 (size x size) matrix product's best time over a bfloat16 one's, on this CPU.

    ``t_float32 / t_bfloat16``: above 1 on CPUs with bfloat16 instructions (AMX: 2.4 for 256 on the
    project's Xeon, one thread), far below on AVX2-only CPUs, which have no bfloat16 kernels (0.002
    on a 2-core AMD EPYC: 0.28 against 146 GFLOP/s). Measured once a process, after an untimed
    product of each type, on one thread, the two types alternated ``repeats`` times: a busy core
    (a browser, another server) once made five products on two threads read below 1.5 on the
    Xeon, and the app then ran in float32 (docs/experiments/2026-11-29-arena-speculation-guard.md).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = {dtype: torch.randn(size, size).to(dtype) for dtype in (torch.float32, torch.bfloat16)}
        best = {}
        for dtype, x in a.items():
            x @ x  # untimed: a first product sets up its kernel (oneDNN's, for bfloat16)
            best[dtype] = float("inf")
        for _ in range(repeats):
            for dtype, x in a.items():
                t0 = time.perf_counter()
                x @ x
                best[dtype] = min(best[dtype], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best[torch.float32] / best[torch.bfloat16]


def resolve_dtype(name: str, device: torch.device | str = "cpu", fast: float = 1.5) -> torch.dtype:
    """The float type option ``name`` (:data:`DTYPES`) asks for on ``device``. ``"auto"``: bfloat16
    on a CUDA device that supports it, or on a CPU whose bfloat16 matrix product is at least
    ``fast`` times its float32 one (:func:`bfloat16_speedup_on_cpu`); else float32."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {DTYPES}")
    if name != "auto":
        return getattr(torch, name)
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device.type == "cpu" and bfloat16_speedup_on_cpu() >= fast else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """The option name of a float type (``torch.bfloat16`` -> ``"bfloat16"``), as :data:`DTYPES` spells it."""
    return str(dtype).removeprefix("torch.")
