"""SJD2's drafts (#50): Jacobi positions that enter as noise and are denoised a level a forward, fed
after the verified drafts as an unverified tail. Greedy output equals AR on ragged guided rows and
with continuous batching; sampled decoding is lossless (chi-square against the exact law), with a
control that noises the last verified input and must fail; bad input is named."""

import pytest
import torch

from conftest import tiny_hf, tiny_llamagen
from drafters.harness import N, V, labels_prefix
from visualspec.core.engine import Requests, decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.core.window import WindowPolicy
from visualspec.drafters import DenoisingJacobiDrafter
from visualspec.drafters.denoising import offset_levels
from visualspec.models.hf import HFCausalLM

GREEDY_GUIDED = SamplingConfig(temperature=0.0, guidance_scale=2.0)


def target(steps=2, **kwargs):
    return tiny_llamagen(vocab_size=16, block_size=16, std=0.3, denoising_steps=steps, **kwargs)


class Recording(DenoisingJacobiDrafter):
    """Records each proposal's drafts and tail widths."""

    def propose(self, tokens, n, k, generator=None):
        drafts, q = super().propose(tokens, n, k, generator)
        self.widths = getattr(self, "widths", []) + [(drafts.shape[1], self.tail[0].shape[1])]
        return drafts, q


def test_offset_levels():
    # half the window clean, then a level more every `band` positions, up to pure noise
    assert offset_levels(7, 2, band=1.0).tolist() == [0, 0, 0, 0, 1, 2, 2]
    assert offset_levels(8, 4, band=2.0).tolist() == [0, 0, 0, 0, 1, 1, 2, 2]
    assert offset_levels(1, 4).tolist() == [0]


@pytest.mark.parametrize("steps", [1, 3])
def test_greedy_output_equals_ar_on_ragged_guided_rows(steps):
    model = target(steps)
    labels = torch.tensor([0, 1, 2, 3, 3, 3])
    ar, _ = decode(model, labels, 16, GREEDY_GUIDED)
    drafter = Recording.for_target(model)
    out, stats = decode(model, labels, 16, GREEDY_GUIDED, drafter=drafter, window=6)
    assert torch.equal(out, ar)
    # every forward is as wide as the window; the first feeds only noise, later ones verify at most
    # the first half of the window (3 of 5 positions: fewer after a step that committed past what
    # was carried) and feed the rest noised
    assert all(m + t == 5 for m, t in drafter.widths) and drafter.widths[0] == (0, 5)
    assert max(m for m, _ in drafter.widths) == 3 and drafter.widths.count((3, 2)) > len(drafter.widths) / 2


def test_greedy_output_equals_ar_with_continuous_batching():
    model = target()
    labels = torch.tensor([0, 1, 2, 0, 1])
    ar, _ = decode(model, labels, 16, SamplingConfig(temperature=0.0))
    requests = Requests(count=5, prefix=lambda r: labels[r], slots=2)
    out, _ = decode(model, requests, 16, SamplingConfig(temperature=0.0),
                    drafter=DenoisingJacobiDrafter.for_target(model), window=5)
    assert torch.equal(out, ar)


class RecordingNoise:
    """A target that records the noise levels of each window it is fed."""

    def __init__(self, model):
        self.model, self.levels = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward_window(self, tokens, start, noise=None, **kwargs):
        self.levels.append(None if noise is None else noise[0].clone())
        return self.model.forward_window(tokens, start, noise=noise, **kwargs)


def test_the_tail_reaches_the_model_noised_after_clean_drafts():
    model = RecordingNoise(target(steps=2))
    drafter = Recording.for_target(model.model)
    decode(model, torch.tensor([0, 1]), 16, SamplingConfig(temperature=0.0), drafter=drafter, window=8)
    for (m, t), levels in zip(drafter.widths, model.levels):
        # the last committed token and the m drafts clean; the tail's carried tokens noised by
        # offset (levels 1/2, 1/2, 1, 1 past 4 clean drafts), positions nobody predicted pure noise
        assert levels.shape[1] == 8 and bool((levels[:, :m + 1] == 0).all()) and bool((levels[:, m + 1:] > 0).all())
    assert model.levels[1][0].tolist() == [0, 0, 0, 0, 0, 0.5, 0.5, 1]


class NoisingTheLastInput:
    """A control target: the tail's noise moved one column earlier, onto the last verified input
    (the last draft, or the last committed token), whose output the rule reads."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward_window(self, tokens, start, noise=None, **kwargs):
        if noise is not None:
            noise = tuple(torch.cat([x[:, 1:], x[:, -1:]], 1) for x in noise)
        return self.model.forward_window(tokens, start, noise=noise, **kwargs)


def test_sjd2_drafts_are_lossless():
    """20,000 sequences of 4 tokens in batches of 500 rows, window 5, two noise levels, sampled with
    guidance, temperature, top-k and top-p; chi-square against the exact law, bound from the sample
    size. The control (4,000 sequences) noises the last verified input: the fit must fail, so the
    test reaches the columns next to the tail."""
    model = tiny_llamagen(vocab_size=V, block_size=16, std=0.5, denoising_steps=2)
    sampling = SamplingConfig(guidance_scale=2.5, temperature=0.8, top_k=3, top_p=0.95)
    prefix = labels_prefix(sampling)
    seqs, probs = exact_sequence_distribution(model, prefix, N, sampling)

    def drawn(target, samples):
        return sample_sequences(target, prefix, N, sampling, samples, batch=500, window=5,
                                drafter_factory=lambda rows: DenoisingJacobiDrafter.for_target(model))
    fit = chi_square_fit(drawn(model, 20000), seqs, probs)
    assert fit.passed, fit
    control = chi_square_fit(drawn(NoisingTheLastInput(model), 4000), seqs, probs)
    assert not control.passed and control.chi2 > 10 * control.threshold, control


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="fine-tuned for noisy inputs"):
        DenoisingJacobiDrafter.for_target(tiny_llamagen(vocab_size=16, block_size=16))
    with pytest.raises(ValueError, match="denoising steps"):
        DenoisingJacobiDrafter(0, 32)
    with pytest.raises(ValueError, match="band"):
        DenoisingJacobiDrafter(2, 32, band=0)
    model = target()
    with pytest.raises(ValueError, match="fixed window"):
        decode(model, torch.tensor([0]), 16, SamplingConfig(temperature=0.0),
               drafter=DenoisingJacobiDrafter.for_target(model), window=WindowPolicy({1: {1: 1.0, 4: 1.0}}))
    lm = HFCausalLM(tiny_hf("llama"))
    with pytest.raises(TypeError, match="takes no noise"):
        decode(lm, torch.tensor([[3, 4]]), 4, SamplingConfig(temperature=0.0),
               drafter=DenoisingJacobiDrafter(2, 32), window=3)
