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


def _bucket_case(greedy: bool, rows: int = 600, k: int = 3, run: int = 8, vocab: int = 11):
    """A verifier, and a window of ``k`` drafts with its step's arguments and the logits of a step
    run in a bucket of ``run`` tokens (the columns past the window's are padding's, random). Half
    the rows draft what the target would accept whatever the uniforms (its argmax; sampled, a draw
    from q = p), so that they accept every real draft and emit the bonus token; half draft at random."""
    from visualspec.core.sampling import SamplingConfig
    from visualspec.core.verify import StepVerifier

    g = torch.Generator().manual_seed(5)
    sampling = SamplingConfig(temperature=0.0 if greedy else 1.0)
    logits = torch.randn(rows, run, vocab, generator=g, dtype=torch.float64)
    p = sampling.probs(logits[:, :k + 1])
    good = torch.arange(rows) < rows // 2
    if greedy:
        drafts = torch.where(good[:, None], p[:, :k].argmax(-1), torch.randint(0, vocab, (rows, k), generator=g))
        q = u = u_emit = None
    else:
        q = torch.where(good[:, None, None], p[:, :k], torch.rand(rows, k, vocab, generator=g, dtype=p.dtype).softmax(-1))
        drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(rows, k)
        u, u_emit = torch.rand(rows, k, generator=g, dtype=torch.float64), torch.rand(rows, generator=g, dtype=torch.float64)
    return StepVerifier(sampling), logits, (torch.zeros(rows, dtype=torch.long), drafts, q, u, u_emit)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_a_window_padded_to_its_bucket_gets_its_own_verdict(greedy):
    """A step run in a power-of-two bucket (the transformers adapters' compiled windows) pads its
    drafts with ones no rule accepts (:meth:`StepVerifier.padded`): its verdict is the window's own at
    the same uniforms, for rows that reject early and for rows that accept every real draft (they
    emit the bonus token from the window's last column, not a padding column's). The control pads
    with drafts the target would accept (its argmax; a draw from q = p), and changes the verdicts of
    the rows that accepted every real draft."""
    verifier, logits, args = _bucket_case(greedy)
    k, run = args[1].shape[1], logits.shape[1]
    probs, accepted, tokens = verifier(logits[:, :k + 1], *args)
    assert 0 < int((accepted == k).sum()) and bool((accepted < k).any())  # both kinds of rows, in every case
    padded = verifier.cropped(verifier(logits, *verifier.padded(args, k + 1, run)), k + 1)
    torch.testing.assert_close(padded[0], probs, rtol=0, atol=0)
    assert torch.equal(padded[1], accepted) and torch.equal(padded[2], tokens)

    partner, drafts, q, u, u_emit = args  # the control: padding the target accepts, its argmax with q = p
    p = verifier.sampling.probs(logits)[:, k:run - 1]  # at the padding columns
    control = (partner, torch.cat([drafts, p.argmax(-1)], 1), None if greedy else torch.cat([q, p], 1),
               None if greedy else torch.nn.functional.pad(u, (0, run - 1 - k)), u_emit)
    _, accepted_c, tokens_c = verifier(logits, *control)
    assert torch.equal(accepted_c[accepted < k], accepted[accepted < k])
    assert bool((accepted_c[accepted == k] > k).all())  # every row that took the real drafts took the padding too
