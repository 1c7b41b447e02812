"""The Lumina-layout training command: its sequences are the pipeline's, it writes a folder that
generates (greedy SJD equals greedy AR), and an interrupted run resumes to the same weights."""

import pytest
import torch

from visualspec.pipelines import UnifiedARPipeline, VisualSpecPipeline
from visualspec.training.unified import UnifiedShapesConfig, train_unified_shapes, training_sequences

TINY = dict(hidden=32, layers=1, heads=2, intermediate=64, steps=2, batch=2, warmup_steps=1, checkpoint_seconds=0.0)


def test_training_sequences_are_what_the_pipeline_feeds_and_generates():
    from visualspec.models.unified_ar import ImageLayout

    layout = ImageLayout((10, 11, 12), height=2, width=2, row_end=20, ending=(21,), opening=(30, 31))
    codes = torch.tensor([[[0, 1], [2, 0]], [[1, 1], [1, 1]]])
    ids, mask, labels = training_sequences([[5, 6, 7], [5]], layout, codes, torch.tensor([False, True]), pad=0)
    assert ids.tolist() == [[5, 6, 7, 30, 31, 10, 11, 20, 12, 10, 20, 21],
                            [0, 0, 0, 30, 31, 11, 11, 20, 11, 11, 20, 21]]  # dropped: the opening alone
    assert mask[1].tolist() == [0, 0, 0] + [1] * 9
    assert (labels[:, :5] == -100).all() and torch.equal(labels[:, 5:], ids[:, 5:])


def test_training_writes_a_folder_that_generates_and_an_interrupted_run_resumes(tmp_path, monkeypatch):
    cfg = UnifiedShapesConfig(**TINY)
    train_unified_shapes(str(tmp_path / "straight"), str(tmp_path / "w1"), cfg, progress=False)
    pipe = VisualSpecPipeline.from_pretrained(tmp_path / "straight")
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe, UnifiedARPipeline) and pipe.family.model_type == "chameleon"
    layout = pipe.layout
    assert (layout.height, layout.width, layout.row_length) == (16, 16, 17) and len(layout.code_tokens) == 101
    ar = pipe("a photo of a red circle", decoding="ar", temperature=0, output_type="latent").images
    sjd = pipe("a photo of a red circle", decoding="sjd", temperature=0, window=8, output_type="latent").images
    assert torch.equal(ar, sjd)
    assert pipe("a photo of a red circle", seed=0, window=8).images[0].size == (64, 64)
    import visualspec.training.unified as train

    real, calls = train.caption_batch, {"n": 0}

    def interrupted(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(train, "caption_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_unified_shapes(str(tmp_path / "resumed"), str(tmp_path / "w2"), cfg, progress=False)
    monkeypatch.setattr(train, "caption_batch", real)
    train_unified_shapes(str(tmp_path / "resumed"), str(tmp_path / "w2"), cfg, progress=False)
    a, b = (VisualSpecPipeline.from_pretrained(tmp_path / run).transformer.state_dict()
            for run in ("straight", "resumed"))
    assert all(torch.equal(a[k], b[k]) for k in a)
