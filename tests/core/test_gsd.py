"""Grouped speculative decoding (GSD): group construction, reduction to exact speculative sampling,
and the one-step laws of its acceptance, exact where possible and statistical otherwise."""

import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binom, chi2, ncx2

from visualspec.core.verify import Verdict, gsd_group, gsd_verify, speculative_verify

ALPHA = 1e-6  # false-alarm rate of every statistical check here

# Hand-made target over V = 8 tokens. Descending order (stable: the tie 2/6 at 0.10 keeps token
# order): ranks 0..7 hold tokens 1, 3, 5, 2, 6, 7, 0, 4.
P = torch.tensor([0.05, 0.30, 0.10, 0.20, 0.02, 0.15, 0.10, 0.08], dtype=torch.float64)
V = 8
LINE = torch.arange(V, dtype=torch.float64)[:, None]  # codes on a line: |e_i - e_j|² = (i - j)²


def _group(x, r, **kw):
    return set(gsd_group(P, torch.tensor(x), r, **kw).nonzero().flatten().tolist())


# ------------------------------------------------------------------------------------ groups

@pytest.mark.parametrize("x, r, expected", [
    (2, 1, {5, 2, 6}),           # ranks 2..4
    (6, 1, {2, 6, 7}),           # ranks 3..5: the tie is broken by token order (6 after 2)
    (1, 1, {1, 3}),              # rank 0: clamped below
    (4, 1, {0, 4}),              # rank 7: clamped above
    (4, 3, {6, 7, 0, 4}),        # ranks 4..7 (clamped above)
    (6, 2, {5, 2, 6, 7, 0}),     # ranks 2..6
    (3, 100, set(range(V))),     # a window wider than the vocabulary
    (5, 0, {5}),
])
def test_group_is_the_rank_window_around_the_draft(x, r, expected):
    assert _group(x, r) == expected


@pytest.mark.parametrize("x, r, max_distance, expected", [
    (6, 2, 1.0, {5, 6, 7}),       # window {5, 2, 6, 7, 0}: distances 1, 16, 0, 1, 36
    (6, 2, 16.0, {2, 5, 6, 7}),   # "at most": distance 16 is in
    (6, 2, 15.9, {5, 6, 7}),
    (6, 2, 0.0, {6}),
    (2, 1, 1.0, {2}),             # window {5, 2, 6}: both neighbours are far
    (4, 3, 4.0, {4, 6}),          # window {6, 7, 0, 4}: only 6 is within distance 2
    (1, 1, 4.0, {1, 3}),          # clamped window, filtered
])
def test_group_keeps_only_visually_similar_tokens(x, r, max_distance, expected):
    assert _group(x, r, embeddings=LINE, max_distance=max_distance) == expected


def test_embeddings_without_max_distance_do_not_filter():
    assert _group(6, 2, embeddings=LINE) == {5, 2, 6, 7, 0}


def test_draft_is_always_in_its_group():
    e = LINE.clone()
    e[6] = float("nan")  # no distance to 6 is <= anything, itself included
    assert _group(6, 2, embeddings=e, max_distance=100.0) == {6}
    e = LINE.clone()
    e[5] = e[6]  # a duplicate code is at distance 0
    assert _group(6, 2, embeddings=e, max_distance=0.0) == {5, 6}
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, V, generator=g, dtype=torch.float64), -1)
    x = torch.randint(0, V, (50,), generator=g)
    for r in range(4):
        assert gsd_group(p, x, r, embeddings=LINE, max_distance=0.0)[torch.arange(50), x].all()


def test_group_is_vectorised_over_leading_dims():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, 4, V, generator=g, dtype=torch.float64), -1)
    x = torch.randint(0, V, (3, 4), generator=g)
    batched = gsd_group(p, x, 2, embeddings=LINE, max_distance=4.0)
    assert batched.shape == (3, 4, V) and batched.dtype == torch.bool
    for i in range(3):
        for j in range(4):
            assert torch.equal(batched[i, j], gsd_group(p[i, j], x[i, j], 2, embeddings=LINE, max_distance=4.0))


# ------------------------------------------------------------------- group_size 0 is exact SD

def _dists(seed, rows, k, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(rows, k + 1, V, generator=g), -1).to(dtype)
    q = torch.softmax(2 * torch.randn(rows, k, V, generator=g), -1).to(dtype)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(rows, k)
    return p, q, drafts


@pytest.mark.parametrize("draft", ["stochastic", "point-mass", "one-hot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_size_zero_is_exact_speculative_sampling(draft, dtype):
    p, q, drafts = _dists(4, 256, 3, dtype)
    q = {"stochastic": q, "point-mass": None,
         "one-hot": torch.nn.functional.one_hot(drafts, V).to(dtype)}[draft]
    a = speculative_verify(drafts, q, p, torch.Generator().manual_seed(5))
    for kw in ({}, {"embeddings": LINE, "max_distance": 2.0}):
        b = gsd_verify(drafts, q, p, torch.Generator().manual_seed(5), group_size=0, **kw)
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_tokens, b.next_tokens)
    assert 0 < a.num_accepted.sum() < 256 * 3  # both branches (accept, reject) are exercised


def test_a_real_group_changes_the_verdict():
    """Control for the test above: it compares verdicts that can differ."""
    p, q, drafts = _dists(4, 256, 3)
    a = speculative_verify(drafts, q, p, torch.Generator().manual_seed(5))
    b = gsd_verify(drafts, q, p, torch.Generator().manual_seed(5), group_size=2)
    assert not torch.equal(a.num_accepted, b.num_accepted)


def test_no_drafts_is_one_autoregressive_step():
    p, _, _ = _dists(0, 16, 0)
    a = speculative_verify(torch.zeros(16, 0, dtype=torch.long), None, p, torch.Generator().manual_seed(0))
    b = gsd_verify(torch.zeros(16, 0, dtype=torch.long), None, p, torch.Generator().manual_seed(0), group_size=3)
    assert torch.equal(a.next_tokens, b.next_tokens) and (b.num_accepted == 0).all()


# -------------------------------------------------------------- one-step law, point-mass draft

def _chi_square(counts, law):
    """Pearson's statistic of counts (V,) against an exact law (V,); a sample of a token of
    probability 0 makes it infinite. Returns (statistic, threshold at ALPHA)."""
    n = counts.sum()
    expected = law * n
    support = law > 0
    if counts[~support].sum() > 0:
        return math.inf, chi2.isf(ALPHA, int(support.sum()) - 1)
    assert expected[support].min() >= 5
    stat = float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())
    return stat, chi2.isf(ALPHA, int(support.sum()) - 1)


def _detectable_tv(n, dof):
    """A TV distance that the chi-square test at ALPHA detects with probability >= 1 - ALPHA.

    Against a reference law r the test's statistic has noncentrality n·χ²(a‖r) >= 4 n TV(a, r)²
    (Cauchy-Schwarz). With λ the noncentrality at which the test has power 1 - ALPHA, any law at
    TV >= sqrt(λ / 4n) from r is rejected with probability >= 1 - ALPHA."""
    threshold = chi2.isf(ALPHA, dof)
    lam = brentq(lambda l: ncx2.cdf(threshold, dof, l) - ALPHA, 1e-3, 1e4)
    return math.sqrt(lam / (4 * n))


def _gsd_law(p, x, group):
    """The emitted law for a point-mass draft x: p̃(x) = p(G), p̃(y) = p(y)(1 - p(G)) / (1 - p(x))."""
    p_g = p[group].sum()
    law = p * (1 - p_g) / (1 - p[x])
    law[x] = p_g
    return law


def _g_mass_moved_onto_x(p, x, group):
    """The LANTERN-style law (G's own mass moved onto x): NOT what this rule emits."""
    law = p.masked_fill(group, 0.0)
    law[x] = p[group].sum()
    return law


def _accept_pg_resample_p(draft_tokens, draft_probs, target_probs, generator, *, group_size):
    """A deliberately wrong rule: accept with p(G), but resample from p itself (x not removed)."""
    group = gsd_group(target_probs[:, :-1], draft_tokens, group_size)
    p_group = (target_probs[:, :-1] * group).sum(-1)
    accept = torch.rand(p_group.shape, generator=generator, dtype=torch.float64) < p_group
    return Verdict(accept[:, 0].long(), torch.multinomial(target_probs[:, 0], 1, generator=generator)[:, 0])


def _emitted_counts(rule, x, n, seed, r):
    target = P.expand(n, 2, V)
    drafts = torch.full((n, 1), x)
    v = rule(drafts, None, target, torch.Generator().manual_seed(seed), group_size=r)
    emitted = torch.where(v.num_accepted == 1, drafts[:, 0], v.next_tokens)
    return torch.bincount(emitted, minlength=V).double()


def test_point_mass_step_emits_the_gsd_law_and_the_controls_fail():
    x, r, n = 2, 1, 200_000  # G = {5, 2, 6}: p(G) = 0.35, p(G \ {x}) = 0.25
    group = gsd_group(P, torch.tensor(x), r)
    law = _gsd_law(P, x, group)
    assert abs(law.sum() - 1) < 1e-12
    tv = lambda a, b: 0.5 * (a - b).abs().sum().item()
    # the documented bound, exactly
    assert abs(tv(law, P) - P[group].sum().item() + P[x].item()) < 1e-12
    # each control is far enough from the law it is tested against to be caught
    detectable = _detectable_tv(n, V - 1)
    wrong_law = (1 - P[group].sum()) * P
    wrong_law[x] += P[group].sum()  # law of _accept_pg_resample_p
    lantern_like = _g_mass_moved_onto_x(P, x, group)
    for other in (P, wrong_law, lantern_like):
        assert tv(law, other) >= 3 * detectable, (tv(law, other), detectable)

    counts = _emitted_counts(gsd_verify, x, n, seed=0, r=r)
    stat, threshold = _chi_square(counts, law)
    assert stat < threshold, (stat, threshold)
    stat, threshold = _chi_square(counts, P)  # lossy, visibly
    assert stat > threshold, (stat, threshold)
    stat, threshold = _chi_square(counts, lantern_like)  # and not LANTERN's relaxation
    assert stat > threshold, (stat, threshold)
    wrong_counts = _emitted_counts(_accept_pg_resample_p, x, n, seed=0, r=r)
    stat, threshold = _chi_square(wrong_counts, law)
    assert stat > threshold, (stat, threshold)


# ------------------------------------------------------------- acceptance, stochastic draft

def test_stochastic_acceptance_rate_is_min_of_group_mass_ratio():
    """Per row the acceptance probability is min(1, p(G)/q(G)), whatever x was drawn from."""
    q = torch.tensor([0.02, 0.10, 0.30, 0.05, 0.20, 0.08, 0.05, 0.20], dtype=torch.float64)
    n, r = 50_000, 1
    ratios = {}
    for x in range(V):
        group = gsd_group(P, torch.tensor(x), r)
        alpha = min(1.0, (P[group].sum() / q[group].sum()).item())
        exact_sd = min(1.0, (P[x] / q[x]).item())
        drafts = torch.full((n, 1), x)
        v = gsd_verify(drafts, q.expand(n, 1, V), P.expand(n, 2, V), torch.Generator().manual_seed(x),
                       group_size=r)
        accepted = int(v.num_accepted.sum())
        lo, hi = binom.interval(1 - ALPHA, n, alpha)
        assert lo <= accepted <= hi, (x, accepted / n, alpha)
        ratios[x] = (alpha, exact_sd)
        if alpha < 1:  # a rejection resamples from norm(max(p - q, 0)): never a token with p <= q
            assert (P[v.next_tokens[v.num_accepted == 0]] > q[v.next_tokens[v.num_accepted == 0]]).all()
    # the check can fail: the group ratio is far (in binomial sigmas) from exact SD's p(x)/q(x),
    # on both sides (GSD can accept less than exact speculative sampling) and below 1
    sigma = lambda a: math.sqrt(a * (1 - a) / n) + 1e-12
    assert any(a > e + 10 * sigma(e) for a, e in ratios.values())
    assert any(a < e - 10 * sigma(e) for a, e in ratios.values())
    assert sum(a < 1 for a, _ in ratios.values()) >= 4


# ---------------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kw, name", [
    ({"group_size": -1}, "group_size"),
    ({"group_size": 1.5}, "group_size"),
    ({"group_size": True}, "group_size"),
    ({"group_size": None}, "group_size"),
    ({"group_size": 1, "embeddings": LINE, "max_distance": -0.5}, "max_distance"),
    ({"group_size": 1, "embeddings": LINE, "max_distance": float("nan")}, "max_distance"),
    ({"group_size": 1, "max_distance": 1.0}, "embeddings"),
    ({"group_size": 1, "embeddings": torch.zeros(V + 1, 2), "max_distance": 1.0}, "embeddings"),
    ({"group_size": 1, "embeddings": torch.zeros(V), "max_distance": 1.0}, "embeddings"),
])
def test_bad_arguments_raise_value_errors_naming_them(kw, name):
    p, q, drafts = _dists(0, 4, 2)
    with pytest.raises(ValueError, match=name):
        gsd_verify(drafts, q, p, **kw)
    with pytest.raises(ValueError, match=name):
        gsd_verify(drafts[:, :0], None, p[:, :1], **kw)  # checked even without drafts
    args = {k: v for k, v in kw.items() if k != "group_size"}
    with pytest.raises(ValueError, match=name):
        gsd_group(p[:, 0], drafts[:, 0], kw["group_size"], **args)
