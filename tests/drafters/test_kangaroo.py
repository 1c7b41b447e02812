"""Kangaroo (double early exit): the draft model is the target's own first layers plus a trained
adapter, run as a draft model by the one engine. Greedy output equals ``generate`` on ragged rows
(eager and compiled, fixed and auto windows); sampled drafts keep decoding lossless (chi-square
against the exact law, with a control that must fail); the shallow layers are the target's modules
and get no gradient; an adapter for another target and a threshold outside [0, 1] are named."""

import json

import pytest
import torch

from conftest import generate_reference, tiny_hf
from drafters.harness import N, V, prompt_prefix, reporting_uniform_law
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import DraftModelDrafter
from visualspec.models.hf import HFCausalLM
from visualspec.models.kangaroo import KangarooAdapter, is_kangaroo_folder, kangaroo_lm, load_kangaroo
from visualspec.text import generate_text
from visualspec.training.kangaroo import kangaroo_losses


def adapter_for(target, exit_layer=1, seed=0, stop_below=0.6, std=0.3):
    """An adapter for ``target`` with random weights (a drafter that differs from the target)."""
    torch.manual_seed(seed)
    adapter = KangarooAdapter.for_target(target, exit_layer, stop_below)
    for p in adapter.parameters():
        torch.nn.init.normal_(p, std=std)
    return adapter.eval()


def saved(adapter, folder):
    adapter.save_pretrained(folder)
    return str(folder)


def test_the_draft_runs_the_targets_own_first_layers_and_only_the_adapter_learns():
    target = tiny_hf("llama", vocab_size=V)
    shared = {name: p.clone() for name, p in target.named_parameters()}
    adapter = adapter_for(target).train()
    lm = kangaroo_lm(adapter, target)
    base = lm.model
    assert base.embed_tokens is target.model.embed_tokens and lm.lm_head is target.lm_head
    assert base.layers[0] is target.model.layers[0] and len(base.layers) == 2
    assert base.layers[1] is adapter.layer and base.norm is adapter.norm
    # no copy: every parameter of the draft is the target's tensor or the adapter's
    own = {id(p) for p in [*target.parameters(), *adapter.parameters()]}
    assert all(id(p) in own for p in lm.parameters())
    expected = {id(p): p for p in [*adapter.parameters(), *target.model.layers[0].parameters(),
                                   target.model.embed_tokens.weight, target.lm_head.weight]}
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in expected.values())
    target.requires_grad_(False)
    x = torch.tensor([[0, 2, 1, 3, 2]])
    with torch.no_grad():
        p = target(input_ids=x).logits
    losses = kangaroo_losses(lm(input_ids=x).logits, p)
    losses["loss"].backward()
    assert all(q.grad is not None for q in adapter.parameters())
    assert all(q.grad is None for q in target.parameters())
    assert all(torch.equal(q, shared[name]) for name, q in target.named_parameters())
    assert 0 < losses["accept"] <= 1 and losses["kl"] >= 0


def test_the_draft_is_the_adapter_on_the_targets_layer_e_states():
    """q = head(norm_out(h_E + attention(norm_in(h_E)))), h_E the target's layer-E output."""
    target = tiny_hf("llama", vocab_size=V)
    adapter = adapter_for(target)
    lm = kangaroo_lm(adapter, target)
    x = torch.tensor([[0, 2, 1, 3, 2]])
    with torch.no_grad():
        h = target(input_ids=x, output_hidden_states=True).hidden_states[1]
        positions = torch.arange(5)[None]
        rope = target.model.rotary_emb(h, positions)
        mask = torch.full((5, 5), torch.finfo(h.dtype).min, dtype=h.dtype).triu(1)[None, None]
        layer = adapter.layer
        a = h + layer.self_attn(layer.input_layernorm(h), position_embeddings=rope, attention_mask=mask)[0]
        torch.testing.assert_close(lm(input_ids=x).logits, target.lm_head(adapter.norm(a)))


ROWS = ["w1 w2 w3 w4", "w5"]  # a ragged batch: the second row is left-padded


@pytest.mark.parametrize("compile,window", [(False, 4), (True, 4), (False, "auto")])
def test_greedy_output_equals_generate_on_ragged_rows(tokenizer, tmp_path, compile, window):
    model = tiny_hf("llama", vocab_size=64)
    folder = saved(adapter_for(model, stop_below=0.3), tmp_path / "kangaroo")
    n = 10 if window != "auto" else 6  # the auto window times a decode at each window up to n first
    out = generate_text(model, tokenizer, ROWS, drafter=folder, window=window, max_new_tokens=n, temperature=0,
                        compile=compile)
    mode = "kangaroo" + ("+compiled" if compile else "")  # auto may find no window beating plain AR here
    assert out.stats.mode in ((mode,) if window != "auto" else (mode, mode + " as AR"))
    for prompt, ids in zip(ROWS, out.token_ids):
        assert ids == generate_reference(model, tokenizer, prompt, n)[:len(ids)]
    if window != "auto":
        assert out.stats.target_forwards < n * len(ROWS)


def test_a_folder_loads_once_per_target(tmp_path):
    model = tiny_hf("llama", vocab_size=64)
    folder = saved(adapter_for(model), tmp_path / "kangaroo")
    assert is_kangaroo_folder(folder) and not is_kangaroo_folder(tmp_path)
    assert load_kangaroo(folder, model) is load_kangaroo(folder, model)


def test_the_folders_threshold_is_the_default_exit_and_draft_stop_below_overrides(tokenizer, tmp_path, monkeypatch):
    import visualspec.text.generate as text

    made = []

    class Spy(DraftModelDrafter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.stop_below)

    monkeypatch.setattr(text, "DraftModelDrafter", Spy)
    model = tiny_hf("llama", vocab_size=64)
    folder = saved(adapter_for(model, stop_below=0.35), tmp_path / "kangaroo")
    generate_text(model, tokenizer, "w1 w2", drafter=folder, window=4, max_new_tokens=4, temperature=0)
    generate_text(model, tokenizer, "w1 w2", drafter=folder, window=4, max_new_tokens=4, temperature=0,
                  draft_stop_below=0.0)
    assert made == [0.35, 0.0]


def test_a_threshold_outside_0_1_is_refused(tokenizer, tmp_path):
    model = tiny_hf("llama", vocab_size=64)
    with pytest.raises(ValueError, match=r"stop_below must be a probability in \[0, 1\], got 1.5"):
        KangarooAdapter.for_target(model, 1, stop_below=1.5)
    folder = saved(adapter_for(model), tmp_path / "kangaroo")
    with pytest.raises(ValueError, match=r"stop_below must be a probability in \[0, 1\] or None, got -0.1"):
        generate_text(model, tokenizer, "w1", drafter=folder, window=3, max_new_tokens=4, draft_stop_below=-0.1)
    config = json.loads((tmp_path / "kangaroo" / "config.json").read_text())
    (tmp_path / "kangaroo" / "config.json").write_text(json.dumps({**config, "stop_below": 2.0}))
    with pytest.raises(ValueError, match=r"stop_below must be a probability in \[0, 1\], got 2.0"):
        generate_text(model, tokenizer, "w1", drafter=folder, window=3, max_new_tokens=4)
    assert torch.get_default_dtype() == torch.float32  # the failed load of a float64 adapter left it as it was


def test_an_adapter_for_another_target_is_refused(tokenizer, tmp_path):
    model, other = tiny_hf("llama", vocab_size=64), tiny_hf("llama", seed=5, vocab_size=64)
    folder = saved(adapter_for(model), tmp_path / "kangaroo")
    ours, theirs = KangarooAdapter.from_pretrained(folder).config.target_hash, None
    from visualspec.models.feature_drafter import weights_hash

    theirs = weights_hash(other)
    with pytest.raises(ValueError, match=f"hash to {ours}; this target's hash to {theirs}"):
        generate_text(other, tokenizer, "w1", drafter=folder, window=3, max_new_tokens=4)
    with pytest.raises(ValueError, match=f"hash to {ours}; this target's hash to {theirs}"):
        load_kangaroo(folder, other)
    lm = load_kangaroo(folder, model)  # a built draft model handed to another target
    with pytest.raises(ValueError, match=f"hash to {ours}; this target's hash to {theirs}"):
        generate_text(other, tokenizer, "w1", drafter=lm, window=3, max_new_tokens=4)
    with pytest.raises(ValueError, match="exit_layer must be between 1 and 1"):
        KangarooAdapter.for_target(model, 2)
    with pytest.raises(ValueError, match="Kangaroo builds on a transformers Llama"):
        kangaroo_lm(adapter_for(model), tiny_hf("gpt2", vocab_size=64))


V_SEQ = {"temperature": 0.8, "top_k": 3}


def test_kangaroo_drafts_are_lossless():
    """4,000 sequences of 4 tokens in batches of 2,000 rows, window 3, the second exit on (drafting
    stops once every row's latest draft has draft probability below 0.7, as it does at some steps);
    chi-square against the exact law, bound from the sample size. The
    control draws the same drafts but reports a uniform law for them: the rule then accepts and
    resamples against the wrong q, and the fit must fail."""
    model = tiny_hf("llama", vocab_size=V)
    target = HFCausalLM(model)
    draft = kangaroo_lm(adapter_for(model, seed=3, std=0.5), model)

    WrongLaw = reporting_uniform_law(DraftModelDrafter)

    sampling = SamplingConfig(**V_SEQ)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)
    stopped = []

    class Exits(DraftModelDrafter):
        def propose(self, tokens, n, k, generator=None):
            drafts, q = super().propose(tokens, n, k, generator)
            stopped.append(drafts.shape[1] < k)
            return drafts, q

    drawn = sample_sequences(target, prompt_prefix, N, sampling, 4000, batch=2000, window=3,
                             drafter_factory=lambda rows: Exits(HFCausalLM(draft), prompt_prefix(rows), stop_below=0.7))
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    assert any(stopped)  # the second exit took some steps' drafts short
    control = sample_sequences(target, prompt_prefix, N, sampling, 4000, batch=2000, window=3,
                               drafter_factory=lambda rows: WrongLaw(HFCausalLM(draft), prompt_prefix(rows)))
    assert not chi_square_fit(control, seqs, probs).passed
