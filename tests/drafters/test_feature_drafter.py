"""Features through the engine and the EAGLE-style feature drafter (#50): the target returns the
hidden states its head reads, the drafter gets them at the right positions (greedy output equal to
AR on ragged rows, with and without continuous batching, eager and static), and the drafts it
samples keep decoding lossless (chi-square against the exact law, with a control that must fail)."""

import pytest
import torch

from conftest import assert_guards_checked_once_a_decode, tiny_hf
from drafters.harness import (N, V, NoFeatures, copying_net, drafter_net, guided_llamagen_ar, prompt_prefix,
                             queued_greedy_ar, ragged_greedy_ar, ragged_prompts, reporting_uniform_law)
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import ChimeraDrafter, FeatureDrafter
from visualspec.models.chimera import ChimeraDraftModel
from visualspec.models.feature_drafter import FeatureDraftModel
from visualspec.models.hf import HFCausalLM


@pytest.mark.parametrize("static", [False, True])
def test_features_are_what_the_head_reads_and_change_no_logit(static):
    target = HFCausalLM(tiny_hf("llama"), static=static)
    prompt = torch.tensor([[3, 5, 7, 9]])
    plain = target.prefill(prompt, 8)
    window = torch.tensor([[11, 12, 13]])
    expected = target.forward_window(window, 0)
    logits, features = target.prefill(prompt, 8, features=True)
    assert features.shape == (1, 4, target.feature_size)
    torch.testing.assert_close(logits, plain)
    torch.testing.assert_close(target.head(features[:, -1:])[:, 0], plain)
    got, features = target.forward_window(window, 0, features=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(target.head(features), expected)


@pytest.mark.parametrize("static", [False, True])
def test_greedy_output_equals_ar_on_ragged_rows(static):
    target, prefix, ar = ragged_greedy_ar(static)
    drafter = FeatureDrafter(drafter_net(target), target, prefix)
    out, stats = decode(target, prefix, 12, SamplingConfig(temperature=0.0), drafter=drafter, window=4)
    assert torch.equal(out, ar)
    assert stats.target_forwards < 12 * 3 and drafter.forwards > 0


@pytest.mark.parametrize("kind", ["eagle", "chimera"])
def test_greedy_output_equals_ar_with_continuous_batching(kind):
    target, requests, prompts, ar = queued_greedy_ar()
    net = drafter_net(target) if kind == "eagle" else drafter_net(target, cls=ChimeraDraftModel, heads=3)
    drafter = FeatureDrafter.for_model(net, target, prompts)
    assert isinstance(drafter, ChimeraDrafter) == (kind == "chimera")
    out, _ = decode(target, requests, 10, SamplingConfig(temperature=0.0), drafter=drafter,
                    window=3 if kind == "eagle" else 4)
    assert torch.equal(out, ar)


def test_the_drafter_gets_each_positions_own_features_and_a_shifted_control_fails():
    """The features reach the drafter at their positions: a drafter network that returns its input
    feature drafts exactly the target's own prediction of the position before (a stale Jacobi
    draft). The control hands it each window's features one position off: its drafts then differ."""
    target = HFCausalLM(tiny_hf("llama", seed=3))  # a greedy path of varied tokens
    net = copying_net(target)
    prefix = torch.tensor([[3, 5, 7, 9]])
    greedy = SamplingConfig(temperature=0.0)
    ar, _ = decode(target, prefix, 16, greedy)
    drafter = FeatureDrafter(net, target, prefix)
    drafts = []
    real = drafter.propose
    drafter.propose = lambda tokens, n, k, g=None: drafts.append((n.clone(), real(tokens, n, k, g)[0])) or drafts[-1][1:] + (None,)
    decode(target, prefix, 16, greedy, drafter=drafter, window=2)
    # the draft for position n is the target's greedy token after x_{n-2}: the token at n-1 (AR's)
    stale = [int(d[0, 0]) == int(ar[0, int(n[0]) - 1]) for n, d in drafts if int(n[0]) >= 2]
    assert stale and all(stale)

    class Shifted(FeatureDrafter):  # the control: each window's features one position off (early)
        def observe(self, n, committed, target_probs, generator=None, features=None):
            super().observe(n, committed, target_probs, generator, torch.cat([features[:, 1:], features[:, -1:]], 1))

    drafts.clear()
    shifted = Shifted(net, target, prefix)
    real = shifted.propose
    shifted.propose = lambda tokens, n, k, g=None: drafts.append((n.clone(), real(tokens, n, k, g)[0])) or drafts[-1][1:] + (None,)
    out, _ = decode(target, prefix, 16, greedy, drafter=shifted, window=2)
    assert torch.equal(out, ar)  # still lossless
    stale = [int(d[0, 0]) == int(ar[0, int(n[0]) - 1]) for n, d in drafts if int(n[0]) >= 2]
    assert not all(stale)


V_SEQ = dict(temperature=0.8, top_k=3)


def test_feature_drafts_are_lossless():
    """20,000 sequences of 4 tokens in batches of 64 rows, window 3; chi-square against the exact
    law, bound from the sample size. The control draws the same drafts but reports a uniform law
    for them: the rule then accepts and resamples against the wrong q, and the fit must fail."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    net = drafter_net(target, seed=3)

    WrongLaw = reporting_uniform_law(FeatureDrafter)

    sampling = SamplingConfig(**V_SEQ)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)
    drawn = sample_sequences(target, prompt_prefix, N, sampling, 20000, batch=64, window=3,
                             drafter_factory=lambda rows: FeatureDrafter(net, target, prompt_prefix(rows)))
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    control = sample_sequences(target, prompt_prefix, N, sampling, 20000, batch=64, window=3,
                               drafter_factory=lambda rows: WrongLaw(net, target, prompt_prefix(rows)))
    assert not chi_square_fit(control, seqs, probs).passed


def test_a_draft_vocabulary_keeps_drafts_lossless():
    """FR-Spec: drafts from the head's kept rows only (tokens 1 and 3 of 4). 8,000 sequences fit the
    exact law; the control draws the same kept-only drafts but reports the untrimmed head's law
    for them (a drafter that forgot its trim), and the fit must fail."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    net, keep = drafter_net(target, seed=3), [1, 3]

    class ForgotTrim(FeatureDrafter):
        def _draw(self, features, generator):
            drafts, _ = super()._draw(features, generator)
            return drafts, self.sampling.probs(self.target.head(features[:, None].to(self.real.dtype))[:, 0])

    sampling = SamplingConfig(**V_SEQ)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)
    drafted = []

    class Kept(FeatureDrafter):
        def propose(self, tokens, n, k, generator=None):
            drafts, q = super().propose(tokens, n, k, generator)
            drafted.append((drafts, q))
            return drafts, q

    drawn = sample_sequences(target, prompt_prefix, N, sampling, 8000, batch=128, window=3,
                             drafter_factory=lambda rows: Kept(net, target, prompt_prefix(rows), keep=keep))
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    drafts = torch.cat([d.flatten() for d, _ in drafted])
    q = torch.cat([q.flatten(0, 1) for _, q in drafted])
    assert set(drafts.tolist()) == {1, 3} and float(q[:, [0, 2]].abs().max()) == 0.0
    control = sample_sequences(target, prompt_prefix, N, sampling, 8000, batch=128, window=3,
                               drafter_factory=lambda rows: ForgotTrim(net, target, prompt_prefix(rows), keep=keep))
    bad = chi_square_fit(control, seqs, probs)
    assert not bad.passed, bad


def test_a_draft_vocabulary_is_checked():
    from conftest import tiny_llamagen

    target = HFCausalLM(tiny_hf("llama"))
    with pytest.raises(ValueError, match="vocab"):
        FeatureDrafter(drafter_net(target), target, keep=[3, 64])
    trimmed = HFCausalLM(tiny_hf("llama"), head_rows=[1, 2])
    with pytest.raises(ValueError, match="trimmed already"):
        FeatureDrafter(drafter_net(target), trimmed, keep=[3])

    class NoKeptHead:
        vocab_size = 16

    with pytest.raises(ValueError, match="kept_head"):
        FeatureDrafter(drafter_net(target), NoKeptHead(), keep=[3])
    image = tiny_llamagen(vocab_size=16)
    features = torch.randn(2, 32, dtype=torch.float64)
    torch.testing.assert_close(image.kept_head(torch.tensor([2, 9]))(features), image.head(features)[:, [2, 9]])


def test_a_target_without_features_is_named():
    net = drafter_net(HFCausalLM(tiny_hf("llama")))
    with pytest.raises(TypeError, match="reads the target's features, but NoFeatures cannot return them"):
        decode(NoFeatures(), torch.tensor([0]), 4, SamplingConfig(), drafter=FeatureDrafter(net, None), window=2)


def test_generate_text_loads_a_feature_drafter_folder(tokenizer, tmp_path):
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    drafter_net(HFCausalLM(model)).save_pretrained(tmp_path / "drafter")
    out = generate_text(model, tokenizer, "w1 w2", drafter=str(tmp_path / "drafter"), window=3, max_new_tokens=6,
                        temperature=0)
    assert out.stats.mode == "feature drafter"
    with pytest.raises(ValueError, match="unknown drafter 'eagle'.*a feature drafter folder"):
        generate_text(model, tokenizer, "w1", drafter="eagle", max_new_tokens=4)


def test_proactive_trees_refuse_a_feature_drafter():
    target = HFCausalLM(tiny_hf("llama"))
    prefix = torch.tensor([[3, 5]])
    with pytest.raises(ValueError, match="reads the target's features.*siblings=1"):
        decode(target, prefix, 4, SamplingConfig(), drafter=FeatureDrafter(drafter_net(target), target, prefix),
               window=3, siblings=2)


@pytest.mark.parametrize("compile,draft_vocab", [(False, None), (True, None), (False, 16)])
def test_generate_text_takes_a_feature_drafter(compile, draft_vocab, tokenizer):
    from conftest import generate_reference
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    net = drafter_net(HFCausalLM(model))
    out = generate_text(model, tokenizer, ["w1 w2 w3", "w4"], drafter=net, window=4, max_new_tokens=10,
                        temperature=0, compile=compile, draft_vocab=draft_vocab)
    assert out.stats.mode == "feature drafter" + ("+compiled" if compile else "")
    for prompt, ids in zip(["w1 w2 w3", "w4"], out.token_ids):
        assert ids == generate_reference(model, tokenizer, prompt, 10)[:len(ids)]


def test_a_feature_drafter_for_another_target_is_refused(tokenizer):
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    net = FeatureDraftModel(feature_size=32, n_head=4, ffn_hidden=64, max_len=128, target_hash="0123456789abcdef")
    with pytest.raises(ValueError, match="trained against a target whose weights hash to 0123456789abcdef"):
        generate_text(model, tokenizer, "w1", drafter=net, max_new_tokens=4)
    wide = FeatureDraftModel(feature_size=64, n_head=4, ffn_hidden=64, max_len=128)
    with pytest.raises(ValueError, match="features of width 64, but the target's are 32 wide"):
        generate_text(model, tokenizer, "w1", drafter=wide, max_new_tokens=4)
    with pytest.raises(ValueError, match="draft tree .* needs a draft model"):
        generate_text(model, tokenizer, "w1", drafter=wide, branches=2, max_new_tokens=4)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_image_model_feeds_a_feature_drafter_under_guidance(compiled):
    """LlamaGen's GPT returns its features too (eager and compiled); the drafter starts from the
    condition's last feature (an image prefix is not tokens), on [cond; uncond] model rows; greedy
    output equals AR's."""
    target, labels, sampling, ar = guided_llamagen_ar(compiled)
    with torch.no_grad():
        logits, features = target.prefill(labels, 16, features=True)
    torch.testing.assert_close(target.head(features[:, -1]), logits)
    net = drafter_net(target)
    out, _ = decode(target, labels, 16, sampling, drafter=FeatureDrafter(net, target), window=3)
    assert torch.equal(out, ar)


@torch.no_grad()
def test_the_drafter_step_checks_its_guards_once_a_decode():
    """As the targets' compiled steps do: after a reset (a decode's start) each compiled bucket's
    first call checks torch's guards and the later calls skip them, and a change its bucket key
    does not name (the fusion weight's layout) is caught at the first call after the next reset."""
    target = HFCausalLM(tiny_hf("llama"))
    net = drafter_net(target)
    net.compile_step()
    rows, columns = 2, 16
    net.precompile(rows, columns, [1])
    pair = torch.zeros(rows, 1, target.feature_size, dtype=torch.float64)
    assert_guards_checked_once_a_decode(lambda: net.reset(rows, columns),
                                        lambda position: net.step(pair, pair, torch.full((rows, 1), position)), net.fc)


def test_a_decode_whose_window_policy_prices_the_drafts_equals_ar():
    """The feature drafter's timer makes real proposals (its forwards counted) on a fresh state;
    a decode after it, with the window chosen each step from those priced tables, is still AR's
    greedy output."""
    from visualspec.core.window import WindowPolicy
    from visualspec.core.window_costs import drafted_step, measure_window_costs

    target = HFCausalLM(tiny_hf("llama"), static=True)
    prefix = ragged_prompts()
    greedy = SamplingConfig(temperature=0.0)
    drafter = FeatureDrafter(drafter_net(target), target, prefix)
    timer = drafter.draft_timer(3, 16, greedy)
    before = drafter.forwards
    timer(8, 3)
    assert drafter.forwards - before == 3  # the catch-up, then two one-pair steps
    costs = measure_window_costs(target, prefix, 16, windows=(1, 2, 4), repeats=1,
                                 forward=drafted_step(target, lambda: timer, features=True))
    assert sorted(costs) == [1, 2, 4] and all(c > 0 for c in costs.values())
    ar, _ = decode(target, prefix, 16, greedy)
    out, _ = decode(target, prefix, 16, greedy, drafter=drafter, window=WindowPolicy({6: {1: 1.0, 2: 1.0, 4: 1.0}}))
    assert torch.equal(out, ar)


def test_a_targets_hash_is_kept_until_its_weights_change(monkeypatch):
    import visualspec.models.feature_drafter as fd

    model, hashed = tiny_hf("llama"), []
    sha256 = fd.hashlib.sha256
    monkeypatch.setattr(fd.hashlib, "sha256", lambda *a: hashed.append(1) or sha256(*a))
    first = fd.weights_hash(model)
    assert fd.weights_hash(model) == first and len(hashed) == 1  # checked again: not hashed again
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # as an optimizer step or load_state_dict changes it
    assert fd.weights_hash(model) != first and len(hashed) == 2
    model.load_state_dict(tiny_hf("llama").state_dict())
    assert fd.weights_hash(model) == first and len(hashed) == 3


@pytest.mark.parametrize("draft_vocab", [None, 16])
def test_greedy_compiled_proposals_run_as_one_chain(draft_vocab, tokenizer, monkeypatch):
    """Greedy and compiled, each proposal of k = 3 drafts is one call of the drafter's compiled
    chain (compiled before the decode; with FR-Spec's kept head too), with the tokens, drafter
    forwards and accepted lengths of the draft-by-draft loop (the control: the chain turned off);
    sampled, the loop drafts."""
    from visualspec.text import generate_text

    model = tiny_hf("llama", vocab_size=64)
    net = drafter_net(HFCausalLM(model))
    calls, chain = [], FeatureDraftModel.greedy_chain
    monkeypatch.setattr(FeatureDraftModel, "greedy_chain",
                        lambda self, *a, **kw: calls.append(a[2]) or chain(self, *a, **kw))

    def run(**kw):
        return generate_text(model, tokenizer, "w1 w2 w3", drafter=net, window=4, max_new_tokens=12, compile=True,
                             draft_vocab=draft_vocab, **{"temperature": 0, **kw})

    out = run()
    assert calls and set(calls) == {3}
    assert [key[2] for c in net._chains.values() for key in c.compile_s] == [3]  # compiled before, not eager
    chain_modules = FeatureDrafter.chain_modules
    monkeypatch.setattr(FeatureDrafter, "chain_modules", lambda self, k, sampling=None: None)
    loop = run()
    assert loop.token_ids == out.token_ids and loop.stats.draft_forwards == out.stats.draft_forwards
    assert loop.stats.accepted_lengths == out.stats.accepted_lengths  # the same drafts, accepted alike
    monkeypatch.setattr(FeatureDrafter, "chain_modules", chain_modules)
    calls.clear()
    run(temperature=0.8, seed=1)
    assert calls == []
    run()
    assert set(calls) == {3}  # the spy still counts (the control of the sampled call)


@torch.no_grad()
def test_a_greedy_chain_drafts_what_drawing_and_stepping_one_at_a_time_does():
    """The compiled chain's k drafts equal the argmax of the head, then a step at the next column,
    done one at a time eagerly from the same cache (drafts that vary, so a wrong token would show),
    and it leaves the cache the loop leaves (a wrong column would show)."""
    target = HFCausalLM(tiny_hf("llama"))
    net = drafter_net(target)
    net.compile_step()
    head, embedding = target.chain_modules()
    rows, columns, k = 2, 16, 4
    pairs = torch.randn(rows, 4, target.feature_size, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1))
    start = torch.tensor([4, 4])

    def prefilled():
        net.reset(rows, columns)
        return net.step(pairs, pairs, torch.arange(4).expand(rows, 4), compiled=False)[:, -1]

    chain = net.greedy_chain(prefilled(), start, k, head, embedding, torch.float64, compile_new=True)
    chain_cache = [c.clone() for c in net._cache]
    g, loop = prefilled(), []
    for j in range(k):
        loop.append(target.head(g[:, None])[:, 0].argmax(-1))
        if j + 1 < k:
            g = net.step(target.embed_tokens(loop[-1][:, None]), g[:, None], (start + j)[:, None], compiled=False)[:, 0]
    assert torch.equal(chain, torch.stack(loop, 1)) and len(set(chain.flatten().tolist())) > 2
    # the cache written where the loop writes it
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(chain_cache, net._cache))
    assert [key[2] for c in net._chains.values() for key in c.compile_s] == [k]
    with pytest.raises(ValueError, match="1 to 15 drafts"):
        net.greedy_chain(g, start, 16, head, embedding, torch.float64)


def test_the_chains_kept_head_is_fr_specs_head_over_the_whole_vocabulary():
    """The module a chain calls for FR-Spec: the kept rows' logits at their ids, -inf elsewhere
    (what the draft-by-draft path draws from), made once per model and set of ids."""
    from visualspec.drafters.draft_model import full_vocabulary

    target = HFCausalLM(tiny_hf("llama", vocab_size=64))
    keep = torch.tensor([3, 9, 17, 40])
    head, _ = target.chain_modules(keep)
    x = torch.randn(2, 1, target.feature_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(head(x).float(), full_vocabulary(target.kept_head(keep)(x), keep, 64))
    assert HFCausalLM(target.model).chain_modules(keep)[0] is head
    assert target.chain_modules()[0] is target.model.get_output_embeddings()

    class OwnHead(HFCausalLM):  # an adapter with a head of its own (as Janus's generation head)
        def head(self, features):
            return super().head(features)

    assert OwnHead(target.model).chain_modules() is None  # it drafts one at a time, through its head
