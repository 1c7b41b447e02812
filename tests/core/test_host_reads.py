"""An AR decode step never waits for the device (#48): the engine keeps its statistics, progress and
finished-row check on the device and reads them at the end, so on a GPU the host's work of one
step runs while the device computes the forward. A CPU shows no waiting, so the tests count what
would wait: every read of a tensor's value on the host."""

from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import tiny_llamagen
from visualspec.core import rows as rows_module
from visualspec.core.constraints import TokenConstraints
from visualspec.core.engine import decode
from visualspec.core.sampling import SamplingConfig

_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
          torch.ops.aten.masked_select.default}


class HostReads(TorchDispatchMode):
    """Counts host reads: ``item()``, ``int()``, ``bool()`` of a tensor, ``nonzero``, indexing by a
    bool mask, ``masked_select`` and ``tolist()``."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _READS or (func is torch.ops.aten.index.Tensor
                              and any(i is not None and i.dtype == torch.bool for i in args[1])):
            self.count += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tolist = torch.Tensor.tolist

        def counted(tensor):
            self.count += 1
            return tolist(tensor)

        self._patch = mock.patch.object(torch.Tensor, "tolist", counted)
        self._patch.start()
        return super().__enter__()

    def __exit__(self, *exc):
        self._patch.stop()
        return super().__exit__(*exc)


def reads_of_a_decode(num_tokens: int, static_step: bool = True, constraints=None, progress=None) -> int:
    model = tiny_llamagen(vocab_size=8, block_size=64)
    model.static_step = static_step
    prefix = torch.tensor([0, 1, 2])
    with HostReads() as reads:
        decode(model, prefix, num_tokens, SamplingConfig(temperature=1.0), generator=torch.Generator().manual_seed(0),
               constraints=constraints, progress=progress)
    return reads.count


def test_an_ar_step_reads_nothing_from_the_device():
    """The reads of a decode are those of its start and end: as many for 64 tokens as for 8."""
    assert reads_of_a_decode(8) == reads_of_a_decode(64)


def test_the_counter_sees_a_step_that_reads():
    """Control: the eager LlamaGen step reads its furthest position every step (free on a CPU)."""
    assert reads_of_a_decode(64, static_step=False) - reads_of_a_decode(8, static_step=False) >= 56


def test_nor_with_constraints_and_a_progress_bar():
    """Forced tokens (counted on the device), and a progress bar told at most every 0.1 s and at
    the end, with every token counted."""
    told = []
    forced = torch.full((64,), -1)
    forced[3::8] = 5
    constraints = TokenConstraints(forced, allowed=torch.arange(8) < 7)
    with mock.patch.object(rows_module, "REPORT_EVERY_S", 3600.0):
        assert reads_of_a_decode(8, constraints=TokenConstraints(forced[:8], torch.arange(8) < 7),
                                 progress=told.append) == reads_of_a_decode(64, constraints=constraints,
                                                                            progress=told.append)
    assert told == [3 * 8, 3 * 64]  # one report each, at the end, of every token


@pytest.mark.parametrize("every", [0.0, 3600.0])
def test_the_statistics_read_once_are_the_ones_read_every_step(every):
    model = tiny_llamagen(vocab_size=8, block_size=64)
    forced = torch.full((40,), -1)
    forced[::10] = 5
    told = []
    with mock.patch.object(rows_module, "REPORT_EVERY_S", every):
        tokens, stats = decode(model, torch.tensor([0, 1]), 40, SamplingConfig(temperature=1.0),
                               generator=torch.Generator().manual_seed(0),
                               constraints=TokenConstraints(forced), progress=told.append)
    assert (tokens[:, ::10] == 5).all() and sum(told) == 80
    assert stats.accepted_lengths == [1] * 78  # two rows, 39 steps each, one token a step
    assert stats.structural_tokens == 8


def test_nor_on_a_static_transformers_cache():
    """The transformers adapter on its static cache (what compiles): an AR step reads nothing."""
    from conftest import tiny_hf
    from visualspec.models.hf import HFCausalLM

    def reads(num_tokens):
        lm = HFCausalLM(tiny_hf("llama"), static=True)
        with HostReads() as counter:
            decode(lm, torch.tensor([[3, 4, 5]]), num_tokens, SamplingConfig(temperature=1.0),
                   generator=torch.Generator().manual_seed(0))
        return counter.count

    assert reads(4) == reads(40)
