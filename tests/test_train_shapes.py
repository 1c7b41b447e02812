"""The shapes training command: it produces a loadable pipeline, and an interrupted run resumes to
exactly the weights of an uninterrupted one."""

import json

import pytest
import torch
import torch.nn.functional as F

from visualspec.pipelines import LlamaGenPipeline
from visualspec.train import ShapesTrainingConfig, build_vq, prune_codebook, train_shapes, world_batch

TINY = dict(codebook_size=64, vq_channels=8, vq_steps=3, vq_batch=2, text_dim=32, text_layers=1, gpt_dim=64,
            gpt_layers=1, gpt_heads=2, gpt_steps=4, gpt_batch=2, warmup_steps=1, codebook_merge_distance=0.0,
            checkpoint_seconds=0.0)


def test_training_writes_a_pipeline_that_generates(tmp_path):
    cfg = ShapesTrainingConfig(**TINY)
    pipe = train_shapes(str(tmp_path / "out"), str(tmp_path / "work"), cfg, progress=False)
    assert isinstance(pipe, LlamaGenPipeline) and pipe.transformer.dtype == torch.float32
    assert pipe.transformer.config.prefix_rope == "identity"
    image = pipe("a photo of a red circle", decoding="sjd", seed=0).images[0]
    assert image.size == (64, 64)
    record = json.loads((tmp_path / "out" / "training.json").read_text())
    assert record["config"]["gpt_steps"] == 4
    with pytest.raises(ValueError, match="another configuration"):
        train_shapes(str(tmp_path / "o2"), str(tmp_path / "work"), ShapesTrainingConfig(**{**TINY, "gpt_steps": 5}),
                     progress=False)


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    cfg = ShapesTrainingConfig(**TINY)
    train_shapes(str(tmp_path / "straight"), str(tmp_path / "w1"), cfg, progress=False)

    import visualspec.train as train

    real = train.world_batch
    calls = {"n": 0}

    def interrupted(seed, step, batch):
        if seed == cfg.seed + 1 and step == 2:  # the GPT stage, after two steps were checkpointed
            raise KeyboardInterrupt
        calls["n"] += 1
        return real(seed, step, batch)

    monkeypatch.setattr(train, "world_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_shapes(str(tmp_path / "resumed"), str(tmp_path / "w2"), cfg, progress=False)
    assert json.loads((tmp_path / "w2" / "gpt" / "meta.json").read_text())["step"] == 2
    monkeypatch.setattr(train, "world_batch", real)
    train_shapes(str(tmp_path / "resumed"), str(tmp_path / "w2"), cfg, progress=False)
    a = LlamaGenPipeline.from_pretrained(tmp_path / "straight").transformer.state_dict()
    b = LlamaGenPipeline.from_pretrained(tmp_path / "resumed").transformer.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_codebook_pruning_keeps_distinct_used_codes():
    cfg = ShapesTrainingConfig(**TINY)
    vq = build_vq(cfg).eval()
    images = world_batch(0, 0, 8)[0]
    used = torch.unique(vq.encode(images)[1])
    assert len(prune_codebook(vq, images, 0.0).quantize.embedding.weight) == len(used)  # nothing merged
    pruned = prune_codebook(vq, images, 0.5)
    kept = pruned.quantize.embedding.weight
    assert pruned.config.codebook_size == len(kept) < len(used)
    original = vq.quantize.embedding.weight
    assert all(any(torch.equal(row, o) for o in original) for row in kept)  # a subset of the old codes
    unit = F.normalize(kept, dim=-1)
    distances = torch.cdist(unit, unit) + 10 * torch.eye(len(kept))
    assert distances.min() > 0.5
    tokens = pruned.encode(images)[1]
    assert tokens.max() < len(kept)
