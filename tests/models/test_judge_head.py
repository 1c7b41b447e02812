"""The judge head of judge decoding: its inputs, scores, folder round trip and target check."""

import math

import pytest
import torch

from conftest import tiny_llamagen
from visualspec.models.feature_drafter import weights_hash
from visualspec.models.judge import JudgeHead, check_judge, distribution_inputs

D, V = 8, 5


def _trained(hidden=0, seed=0, **config):
    """A head with random weights and a scaler set from skewed inputs (a mean far from 0, a spread
    far from 1), as training leaves it."""
    torch.manual_seed(seed)
    head = JudgeHead(feature_size=D, hidden=hidden, **config)
    for p in head.net.parameters():
        torch.nn.init.normal_(p, std=0.5)
    head.set_scaler(3 * torch.randn(200, D + 2) + 2)
    return head.eval()


def _window(rows=3, k=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, k, D, generator=g)
    probs = torch.softmax(2 * torch.randn(rows, k, V, generator=g), -1)
    drafts = torch.randint(0, V, (rows, k), generator=g)
    return features, drafts, probs


def test_distribution_inputs_are_log_p_of_the_draft_and_the_entropy():
    probs = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    got = distribution_inputs(torch.tensor([0, 3, 2]), probs)
    expected = torch.tensor([[0.0, 0.0], [math.log(0.25), math.log(4)], [math.log(1e-12), math.log(2)]])
    torch.testing.assert_close(got, expected)
    features, drafts, probs = _window()
    inputs = JudgeHead.inputs(features, drafts, probs)
    assert inputs.shape == (3, 4, D + 2)
    torch.testing.assert_close(inputs[..., :D], features)
    torch.testing.assert_close(inputs[..., D:], distribution_inputs(drafts, probs))


def test_the_scaler_standardises_the_training_inputs():
    head = JudgeHead(feature_size=D)
    inputs = 3 * torch.randn(500, D + 2, generator=torch.Generator().manual_seed(0)) + 2
    inputs[:, 1] = 7.0  # a constant column: its spread is floored, not zero
    head.set_scaler(inputs)
    torch.testing.assert_close(head.mean, inputs.mean(0))
    assert head.scale[1] == pytest.approx(1e-4) and head.scale[0] == pytest.approx(float(inputs[:, 0].std()))
    standardised = (inputs - head.mean) / head.scale
    torch.testing.assert_close(standardised[:, [0, 2]].mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(standardised[:, [0, 2]].std(0), torch.ones(2))


@pytest.mark.parametrize("hidden", [0, 6])
def test_scores_are_probabilities_of_the_drafts_shape(hidden):
    head = _trained(hidden)
    features, drafts, probs = _window()
    scores = head.score(features, drafts, probs)
    assert scores.shape == drafts.shape and scores.dtype == torch.float32
    assert ((scores >= 0) & (scores <= 1)).all() and scores.std() > 0.01  # they differ from draft to draft
    # the score is the sigmoid of the head on the standardised inputs
    x = (JudgeHead.inputs(features, drafts, probs) - head.mean) / head.scale
    torch.testing.assert_close(scores, torch.sigmoid(head.net(x).squeeze(-1)))
    assert isinstance(head.net, torch.nn.Linear) == (hidden == 0)
    # a float64 window (a float64 target's features) is scored too
    torch.testing.assert_close(head.score(features.double(), drafts, probs.double()), scores)


def test_the_bias_moves_every_score_to_an_end():
    head = _trained()
    features, drafts, probs = _window()
    with torch.no_grad():
        head.net.bias.fill_(100.0)
    assert (head.score(features, drafts, probs) > 0.999).all()
    with torch.no_grad():
        head.net.bias.fill_(-100.0)
    assert (head.score(features, drafts, probs) < 0.001).all()


@pytest.mark.parametrize("hidden", [0, 6])
def test_a_saved_head_loads_with_its_scaler_weights_and_config(tmp_path, hidden):
    head = _trained(hidden, threshold=0.35, target_hash="0123456789abcdef", outcome="geneval-shapes verdict")
    head.save_pretrained(tmp_path)
    loaded = JudgeHead.from_pretrained(tmp_path).eval()
    keys = ("feature_size", "hidden", "threshold", "target_hash", "outcome")
    assert {k: loaded.config[k] for k in keys} == {k: head.config[k] for k in keys}
    assert (loaded.config.threshold, loaded.config.target_hash, loaded.config.hidden) == (0.35, "0123456789abcdef",
                                                                                            hidden)
    saved, got = head.state_dict(), loaded.state_dict()
    assert saved.keys() == got.keys() and {"mean", "scale"} <= set(got)
    for name in saved:
        assert torch.equal(saved[name], got[name]), name
    features, drafts, probs = _window()
    torch.testing.assert_close(loaded.score(features, drafts, probs), head.score(features, drafts, probs))
    # the control: the same weights with a fresh scaler score differently, so the buffers were what kept them
    fresh = JudgeHead(feature_size=D, hidden=hidden)
    fresh.net.load_state_dict(head.net.state_dict())
    assert not torch.allclose(fresh.score(features, drafts, probs), head.score(features, drafts, probs), atol=1e-3)


def test_check_judge_wants_the_targets_width_and_weights():
    target = tiny_llamagen(dim=32)
    check_judge(JudgeHead(feature_size=32, target_hash=weights_hash(target)), target, target.feature_size)
    check_judge(JudgeHead(feature_size=32), target, target.feature_size)  # no recorded target: any of that width
    with pytest.raises(ValueError, match="the judge reads features of width 16, but the target's are 32 wide"):
        check_judge(JudgeHead(feature_size=16, target_hash=weights_hash(target)), target, target.feature_size)
    other = tiny_llamagen(seed=1, dim=32)
    assert weights_hash(other) != weights_hash(target)
    with pytest.raises(ValueError, match=f"hash to {weights_hash(other)}; this target's hash to {weights_hash(target)}"):
        check_judge(JudgeHead(feature_size=32, target_hash=weights_hash(other)), target, target.feature_size)
