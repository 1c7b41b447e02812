"""MAR's diffusion head: the official parameter layout, the respaced cosine schedule, sampling from
given noise (aligned trajectories) and the last step's Gaussian that CSpD verifies against."""

import json
import math

import pytest
import torch

from conftest import FIXTURES
from visualspec.core.continuous import continuous_verify
from visualspec.models.diffusion_head import DiffusionHead, DiffusionSchedule, space_timesteps

LAYOUT = json.loads((FIXTURES / "mar_keys.json").read_text())  # the official MAR's keys and shapes
Z_CHANNELS = {"mar_base": 768, "mar_large": 1024, "mar_huge": 1280}


@pytest.mark.parametrize("name", sorted(LAYOUT["configs"]))
def test_the_head_has_marss_official_keys_and_shapes(name):
    cfg = LAYOUT["configs"][name]
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        head = DiffusionHead(16, Z_CHANNELS[name], cfg["diffloss_d"], cfg["diffloss_w"])
    ours = {f"diffloss.{k}": list(v.shape) for k, v in head.state_dict().items()}
    assert ours == {k: v for k, v in LAYOUT["keys"][name].items() if k.startswith("diffloss.")}


def _alpha_bar(s):
    return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2


def test_the_schedule_is_the_cosine_one_respaced():
    full = DiffusionSchedule(1000)
    expected = [min(1 - _alpha_bar((i + 1) / 1000) / _alpha_bar(i / 1000), 0.999) for i in range(1000)]
    assert torch.allclose(full.beta, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert space_timesteps(1000, 100)[:3] == [0, 10, 20] and space_timesteps(1000, 100)[-1] == 999
    s = DiffusionSchedule(100)
    assert len(s) == 100 and s.timesteps.tolist() == space_timesteps(1000, 100)
    # respaced betas chain the kept steps' alpha_bar; the first posterior variance is clipped (it is 0)
    # (alpha_bar(t) / alpha_bar(0) for every kept step but the last, whose beta is capped at 0.999)
    abar = torch.tensor([_alpha_bar((t + 1) / 1000) / _alpha_bar(0) for t in s.timesteps.tolist()], dtype=torch.float64)
    assert torch.allclose((1 - s.beta).cumprod(0)[:-1], abar[:-1], rtol=1e-9)
    assert s.log_posterior[0] == s.log_posterior[1] and torch.isfinite(s.log_posterior).all()
    with pytest.raises(ValueError, match="num_sampling_steps"):
        DiffusionSchedule(0)


def _head(seed, depth=2, width=48, steps=10):
    torch.manual_seed(seed)
    head = DiffusionHead(4, 24, depth, width, num_sampling_steps=steps)
    for p in head.parameters():  # a trained head's layers are not zero: give every layer weight
        torch.nn.init.normal_(p, std=0.1)
    return head


def test_the_token_is_a_draw_from_the_returned_last_step_gaussian():
    head = _head(0)
    z = torch.randn(6, 24)
    noise = head.noise(6, torch.Generator().manual_seed(1))
    token, last = head.sample(z, noise)
    assert torch.allclose(token, last.mean + last.std * noise["eps"][0], atol=1e-6)
    assert bool((last.std > 0).all())  # the last step has a density
    mar_token, mar_last = head.sample(z, noise, last_step_noise=False)  # MAR's sampler: the mean itself
    assert torch.equal(mar_token, mar_last.mean) and torch.allclose(mar_last.mean, last.mean)


def test_shared_noise_aligns_two_heads():
    target, same, other = _head(0), _head(0), _head(1)
    z = torch.randn(8, 24)
    noise = target.noise(8, torch.Generator().manual_seed(2))
    x, p = target.sample(z, noise)
    y, q = same.sample(z, noise)
    assert torch.equal(x, y)
    fresh = target.noise(8, torch.Generator().manual_seed(3))
    w, _ = other.sample(z, noise)
    v, _ = other.sample(z, fresh)
    assert (w - x).norm() < (v - x).norm()  # the same noise brings another head's token closer
    # a draft head identical to the target is always accepted: the density ratio is 1
    verdict = continuous_verify(y[:, None], q[:, None], type(p)(torch.stack([p.mean, p.mean], 1),
                                                                 torch.stack([p.std, p.std], 1)))
    assert bool((verdict.num_accepted == 1).all())


def test_guidance_with_equal_conditions_changes_nothing():
    head = _head(2)
    z = torch.randn(3, 24)
    noise = head.noise(3, torch.Generator().manual_seed(4))
    plain, _ = head.sample(z, noise)
    guided, _ = head.sample(torch.cat([z, z]), noise, guidance=4.0)
    assert torch.allclose(plain, guided, atol=1e-5)
    other, _ = head.sample(torch.cat([z, torch.randn(3, 24)]), noise, guidance=4.0)
    assert not torch.allclose(plain, other, atol=1e-3)


class _BayesNet(torch.nn.Module):
    """The exact denoiser for tokens x0 ~ N(mu, s^2) per channel: E[eps | x_t] or E[v | x_t] at the
    training step t (the variance outputs stay 0, the middle of their range, as a head trained
    without them)."""

    def __init__(self, mu, s, predict):
        super().__init__()
        self.mu, self.s, self.predict = mu, s, predict

    def forward(self, x, t, z):
        from visualspec.models.diffusion_head import _training_alpha_bar

        abar = _training_alpha_bar()[t].to(x.dtype)[:, None]
        a, b = abar.sqrt(), (1 - abar).sqrt()
        var = a ** 2 * self.s ** 2 + b ** 2  # x_t = a x0 + b eps has variance a^2 s^2 + b^2 about a mu
        eps = b * (x - a * self.mu) / var
        x0 = self.mu + a * self.s ** 2 * (x - a * self.mu) / var
        out = eps if self.predict == "epsilon" else a * eps - b * x0
        return torch.cat([out, torch.zeros_like(out)], 1)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_a_bayes_optimal_head_samples_the_data_law(prediction_type):
    """With the exact denoiser for Gaussian tokens, 50 sampling steps reproduce their mean and
    standard deviation (4,000 draws: the mean's standard error is s / 63, tolerance 0.08 s; the
    std's about 1.1 %, tolerance 8 %); the control reads the same network with the other prediction
    type and misses."""
    mu, s = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([0.3, 1.0, 0.5, 1.5])
    n = 4000
    head = DiffusionHead(4, 24, 1, 16, num_sampling_steps=50, prediction_type=prediction_type)
    head.net = _BayesNet(mu, s, prediction_type)
    tokens, _ = head.sample(torch.zeros(n, 24), head.noise(n, torch.Generator().manual_seed(0)))
    assert torch.all((tokens.mean(0) - mu).abs() < 0.08 * s), tokens.mean(0)
    assert torch.all((tokens.std(0) / s - 1).abs() < 0.08), tokens.std(0)
    other = "epsilon" if prediction_type == "v_prediction" else "v_prediction"
    wrong = DiffusionHead(4, 24, 1, 16, num_sampling_steps=50, prediction_type=other)
    wrong.net = head.net
    bad, _ = wrong.sample(torch.zeros(n, 24), head.noise(n, torch.Generator().manual_seed(0)))
    assert not torch.all((bad.mean(0) - mu).abs() < 0.08 * s) or not torch.all((bad.std(0) / s - 1).abs() < 0.08)


def test_the_loss_target_matches_the_prediction_type():
    mu, s = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([0.3, 1.0, 0.5, 1.5])
    x0 = mu + s * torch.randn(20000, 4, generator=torch.Generator().manual_seed(1))
    losses = {}
    for kind in ("epsilon", "v_prediction"):
        for net in ("epsilon", "v_prediction"):
            head = DiffusionHead(4, 24, 1, 16, prediction_type=kind)
            head.net = _BayesNet(mu, s, net)
            losses[kind, net] = head.loss(x0, torch.zeros(len(x0), 24), torch.Generator().manual_seed(2)).item()
    # each loss is smallest for the network that predicts what the head's type says (the Bayes risk)
    assert losses["epsilon", "epsilon"] < 0.5 * losses["epsilon", "v_prediction"]
    assert losses["v_prediction", "v_prediction"] < 0.5 * losses["v_prediction", "epsilon"]
    with pytest.raises(ValueError, match="prediction_type must be one of"):
        DiffusionHead(4, 24, 1, 16, prediction_type="sample")
