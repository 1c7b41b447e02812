"""ASSD (Any-Subset Speculative Decoding) is lossless along the order; parallel decoding is not.

An any-order model of 4 cells and 4 tokens (256 sequences) gives the exact law of sequential
sampling along an order, by enumeration. ASSD's samples (self-drafts of the next cells, verified
along the order by the engine) must fit it by a chi-square test at false-alarm probability 1e-6
(24,000 samples, ragged rows, with guidance, top-k and top-p; and infilling, with a kept cell);
RandAR-style parallel decoding (the same conditionals, drawn together without verification) must
fail the same test at the same sample size.
"""

import pytest
import torch

from conftest import tiny_llamagen
from drafters.harness import GUIDED, PLAIN, SAMPLES, V
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.parallel import cosine_schedule, decode_parallel
from visualspec.drafters import AnySubsetDrafter
from visualspec.models.any_order import AnyOrderGPT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CELLS = 4
ORDER = [2, 0, 3, 1]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    any_order = AnyOrderGPT.from_raster(tiny_llamagen(seed=0, vocab_size=V, block_size=CELLS))
    torch.nn.init.normal_(any_order.query_embeddings.weight, std=0.5)
    return any_order.eval()


def prefix_maker(sampling, kept=()):
    """Class 1 (and the null class 3 under guidance), ORDER, and the tokens of its first cells."""
    def make(rows):
        labels = torch.tensor([1] * rows + ([3] * rows if sampling.uses_guidance else []))
        orders = torch.tensor([ORDER]).expand(len(labels), CELLS)
        return labels, None, orders, torch.tensor([list(kept)], dtype=torch.long).expand(len(labels), len(kept))
    return make


def fit(model, sampling, kept=(), decode_fn=decode, **kwargs):
    make = prefix_maker(sampling, kept)
    n = CELLS - len(kept)
    seqs, probs = exact_sequence_distribution(model, make, n, sampling)
    drawn = sample_sequences(model, make, n, sampling, SAMPLES, decode_fn=decode_fn, **kwargs)
    return chi_square_fit(drawn, seqs, probs)


@pytest.mark.parametrize("sampling, kept", [(GUIDED, ()), (PLAIN, (3,))], ids=["guided-topk-topp", "infilling"])
def test_assd_has_the_law_of_sequential_sampling_along_the_order(model, sampling, kept):
    make = prefix_maker(sampling, kept)
    _, stats = decode(model, make(64), CELLS - len(kept), sampling, drafter=AnySubsetDrafter(model), window=4,
                      generator=torch.Generator().manual_seed(0))
    if not kept:  # (with a cell kept, every row finishes in one round: nothing is left to be ragged about)
        assert stats.row_forwards.unique().numel() > 1, "every row accepted alike: not a ragged batch"
    assert stats.mean_accepted > 1.5  # drafts were kept: the verification path is what is tested
    result = fit(model, sampling, kept, drafter_factory=lambda rows: AnySubsetDrafter(model), window=4)
    assert result.passed, result


def test_parallel_drafts_committed_without_verification_fail_the_same_test(model):
    """Control: the same conditionals, three cells drawn together (RandAR's parallel decoding)."""
    def parallel(target, prefix, n, sampling, drafter=None, generator=None):
        return decode_parallel(target, prefix, n, sampling, steps=1, generator=generator)
    result = fit(model, GUIDED, decode_fn=parallel)
    assert not result.passed, result


def test_every_round_commits_two_tokens_so_assd_never_needs_more_forwards_than_sequential():
    """The first draft's q is its p: always accepted. Drafts count as the target's forwards (16 cells)."""
    torch.manual_seed(2)
    model = AnyOrderGPT.from_raster(tiny_llamagen(seed=2, vocab_size=V, block_size=16))
    torch.nn.init.normal_(model.query_embeddings.weight, std=0.5)
    labels, orders = torch.tensor([1] * 32), torch.stack([torch.randperm(16) for _ in range(32)])
    _, stats = decode(model, (labels, None, orders, None), 16, PLAIN, drafter=AnySubsetDrafter(model), window=5,
                      generator=torch.Generator().manual_seed(1))
    assert sum(n == 1 for n in stats.accepted_lengths) <= 32  # one token only where one was left (a row's last step)
    assert stats.row_forwards.unique().numel() > 1 and int(stats.row_forwards.max()) <= 16
    assert int((stats.row_forwards - 1).sum()) == 2 * stats.steps and stats.draft_forwards == 0  # draft + verify


def test_the_cosine_schedule_draws_few_tokens_first_and_every_token_once():
    counts = cosine_schedule(256, 88)
    assert len(counts) == 88 and sum(counts) == 255 and min(counts) >= 1
    assert counts[0] < counts[-1]
    assert cosine_schedule(5, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="at most one step per token"):
        cosine_schedule(5, 5)
