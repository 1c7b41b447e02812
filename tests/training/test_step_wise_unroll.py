"""EAGLE-3's training-time test (``train-drafter --unroll N --step-wise``): each unrolled pass of
:meth:`FeatureDraftModel.unrolled_passes` computes exactly what the drafter computes for the same draft
of a decode chain, through its cache; the whole-pass unroll it replaces does not (the control)."""

import pytest
import torch

from visualspec.models.feature_drafter import FeatureDraftModel, chain_attention_mask
from visualspec.training.feature_drafter import feature_losses, pass_weights

D, L, PASSES = 32, 10, 3


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return FeatureDraftModel(feature_size=D, n_head=4, ffn_hidden=64, max_len=64).eval()


def decode_chain(net, emb, feats, m, drafts):
    """What decoding computes: real pairs at columns 0..m-1 through the cache, then a chain of
    ``drafts`` steps, each reading the token at its column and the feature the step before predicted.
    Returns the predicted features at columns m-1 (the real pass's last) .. m-1+drafts."""
    B = emb.shape[0]
    net.reset(B, L)
    columns = torch.arange(m).expand(B, -1)
    g = net.step(emb[:, :m], feats[:, :m], columns, compiled=False)[:, -1]
    out = [g]
    for j in range(1, drafts + 1):
        column = torch.full((B, 1), m - 1 + j)
        g = net.step(emb[:, m - 1 + j:m + j], g[:, None], column, compiled=False)[:, 0]
        out.append(g)
    return out


@torch.no_grad()
def test_each_pass_is_what_a_decode_chain_computes_at_that_depth(net):
    emb, feats = torch.randn(2, L, D), torch.randn(2, L, D)
    passes = net.unrolled_passes(emb, feats, PASSES, step_wise=True)
    assert torch.allclose(passes[0], net(emb, feats), atol=1e-6)  # pass 0 is the teacher-forced forward
    for m in (1, 3, 6):  # real columns before the chain
        chain = decode_chain(net, emb, feats, m, PASSES)
        for j in range(PASSES + 1):
            assert torch.allclose(passes[j][:, m - 1 + j], chain[j], atol=1e-5), (m, j)


@torch.no_grad()
def test_control_the_whole_pass_unroll_attends_predicted_columns_and_differs(net):
    """The unroll without ``step_wise`` (each pass attending its own columns) reads the same inputs
    but not the same context: from depth 1 on it is not what decoding computes."""
    emb, feats = torch.randn(2, L, D), torch.randn(2, L, D)
    chain = decode_chain(net, emb, feats, 3, 2)
    for j, g in enumerate(net.unrolled_passes(emb, feats, 2)):
        same = torch.allclose(g[:, 2 + j], chain[j], atol=1e-5)
        assert same == (j == 0), j


def test_the_mask_follows_its_formula():
    """Pass 2 over 4 columns: column c sees pass 0 up to c - 2, pass 1 at c - 1, pass 2 at c."""
    expected = torch.tensor([
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0],
        [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
        [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(chain_attention_mask(4, 2), expected)
    assert torch.equal(chain_attention_mask(4, 0), torch.ones(4, 4, dtype=torch.bool).tril())


def test_step_wise_losses_train_every_pass():
    """Every pass has its KL term, the teacher-forced one as without ``step_wise``, the later ones
    not; the loss reaches the drafter's weights."""
    torch.manual_seed(1)
    train = FeatureDraftModel(feature_size=D, n_head=4, ffn_hidden=64, max_len=64)
    head = torch.nn.Linear(D, 50, bias=False).requires_grad_(False)
    feats, emb = torch.randn(2, L + 1, D), torch.randn(2, L, D)
    plain = feature_losses(train, feats, emb, head, unroll=2, kl_weight=1.0)
    stepped = feature_losses(train, feats, emb, head, unroll=2, kl_weight=1.0, step_wise=True)
    assert set(stepped) == {"loss", "kl0", "kl1", "kl2"}
    assert stepped["kl0"] == pytest.approx(plain["kl0"])  # the teacher-forced pass is the same
    assert stepped["kl2"] != pytest.approx(plain["kl2"])
    stepped["loss"].backward()
    assert train.layer.attention.wqkv.weight.grad.abs().sum() > 0


def test_pass_weights_decay_and_sum_to_one():
    assert pass_weights(3, 1.0) == pytest.approx([1 / 3] * 3)
    w = pass_weights(4, 0.8)
    assert sum(w) == pytest.approx(1.0) and [b / a for a, b in zip(w, w[1:])] == pytest.approx([0.8] * 3)


def test_eagle_3s_loss_is_the_decayed_sum_of_the_passes_kl():
    """``regression_weight=0`` (``--no-feature-loss``) and ``decay=0.8`` (``--pass-decay``): the loss
    is sum_j w_j KL_j exactly; with the feature loss back it is larger (the control)."""
    torch.manual_seed(2)
    net = FeatureDraftModel(feature_size=D, n_head=4, ffn_hidden=64, max_len=64)
    head = torch.nn.Linear(D, 50, bias=False).requires_grad_(False)
    feats, emb = torch.randn(2, L + 1, D), torch.randn(2, L, D)
    out = feature_losses(net, feats, emb, head, unroll=3, kl_weight=1.0, step_wise=True, decay=0.8,
                         regression_weight=0.0)
    kl = [out[f"kl{j}"] for j in range(4)]
    assert float(out["loss"]) == pytest.approx(sum(w * k for w, k in zip(pass_weights(4, 0.8), kl)), rel=1e-5)
    with_features = feature_losses(net, feats, emb, head, unroll=3, kl_weight=1.0, step_wise=True, decay=0.8)
    assert float(with_features["loss"]) > float(out["loss"]) + 0.01
