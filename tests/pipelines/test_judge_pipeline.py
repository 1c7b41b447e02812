"""decoding="judge" in the LlamaGen pipeline: Jacobi drafts verified by the exact rule or a judge
head on the transformer's own features."""

import numpy as np
import pytest
import torch

from visualspec import VisualSpecPipeline
from visualspec.models.feature_drafter import weights_hash
from visualspec.models.judge import JudgeHead
from visualspec.pipelines import LlamaGenPipeline
from visualspec.pipelines.tiny import tiny_random_pipeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny CPU workloads

PROMPT = "a photo of a red circle"
FIXED = dict(window=4, seed=0, compile=False, output_type="latent")


def _head(transformer, bias=None, **config):
    """A judge for ``transformer``; ``bias`` sets its logit for every draft (100: keep all)."""
    head = JudgeHead(feature_size=transformer.config.dim, target_hash=weights_hash(transformer), **config)
    if bias is not None:
        with torch.no_grad():
            head.net.weight.zero_()
            head.net.bias.fill_(bias)
    return head


@pytest.fixture(scope="module")
def pipe():
    p = tiny_random_pipeline(seed=0)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture
def judged(pipe):
    """``pipe`` with a judge that keeps every draft (the module's pipe gets none back after)."""
    pipe.register_modules(judge=_head(pipe.transformer, bias=100.0))
    yield pipe
    pipe.register_modules(judge=None)


def test_threshold_one_gives_sjds_tokens_and_a_low_one_keeps_drafts(judged):
    sjd = judged(PROMPT, decoding="sjd", **FIXED)
    exact = judged(PROMPT, decoding="judge", judge_threshold=1.0, **FIXED)
    assert torch.equal(exact.images, sjd.images)
    assert exact.stats.target_forwards == sjd.stats.target_forwards and exact.stats.judged_tokens == 0
    kept = judged(PROMPT, decoding="judge", judge_threshold=0.0, **FIXED)
    assert kept.stats.judged_tokens > 0 and kept.stats.judged_at.shape == (1, 256)
    assert kept.stats.judged_tokens == int(kept.stats.judged_at.sum())
    assert kept.stats.target_forwards < sjd.stats.target_forwards
    assert not torch.equal(kept.images, sjd.images)  # lossy: the judge's drafts change the image
    assert kept.stats.to_dict()["judged_tokens"] == kept.stats.judged_tokens


def test_calls_in_batches_join_where_the_judge_kept_drafts_and_the_map_shows_them(judged):
    out = judged([PROMPT, "a photo of a blue square"], decoding="judge", judge_threshold=0.0, batch_size=1, **FIXED)
    stats = out.stats
    assert stats.batch_size == 2 and stats.judged_at.shape == (2, 256)
    assert stats.judged_tokens == int(stats.judged_at.sum()) and stats.judged_at[1].any()
    image = torch.from_numpy(np.array(stats.acceptance_map_image(16, 16, scale=1, index=1)))  # (16, 16, 3)
    red = (image == torch.tensor([230, 40, 40])).all(-1)
    assert torch.equal(red, stats.judged_at[1].view(16, 16))


def test_the_default_threshold_is_the_judges_own(pipe):
    pipe.register_modules(judge=_head(pipe.transformer, bias=100.0, threshold=1.0))
    try:
        sjd = pipe(PROMPT, decoding="sjd", **FIXED)
        own = pipe(PROMPT, decoding="judge", **FIXED)  # the folder's 1.0: nothing beyond the exact rule
        assert torch.equal(own.images, sjd.images) and own.stats.judged_tokens == 0
        assert pipe(PROMPT, decoding="judge", judge_threshold=0.5, **FIXED).stats.judged_tokens > 0
    finally:
        pipe.register_modules(judge=None)


def test_judge_is_a_decoding_only_with_a_judge(pipe):
    assert "judge" not in pipe.available_decodings()
    pipe.register_modules(judge=_head(pipe.transformer))
    try:
        assert "judge" in pipe.available_decodings()
    finally:
        pipe.register_modules(judge=None)
    assert LlamaGenPipeline.bench_mode("judge@0.9") == dict(decoding="judge", judge_threshold=0.9, compile=False)


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="judge"), "decoding='judge' needs a judge"),
    (dict(decoding="sjd", judge_threshold=0.5), "judge_threshold is for decoding='judge', not 'sjd'"),
])
def test_judge_arguments_without_a_judge_get_clear_errors(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(PROMPT, **FIXED, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="judge", judge_threshold=2), r"judge_threshold must be a number in \[0, 1\], got 2"),
    (dict(decoding="judge", judge_threshold=-0.5), r"judge_threshold must be a number in \[0, 1\]"),
    (dict(decoding="sjd", judge_threshold=0.5), "judge_threshold is for decoding='judge', not 'sjd'"),
    (dict(decoding="judge", siblings=2), "siblings .proactive drafting. are verified exactly"),
])
def test_bad_judge_arguments_get_clear_errors(judged, kwargs, message):
    with pytest.raises(ValueError, match=message):
        judged(PROMPT, **FIXED, **kwargs)


def test_a_judge_for_another_target_is_refused(pipe):
    other = tiny_random_pipeline(seed=1).transformer
    for head, message in ((_head(other), f"trained against a target whose weights hash to {weights_hash(other)}"),
                          (JudgeHead(feature_size=32), "features of width 32, but the target's are 64 wide")):
        pipe.register_modules(judge=head)
        try:
            with pytest.raises(ValueError, match=message):
                pipe(PROMPT, decoding="judge", **FIXED)
        finally:
            pipe.register_modules(judge=None)


def test_a_pipeline_folder_keeps_its_judge(pipe, tmp_path):
    head = _head(pipe.transformer, bias=100.0, threshold=0.25)
    pipe.register_modules(judge=head)
    try:
        pipe.save_pretrained(tmp_path)
    finally:
        pipe.register_modules(judge=None)
    loaded = VisualSpecPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert isinstance(loaded.judge, JudgeHead) and "judge" in loaded.available_decodings()
    assert loaded.judge.config.threshold == 0.25
    assert loaded(PROMPT, decoding="judge", **FIXED).stats.judged_tokens > 0
