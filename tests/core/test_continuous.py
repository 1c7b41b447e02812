"""CSpD's rule for continuous tokens: exact in law where the densities are exact, with controls
that fail, the residual's bounded proposals, per-row independence and clear errors."""

import math

import pytest
import torch
from scipy.stats import chi2

from visualspec.core.continuous import Gaussian, continuous_verify, residual_sample

N = 40_000  # samples per fit: a wrong rule below moves some cell by far more than the test's slack
ALPHA = 1e-6  # false-alarm rate of one fit


def _cell(x, mean, std, bins):
    """The equiprobable bin (0..bins-1) of each coordinate's N(mean, std) CDF value."""
    u = 0.5 * (1 + torch.erf((x - mean) / (std * math.sqrt(2))))
    return (u * bins).long().clamp(0, bins - 1)


def _fits_uniform(cells: torch.Tensor, count: int) -> tuple[float, float]:
    """Chi-square statistic of cell ids against the uniform law on ``count`` cells, and the
    threshold at ALPHA."""
    observed = torch.bincount(cells, minlength=count).double()
    expected = len(cells) / count
    return float(((observed - expected) ** 2 / expected).sum()), float(chi2.isf(ALPHA, count - 1))


# ------------------------------------------------------------------------- one position, D = 2

P = Gaussian(torch.tensor([0.5, -0.3]), torch.tensor([0.8, 1.2]))
Q = Gaussian(torch.tensor([0.0, 0.2]), torch.tensor([1.1, 0.9]))


def _one_position(rule, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = Gaussian(Q.mean.expand(N, 1, 2).clone(), Q.std.expand(N, 1, 2).clone())
    p = Gaussian(P.mean.expand(N, 2, 2).clone(), P.std.expand(N, 2, 2).clone())
    x = q.sample(g)
    return rule(x, q, p, g)


def _first_token_statistic(tokens):
    c = _cell(tokens, P.mean, P.std, 5)
    return _fits_uniform(c[:, 0] * 5 + c[:, 1], 25)


def _exact(x, q, p, g):
    v = continuous_verify(x, q, p, g)
    return torch.where((v.num_accepted >= 1)[:, None], x[:, 0], v.next_tokens)


def test_one_continuous_token_has_exactly_the_targets_law():
    stat, threshold = _first_token_statistic(_one_position(_exact))
    assert stat < threshold, (stat, threshold)


def _flattened(x, q, p, g):  # the released code's inner temperature 42
    v = continuous_verify(x, q, p, g, flatten=42.0)
    return torch.where((v.num_accepted >= 1)[:, None], x[:, 0], v.next_tokens)


def _resample_from_p(x, q, p, g):  # a common mistake: after a rejection, a fresh draw from p
    v = continuous_verify(x, q, p, g)
    return torch.where((v.num_accepted >= 1)[:, None], x[:, 0], p[:, 0].sample(g))


def _trajectory_factor(x, q, p, g, factor=2.0):  # the ratio times a constant (the paper's Sigma != 1)
    u = torch.rand(N, generator=g, dtype=torch.float64)
    ratio = factor * (p[:, 0].log_prob(x[:, 0]) - q[:, 0].log_prob(x[:, 0])).exp()
    residual, _, _ = residual_sample(p[:, 0], q[:, 0], g)
    return torch.where((u < ratio)[:, None], x[:, 0], residual)


@pytest.mark.parametrize("wrong", [_flattened, _resample_from_p, _trajectory_factor])
def test_the_fit_catches_a_wrong_rule(wrong):
    stat, threshold = _first_token_statistic(_one_position(wrong))
    assert stat > threshold, (wrong.__name__, stat, threshold)


# ------------------------------------------------------------------------- a chain of two drafts

# target: x1 ~ N(0.4, 1.0^2), x2 | x1 ~ N(0.9 x1 - 0.2, 0.6^2); draft: x1 ~ N(0, 1.3^2), x2 | x1 ~ N(0.5 x1, 0.8^2)
def _p2(x1):
    return 0.9 * x1 - 0.2, 0.6


def _q2(x1):
    return 0.5 * x1, 0.8


def _chain(independent: bool, seed: int = 1):
    """The first two tokens of N sequences: one speculative step with K = 2 drafts, then (where it
    committed only one) a plain target draw. ``independent`` tests each draft on its own (no stop at
    the first rejection), the released code's way: a control that must fail."""
    g = torch.Generator().manual_seed(seed)
    col = lambda v: torch.full((N, 1), float(v))  # noqa: E731
    x1 = 0 + 1.3 * torch.randn(N, 1, generator=g)
    m, s = _q2(x1)
    x2 = m + s * torch.randn(N, 1, generator=g)
    drafts = torch.stack([x1, x2], 1)  # (N, 2, 1)
    q = Gaussian(torch.stack([col(0), m], 1), torch.stack([col(1.3), col(s)], 1))
    pm, ps = _p2(x1)
    p = Gaussian(torch.stack([col(0.4), pm, col(0.0)], 1), torch.stack([col(1.0), col(ps), col(1.0)], 1))
    v = continuous_verify(drafts, q, p, g)
    a = v.num_accepted
    t1 = torch.where((a >= 1)[:, None], x1, v.next_tokens)
    pm1, ps1 = _p2(t1)
    fresh = pm1 + ps1 * torch.randn(N, 1, generator=g)
    t2 = torch.where((a >= 2)[:, None], x2, torch.where((a == 1)[:, None], v.next_tokens, fresh))
    if independent:  # keep x2 whenever its own test passed, even after x1 was replaced
        u = torch.rand(N, generator=g, dtype=torch.float64)
        own = (p[:, 1].log_prob(x2) - q[:, 1].log_prob(x2)).exp()
        t2 = torch.where(((a == 0) & (u < own))[:, None], x2, t2)
    return t1, t2


def _chain_statistic(t1, t2):
    m2, s2 = _p2(t1)
    c1 = _cell(t1, torch.tensor(0.4), torch.tensor(1.0), 4)[:, 0]
    c2 = _cell(t2, m2, torch.tensor(s2), 4)[:, 0]
    return _fits_uniform(c1 * 4 + c2, 16)


def test_a_chain_of_continuous_drafts_keeps_the_targets_joint_law():
    stat, threshold = _chain_statistic(*_chain(independent=False))
    assert stat < threshold, (stat, threshold)


def test_the_chain_fit_catches_drafts_tested_independently():
    stat, threshold = _chain_statistic(*_chain(independent=True))
    assert stat > threshold, (stat, threshold)


# ------------------------------------------------------------------------- the residual sampler

def test_the_residual_sampler_counts_its_proposals_and_fallbacks():
    R = 2_000
    p = Gaussian(torch.zeros(R, 3), torch.ones(R, 3))
    near = Gaussian(torch.full((R, 3), 0.02), torch.ones(R, 3))  # TV(p, q) about 0.01: proposals rarely kept
    g = torch.Generator().manual_seed(0)
    tokens, used, fallbacks = residual_sample(p, near, g, max_proposals=8, chunk=3)
    assert used.max() <= 8 and bool((used[fallbacks] == 8).all())
    assert 0.8 < float(fallbacks.float().mean()) < 1.0  # (1 - Z)^8 with Z about 0.01
    assert bool(torch.isfinite(tokens).all())
    far = Gaussian(torch.full((R, 3), 3.0), torch.ones(R, 3))
    tokens, used, fallbacks = residual_sample(p, far, g, max_proposals=1024)
    assert not bool(fallbacks.any()) and float(used.float().mean()) < 1.2  # Z near 1: about one proposal


def test_a_rows_token_depends_only_on_its_own_generator():
    B, K, D = 5, 3, 4
    q = Gaussian(torch.randn(B, K, D, generator=torch.Generator().manual_seed(1)), torch.full((B, K, D), 1.0))
    near = torch.cat([q.mean, torch.zeros(B, 1, D)], 1) + 0.3 * torch.randn(B, K + 1, D, generator=torch.Generator().manual_seed(2))
    p = Gaussian(near, torch.full((B, K + 1, D), 0.9))
    x = q.sample(torch.Generator().manual_seed(3))
    together = continuous_verify(x, q, p, [torch.Generator().manual_seed(10 + b) for b in range(B)])
    for b in range(B):
        alone = continuous_verify(x[b:b + 1], q[b:b + 1], p[b:b + 1], [torch.Generator().manual_seed(10 + b)])
        assert int(alone.num_accepted) == int(together.num_accepted[b])
        assert torch.equal(alone.next_tokens[0], together.next_tokens[b])
    assert len(set(together.num_accepted.tolist())) > 1  # the rows did stop at different drafts


def test_bad_input_gets_a_clear_error():
    q = Gaussian(torch.zeros(2, 3, 4), torch.ones(2, 3, 4))
    p = Gaussian(torch.zeros(2, 4, 4), torch.ones(2, 4, 4))
    x = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="token dimension"):
        continuous_verify(x, q, Gaussian(torch.zeros(2, 4, 8), torch.ones(2, 4, 8)))
    with pytest.raises(ValueError, match=r"\(batch, K, D\)"):
        continuous_verify(x[0], q, p)
    with pytest.raises(ValueError, match="max_proposals"):
        continuous_verify(x, q, p, max_proposals=0)
    with pytest.raises(ValueError, match="flatten"):
        continuous_verify(x, q, p, flatten=0.5)
    with pytest.raises(ValueError, match="standard deviation must be positive"):
        Gaussian(torch.zeros(3), torch.zeros(3))
