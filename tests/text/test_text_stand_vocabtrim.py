"""STAND stochastic n-gram drafting and VocabTrim draft vocabularies: greedy equality with
transformers' generate, losslessness under sampling (exact enumeration vs chi-square, with controls
that must fail), VocabTrim's support, the STAND memory, its tree drafts (sampling only: the tree
decoder is tested elsewhere), and clear errors."""

import pytest
import torch

from conftest import TEXT_PROMPTS, generate_reference, tiny_hf, tiny_llamagen
from drafters.harness import FILTERED, PLAIN, PROMPT, SAMPLES, STAND_PROMPT, N, V
from drafters.harness import llama4  # noqa: F401 (a fixture, used by name)
from visualspec.drafters import StandDrafter, VocabTrimDrafter, frequent_tokens, kept_token_ids
from visualspec.models.hf import HFCausalLM
from visualspec.core.multidraft import rsd_verify
from visualspec.core.sampling import SamplingConfig
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.text import generate_text

PROMPTS = TEXT_PROMPTS

gen = None  # the randomness of drafter calls in tests that set none


# ----------------------------------------------------------------------------------------------
# greedy equality through generate_text
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["stand", "vocabtrim-ids", "vocabtrim-int"])
def test_greedy_output_equals_generate(family, mode, tokenizer):
    model = tiny_hf(family, vocab_size=64)
    if mode == "stand":
        kwargs = dict(drafter="stand", ngram=2)
    else:
        kwargs = dict(drafter=tiny_hf(family, seed=1, vocab_size=64),
                      draft_vocab=[1, 5, 9, 12, 33, 40] if mode == "vocabtrim-ids" else 12)
    out = generate_text(model, tokenizer, PROMPTS, max_new_tokens=20, temperature=0, window=5, **kwargs)
    for prompt, ids in zip(PROMPTS, out.token_ids):
        ref = generate_reference(model, tokenizer, prompt, 20)
        assert ids == ref[: len(ids)] and (len(ids) == 20 or ids[-1] == tokenizer.eos_token_id)
    assert out.stats.num_tokens == 20 and out.stats.target_forwards <= 20
    assert out.stats.mode == ("stand" if mode == "stand" else "vocabtrim")


def test_sampled_stand_text_is_seeded(tokenizer):
    model = tiny_hf("llama", vocab_size=64)
    a = generate_text(model, tokenizer, PROMPTS[0], drafter="stand", max_new_tokens=16, seed=5, temperature=0.5)
    b = generate_text(model, tokenizer, PROMPTS[0], drafter="stand", max_new_tokens=16, seed=5, temperature=0.5)
    assert a.token_ids == b.token_ids and isinstance(a.text, str)


# ----------------------------------------------------------------------------------------------
# losslessness under sampling: the harness of visualspec.core.lossless on a tiny transformers Llama
# ----------------------------------------------------------------------------------------------


def prompt_rows(rows, prompt=PROMPT):
    return torch.tensor([prompt]).expand(rows, len(prompt))


def fit_for(target, sampling, drafter, prompt=PROMPT, samples=SAMPLES, window=3, seed=0):
    """``drafter(rows)`` builds a fresh drafter for a batch of ``rows`` rows."""
    make_prefix = lambda rows: prompt_rows(rows, prompt)  # noqa: E731
    seqs, probs = exact_sequence_distribution(target, make_prefix, N, sampling)
    drawn = sample_sequences(target, make_prefix, N, sampling, samples, seed=seed, window=window,
                             drafter_factory=drafter)
    return chi_square_fit(drawn, seqs, probs)


class UniformClaimStand(StandDrafter):
    """Control: samples drafts from the table but claims they came from the uniform distribution."""

    def propose(self, tokens, n, k, generator=None):
        drafts, q = super().propose(tokens, n, k, generator)
        return drafts, (None if q is None else torch.full_like(q, 1.0 / q.shape[-1]))


class ForgetsTheTrim(VocabTrimDrafter):
    """Control: samples drafts from the trimmed q but claims the untrimmed draft distribution
    (kept tokens keep their full-vocabulary probabilities, the dropped mass is lost)."""

    def _draft_probs(self, logits):
        self.claims.append(self.sampling.probs(logits) * torch.isin(torch.arange(logits.shape[-1]), self.keep))
        return super()._draft_probs(logits)

    def propose(self, tokens, n, k, generator=None):
        self.claims = []
        drafts, q = super().propose(tokens, n, k, generator)
        return drafts, (torch.stack(self.claims, 1) if self.claims else q)


@pytest.mark.parametrize("sampling, ngram", [(PLAIN, 2), (FILTERED, 1)],
                         ids=["plain-2gram", "temperature-topk-topp-1gram"])
def test_stand_is_lossless(sampling, ngram, llama4):
    target, _ = llama4
    fit = fit_for(target, sampling, lambda rows: StandDrafter([STAND_PROMPT] * rows, V, max_ngram=ngram),
                  prompt=STAND_PROMPT)
    assert fit.passed, fit


@pytest.mark.parametrize("sampling", [PLAIN, FILTERED], ids=["plain", "temperature-topk-topp"])
def test_vocabtrim_is_lossless(sampling, llama4):
    target, draft = llama4
    keep = [0, 1, 3]  # token 2, the draft's favourite, is never drafted
    trimmed = HFCausalLM(draft, head_rows=keep)
    fit = fit_for(target, sampling, lambda rows: VocabTrimDrafter(trimmed, prompt_rows(rows), keep))
    assert fit.passed, fit


@pytest.mark.parametrize("control", ["stand-claims-uniform", "vocabtrim-forgets-the-trim"])
def test_the_harness_catches_a_wrong_draft_distribution(control, llama4):
    target, draft = llama4
    if control == "stand-claims-uniform":
        prompt = STAND_PROMPT
        drafter = lambda rows: UniformClaimStand([prompt] * rows, V, max_ngram=2)  # noqa: E731
    else:
        prompt, full = PROMPT, HFCausalLM(draft)  # the generic path: full logits, kept columns picked here
        drafter = lambda rows: ForgetsTheTrim(full, prompt_rows(rows), [0, 1, 3])  # noqa: E731
    fit = fit_for(target, PLAIN, drafter, prompt=prompt, samples=SAMPLES // 4)  # wrong by far: fewer samples do
    assert not fit.passed, fit


# ----------------------------------------------------------------------------------------------
# VocabTrim: the trimmed head, q's support
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_trimmed_head_logits_equal_the_full_heads_rows(family):
    model = tiny_hf(family, seed=3, vocab_size=64)
    keep = torch.tensor([2, 7, 8, 30, 63])
    full, trimmed = HFCausalLM(model), HFCausalLM(model, head_rows=keep)
    ids = torch.tensor([[4, 5, 6, 7], [9, 9, 10, 11]])
    first = trimmed.prefill(ids, 4)
    assert first.shape == (2, 5) and trimmed.vocab_size == 64
    torch.testing.assert_close(first, full.prefill(ids, 4)[:, keep], rtol=0, atol=1e-9)
    window = torch.tensor([[12, 13], [14, 15]])
    torch.testing.assert_close(trimmed.forward_window(window, 0), full.forward_window(window, 0)[..., keep],
                               rtol=0, atol=1e-9)
    assert HFCausalLM(model).head_rows is None  # the default adapter is unchanged
    for bad in ([], [64], [-1], [[1, 2]], [0.5]):
        with pytest.raises(ValueError, match="head_rows"):
            HFCausalLM(model, head_rows=bad)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=8, top_p=0.9),
                                      SamplingConfig(temperature=0)], ids=["plain", "filtered", "greedy"])
def test_vocabtrim_q_is_zero_outside_the_kept_set_and_drafts_are_kept(sampling):
    draft = tiny_hf("llama", seed=1, vocab_size=64)
    keep = kept_token_ids([3, 9, 17, 18, 40, 41, 50, 63], 64)
    outside = ~torch.isin(torch.arange(64), keep)
    B, k = 256, 4
    prompt = torch.randint(2, 64, (B, 5), generator=torch.Generator().manual_seed(0))
    drafter = VocabTrimDrafter(HFCausalLM(draft, head_rows=keep), prompt, keep)
    drafter.start(B, 8, sampling)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.zeros(B, 8, dtype=torch.long)
    tokens[:, 0] = 5
    drafts, q = drafter.propose(tokens, 1, k, generator=gen)
    assert q.shape == (B, k, 64) and bool(torch.isin(drafts, keep).all())
    assert bool((q[..., outside] == 0).all()) and torch.allclose(q.sum(-1), torch.ones(B, k))
    assert drafter.forwards == 1 + k  # prefill + one forward per draft
    # q is exactly what the full-vocabulary head gives once it is restricted to the kept tokens
    full = HFCausalLM(draft)
    full.prefill(prompt, 8)
    logits = full.forward_window(torch.cat([tokens[:, :1], drafts[:, :-1]], 1), 0)
    restricted = logits.masked_fill(outside, float("-inf"))
    torch.testing.assert_close(q, sampling.probs(restricted), rtol=0, atol=1e-6)


def test_vocabtrim_on_a_token_model_without_a_trimmed_head_and_with_guidance():
    model = tiny_llamagen(seed=0, vocab_size=16, block_size=9)
    keep = [1, 4, 5, 11]
    labels = torch.tensor([1, 2, 3, 3])  # [cond; uncond] for guidance 3 with 2 rows
    drafter = VocabTrimDrafter(model, labels, keep)
    drafter.start(2, 8, SamplingConfig(guidance_scale=3.0, temperature=0.9))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.zeros(2, 8, dtype=torch.long)
    drafts, q = drafter.propose(tokens, 1, 3, generator=gen)
    assert torch.isfinite(q).all() and torch.allclose(q.sum(-1), torch.ones(2, 3))
    outside = [t for t in range(16) if t not in keep]
    assert bool((q[..., outside] == 0).all()) and bool(torch.isin(drafts, torch.tensor(keep)).all())
    with pytest.raises(ValueError, match="head rows"):
        VocabTrimDrafter(HFCausalLM(tiny_hf("llama"), head_rows=[5, 1]), labels, [5, 1])  # not sorted


def test_frequent_tokens_counts_calibration_text():
    texts = [[5, 5, 7, 9, 9, 9], torch.tensor([7, 5, 2]), []]
    assert frequent_tokens(texts, 2).tolist() == [5, 9]  # 5 and 9 three times each, 7 twice
    assert frequent_tokens(texts, 2, always=[1]).tolist() == [1, 5]  # 5 and 9 tie: the smaller id wins
    assert frequent_tokens(texts, 10, always=[1]).tolist() == [1, 2, 5, 7, 9]  # fewer distinct ids than size
    with pytest.raises(ValueError, match="size"):
        frequent_tokens(texts, 0)
    with pytest.raises(ValueError, match="always"):
        frequent_tokens(texts, 1, always=[1, 2])


# ----------------------------------------------------------------------------------------------
# STAND: the memory and its drafts
# ----------------------------------------------------------------------------------------------


def stand(prompts, vocab=6, sampling=PLAIN, seed=0, **kw):
    d = StandDrafter(prompts, vocab, **kw)
    d.start(len(prompts), 16, sampling)
    gen = torch.Generator().manual_seed(seed)
    return d


def test_stand_is_seeded_from_the_prompt_with_point_mass_counts():
    d = stand([[5, 1, 5, 2, 5, 1, 3, 5]], max_ngram=2)
    tokens = torch.tensor([[0, 0]])  # generated token 0 = 0: context (5, 0) is unseen, so is (0)...
    drafts, q = d.propose(tokens, 1, 1, generator=gen)
    assert drafts.tolist() == [[0]] and q[0, 0].tolist() == [1, 0, 0, 0, 0, 0]  # ... repeat the last token
    d = stand([[5, 1, 5, 2, 5, 1, 3, 5]], max_ngram=2)
    # after "5" came 1, 2, 1: q = (1: 2/3, 2: 1/3); after "3 5" nothing yet, after "5" the same
    q = d._dense(d.tables, [[3, 5]], "cpu")[0]
    torch.testing.assert_close(q, torch.tensor([0, 2 / 3, 1 / 3, 0, 0, 0]))
    greedy = stand([[5, 1, 5, 2, 5, 1, 3, 5]], max_ngram=2, sampling=SamplingConfig(temperature=0))
    # generated "1" after "3 5": "5 1" was followed by 5 and 3 (a tie: the smaller id), "1 3" by 5
    drafts, q = greedy.propose(torch.tensor([[1, 0, 0]]), 1, 2, generator=gen)
    assert q is None and drafts.tolist() == [[3, 5]]


def test_stand_learns_the_targets_distribution_from_observe():
    B, d_probs = 20000, torch.tensor([0.1, 0.0, 0.5, 0.0, 0.3, 0.1])
    d = stand([[0, 1, 2]] * B, max_ngram=2, top_m=4)
    tokens = torch.zeros(B, 4, dtype=torch.long)
    tokens[:, 0] = 3
    d.propose(tokens, 1, 1, generator=gen)
    target_probs = torch.zeros(B, 2, 6)
    target_probs[:, 0] = d_probs  # the target's distribution at position 1, after "... 2 3"
    target_probs[:, 1] = torch.tensor([1.0, 0, 0, 0, 0, 0])  # past the committed token: ignored
    d.observe(1, 1, target_probs, generator=gen)
    tokens[:, 1] = 3  # committed "3" again: the draft's context "3 3" falls back to "3" -> d_probs
    drafts, q = d.propose(tokens, 2, 1, generator=gen)
    torch.testing.assert_close(q[:, 0], d_probs.expand(B, 6))
    law = torch.bincount(drafts[:, 0], minlength=6).double() / B
    assert 0.5 * (law - d_probs.double()).abs().sum() < 0.02  # drafts are samples from it
    # top_m truncates: with top_m = 2 only the two heaviest tokens remain, renormalised
    d = stand([[0, 1, 2]], max_ngram=1, top_m=2)
    d.propose(torch.tensor([[3, 0, 0]]), 1, 1, generator=gen)
    d.observe(1, 1, d_probs.expand(1, 2, 6), generator=gen)
    _, q = d.propose(torch.tensor([[3, 3, 0]]), 2, 1, generator=gen)
    torch.testing.assert_close(q[0, 0], torch.tensor([0, 0, 0.625, 0, 0.375, 0]))


def test_stand_memory_stays_within_its_bound_and_evicts_the_least_recently_used():
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 50, (400,), generator=g).tolist()
    d = stand([prompt], vocab=50, max_ngram=3, top_m=3, max_entries=64)
    table = d.tables[0]
    assert len(table) == 64 and all(len(e) <= 3 for e in table.values())
    assert tuple(prompt[-4:-1]) in table and tuple(prompt[:3]) not in table  # the newest stay, the oldest go
    tokens = torch.zeros(1, 40, dtype=torch.long)
    n = 1
    while n < 39:  # a decode loop with the target's (random) distributions
        drafts, _ = d.propose(tokens, n, 3, generator=gen)
        p = torch.softmax(3 * torch.randn(1, 4, 50, generator=g), -1)
        committed = min(2, 39 - n)
        tokens[:, n:n + committed] = drafts[:, :committed]
        d.observe(n, committed, p, generator=gen)
        n += committed
        assert len(table) <= 64 and all(len(e) <= 3 for e in table.values())
    d.propose(tokens, n, 1, generator=gen)
    assert tuple(tokens[0, n - 4:n - 1].tolist()) in table  # the context of the last committed token


def test_stand_tree_draws_distinct_first_tokens_without_replacement():
    B, branches, depth = 40000, 3, 2
    q0 = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    d = stand([[1, 2]] * B, max_ngram=1, top_m=6, seed=3)
    tokens = torch.full((B, 3), 3)
    d.propose(tokens, 1, 0, generator=gen)  # learns "2 -> 3" (the first generated token)
    d.observe(1, 1, q0.expand(B, 2, 6), generator=gen)  # after "3" the target has q0
    tree = d.propose_tree(tokens, 2, branches, depth, generator=gen)  # context "3"
    assert tree.scheme == "without_replacement" and tree.tokens.shape == (B, branches, depth)
    assert tree.chain_q.shape == (B, branches, depth - 1, 6)
    torch.testing.assert_close(tree.first_q, q0.expand(B, 6))
    first = tree.tokens[:, :, 0]
    assert all(len(set(row)) == branches for row in first.tolist())  # distinct first tokens in every row
    assert (q0[first] > 0).all()  # only tokens of positive mass
    law = torch.bincount(first[:, 0], minlength=6).double() / B
    assert 0.5 * (law - q0.double()).abs().sum() < 0.015  # the first draw is a draw from q0
    # the second draw is the second draw without replacement: P(j) = sum_i q_i q_j / (1 - q_i)
    second = sum(q0[i] * q0 / (1 - q0[i]) * (torch.arange(6) != i) for i in range(4))
    law2 = torch.bincount(first[:, 1], minlength=6).double() / B
    assert 0.5 * (law2 - second.double()).abs().sum() < 0.015
    # so the first tokens are what rsd_verify (lossless for draws without replacement) expects
    p = torch.tensor([0.1, 0.1, 0.1, 0.2, 0.3, 0.2])
    emitted = rsd_verify(first, tree.first_q, p.expand(B, 6), torch.Generator().manual_seed(9)).token
    assert 0.5 * (torch.bincount(emitted, minlength=6).double() / B - p.double()).abs().sum() < 0.015
    # each chain continues after its own first token: 1 -> 2 (prompt), 2 -> 3, 0 -> unseen (repeat), 3 -> q0
    chain = tree.tokens[:, :, 1]
    for t, follow in ((0, 0), (1, 2), (2, 3)):
        assert (chain[first == t] == follow).all()
    torch.testing.assert_close(tree.chain_q[:, :, 0][first == 3], q0.expand(int((first == 3).sum()), 6))


def test_stand_tree_with_a_narrow_distribution_and_at_temperature_zero():
    small = stand([[1, 2]], max_ngram=1, seed=4)
    wide = small.propose_tree(torch.tensor([[1, 0]]), 1, 3, 1, generator=gen)  # after "1" only 2 was seen
    first = wide.tokens[0, :, 0].tolist()
    assert first[0] == 2 and len(set(first)) == 3 and wide.first_q[0, first[1:]].tolist() == [0, 0]
    assert wide.chain_q.shape == (1, 3, 0, 6)
    greedy = stand([[1, 2, 1, 3, 1, 2]], max_ngram=1, sampling=SamplingConfig(temperature=0))
    tree = greedy.propose_tree(torch.tensor([[1, 0]]), 1, 2, 2, generator=gen)  # after "1": 2 twice, 3 once
    assert tree.scheme == "greedy" and tree.first_q is None and tree.chain_q is None
    assert tree.tokens.tolist() == [[[2, 1], [3, 1]]]


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------


def test_errors_are_named(tokenizer):
    model = tiny_hf("llama", vocab_size=64)
    draft = tiny_hf("llama", seed=1, vocab_size=64)
    with pytest.raises(ValueError, match="unknown drafter"):
        generate_text(model, tokenizer, "w1", drafter="standard", max_new_tokens=4)
    for free in ("stand", "ngram", "jacobi", None):
        with pytest.raises(ValueError, match="draft_vocab.*needs a draft model"):
            generate_text(model, tokenizer, "w1", drafter=free, draft_vocab=8, max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        generate_text(model, tokenizer, "w1", drafter=draft, draft_vocab=[], max_new_tokens=4)
    for bad in ([3, 64], torch.tensor([-1, 2])):
        with pytest.raises(ValueError, match="out of range"):
            generate_text(model, tokenizer, "w1", drafter=draft, draft_vocab=bad, max_new_tokens=4)
    for bad in (0, 65):
        with pytest.raises(ValueError, match="draft_vocab"):
            generate_text(model, tokenizer, "w1", drafter=draft, draft_vocab=bad, max_new_tokens=4)
    for bad in (2.5, [1.0, 2.0], "w1"):
        with pytest.raises(ValueError, match="draft_vocab|integers"):
            generate_text(model, tokenizer, "w1", drafter=draft, draft_vocab=bad, max_new_tokens=4)
    with pytest.raises(ValueError, match="window"):
        generate_text(model, tokenizer, "w1", drafter="stand", window=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="vocabulary"):
        generate_text(model, tokenizer, "w1", drafter=tiny_hf("llama", vocab_size=32), draft_vocab=8, max_new_tokens=4)
    with pytest.raises(ValueError, match="max_ngram"):
        generate_text(model, tokenizer, "w1", drafter="stand", ngram=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="top_m"):
        StandDrafter([[1]], 8, top_m=0)
    with pytest.raises(ValueError, match="max_entries"):
        StandDrafter([[1]], 8, max_entries=0)
    with pytest.raises(ValueError, match="prompt token ids"):
        StandDrafter([[1, 9]], 8)
    with pytest.raises(ValueError, match="prompts for a batch"):
        StandDrafter([[1]], 8).start(2, 4, PLAIN)
    with pytest.raises(ValueError, match="branches"):
        stand([[1]]).propose_tree(torch.tensor([[1]]), 1, 7, 1)
