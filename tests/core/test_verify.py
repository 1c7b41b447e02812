"""Single-step laws of the verification rules, exact where possible and statistical otherwise."""

import pytest
import torch

from drafters.harness import accept_with_p_rule
from visualspec.core.lossless import chi_square_fit
from visualspec.core.verify import (Verdict, greedy_verify, lantern_relaxation, lantern_verify, relaxed_distribution,
                               speculative_verify)

V = 6


def _dists(seed, rows=1, k=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.softmax(2 * torch.randn(rows, k, V, generator=g), -1),
            torch.softmax(2 * torch.randn(rows, k, V, generator=g), -1))


def _one_step_samples(rule, p, q, n, seed=0, **kw):
    """Emitted token of n independent one-draft steps (draft ~ q), as (n, 1) sequences."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q[0, 0], n, replacement=True, generator=g)[:, None]
    target = torch.cat([p, p], 1).expand(n, 2, V)  # bonus row only matters when accepted
    verdict = rule(drafts, q.expand(n, 1, V), target, g, **kw)
    return torch.where(verdict.num_accepted == 1, drafts[:, 0], verdict.next_tokens)[:, None]


def test_exact_rule_emits_the_target_law():
    p, q = _dists(0)
    seqs = torch.arange(V)[:, None]
    fit = chi_square_fit(_one_step_samples(speculative_verify, p, q, 60000), seqs, p[0, 0])
    assert fit.passed, fit


def test_exact_rule_acceptance_rate_is_sum_of_min():
    p, q = _dists(1)
    n = 60000
    g = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(q[0, 0], n, replacement=True, generator=g)[:, None]
    verdict = speculative_verify(drafts, q.expand(n, 1, V), torch.cat([p, p], 1).expand(n, 2, V), g)
    alpha = torch.minimum(p, q).sum().item()
    rate = verdict.num_accepted.double().mean().item()
    assert abs(rate - alpha) < 6 * (alpha * (1 - alpha) / n) ** 0.5


def resample_from_p_rule(draft_tokens, draft_probs, target_probs, generator):
    """Another classic bug: the right acceptance test, but resampling from p instead of the residual."""
    p_x = target_probs[:, 0].gather(-1, draft_tokens).squeeze(-1)
    q_x = draft_probs[:, 0].gather(-1, draft_tokens).squeeze(-1)
    accept = torch.rand(p_x.shape, generator=generator, dtype=torch.float64) * q_x < p_x
    return Verdict(accept.long(), torch.multinomial(target_probs[:, 0], 1, generator=generator)[:, 0])


@pytest.mark.parametrize("wrong", [accept_with_p_rule, resample_from_p_rule])
def test_a_wrong_rule_is_caught_by_the_same_test(wrong):
    """Controls: the harness that passes the exact rule must fail these."""
    p, q = _dists(0)
    seqs = torch.arange(V)[:, None]
    fit = chi_square_fit(_one_step_samples(wrong, p, q, 60000), seqs, p[0, 0])
    assert not fit.passed, fit


def test_treating_a_sampled_draft_as_a_point_mass_is_still_lossless():
    """Accept with p(x), resample from p without x: lossless for any draft law (only slower)."""
    p, q = _dists(0)

    def as_point_mass(draft_tokens, draft_probs, target_probs, generator):
        return speculative_verify(draft_tokens, None, target_probs, generator)

    fit = chi_square_fit(_one_step_samples(as_point_mass, p, q, 60000), torch.arange(V)[:, None], p[0, 0])
    assert fit.passed, fit


def test_greedy_rule_accepts_the_argmax_prefix():
    target = torch.nn.functional.one_hot(torch.tensor([[2, 3, 1, 0]]), V).float()
    v = greedy_verify(torch.tensor([[2, 3, 5]]), None, target)
    assert v.num_accepted.item() == 2 and v.next_tokens.item() == 1
    v = greedy_verify(torch.tensor([[2, 3, 1]]), None, target)
    assert v.num_accepted.item() == 3 and v.next_tokens.item() == 0


def test_point_mass_draft_rejection_resamples_without_the_draft():
    p = torch.tensor([[[0.5, 0.5, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0]]])
    n = 2000
    v = speculative_verify(torch.zeros(n, 1, dtype=torch.long), None, p.expand(n, 2, V),
                           torch.Generator().manual_seed(0))
    assert set(v.next_tokens[v.num_accepted == 0].tolist()) == {1}


# ------------------------------------------------------------------------------------------ LANTERN

def _neighbours():
    # codes on a line: the nearest neighbours of code i are i-1, i+1, i-2, ...
    table = []
    for i in range(V):
        others = sorted((j for j in range(V) if j != i), key=lambda j: (abs(j - i), j))
        table.append(others)
    return torch.tensor(table)


@pytest.mark.parametrize("delta", [0.05, 0.1, 0.3])
def test_lantern_relaxed_distribution_is_within_delta_of_the_target(delta):
    nb = _neighbours()
    for seed in range(20):
        p = _dists(seed)[0][0, 0]
        for x in range(V):
            p_tilde_x, absorbed = lantern_relaxation(p, torch.tensor(x), nb, delta=delta)
            relaxed = relaxed_distribution(p, torch.tensor(x), nb, absorbed)
            tv = 0.5 * (relaxed - p).abs().sum().item()
            assert tv <= delta + 1e-6
            assert abs(relaxed.sum().item() - 1) < 1e-5 and abs(relaxed[x].item() - p_tilde_x.item()) < 1e-6
            # maximal: the next neighbour would have broken the budget
            m = int(absorbed.sum())
            if m < V - 1:
                assert (p[nb[x, : m + 1]].sum() > delta)


def test_lantern_lambda_variant_caps_the_ratio():
    nb = _neighbours()
    for seed in range(20):
        p = _dists(seed)[0][0, 0]
        for x in range(V):
            p_tilde_x, _ = lantern_relaxation(p, torch.tensor(x), nb, lam=3.0)
            assert p_tilde_x.item() <= 3.0 * p[x].item() + 1e-6


def test_lantern_step_with_a_point_mass_draft_emits_the_relaxed_law():
    """Exact per-step law for deterministic drafts: the emitted token ~ p~_x, TV(p~_x, p) <= delta."""
    nb = _neighbours()
    p = _dists(3)[0]
    x, delta, n = 2, 0.2, 60000
    p_tilde_x, absorbed = lantern_relaxation(p[0, 0], torch.tensor(x), nb, delta=delta)
    law = relaxed_distribution(p[0, 0], torch.tensor(x), nb, absorbed)
    assert 0.5 * (law - p[0, 0]).abs().sum() <= delta + 1e-6
    g = torch.Generator().manual_seed(0)
    drafts = torch.full((n, 1), x)
    v = lantern_verify(drafts, None, torch.cat([p, p], 1).expand(n, 2, V), g, neighbours=nb, delta=delta)
    emitted = torch.where(v.num_accepted == 1, drafts[:, 0], v.next_tokens)[:, None]
    fit = chi_square_fit(emitted, torch.arange(V)[:, None], law)
    assert fit.passed, fit
    assert not chi_square_fit(emitted, torch.arange(V)[:, None], p[0, 0]).passed  # it is lossy, visibly


def test_lantern_with_zero_budget_is_exact_speculative_sampling():
    p, q = _dists(4, rows=64, k=3)
    target = torch.cat([p, p[:, :1]], 1)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=torch.Generator().manual_seed(0)).view(64, 3)
    a = speculative_verify(drafts, q, target, g1)
    b = lantern_verify(drafts, q, target, g2, neighbours=_neighbours(), delta=0.0)
    assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_tokens, b.next_tokens)
