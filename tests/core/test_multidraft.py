"""Multi-draft verification at one position: exact laws, sampled laws, acceptance against the bound."""

import itertools

import pytest
import torch
from scipy.stats import chi2

from visualspec.core.multidraft import (MAX_DRAFT_TUPLES, MultiDraftVerdict, acceptance_rate, enumerate_drafts,
                                   gumbel_top_k, iid_drafts, optimal_acceptance, output_distribution,
                                   recursive_iid_verify, rsd_verify, spectr_rho, spectr_verify)
from visualspec.core.lossless import FitResult

V = 6
N = 200_000
ALPHA = 1e-6
# each rule with the drafting it is lossless for
RULES = {
    "spectr": (spectr_verify, "iid"),
    "rsd": (rsd_verify, "without_replacement"),
    "recursive_iid": (recursive_iid_verify, "iid"),
}


def _pair(seed):
    """A (p, q) pair on V tokens, far apart and with every p(x) >= 0.017 (seeds 1 and 3)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    return p, q


def _draft(q, k, scheme, generator):
    if scheme == "iid":
        return iid_drafts(q, k, generator)
    return gumbel_top_k(q.log(), k, generator)


def _fit(tokens, p, alpha=ALPHA):
    """Pearson's chi-square of sampled tokens against p; expected counts n p(x) (all >= 5 here)."""
    n = tokens.shape[0]
    observed = torch.bincount(tokens, minlength=V).double()
    expected = n * p.double()
    assert expected.min() >= 5
    stat = float(((observed - expected) ** 2 / expected).sum())
    return FitResult(stat, float(chi2.isf(alpha, V - 1)), V - 1, n)


def _run(rule, p, q, k, n=N, seed=0, scheme=None):
    verify, natural = RULES[rule]
    g = torch.Generator().manual_seed(seed)
    Q, P = q.expand(n, V), p.expand(n, V)
    candidates = _draft(Q, k, scheme or natural, g)
    return candidates, verify(candidates, Q, P, g)


# ----------------------------------------------------------------------------------------------
# Losslessness
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", sorted(RULES))
def test_exact_output_law_is_p(rule):
    for seed, k in itertools.product(range(4), (1, 2, 3)):
        p, q = _pair(seed)
        out = output_distribution(rule, p, q, k)
        assert torch.allclose(out, p, rtol=0, atol=1e-12), (seed, k, out, p)


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("seed", [1, 3])
def test_sampled_output_fits_p_and_acceptance_matches_exact(rule, k, seed):
    p, q = _pair(seed)
    candidates, verdict = _run(rule, p, q, k, seed=seed)
    fit = _fit(verdict.token, p)
    assert fit.passed, fit
    # the index points at the emitted candidate
    hit = verdict.index >= 0
    assert (verdict.index >= -1).all() and (verdict.index < k).all()
    assert torch.equal(candidates.gather(1, verdict.index.clamp(min=0)[:, None])[hit, 0], verdict.token[hit])
    # empirical acceptance frequency vs the exact enumeration
    exact = acceptance_rate(rule, p, q, k)
    rate = hit.double().mean().item()
    assert abs(rate - exact) < 5 * (exact * (1 - exact) / N) ** 0.5, (rate, exact)


def _last_candidate_instead_of_residual(candidates, q, p, generator):
    """Control: RSD, but after k rejections emit the last candidate instead of a residual sample."""
    v = rsd_verify(candidates, q, p, generator)
    return MultiDraftVerdict(v.index, torch.where(v.index < 0, candidates[:, -1], v.token))


@pytest.mark.parametrize("k", [2, 3])
def test_controls_are_caught(k):
    p, q = _pair(1)
    threshold = chi2.isf(ALPHA, V - 1)
    # control 1: recursive rejection without the q update (i.i.d. recursion) on drafts without replacement
    biased = output_distribution("recursive_iid", p, q, k, scheme="without_replacement")
    noncentrality = N * float(((biased - p) ** 2 / p).sum())
    assert noncentrality > 10 * threshold  # the bias is real and large enough to be seen at this N
    _, verdict = _run("recursive_iid", p, q, k, scheme="without_replacement")
    fit = _fit(verdict.token, p)
    assert not fit.passed, fit
    # ... and the converse mismatch, RSD's exact law on i.i.d. drafts, is biased too
    assert (output_distribution("rsd", p, q, k, scheme="iid") - p).abs().max() > 1e-2
    # control 2: no residual after k rejections
    g = torch.Generator().manual_seed(7)
    Q, P = q.expand(N, V), p.expand(N, V)
    candidates = gumbel_top_k(Q.log(), k, g)
    fit = _fit(_last_candidate_instead_of_residual(candidates, Q, P, g).token, p)
    assert not fit.passed, fit


def test_rsd_with_fewer_possible_tokens_than_candidates():
    """Gumbel-top-k pads with impossible tokens; RSD rejects them and stays lossless."""
    p, _ = _pair(1)
    q = torch.tensor([0.3, 0.0, 0.7, 0.0, 0.0, 0.0], dtype=torch.float64)
    n = 100_000
    g = torch.Generator().manual_seed(3)
    Q, P = q.expand(n, V), p.expand(n, V)
    candidates = gumbel_top_k(Q.log(), 3, g)
    verdict = rsd_verify(candidates, Q, P, g)
    assert (verdict.index < 2).all()  # the third candidate has q = 0
    assert _fit(verdict.token, p).passed


# ----------------------------------------------------------------------------------------------
# Exact acceptance against the optimal-transport bound
# ----------------------------------------------------------------------------------------------


def _min_cut_bound(p, q, k, scheme):
    """The dual of the acceptance LP by brute force: min over token sets A of p(A) + 1 - Q(drafts ⊆ A)."""
    tuples, probs = enumerate_drafts(q, k, scheme)
    best = float("inf")
    for r in range(V + 1):
        for subset in itertools.combinations(range(V), r):
            inside = torch.isin(tuples, torch.tensor(subset, dtype=torch.long)).all(1)
            best = min(best, float(p[list(subset)].sum()) + 1 - float(probs[inside].sum()))
    return best


@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_lp_matches_min_cut_dual(scheme):
    for seed, k in [(0, 2), (1, 3), (3, 2)]:
        p, q = _pair(seed)
        assert optimal_acceptance(p, q, k, scheme) == pytest.approx(_min_cut_bound(p, q, k, scheme), abs=1e-9)


def test_rules_never_beat_the_bound_and_more_drafts_never_accept_less():
    for seed in range(5):
        p, q = _pair(seed)
        bound = {s: [optimal_acceptance(p, q, k, s) for k in (1, 2, 3)] for s in ("iid", "without_replacement")}
        for s in bound:
            assert bound[s][0] <= bound[s][1] + 1e-9 <= bound[s][2] + 2e-9
        for rule, (_, scheme) in RULES.items():
            rates = [acceptance_rate(rule, p, q, k) for k in (1, 2, 3)]
            for k, rate in zip((1, 2, 3), rates):
                assert rate <= bound[scheme][k - 1] + 1e-9, (seed, rule, k, rate, bound[scheme][k - 1])
            assert rates[0] <= rates[1] <= rates[2], (seed, rule, rates)


def test_single_draft_accepts_one_minus_total_variation():
    for seed in range(5):
        p, q = _pair(seed)
        alpha = 1 - 0.5 * float((p - q).abs().sum())
        for rule in RULES:
            assert acceptance_rate(rule, p, q, 1) == pytest.approx(alpha, abs=1e-12)
        for scheme in ("iid", "without_replacement"):
            assert optimal_acceptance(p, q, 1, scheme) == pytest.approx(alpha, abs=1e-9)


def test_a_two_token_example_worked_by_hand():
    """p = (0.6, 0.4), q = (0.2, 0.8), two drafts; each number below is worked out by hand.

    - one draft: sum min(p, q) = 0.2 + 0.4 = 0.6;
    - recursive i.i.d.: the first draft is accepted with 0.2 * 1 + 0.8 * 0.5 = 0.6; a rejection leaves
      the residual (1, 0), which only a second draft of token 0 (probability 0.2) meets: 0.6 + 0.4 * 0.2;
    - SpecTr: rho solves 1 - (1 - beta)^2 = rho beta with beta = 0.2 + 0.4 / rho, i.e.
      rho^2 - 1.8 rho + 0.4 = 0, rho = 0.9 + sqrt(0.41); acceptance = 0.2 rho + 0.4;
    - the best any i.i.d. rule can do: token 0 is among the drafts with 1 - 0.8^2 = 0.36 < 0.6 and
      token 1 with 0.96 > 0.4, so at most 0.36 + 0.4 = 0.76, which a coupling reaches;
    - without replacement both tokens are always drafted: RSD and the bound accept always.
    """
    p, q = torch.tensor([0.6, 0.4], dtype=torch.float64), torch.tensor([0.2, 0.8], dtype=torch.float64)
    assert acceptance_rate("recursive_iid", p, q, 1) == pytest.approx(0.6, abs=1e-12)
    assert acceptance_rate("recursive_iid", p, q, 2) == pytest.approx(0.68, abs=1e-12)
    assert acceptance_rate("spectr", p, q, 2) == pytest.approx(0.58 + 0.2 * 0.41 ** 0.5, abs=1e-9)
    assert acceptance_rate("rsd", p, q, 2) == pytest.approx(1.0, abs=1e-12)
    assert optimal_acceptance(p, q, 2, "iid") == pytest.approx(0.76, abs=1e-9)
    assert optimal_acceptance(p, q, 2, "without_replacement") == pytest.approx(1.0, abs=1e-9)


def test_spectr_closed_forms():
    """ρ* solves 1 - (1 - β)^k = ρβ; acceptance = Σ min(ρ* q, p); residual ∝ (p - ρ* q)_+."""
    from visualspec.core.multidraft import _spectr_stages

    for seed, k in itertools.product(range(4), (1, 2, 3)):
        p, q = _pair(seed)
        rho = spectr_rho(q[None], p[None], k)[0].item()
        assert 1 <= rho <= k
        beta = float(torch.minimum(q, p / rho).sum())
        assert 1 - (1 - beta) ** k == pytest.approx(rho * beta, abs=1e-12)
        assert acceptance_rate("spectr", p, q, k) == pytest.approx(float(torch.minimum(rho * q, p).sum()), abs=1e-12)
        if k == 1:
            assert rho == 1.0
        _, residual = _spectr_stages(torch.zeros(1, k, dtype=torch.long), q[None], p[None])
        expected = (p - rho * q).clamp(min=0)
        assert torch.allclose(residual[0], expected / expected.sum(), atol=1e-9)


def test_identical_distributions_accept_the_first_draft():
    p, _ = _pair(2)
    for rule in RULES:
        assert acceptance_rate(rule, p, p, 2) == pytest.approx(1.0, abs=1e-12)
    candidates = iid_drafts(p.expand(1000, V), 3, torch.Generator().manual_seed(0))
    assert (spectr_verify(candidates, p.expand(1000, V), p.expand(1000, V)).index == 0).all()


# ----------------------------------------------------------------------------------------------
# Drafting
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_drafts_follow_their_law(scheme):
    _, q = _pair(3)
    n = N
    candidates = _draft(q.expand(n, V), 2, scheme, torch.Generator().manual_seed(5))
    if scheme == "without_replacement":
        assert (candidates[:, 0] != candidates[:, 1]).all()
    tuples, probs = enumerate_drafts(q, 2, scheme)
    observed = torch.bincount(candidates[:, 0] * V + candidates[:, 1], minlength=V * V).double()
    expected = torch.zeros(V * V, dtype=torch.float64)
    expected[tuples[:, 0] * V + tuples[:, 1]] = n * probs
    possible = expected > 0
    assert observed[~possible].sum() == 0
    assert expected[possible].min() >= 5
    obs, exp = observed[possible], expected[possible]
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2.isf(ALPHA, len(exp) - 1)


# ----------------------------------------------------------------------------------------------
# Batches and generators
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rows_are_independent(rule):
    """With one generator per row, a row's verdict does not depend on the other rows."""
    verify, scheme = RULES[rule]
    pairs = [_pair(s) for s in range(4)]
    P = torch.stack([p for p, _ in pairs])
    Q = torch.stack([q for _, q in pairs])

    def gens():
        return [torch.Generator().manual_seed(100 + b) for b in range(4)]

    g = gens()
    c = _draft(Q, 3, scheme, g)
    batched = verify(c, Q, P, g)
    for b, gb in enumerate(gens()):
        cb = _draft(Q[b:b + 1], 3, scheme, [gb])
        single = verify(cb, Q[b:b + 1], P[b:b + 1], [gb])
        assert torch.equal(cb[0], c[b])
        assert single.index.item() == batched.index[b].item() and single.token.item() == batched.token[b].item()


def test_mixed_batch_each_row_follows_its_own_target():
    """Alternating rows with different (p, q) in one batch: each half has its own law (ρ is per row)."""
    (p1, q1), (p2, q2) = _pair(1), _pair(3)
    n = 100_000
    P = torch.stack([p1, p2]).repeat(n, 1)
    Q = torch.stack([q1, q2]).repeat(n, 1)
    g = torch.Generator().manual_seed(11)
    verdict = spectr_verify(iid_drafts(Q, 3, g), Q, P, g)
    assert _fit(verdict.token[0::2], p1).passed
    assert _fit(verdict.token[1::2], p2).passed


@pytest.mark.parametrize("rule", sorted(RULES))
def test_generator_makes_results_reproducible(rule):
    p, q = _pair(1)
    a = _run(rule, p, q, 3, n=2000, seed=4)[1]
    b = _run(rule, p, q, 3, n=2000, seed=4)[1]
    c = _run(rule, p, q, 3, n=2000, seed=5)[1]
    assert torch.equal(a.index, b.index) and torch.equal(a.token, b.token)
    assert not torch.equal(a.token, c.token)


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def test_bad_draft_counts_and_shapes_are_named():
    p, q = _pair(0)
    P, Q = p.expand(4, V), q.expand(4, V)
    c = torch.tensor([[0, 1]] * 4)
    for bad_k in (0, -1, 1.5):
        with pytest.raises(ValueError, match="k"):
            gumbel_top_k(Q.log(), bad_k)
        with pytest.raises(ValueError, match="k"):
            iid_drafts(Q, bad_k)
        with pytest.raises(ValueError, match="k"):
            optimal_acceptance(p, q, bad_k)
        with pytest.raises(ValueError, match="k"):
            acceptance_rate("spectr", p, q, bad_k)
    with pytest.raises(ValueError, match="vocabulary"):
        gumbel_top_k(Q.log(), V + 1)
    for verify, _ in RULES.values():
        with pytest.raises(ValueError, match="k"):
            verify(torch.zeros(4, 0, dtype=torch.long), Q, P)
        with pytest.raises(ValueError, match="rows"):
            verify(c[:3], Q, P)
        with pytest.raises(ValueError, match=r"\(B, k\)"):
            verify(c[:, 0], Q, P)
        with pytest.raises(ValueError, match="sum to 1"):
            verify(c, Q, P * 1.1)
        with pytest.raises(ValueError, match="sum to 1"):
            verify(c, Q * 0.5, P)
        with pytest.raises(ValueError, match="non-negative"):
            verify(c, Q, P - 0.5)
        with pytest.raises(ValueError, match="same shape"):
            verify(c, Q, P[:, :5] / P[:, :5].sum(-1, keepdim=True))
        with pytest.raises(ValueError, match="lie in"):
            verify(c + V, Q, P)
    with pytest.raises(ValueError, match="distinct"):
        rsd_verify(torch.tensor([[2, 2]] * 4), Q, P)
    with pytest.raises(ValueError, match="too large"):
        optimal_acceptance(torch.full((16,), 1 / 16), torch.full((16,), 1 / 16), 4)
    assert 16 ** 4 > MAX_DRAFT_TUPLES
    with pytest.raises(ValueError, match="too large"):
        acceptance_rate("rsd", torch.full((16,), 1 / 16), torch.full((16,), 1 / 16), 4)
    with pytest.raises(ValueError, match="scheme"):
        optimal_acceptance(p, q, 2, scheme="poisson")
    with pytest.raises(ValueError, match="unknown rule"):
        acceptance_rate("typical", p, q, 2)
    with pytest.raises(ValueError, match="at least k tokens"):
        optimal_acceptance(p, torch.tensor([1.0, 0, 0, 0, 0, 0]), 2, "without_replacement")
