import pytest
import torch

from visualspec.core.sampling import SamplingConfig, filter_epsilon, filter_top_k_top_p, sample, uniform


def test_guidance_formula_applies_to_logits_before_temperature():
    cond, uncond = torch.randn(2, 5), torch.randn(2, 5)
    sc = SamplingConfig(guidance_scale=3.0, temperature=0.7)
    expected = torch.softmax((uncond + 3.0 * (cond - uncond)) / 0.7, -1)
    torch.testing.assert_close(sc.probs(torch.cat([cond, uncond])), expected)


def test_top_k_and_top_p_keep_the_right_sets():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert torch.isinf(filter_top_k_top_p(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # nucleus 0.6: 0.4 then 0.3 reaches 0.7 >= 0.6, so two tokens stay
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.6)).tolist() == [[False, False, True, True]]
    # the most likely token always stays
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.01)).tolist() == [[False, True, True, True]]


def test_epsilon_cutoff_is_taken_from_the_conditional_before_guidance():
    cond = torch.log(torch.tensor([[0.6, 0.3, 0.0995, 0.0005]]))
    uncond = torch.log(torch.tensor([[0.4, 0.4, 0.1995, 0.0005 / 64]]))
    # guidance 3 weights token 3 by (cond / uncond)^2 = 64^2: it becomes the most likely token
    guided = SamplingConfig(guidance_scale=3.0).probs(torch.cat([cond, uncond]))
    assert guided.argmax().item() == 3
    # the cut-off looks at the conditional (token 3: 0.0005 < 0.001) and removes it; the guided
    # distribution is renormalised over the rest, keeping guidance's weights among them
    cut = SamplingConfig(guidance_scale=3.0, epsilon_cutoff=1e-3).probs(torch.cat([cond, uncond]))
    assert cut[0, 3] == 0
    torch.testing.assert_close(cut[0, :3], guided[0, :3] / guided[0, :3].sum())
    # without guidance it is epsilon sampling on the model's distribution; at temperature 0 the
    # argmax is taken among the kept tokens
    plain = SamplingConfig(epsilon_cutoff=0.2).probs(cond)
    torch.testing.assert_close(plain, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    assert SamplingConfig(guidance_scale=3.0, epsilon_cutoff=1e-3, temperature=0).probs(
        torch.cat([cond, uncond])).argmax().item() == 0


def test_epsilon_cutoff_always_keeps_the_conditionals_most_likely_token():
    logits = torch.zeros(2, 10)  # uniform: every token at 0.1
    assert torch.isinf(filter_epsilon(logits, logits, 0.5)).sum(-1).tolist() == [9, 9]


def test_greedy_is_a_point_mass_on_the_argmax():
    logits = torch.tensor([[0.1, 2.0, 0.3]])
    assert SamplingConfig(temperature=0).probs(logits).tolist() == [[0.0, 1.0, 0.0]]


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-1), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(guidance_scale=-0.5), "guidance_scale"),
    (dict(epsilon_cutoff=1.0), "epsilon_cutoff"), (dict(epsilon_cutoff=-0.1), "epsilon_cutoff")])
def test_bad_sampling_arguments_name_the_problem(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


def test_sample_follows_the_distribution_and_never_picks_zero_mass():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0]).repeat(40000, 1)
    draws = sample(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=5).double() / 40000
    assert counts[1] == 0 and counts[4] == 0
    # 6 standard deviations of a binomial proportion at n = 40000
    tol = 6 * (0.25 / 40000) ** 0.5
    assert torch.allclose(counts, probs[0].double(), atol=tol)


def test_per_row_generators_are_reproducible_and_independent_of_the_batch():
    probs = torch.softmax(torch.randn(3, 50), -1)
    gens = lambda: [torch.Generator().manual_seed(s) for s in (1, 2, 3)]  # noqa: E731
    a = sample(probs, gens())
    b = sample(probs, gens())
    alone = sample(probs[1:2], [torch.Generator().manual_seed(2)])
    assert torch.equal(a, b) and a[1] == alone[0]
    with pytest.raises(ValueError, match="generators"):
        uniform((4,), gens())
