"""The judge's recipe (visualspec.training.judge): the drafts it records are the ones the exact rule
rejected, with the features a judge reads; the continuations share their random numbers; the fit
and the threshold rule."""

import numpy as np
import pytest
import torch

from visualspec.core.sampling import SamplingConfig, inverse_cdf
from visualspec.models.judge import JudgeHead
from visualspec.pipelines.tiny import tiny_random_pipeline
from visualspec.training.judge import (JudgeConfig, auc, coupled_continuations, fit_head, pick_threshold,
                                       record_rejections)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPTS = ["a red circle", "two blue squares"]


@pytest.fixture(scope="module")
def pipe():
    p = tiny_random_pipeline(seed=0)
    p.set_progress_bar_config(disable=True)
    return p


def _teacher_forced(pipe, prompts, tokens, sampling):
    """The transformer's guided distributions (B, N, V) and conditional features (B, N, D) over
    whole token sequences: row j's predicts token j."""
    gpt = pipe.transformer
    captions, mask = pipe._conditions(prompts, None, 1)
    B = tokens.shape[0]
    null = gpt.null_condition(B).to(captions.dtype)
    both = dict(cond_mask=torch.cat([mask, torch.ones_like(mask)]))  # the prefix's [cond; null], as _prefix lays it
    with torch.no_grad():
        logits = gpt(torch.cat([captions, null]), torch.cat([tokens, tokens]), **both)
        feats = gpt(torch.cat([captions, null]), torch.cat([tokens, tokens]), features=True, **both)[:B]
    return sampling.probs(logits), feats


def test_recorded_drafts_are_the_rejected_ones_with_the_feature_at_their_own_column(pipe):
    tokens, rec = record_rejections(pipe, PROMPTS, [0, 1], window=4)
    n = len(rec["draft"])
    assert n > 50 and set(rec["request"].tolist()) == {0, 1}
    committed = tokens[rec["request"], rec["position"]]
    # a rejected Jacobi draft has p(d) < q(d), so the residual the target emitted there is never d
    assert not torch.any(committed == rec["draft"])
    # the feature is the target's at d's column given the committed prefix (teacher-forced)
    sampling = SamplingConfig(guidance_scale=pipe.config.default_guidance_scale,
                              epsilon_cutoff=pipe.config.default_epsilon_cutoff)
    picks = torch.arange(0, n, max(1, n // 12))
    for i in picks.tolist():
        r, t, d = int(rec["request"][i]), int(rec["position"][i]), int(rec["draft"][i])
        swapped = tokens[r:r + 1].clone()
        swapped[0, t] = d
        probs, feats = _teacher_forced(pipe, [PROMPTS[r]], swapped, sampling)
        assert torch.allclose(rec["feature"][i], feats[0, t + 1].float(), atol=1e-4)
        assert not torch.allclose(rec["feature"][i], feats[0, t].float(), atol=1e-4)  # the column before
        p = probs[0, t]
        assert torch.allclose(rec["distribution"][i, 0], p[d].clamp(min=1e-12).log(), atol=1e-4)


def test_continuations_keep_their_forced_tokens_and_draw_the_rest_at_their_uniforms(pipe):
    model, sampling = pipe.transformer, SamplingConfig(guidance_scale=pipe.config.default_guidance_scale)
    N = model.config.block_size
    g = torch.Generator().manual_seed(0)
    forced = torch.randint(0, model.config.vocab_size, (3, N), generator=g)
    upto = torch.tensor([5, 40, 5])
    u = torch.rand(3, N, generator=g)
    u[2] = u[0]  # rows 0 and 2: the same prefix, the same uniforms
    forced[2, :6] = forced[0, :6]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    cond = pipe._conditions(prompts, None, 1)
    out = coupled_continuations(model, pipe._prefix(model, cond, sampling), sampling, forced, upto, u)
    for r in range(3):
        assert torch.equal(out[r, :upto[r] + 1], forced[r, :upto[r] + 1])
    assert torch.equal(out[0], out[2])
    # every drawn token is the inverse CDF of the target's distribution there at its uniform
    probs, _ = _teacher_forced(pipe, prompts, out, sampling)
    drawn = inverse_cdf(probs, u)
    for r in range(3):
        assert torch.equal(out[r, upto[r] + 1:], drawn[r, upto[r] + 1:])
    # one row alone gives the same tokens (rows do not leak into each other)
    alone = coupled_continuations(model, pipe._prefix(model, pipe._conditions(prompts[1:2], None, 1), sampling),
                                  sampling, forced[1:2], upto[1:2], u[1:2])
    assert torch.equal(alone[0], out[1])


def test_the_threshold_rule_takes_the_lowest_passing_threshold_or_the_exact_rule():
    scores = {0.5: 0.60, 0.6: 0.69, 0.7: 0.70, 0.9: 0.72}
    assert pick_threshold(scores, exact=0.71, max_drop=0.02) == 0.6
    assert pick_threshold(scores, exact=0.71, max_drop=0.0) == 0.9
    assert pick_threshold(scores, exact=0.80, max_drop=0.02) == 1.0


def test_auc_counts_ordered_pairs_and_ties_half():
    assert auc(np.array([0.9, 0.8, 0.1]), np.array([1.0, 1.0, 0.0])) == 1.0
    assert auc(np.array([0.1, 0.9]), np.array([1.0, 0.0])) == 0.0
    assert auc(np.array([0.5, 0.5]), np.array([1.0, 0.0])) == 0.5


def test_the_head_fits_labels_its_inputs_predict_and_validates_on_held_out_prompts():
    g = torch.Generator().manual_seed(0)
    n, d = 600, 8
    feature = torch.randn(n, d, generator=g)
    distribution = torch.randn(n, 2, generator=g)
    harmless = (feature[:, 0] + 0.5 * distribution[:, 1] > 0).float()
    data = {"feature": feature, "distribution": distribution, "harmless": harmless,
            "prompt": torch.arange(n) // 3, "position": torch.zeros(n, dtype=torch.long)}
    head = JudgeHead(feature_size=d)
    fit = fit_head(head, data, JudgeConfig(l2=1e-3))
    assert fit["validation_auc"] > 0.97 and fit["validation_labels"] == 120
    assert fit["validation_bce"] < 0.5 * fit["constant_bce"]
    # the candidate thresholds keep 90 %, 75 %, 50 % and 25 % of the validation drafts
    # (of all drafts, validation and training alike, within sampling error)
    with torch.no_grad():
        scores = torch.sigmoid(head(torch.cat([feature, distribution], -1)))
    kept = [float((scores > t).float().mean()) for t in fit["thresholds"]]
    assert fit["thresholds"] == sorted(fit["thresholds"])
    assert all(abs(k - share) < 0.1 for k, share in zip(kept, (0.9, 0.75, 0.5, 0.25))), kept
    shuffled = dict(data, harmless=harmless[torch.randperm(n, generator=g)])  # control: labels the inputs do not predict
    assert fit_head(JudgeHead(feature_size=d), shuffled, JudgeConfig(l2=1e-3))["validation_auc"] < 0.7


def test_labels_are_mined_in_saved_chunks_a_rerun_reads_back(pipe, tmp_path, monkeypatch):
    """Stages 1 and 2 on six prompts in chunks of four: each chunk is saved, every label is a
    recorded rejection (at most two per image, each image's own), and a rerun reads the chunks
    back instead of decoding again (the control: with a chunk removed it decodes that chunk)."""
    import visualspec.training.judge as judge

    cfg = JudgeConfig(prompts_per_task=1, batch=4, drafts_per_image=2, window=4, rows=8)
    data = judge.mine_labels(pipe, cfg, tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.glob("labels-*.pt")) == ["labels-00000.pt", "labels-00004.pt"]
    n = len(data["harmless"])
    assert 0 < n <= 12 and set(data["harmless"].tolist()) <= {0.0, 1.0}
    assert all(torch.bincount(data["prompt"], minlength=6) <= 2)
    assert data["feature"].shape == (n, pipe.transformer.config.dim)
    decoded = []
    record = judge.record_rejections
    monkeypatch.setattr(judge, "record_rejections",
                        lambda pipe, texts, *a: decoded.append(texts) or record(pipe, texts, *a))
    again = judge.mine_labels(pipe, cfg, tmp_path, progress=False)
    assert not decoded and all(torch.equal(again[k], data[k]) for k in data)
    (tmp_path / "labels-00004.pt").unlink()
    again = judge.mine_labels(pipe, cfg, tmp_path, progress=False)
    assert len(decoded) == 1 and len(decoded[0]) == 2 and all(torch.equal(again[k], data[k]) for k in data)
