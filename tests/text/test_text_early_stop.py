"""A draft model that stops drafting early (``stop_below``, transformers' assistant confidence
threshold): greedy equality with generate, losslessness under sampling with the exact-enumeration
harness (the stops really happen, at varying lengths), and clear errors."""

import pytest
import torch

from conftest import TEXT_PROMPTS, generate_reference, tiny_hf
from drafters.harness import PROMPT, N, V
from visualspec.drafters import DraftModelDrafter
from visualspec.models.hf import HFCausalLM
from visualspec.core.sampling import SamplingConfig
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.text import generate_text


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_output_equals_generate_and_fewer_drafts_are_made(family, tokenizer):
    model, draft = tiny_hf(family, vocab_size=64), tiny_hf(family, seed=1, vocab_size=64)
    runs = {s: generate_text(model, tokenizer, TEXT_PROMPTS, drafter=draft, max_new_tokens=20, temperature=0,
                             window=8, draft_stop_below=s) for s in (None, 0.5)}
    for out in runs.values():
        for prompt, ids in zip(TEXT_PROMPTS, out.token_ids):
            ref = generate_reference(model, tokenizer, prompt, 20)
            assert ids == ref[: len(ids)] and (len(ids) == 20 or ids[-1] == tokenizer.eos_token_id)
    assert runs[0.5].stats.draft_forwards < runs[None].stats.draft_forwards


class Recording(DraftModelDrafter):
    """Records how many drafts each step got."""

    lengths: list

    def propose(self, tokens, n, k, generator=None):
        drafts, q = super().propose(tokens, n, k, generator)
        if k:
            assert q.shape[:2] == drafts.shape
            self.lengths.append((k, drafts.shape[1]))
        return drafts, q


def test_early_stopping_is_lossless():
    """20,000 sequences of 4 tokens in batches of 64 rows, window 4; chi-square against the exact
    law, bound from the sample size. This draft model is unsure (below 0.6) at the prompt whatever
    it drafts, so every step that asks for two drafts stops after one, in every row of the batch:
    the early stop is taken on half of all steps, and the law must still be exact."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    draft = HFCausalLM(tiny_hf("llama", seed=2, vocab_size=V))
    lengths = []

    def make_prefix(rows):
        return torch.tensor([PROMPT]).expand(rows, len(PROMPT))

    def drafter(rows):
        d = Recording(draft, make_prefix(rows), stop_below=0.6)
        d.lengths = lengths
        return d

    sampling = SamplingConfig(temperature=0.8, top_k=3)
    seqs, probs = exact_sequence_distribution(target, make_prefix, N, sampling)
    drawn = sample_sequences(target, make_prefix, N, sampling, 20000, batch=64, window=4, drafter_factory=drafter)
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    stopped = sum(got < asked for asked, got in lengths)
    assert lengths and stopped == len(lengths), (stopped, len(lengths))  # the early stop is taken


def test_errors_are_named(tokenizer):
    model, draft = tiny_hf("llama", vocab_size=64), tiny_hf("llama", seed=1, vocab_size=64)
    with pytest.raises(ValueError, match="stop_below must be a probability"):
        generate_text(model, tokenizer, "w1", drafter=draft, draft_stop_below=1.5, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a draft model"):
        generate_text(model, tokenizer, "w1", drafter="ngram", draft_stop_below=0.3, max_new_tokens=4)
    with pytest.raises(ValueError, match="fixed shape"):
        generate_text(model, tokenizer, "w1", drafter=draft, branches=2, window=7, draft_stop_below=0.3,
                      max_new_tokens=4)
