"""The float type a model runs in: "auto" takes bfloat16 only where the machine runs it natively."""

import pytest
import torch

from visualspec.core import precision


def test_dtype_options_resolve_and_auto_follows_the_measured_speed(monkeypatch):
    assert precision.resolve_dtype("float32") is torch.float32
    assert precision.resolve_dtype("bfloat16") is torch.bfloat16
    for speedup, expected in ((2.4, torch.bfloat16), (1.2, torch.float32), (0.002, torch.float32)):
        monkeypatch.setattr(precision, "bfloat16_speedup_on_cpu", lambda: speedup)
        assert precision.resolve_dtype("auto", "cpu") is expected
    with pytest.raises(ValueError, match="unknown dtype 'half'"):
        precision.resolve_dtype("half")


def test_the_bfloat16_speed_is_measured_once_a_process():
    first = precision.bfloat16_speedup_on_cpu()
    assert first > 0 and precision.bfloat16_speedup_on_cpu() == first


def test_measuring_the_bfloat16_speed_leaves_torch_threads_as_they_were():
    import torch

    before = torch.get_num_threads()
    precision.bfloat16_speedup_on_cpu.cache_clear()
    try:
        torch.set_num_threads(2)
        assert precision.bfloat16_speedup_on_cpu(size=64, repeats=2) > 0 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
