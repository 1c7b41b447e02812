"""EAGLE-3's multi-layer fusion (#50): a feature drafter with ``feature_layers`` asks the target for
several of its hidden states side by side; the target returns exactly those, the drafter gets them
at the right positions (a drafter that reads back the head's input drafts the target's own stale
prediction, and one that reads another layer does not), greedy output equals AR, sampled drafts
stay lossless (chi-square with a control that fails), and what cannot work is refused by name."""

import pytest
import torch

from conftest import tiny_hf
from drafters.harness import (N, V, drafter_net, guided_llamagen_ar, prompt_prefix, queued_greedy_ar,
                             ragged_greedy_ar, reporting_uniform_law)
from visualspec.core.engine import decode
from visualspec.core.judge import JudgeRule
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import FeatureDrafter
from visualspec.models.feature_drafter import FeatureDraftModel, check_target
from visualspec.models.hf import HFCausalLM

GREEDY = SamplingConfig(temperature=0.0)
LAYERS = (0, 1, 2)  # a two-layer Llama's hidden states: the embeddings, layer 1's input, the normed output


@pytest.mark.parametrize("static", [False, True])
def test_fused_features_are_the_named_hidden_states_and_change_no_logit(static):
    model = tiny_hf("llama")
    target = HFCausalLM(model, static=static)
    prompt, window = torch.tensor([[3, 5, 7, 9]]), torch.tensor([[11, 12, 13]])
    target.prefill(prompt, 8)
    expected, last = target.forward_window(window, 0, features=True)
    _, prefix = target.prefill(prompt, 8, features=LAYERS)
    got, fused = target.forward_window(window, 0, features=(2, 0))
    torch.testing.assert_close(got, expected)
    D = target.feature_size
    assert prefix.shape == (1, 4, 3 * D) and fused.shape == (1, 3, 2 * D)
    torch.testing.assert_close(fused[..., :D], last)  # index 2: what the head reads
    torch.testing.assert_close(fused[..., D:], model.get_input_embeddings()(window))  # index 0: the embeddings
    full = model(torch.cat([prompt, window], 1), output_hidden_states=True).hidden_states
    torch.testing.assert_close(prefix, torch.cat([full[i][:, :4] for i in LAYERS], -1))


def fusing_net(target, seed=0):
    return drafter_net(target, seed=seed, feature_layers=list(LAYERS))


@pytest.mark.parametrize("static", [False, True])
def test_a_fusing_drafter_gives_ar_greedy_on_ragged_rows(static):
    target, prefix, ar = ragged_greedy_ar(static)
    drafter = FeatureDrafter(fusing_net(target), target, prefix)
    assert drafter.wants_features == LAYERS
    out, stats = decode(target, prefix, 12, GREEDY, drafter=drafter, window=4)
    assert torch.equal(out, ar)
    assert drafter.forwards > 0 and stats.target_forwards < 12 * 3


def test_a_fusing_drafter_gives_ar_greedy_with_continuous_batching():
    target, requests, prompts, ar = queued_greedy_ar()
    out, _ = decode(target, requests, 10, GREEDY, drafter=FeatureDrafter(fusing_net(target), target, prompts), window=3)
    assert torch.equal(out, ar)


class ReadBack(FeatureDraftModel):
    """A fusing network whose step returns the fused feature it is fed: with ``reduce`` picking one
    hidden state's block, it drafts what the target's head makes of that state one position back."""

    def step(self, embeddings, features, columns, **options):
        super().step(embeddings, features, columns, **options)
        return features


def read_back(target, block: int) -> ReadBack:
    D = target.feature_size
    net = ReadBack(feature_size=D, n_head=4, ffn_hidden=64, max_len=128, feature_layers=list(LAYERS)).double()
    with torch.no_grad():
        net.reduce.weight.zero_()
        net.reduce.weight[:, block * D:(block + 1) * D] = torch.eye(D)
    return net


def test_the_fused_states_reach_the_drafter_at_their_positions_and_another_layer_differs():
    """Reading back the normed output's block, each first draft is the target's greedy token one
    position stale (AR's token at n - 1), so every position's fused states arrived where they
    belong. The control reads back layer 1's input instead, not what the head reads: its drafts
    differ."""
    target = HFCausalLM(tiny_hf("llama", seed=3))
    prefix = torch.tensor([[3, 5, 7, 9]])
    ar, _ = decode(target, prefix, 16, GREEDY)

    def first_drafts(block):
        drafter = FeatureDrafter(read_back(target, block), target, prefix)
        seen, real = [], drafter.propose

        def propose(tokens, n, k, generator=None):
            drafts, q = real(tokens, n, k, generator)
            seen.append((int(n[0]), int(drafts[0, 0])))
            return drafts, q
        drafter.propose = propose
        out, _ = decode(target, prefix, 16, GREEDY, drafter=drafter, window=2)
        assert torch.equal(out, ar)  # lossless either way
        return [d == int(ar[0, n - 1]) for n, d in seen if n >= 2]

    stale = first_drafts(2)
    assert stale and all(stale)
    assert not all(first_drafts(1))


def test_fused_feature_drafts_are_lossless():
    """20,000 sequences of 4 tokens at temperature 0.8, top-k 3, window 3, batches of 64 rows;
    chi-square against the exact law (bound from the sample size). The control reports a uniform
    law for the same drafts and must fail."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    net = fusing_net(target, seed=3)
    sampling = SamplingConfig(temperature=0.8, top_k=3)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)

    def drawn(cls):
        return sample_sequences(target, prompt_prefix, N, sampling, 20000, batch=64, window=3,
                                drafter_factory=lambda rows: cls(net, target, prompt_prefix(rows)))
    fit = chi_square_fit(drawn(FeatureDrafter), seqs, probs)
    assert fit.passed, fit
    assert not chi_square_fit(drawn(reporting_uniform_law(FeatureDrafter)), seqs, probs).passed


@pytest.mark.parametrize("compiled", [False, True])
def test_the_shapes_gpt_fuses_its_hidden_states_for_a_drafter_under_guidance(compiled):
    """LlamaGen's GPT returns the named hidden states too: in its decode (eager and compiled) as in
    its teacher-forced forward (what training reads), the head's input at index n_layer; a fusing
    drafter on [cond; uncond] rows gives AR's greedy output."""
    target, labels, sampling, ar = guided_llamagen_ar(compiled, features=LAYERS)
    with torch.no_grad():
        _, last = target.prefill(labels, 16, features=True)
        _, fused = target.prefill(labels, 16, features=LAYERS)
        tokens = ar[:2, :5]
        taught = target(labels[:2], tokens, features=LAYERS)  # row c: the states that predict token c
    D = target.config.dim
    torch.testing.assert_close(fused[..., 2 * D:], last)
    torch.testing.assert_close(fused[..., :D], target.embed_condition(labels))
    torch.testing.assert_close(taught[:, 0], fused[:2, -1])
    torch.testing.assert_close(taught[..., 2 * D:], target(labels[:2], tokens, features=True))
    net = fusing_net(target)
    out, _ = decode(target, labels, 16, sampling, drafter=FeatureDrafter(net, target), window=3)
    assert torch.equal(out, ar)


def test_generate_text_takes_a_fusing_drafter_compiled(tokenizer):
    from conftest import generate_reference
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    net = fusing_net(HFCausalLM(model))
    # copying first: the lookup drafter passes the fusing drafter's request on; rows that match
    # nothing draft with the fusing drafter, on the compiled step's fused states
    out = generate_text(model, tokenizer, ["w1 w2 w3", "w4"], drafter=net, window=4, max_new_tokens=10,
                        temperature=0, compile=True, lookup=2)
    assert out.stats.mode.endswith("+compiled") and out.stats.draft_forwards > 0, out.stats
    for prompt, ids in zip(["w1 w2 w3", "w4"], out.token_ids):
        assert ids == generate_reference(model, tokenizer, prompt, 10)[:len(ids)]


def test_what_a_fusing_drafter_cannot_read_is_refused():
    with pytest.raises(ValueError, match="feature_layers must be distinct hidden-state indices"):
        FeatureDraftModel(feature_size=32, feature_layers=[1, 1])
    model = tiny_hf("llama")
    with pytest.raises(ValueError, match="reads hidden state 5, but the target has 3"):
        check_target(FeatureDraftModel(feature_size=32, feature_layers=[0, 5]), model, 32)
    with pytest.raises(ValueError, match="Linear returns only the features its head reads"):
        check_target(FeatureDraftModel(feature_size=32, feature_layers=[0, 1]), torch.nn.Linear(2, 2), 32)
    target = HFCausalLM(model)
    prefix = torch.tensor([[3, 5]])
    judge = JudgeRule(lambda f, d, p: torch.zeros(d.shape), 1.0)
    with pytest.raises(ValueError, match=r"reads the target's hidden states \(0, 1, 2\) and JudgeRule its last"):
        decode(target, prefix, 4, GREEDY, drafter=FeatureDrafter(fusing_net(target), target, prefix), window=3,
               rule=judge)
