"""DistillSpec's divergences (#50): hand values, and what each is zero or large for."""

import math

import pytest
import torch

from visualspec.training.distill import distill_divergence


def logits(*probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def test_divergences_on_hand_values():
    p, q = logits(0.5, 0.5), logits(0.9, 0.1)  # teacher p, student q
    assert float(distill_divergence(q, p, "tvd")) == pytest.approx(0.4)  # one minus the acceptance 0.6
    assert float(distill_divergence(q, p, "fkl")) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1))
    assert float(distill_divergence(q, p, "rkl")) == pytest.approx(0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5))
    m = (0.7, 0.3)
    jsd = 0.5 * sum(a * math.log(a / c) for a, c in zip((0.5, 0.5), m)) \
        + 0.5 * sum(b * math.log(b / c) for b, c in zip((0.9, 0.1), m))
    assert float(distill_divergence(q, p, "jsd", beta=0.5)) == pytest.approx(jsd)


@pytest.mark.parametrize("kind", ["tvd", "fkl", "rkl", "jsd"])
def test_each_divergence_is_zero_only_where_draft_and_target_agree(kind):
    p = torch.randn(4, 7, dtype=torch.float64)
    assert torch.allclose(distill_divergence(p, p, kind), torch.zeros(4), atol=1e-6)  # computed in float32
    assert (distill_divergence(p + torch.randn(4, 7, dtype=torch.float64), p, kind) > 1e-6).all()


def test_an_unknown_divergence_or_beta_is_named():
    p = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="unknown divergence 'kl'"):
        distill_divergence(p, p, "kl")
    with pytest.raises(ValueError, match="beta must lie in"):
        distill_divergence(p, p, "jsd", beta=1.0)
