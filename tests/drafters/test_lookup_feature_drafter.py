"""Copying where the context repeats, the feature drafter elsewhere (#50, SAM-Decoding's choice):
the longest match is the one its definition names; each row copies or drafts with features as its
own context says; greedy output equals AR on ragged rows and through ``generate_text``; sampled
decoding is lossless (chi-square against the exact law) with a control that reports the wrong
law for the copied drafts only and must fail; bad arguments are named."""

import random

import pytest
import torch

from conftest import generate_reference, tiny_hf
from drafters.harness import N, V, drafter_net, prompt_prefix, ragged_greedy_ar, ragged_prompts
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.rows import per_row
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import FeatureDrafter, LookupFeatureDrafter, NGramDrafter
from visualspec.drafters.ngram import longest_match
from visualspec.models.hf import HFCausalLM
from visualspec.text import generate_text


def brute_force_match(context, longest):
    """The definition: over earlier ends e < L - 1, n(e) = the longest m <= min(longest, e + 1)
    with context[e - i] == context[L - 1 - i] for every i < m; the largest n, then the largest e."""
    L, best = len(context), (0, -1)
    for e in range(L - 1):
        m = 0
        while m < min(longest, e + 1) and context[e - m] == context[L - 1 - m]:
            m += 1
        if m:
            best = max(best, (m, e))
    return best[1], best[0]


def test_longest_match_is_the_longest_then_latest_earlier_match():
    assert longest_match([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 8) == (2, 3)  # "1 2 3" beats the later "2 3"
    assert longest_match([5, 1, 5, 1, 5], 8) == (2, 3)  # overlapping: "5 1 5" ends at index 2
    assert longest_match([5, 1, 5, 1, 5], 2) == (2, 2)  # capped at 2: the latest of equal length
    assert longest_match([4, 5, 6], 8) == (-1, 0) and longest_match([4], 8) == (-1, 0)
    rng = random.Random(0)
    for _ in range(3000):
        context = [rng.randrange(rng.choice([2, 3, 6])) for _ in range(rng.randrange(1, 30))]
        longest = rng.randrange(1, 7)
        assert longest_match(context, longest) == brute_force_match(context, longest), (context, longest)


def test_a_continuation_reports_its_match_and_only_matches_of_min_ngram_copy():
    d = NGramDrafter([[0]], max_ngram=8, min_ngram=2)
    assert d.continuation([1, 2, 3, 9, 1, 2], 3) == ([3, 9, 1], 2)
    assert d.continuation([1, 2, 3, 9, 1, 2], 9) == ([3, 9, 1, 2], 2)  # to the context's end
    assert d.continuation([1, 2, 3, 9, 7, 2], 2) == ([], 0)  # "2" alone is too short: no copy
    assert d.lookup([1, 2, 3, 9, 7, 2], 2) == [2, 2]


class Recording(LookupFeatureDrafter):
    """Records, per proposal, k, the feature drafter's passes for it, the rows, their n and the drafts."""

    def propose(self, tokens, n, k, generator=None):
        before = self.feature.forwards
        drafts, q = super().propose(tokens, n, k, generator)
        live = list(self.lookup.rows)  # the rows still decoding (finished ones are dropped)
        step = (k, self.feature.forwards - before, live, per_row(n, len(live)), drafts)
        self.seen = getattr(self, "seen", []) + [step]
        return drafts, q


def lookup_drafter(target, prefix, rows, min_ngram=2, feature_drafts=None, cls=LookupFeatureDrafter, seed=0):
    feature = FeatureDrafter(drafter_net(target, seed=seed), target, prefix)
    return cls(NGramDrafter(rows, max_ngram=8, min_ngram=min_ngram), feature, feature_drafts)


def test_each_row_copies_where_its_context_repeats_and_drafts_with_features_elsewhere():
    """Two rows whose contexts repeat at different steps. At every step, a row whose context's
    end matches earlier text by two tokens or more gets the continuation it matched (at most k),
    the other its one feature draft (the cap); the step is as wide as its longest row, the shorter
    rows filled with their last draft; a step where every row copies runs no drafter pass. Both
    kinds of step, and mixed ones, occur; greedy output equals AR."""
    target = HFCausalLM(tiny_hf("llama", seed=3))
    ids = torch.tensor([[4, 5, 6, 4, 5, 6, 4, 5], [0, 0, 0, 0, 0, 7, 8, 9]])
    prefix = (ids, (ids != 0).long())
    rows = [[4, 5, 6, 4, 5, 6, 4, 5], [7, 8, 9]]
    ar, _ = decode(target, prefix, 16, SamplingConfig(temperature=0.0))
    drafter = lookup_drafter(target, prefix, rows, feature_drafts=1, cls=Recording)
    out, _ = decode(target, prefix, 16, SamplingConfig(temperature=0.0), drafter=drafter, window=4)
    assert torch.equal(out, ar)
    kinds = set()
    for k, passes, live, n, drafts in drafter.seen:
        follows = [NGramDrafter([rows[r]], max_ngram=8, min_ngram=2).continuation(rows[r] + ar[r, :int(m)].tolist(),
                                                                                   k)[0] for r, m in zip(live, n)]
        copy = [bool(f) for f in follows]
        kinds.add(tuple(copy) if len(copy) == 2 else None)
        assert passes == 0 if all(copy) else passes >= 1
        width = max([len(f) for f in follows] + ([] if all(copy) else [1]))
        assert drafts.shape[1] == width
        for b, follow in enumerate(follows):
            row = follow or drafts[b, :1].tolist()  # a feature row: its one draft
            assert drafts[b].tolist() == row + row[-1:] * (width - len(row))  # filled with its last draft
    assert (True, False) in kinds or (False, True) in kinds, kinds  # mixed steps were reached


@pytest.mark.parametrize("static", [False, True])
def test_greedy_output_equals_ar_on_ragged_rows(static):
    target, prefix, ar = ragged_greedy_ar(static)
    rows = [r[m.bool()].tolist() for r, m in zip(*ragged_prompts())]
    for min_ngram, cap in ((1, None), (2, 2)):
        drafter = lookup_drafter(target, prefix, rows, min_ngram, cap, cls=Recording)
        out, _ = decode(target, prefix, 12, SamplingConfig(temperature=0.0), drafter=drafter, window=5)
        assert torch.equal(out, ar)
        assert drafter.copied > 0 and drafter.feature.forwards > 0  # both kinds of drafts were verified


def test_lookup_feature_drafts_are_lossless():
    """20,000 sequences of 4 tokens in batches of 64 rows, window 4, copies from a match of one
    token or more, feature drafts capped at 1, so rows that copy and rows that draft with features
    meet in one step; the drafter's weights are scaled down, so that its laws are flat (a wrong law
    for its drafts shows). Chi-square against the exact law, bound from the sample size. Two
    controls draw the same drafts (4,000 sequences each) but report the uniform law for the copied
    drafts, or for the feature rows' drafts in steps where other rows copy: each fit must fail, so
    the test reaches both paths."""
    target = HFCausalLM(tiny_hf("llama", vocab_size=V))
    made = []

    class WrongLaw(LookupFeatureDrafter):
        wrong = "copied"

        def propose(self, tokens, n, k, generator=None):
            drafts, q = super().propose(tokens, n, k, generator)
            contexts = [p + row[:m] for p, row, m in zip(self.lookup.prompts, tokens.tolist(), per_row(n, len(tokens)))]
            copy = torch.tensor([bool(self.lookup.continuation(c, k)[0]) for c in contexts])
            if q is not None and copy.any():
                rows = copy if self.wrong == "copied" else ~copy
                q = torch.where(rows[:, None, None], torch.full_like(q, 1 / q.shape[-1]), q)
            return drafts, q

    class WrongMixedFeatureLaw(WrongLaw):
        wrong = "feature rows"

    def factory(cls):
        def make(rows):
            prefix = prompt_prefix(rows)
            made.append(lookup_drafter(target, prefix, prefix.tolist(), min_ngram=1, feature_drafts=1, cls=cls,
                                       seed=3))
            with torch.no_grad():
                for p in made[-1].feature.model.parameters():
                    p.mul_(0.1)  # flat draft laws: the largest about 0.4 of 3 tokens
            return made[-1]
        return make

    sampling = SamplingConfig(temperature=0.8, top_k=3)
    seqs, probs = exact_sequence_distribution(target, prompt_prefix, N, sampling)
    drawn = sample_sequences(target, prompt_prefix, N, sampling, 20000, batch=64, window=4,
                             drafter_factory=factory(LookupFeatureDrafter))
    fit = chi_square_fit(drawn, seqs, probs)
    assert fit.passed, fit
    assert all(d.copied > 0 and d.feature.forwards > 0 for d in made)
    for control in (WrongLaw, WrongMixedFeatureLaw):
        fit = chi_square_fit(sample_sequences(target, prompt_prefix, N, sampling, 4000, batch=64, window=4,
                                              drafter_factory=factory(control)), seqs, probs)
        assert not fit.passed and fit.chi2 > 10 * fit.threshold, (control.wrong, fit)


@pytest.mark.parametrize("compile", [False, True])
def test_generate_text_copies_before_the_feature_drafter(compile, tokenizer):
    """A prompt that repeats itself: with ``lookup`` the feature drafter runs fewer passes than
    without, for the same greedy tokens as ``generate``."""
    model = tiny_hf("llama", vocab_size=64)
    net = drafter_net(HFCausalLM(model))
    prompt = "w1 w2 w3 w1 w2 w3 w1 w2 w3 w1 w2"
    plain = generate_text(model, tokenizer, prompt, drafter=net, window=4, max_new_tokens=12, temperature=0,
                          compile=compile)
    out = generate_text(model, tokenizer, prompt, drafter=net, window=4, max_new_tokens=12, temperature=0,
                        compile=compile, lookup=1)
    assert out.stats.mode == "feature drafter+lookup 1" + ("+compiled" if compile else "")
    assert out.token_ids[0] == plain.token_ids[0] == generate_reference(model, tokenizer, prompt, 12)
    assert out.stats.draft_forwards < plain.stats.draft_forwards


@pytest.mark.parametrize("kwargs,match", [
    (dict(drafter="ngram", lookup=2), "lookup= copies drafts .* needs a feature drafter"),
    (dict(lookup=2), "needs a feature drafter, not drafter=None"),
    (dict(feature=True, lookup=0), "lookup .* must be an integer >= 1"),
    (dict(feature=True, lookup=2, tree_width=2, depth=2), "dynamic draft tree .* takes no lookup"),
])
def test_bad_lookups_are_named(kwargs, match, tokenizer):
    model = tiny_hf("llama", vocab_size=64)
    if kwargs.pop("feature", False):
        kwargs["drafter"] = drafter_net(HFCausalLM(model))
    with pytest.raises(ValueError, match=match):
        generate_text(model, tokenizer, "w1 w2", max_new_tokens=4, temperature=0, **kwargs)


def test_a_bad_feature_cap_is_named():
    target = HFCausalLM(tiny_hf("llama"))
    with pytest.raises(ValueError, match="feature_drafts"):
        lookup_drafter(target, None, [[1, 2]], feature_drafts=0)
