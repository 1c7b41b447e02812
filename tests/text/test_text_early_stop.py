"""A draft model that stops drafting early (``stop_below``, transformers' assistant confidence
threshold): greedy equality with generate, losslessness under sampling with the exact-enumeration
harness (the stops really happen, at varying lengths), and clear errors; STAND's chain stopping
where its memory is unsure, the same way."""

import pytest
import torch

from conftest import TEXT_PROMPTS, generate_reference, tiny_hf
from drafters.harness import PROMPT, STAND_PROMPT, N, V
from visualspec.drafters import DraftModelDrafter, StandDrafter
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


def recording(drafter_class):
    """``drafter_class`` recording, in its ``lengths`` list, how many drafts each step asked and got."""
    class Recording(drafter_class):
        lengths: list

        def propose(self, tokens, n, k, generator=None):
            drafts, q = super().propose(tokens, n, k, generator)
            if k:
                assert q.shape[:2] == drafts.shape
                self.lengths.append((k, drafts.shape[1]))
            return drafts, q
    return Recording


Recording = recording(DraftModelDrafter)


def test_early_stopping_is_lossless():
    """20,000 sequences of 4 tokens in batches of 64 rows, window 4; chi-square against the exact
    law, bound from the sample size. This draft model is unsure (below 0.6) at the prompt whatever
    it drafts, so every step that asks for two drafts stops after one, in every row of the batch:
    the early stop is taken on half of all steps, and the law must still be exact."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    draft = HFCausalLM(tiny_hf("llama", seed=2, vocab_size=V))
    fit, lengths = sampled_with_stops(target, PROMPT, 64, lambda prefix: Recording(draft, prefix, stop_below=0.6))
    assert fit.passed, fit
    stopped = sum(got < asked for asked, got in lengths)
    assert lengths and stopped == len(lengths), (stopped, len(lengths))  # the early stop is taken


def sampled_with_stops(target, prompt, batch, make_drafter):
    """The chi-square fit of 20,000 sampled sequences of 4 tokens after ``prompt`` (window 4, in
    batches of ``batch`` rows, each drafted by ``make_drafter(prefix)``, a :func:`recording`
    drafter), and the (asked, got) draft counts of every step."""
    lengths = []

    def make_prefix(rows):
        return torch.tensor([prompt]).expand(rows, len(prompt))

    def drafter(rows):
        d = make_drafter(make_prefix(rows))
        d.lengths = lengths
        return d

    sampling = SamplingConfig(temperature=0.8, top_k=3)
    seqs, probs = exact_sequence_distribution(target, make_prefix, N, sampling)
    drawn = sample_sequences(target, make_prefix, N, sampling, 20000, batch=batch, window=4, drafter_factory=drafter)
    return chi_square_fit(drawn, seqs, probs), lengths


def test_errors_are_named(tokenizer):
    model, draft = tiny_hf("llama", vocab_size=64), tiny_hf("llama", seed=1, vocab_size=64)
    with pytest.raises(ValueError, match="stop_below must be a probability"):
        generate_text(model, tokenizer, "w1", drafter=draft, draft_stop_below=1.5, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a draft model"):
        generate_text(model, tokenizer, "w1", drafter="ngram", draft_stop_below=0.3, max_new_tokens=4)
    with pytest.raises(ValueError, match="fixed shape"):
        generate_text(model, tokenizer, "w1", drafter=draft, branches=2, window=7, draft_stop_below=0.3,
                      max_new_tokens=4)


# ---------------------------------------------------------------------------------- STAND's stop

def test_stands_chain_stops_at_its_first_unsure_draft():
    """After "5 1" the prompt's memory holds 5 and 3 at 1/2 each (greedy: 3), after "1 3" only 5:
    a stop below 0.6 ends the chain at the unsure draft, which is kept; below 0.4 it goes on."""
    prompt, generated = [5, 1, 5, 2, 5, 1, 3, 5], torch.tensor([[1, 0, 0]])
    for stop, drafts in ((None, [[3, 5]]), (0.4, [[3, 5]]), (0.6, [[3]])):
        d = StandDrafter([prompt], 6, max_ngram=2, stop_below=stop)
        d.start(1, 16, SamplingConfig(temperature=0))
        assert d.propose(generated, 1, 2)[0].tolist() == drafts, stop


def test_stands_early_stop_is_lossless():
    """20,000 sequences of 4 tokens in batches of 16 rows, window 4, STAND over a prompt whose
    contexts have several successors, stopping below 0.9 (a batch stops only where every row's
    latest draft is unsure, so the batches are small); chi-square against the exact law, bound
    from the sample size. Some steps stop early and most do not, and the law must still be exact
    (the harness's control for STAND, drafts claimed uniform, is
    ``test_the_harness_catches_a_wrong_draft_distribution``)."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    fit, lengths = sampled_with_stops(target, STAND_PROMPT, 16, lambda prefix: recording(StandDrafter)(
        prefix.tolist(), V, max_ngram=2, stop_below=0.9))
    assert fit.passed, fit
    stopped = sum(got < asked for asked, got in lengths)
    assert 0 < stopped < len(lengths), (stopped, len(lengths))  # the early stop is taken, and not always


def test_stand_takes_its_default_stop_and_zero_turns_it_off(tokenizer, monkeypatch):
    import visualspec.text.generate as generate

    model = tiny_hf("llama", vocab_size=64)
    seen = []
    monkeypatch.setattr(generate, "StandDrafter",
                        lambda *a, **kw: seen.append(kw["stop_below"]) or StandDrafter(*a, **kw))
    monkeypatch.setattr(generate, "STAND_STOP_BELOW", 0.25)
    for stop in (None, 0, 0.5):
        out = generate_text(model, tokenizer, TEXT_PROMPTS[0], drafter="stand", window=4, max_new_tokens=12,
                            temperature=0, draft_stop_below=stop)
        assert out.token_ids[0] == generate_reference(model, tokenizer, TEXT_PROMPTS[0], 12)
    assert seen == [0.25, 0, 0.5]
    with pytest.raises(ValueError, match="stop_below must be a number in"):
        generate_text(model, tokenizer, "w1", drafter="stand", draft_stop_below=1.5, max_new_tokens=4)


@pytest.mark.parametrize("stop", [None, 0.5])
def test_stands_greedy_drafts_are_its_dense_laws_argmax(stop):
    """Greedy STAND drafts from its memory directly; the same drafts as the argmax of the dense
    laws the sampled path builds, on random prompts of a small vocabulary (ties and unseen contexts
    included), stops as well."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 5, (6, 12), generator=gen).tolist()
    tokens = torch.randint(0, 5, (6, 4), generator=gen)
    greedy = SamplingConfig(temperature=0)
    d = StandDrafter(prompts, 5, max_ngram=2, stop_below=stop)
    d.start(6, 16, greedy)
    drafts, q = d.propose(tokens, torch.tensor([1, 2, 3, 4, 2, 1]), 5)
    dense, laws = d._chains(d.tables, d._contexts(tokens, torch.tensor([1, 2, 3, 4, 2, 1])), (6,), 5, "cpu",
                            stop_below=stop)
    assert q is None and torch.equal(drafts, dense) and laws.shape[1] == drafts.shape[1]
