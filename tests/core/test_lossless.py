"""Losslessness of whole sequences: exact enumeration vs sampling, with controls that must fail.

A tiny random model (vocabulary 4, 4 tokens: 256 possible sequences) gives the target's exact
sequence distribution. Each lossless mode samples 24,000 sequences in batches (so the batch-aligned
engine path is what is tested) and must pass a chi-square test at false-alarm probability 1e-6;
the same harness, at the same sample size, must reject a deliberately wrong acceptance rule.
Coupled drafts take 40,000: their control (a stale q) biases the law less, and fails only there.
"""

import pytest
import torch

from conftest import tiny_hf, tiny_llamagen
from drafters.harness import GUIDED, PLAIN, SAMPLES, N, V, accept_with_p_rule, labels_prefix
from visualspec.drafters import DraftModelDrafter, JacobiDrafter
from visualspec.core.engine import decode
from visualspec.models.hf import HFCausalLM
from visualspec.core.sampling import SamplingConfig
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.verify import Verdict, point_mass, speculative_verify

COUPLED_SAMPLES = 40000


def batch_wrong_rule(draft_tokens, draft_probs, target_probs, generator):
    """accept_with_p_rule applied to the first draft only (enough to bias the sequence law)."""
    if draft_tokens.shape[1] == 0 or draft_probs is None:
        return speculative_verify(draft_tokens, draft_probs, target_probs, generator)
    v = accept_with_p_rule(draft_tokens[:, :1], draft_probs[:, :1], target_probs[:, :2], generator)
    # after an accepted first draft, emit the target's token at position 1 (no further drafts)
    bonus = torch.multinomial(target_probs[:, 1], 1, generator=generator)[:, 0]
    return Verdict(v.num_accepted, torch.where(v.num_accepted == 1, bonus, v.next_tokens))


def fit_for(model, make_prefix, sampling, rule=speculative_verify, drafter=None, window=4, seed=0,
            samples=SAMPLES):
    """``drafter(rows)`` builds a fresh drafter for a batch of ``rows`` rows. With a drafter, the
    rows of a batch must commit different counts (so the ragged path is what is tested)."""
    if drafter is not None:
        _, stats = decode(model, make_prefix(64), N, sampling, drafter=drafter(64), rule=rule, window=window,
                          generator=torch.Generator().manual_seed(seed))
        assert stats.row_forwards.unique().numel() > 1, "every row accepted alike: not a ragged batch"
    seqs, probs = exact_sequence_distribution(model, make_prefix, N, sampling)
    drawn = sample_sequences(model, make_prefix, N, sampling, samples, seed=seed, rule=rule, window=window,
                             drafter_factory=drafter or (lambda rows: None))
    return chi_square_fit(drawn, seqs, probs)


@pytest.mark.parametrize("sampling, init", [(GUIDED, "random"), (PLAIN, "repeat_left"), (GUIDED, "repeat_above")],
                         ids=["guided-topk-topp-random", "plain-repeat_left", "guided-topk-topp-repeat_above"])
def test_sjd_is_lossless(sampling, init):
    """Each Jacobi init once (the rule is the same for all; the init only changes which drafts
    are tested), the shipped one and random under guidance with top-k and top-p."""
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    fit = fit_for(model, labels_prefix(sampling), sampling,
                  drafter=lambda rows: JacobiDrafter(V, init, grid_width=2), window=4)
    assert fit.passed, fit


def test_sjd_is_lossless_with_the_epsilon_cutoff():
    """The cut-off reads the conditional rows of the forward; drafts and verification must both
    see it. It must bite here: some sequences the guided law allows are cut to zero."""
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    sampling = SamplingConfig(guidance_scale=2.5, epsilon_cutoff=0.2)
    _, cut = exact_sequence_distribution(model, labels_prefix(sampling), N, sampling)
    _, uncut = exact_sequence_distribution(model, labels_prefix(sampling), N, SamplingConfig(guidance_scale=2.5))
    assert (cut == 0).sum() > 0 and (uncut == 0).sum() == 0
    fit = fit_for(model, labels_prefix(sampling), sampling,
                  drafter=lambda rows: JacobiDrafter(V, "repeat_above", grid_width=2), window=4)
    assert fit.passed, fit


def test_the_harness_fails_samples_of_impossible_sequences():
    """Control for the test above: AR that forgets the cut-off draws sequences the cut law gives
    probability 0, and a single such sample fails the fit."""
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    cut = SamplingConfig(guidance_scale=2.5, epsilon_cutoff=0.2)
    seqs, probs = exact_sequence_distribution(model, labels_prefix(cut), N, cut)
    forgetful = sample_sequences(model, labels_prefix(cut), N, SamplingConfig(guidance_scale=2.5), 4000)
    fit = chi_square_fit(forgetful, seqs, probs)
    assert fit.impossible > 0 and not fit.passed
    faithful = sample_sequences(model, labels_prefix(cut), N, cut, 4000)
    fit = chi_square_fit(faithful, seqs, probs)
    assert fit.passed, fit
    one_off = torch.cat([faithful, seqs[probs == 0][:1]])
    assert not chi_square_fit(one_off, seqs, probs).passed


def test_ar_is_lossless():
    model = tiny_llamagen(seed=1, vocab_size=V, block_size=N)
    assert fit_for(model, labels_prefix(GUIDED), GUIDED).passed


@pytest.mark.parametrize("sampling", [PLAIN, GUIDED], ids=["plain", "guided-topk-topp"])
def test_draft_model_speculative_sampling_is_lossless(sampling):
    target = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    draft = tiny_llamagen(seed=7, vocab_size=V, block_size=N, dim=16, n_layer=1)
    prefix = labels_prefix(sampling)
    fit = fit_for(target, prefix, sampling, drafter=lambda rows: DraftModelDrafter(draft, prefix(rows)), window=3)
    assert fit.passed, fit


def test_sjd_on_a_transformers_llama_is_lossless():
    model = HFCausalLM(tiny_hf("llama", vocab_size=V))
    prompt = lambda rows: torch.tensor([[0, 2, 1]]).expand(rows, 3)  # noqa: E731
    fit = fit_for(model, prompt, PLAIN, drafter=lambda rows: JacobiDrafter(V, "random"), window=3)
    assert fit.passed, fit


@pytest.mark.parametrize("mode", ["sjd", "draft-model"])
def test_the_harness_catches_a_wrong_rule(mode):
    target = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    if mode == "sjd":
        drafter = lambda rows: JacobiDrafter(V, "random")  # noqa: E731
    else:
        draft = tiny_llamagen(seed=7, vocab_size=V, block_size=N, dim=16, n_layer=1)
        drafter = lambda rows: DraftModelDrafter(draft, labels_prefix(PLAIN)(rows))  # noqa: E731
    fit = fit_for(target, labels_prefix(PLAIN), PLAIN, rule=batch_wrong_rule, drafter=drafter, window=3)
    assert not fit.passed, fit


class StaleCoupling(JacobiDrafter):
    """The released Lumina/Janus form of coupling: a draft the coupling kept carries its *old* q
    into the next verification instead of the new distribution (a wrong rule: not lossless)."""

    def observe(self, n, committed, target_probs, generator=None):
        drafts, q = self.proposed
        super().observe(n, committed, target_probs, generator)
        B, K1, V = target_probs.shape
        carried, carried_probs, count = self.carry
        width = carried.shape[1]
        index = (committed[:, None] + torch.arange(width)).clamp(max=K1 - 1)
        old = torch.cat([drafts, torch.full_like(drafts[:, :1], -1)], 1).gather(1, index)
        q = point_mass(drafts, V) if q is None else q
        old_q = torch.cat([q, torch.zeros_like(q[:, :1])], 1).gather(1, index[..., None].expand(B, width, V))
        self.carry = (carried, torch.where((carried == old)[..., None], old_q.to(target_probs.dtype), carried_probs),
                      count)


@pytest.mark.parametrize("sampling, init", [(PLAIN, "random"), (GUIDED, "repeat_above")],
                         ids=["plain-random", "guided-topk-topp-repeat_above"])
def test_coupled_sjd_is_lossless(sampling, init):
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    fit = fit_for(model, labels_prefix(sampling), sampling,
                  drafter=lambda rows: JacobiDrafter(V, init, grid_width=2, coupling=True), window=4,
                  samples=COUPLED_SAMPLES)
    assert fit.passed, fit


def test_the_harness_catches_stale_coupling():
    """Control for the test above: the same coupling with the old q kept must fail. The coupled
    positions are really exercised: a window of 4 carries two predicted positions past a commit
    of one token."""
    model = tiny_llamagen(seed=0, vocab_size=V, block_size=N)
    fit = fit_for(model, labels_prefix(PLAIN), PLAIN,
                  drafter=lambda rows: StaleCoupling(V, "random", coupling=True), window=4,
                  samples=COUPLED_SAMPLES)
    assert not fit.passed, fit
