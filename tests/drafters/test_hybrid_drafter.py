"""The hybrid drafter (#50): a feature drafter's drafts next to the committed tokens, Jacobi's past
them. Greedy output equals AR on ragged rows and with continuous batching; sampled decoding is
lossless (chi-square against the exact law, coupling on), with a control whose Jacobi positions
report the wrong law and must fail; bad depths are named."""

import pytest
import torch

from conftest import tiny_hf
from drafters.harness import N, V, copying_net, drafter_net, prompt_prefix, queued_greedy_ar, ragged_greedy_ar
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import FeatureDrafter, HybridDrafter, JacobiDrafter
from visualspec.models.hf import HFCausalLM


def hybrid(net, target, prefix, depth, coupling=False):
    jacobi = JacobiDrafter(target.vocab_size, coupling=coupling)
    return HybridDrafter(FeatureDrafter(net, target, prefix), jacobi, depth)


class Recording(HybridDrafter):
    """Records, per proposal, k and the feature drafter's passes for it, and row 0's n and drafts."""

    def propose(self, tokens, n, k, generator=None):
        before = self.feature.forwards
        drafts, q = super().propose(tokens, n, k, generator)
        self.seen = getattr(self, "seen", []) + [(k, self.feature.forwards - before)]
        self.drafts = getattr(self, "drafts", []) + [(int(torch.as_tensor(n).reshape(-1)[0]), drafts)]
        return drafts, q


@pytest.mark.parametrize("static", [False, True])
def test_greedy_output_equals_ar_on_ragged_rows(static):
    target, prefix, ar = ragged_greedy_ar(static)
    drafter = Recording(FeatureDrafter(drafter_net(target), target, prefix), JacobiDrafter(target.vocab_size), 2)
    out, stats = decode(target, prefix, 12, SamplingConfig(temperature=0.0), drafter=drafter, window=5)
    assert torch.equal(out, ar)
    # each window of 4 drafts: the catch-up pass gives the first learned draft, one more pass the second
    assert {k for k, _ in drafter.seen} == {4} and {passes for _, passes in drafter.seen} == {2}
    assert stats.target_forwards < 12 * 3


def test_the_feature_drafter_reads_each_windows_features():
    """With a drafter network that returns its input feature, the first draft of every window is
    the target's own prediction of the position before (the token AR put at n - 1), as the feature
    drafter's own test shows for it alone: the hybrid hands each verified window's features on."""
    target = HFCausalLM(tiny_hf("llama", seed=3))  # a greedy path of varied tokens
    net = copying_net(target)
    prefix, greedy = torch.tensor([[3, 5, 7, 9]]), SamplingConfig(temperature=0.0)
    ar, _ = decode(target, prefix, 16, greedy)
    drafter = Recording(FeatureDrafter(net, target, prefix), JacobiDrafter(target.vocab_size), 1)
    out, _ = decode(target, prefix, 16, greedy, drafter=drafter, window=4)
    assert torch.equal(out, ar)
    first = [int(d[0, 0]) == int(ar[0, n - 1]) for n, d in drafter.drafts if n >= 2]
    assert first and all(first)


def test_greedy_output_equals_ar_with_continuous_batching():
    target, requests, prompts, ar = queued_greedy_ar()
    drafter = hybrid(drafter_net(target), target, prompts, depth=1)
    out, _ = decode(target, requests, 10, SamplingConfig(temperature=0.0), drafter=drafter, window=4)
    assert torch.equal(out, ar)


def test_hybrid_drafts_are_lossless():
    """20,000 sequences of 4 tokens in batches of 64 rows, window 4 (the feature drafter drafts the
    first position, Jacobi the two past it: carried samples, coupled, or repeats of the token to
    their left); chi-square against the exact law, bound from the sample size. The control draws
    the same drafts (4,000 sequences) but reports the uniform law at the Jacobi positions only,
    which their drafts do not follow: the fit must fail, so the test reaches the positions past
    the depth."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    net = drafter_net(target, seed=3)

    class WrongJacobiLaw(HybridDrafter):
        def propose(self, tokens, n, k, generator=None):
            drafts, q = super().propose(tokens, n, k, generator)
            q = q.clone()
            q[:, self.depth:] = 1 / q.shape[-1]
            return drafts, q

    sampling = SamplingConfig(temperature=0.8, top_k=3)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)

    def drawn(cls, samples):
        return sample_sequences(target, prompt_prefix, N, sampling, samples, batch=64, window=4,
                                drafter_factory=lambda rows: cls(FeatureDrafter(net, target, prompt_prefix(rows)),
                                                                 JacobiDrafter(V, "repeat_left", coupling=True), 1))
    fit = chi_square_fit(drawn(HybridDrafter, 20000), seqs, probs)
    assert fit.passed, fit
    control = chi_square_fit(drawn(WrongJacobiLaw, 4000), seqs, probs)  # 4,000 suffice: it misses by far
    assert not control.passed and control.chi2 > 10 * control.threshold, control


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_a_bad_depth_is_named(depth):
    target = HFCausalLM(tiny_hf("llama"))
    with pytest.raises(ValueError, match="hybrid drafter's depth"):
        hybrid(drafter_net(target), target, None, depth)
