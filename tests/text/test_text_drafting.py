"""Model-free drafting and typical acceptance (the text-side pieces of the shared core)."""

import pytest
import torch

from visualspec.drafters import NGramDrafter
from visualspec.core.sampling import SamplingConfig
from visualspec.core.verify import typical_verify

gen = None  # the randomness of drafter calls in tests that set none


def test_ngram_lookup_takes_the_latest_longest_match():
    d = NGramDrafter([[0]], max_ngram=3)
    ctx = [5, 6, 7, 1, 2, 5, 6, 7, 3, 4, 9, 5, 6, 7]
    assert d.lookup(ctx, 2) == [3, 4]  # "5 6 7" last seen before the end at index 5
    assert d.lookup([1, 2, 3, 9, 2, 3], 3) == [9, 2, 3]  # "2 3" -> 9 2 3
    assert d.lookup([1, 2, 3, 1], 4) == [2, 3, 1, 1]  # continuation padded with its last token
    assert d.lookup([4, 5, 6], 2) == [6, 6]  # no match: repeat the last token
    assert d.lookup([4, 5], 0) == []
    with pytest.raises(ValueError, match="min_ngram"):
        NGramDrafter([[0]], max_ngram=1, min_ngram=2)


def test_ngram_drafter_reads_prompt_and_generated_tokens_per_row():
    d = NGramDrafter([[1, 2, 3, 4], [7, 7, 8]], max_ngram=2)
    d.start(2, 8, SamplingConfig())
    tokens = torch.tensor([[1, 2, 0, 0], [8, 7, 0, 0]])
    drafts, probs = d.propose(tokens, 2, 3, generator=gen)
    assert probs is None  # point masses
    assert drafts.tolist() == [[3, 4, 1], [8, 8, 7]]  # row 1: no 2-gram match; "7" last seen at 1
    with pytest.raises(ValueError, match="prompts"):
        d.start(3, 8, SamplingConfig())


def test_ngram_drafts_only_what_matched():
    """A step drafts as many tokens as the longest continuation a row found (the other rows filled
    with their last token), and none where no row matched: then the step is a plain forward."""
    d = NGramDrafter([[1, 2, 3, 4], [5, 6]], max_ngram=2)
    d.start(2, 8, SamplingConfig())
    tokens = torch.tensor([[1, 2, 0], [9, 0, 0]])
    drafts, _ = d.propose(tokens, torch.tensor([2, 1]), 5, generator=gen)
    assert drafts.tolist() == [[3, 4, 1, 2], [9, 9, 9, 9]]  # "1 2" goes on 3 4 1 2; "9" is new
    d.select(torch.tensor([1]))
    drafts, _ = d.propose(tokens[1:], 1, 5, generator=gen)
    assert drafts.shape == (1, 0)


def test_typical_acceptance_keeps_tokens_above_the_entropy_threshold():
    V = 4
    confident = torch.tensor([0.97, 0.01, 0.01, 0.01])  # low entropy: threshold = min(0.09, 0.3 e^-H)
    flat = torch.full((V,), 0.25)  # H = ln 4: threshold = min(0.09, 0.075) = 0.075 -> any token passes
    target = torch.stack([confident, flat, confident])[None]  # K = 2 drafts + bonus row
    verdict = typical_verify(torch.tensor([[0, 3]]), None, target, torch.Generator().manual_seed(0))
    assert verdict.num_accepted.item() == 2
    verdict = typical_verify(torch.tensor([[1, 3]]), None, target, torch.Generator().manual_seed(0))
    assert verdict.num_accepted.item() == 0  # p(1) = 0.01 is below the threshold


def test_typical_acceptance_is_greedy_at_temperature_zero():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(64, 4, 10, generator=g), -1)
    greedy = torch.nn.functional.one_hot(p.argmax(-1), 10).float()
    drafts = torch.where(torch.rand(64, 3, generator=g) < 0.7, p[:, :3].argmax(-1), torch.randint(0, 10, (64, 3), generator=g))
    verdict = typical_verify(drafts, None, greedy, g)
    match = (drafts == p[:, :3].argmax(-1)).long().cumprod(-1).sum(-1)
    assert torch.equal(verdict.num_accepted, match)
    assert torch.equal(verdict.next_tokens, p.argmax(-1)[torch.arange(64), match])


def test_typical_acceptance_is_lossy_and_its_distance_can_be_measured():
    """One step with a draft the target finds unlikely-but-typical: the output law shifts toward it."""
    p = torch.tensor([0.5, 0.3, 0.12, 0.08])
    n = 200_000
    g = torch.Generator().manual_seed(2)
    target = p.expand(n, 2, 4)
    drafts = torch.full((n, 1), 2)  # p(2) = 0.12 > min(0.09, 0.3 e^-H(p) = 0.094): always accepted
    out = typical_verify(drafts, None, target, g)
    first = torch.where(out.num_accepted == 1, drafts[:, 0], out.next_tokens)
    law = torch.bincount(first, minlength=4).double() / n
    tv = 0.5 * (law - p.double()).abs().sum()
    assert tv > 0.8  # all the mass lands on token 2 (TV 0.88): the rule is lossy
