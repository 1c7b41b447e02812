"""``visualspec train-drafter --model``: a feature drafter for the shipped shapes pipeline trains a
few steps, resumes, saves with its target's hash and decodes exactly (greedy equal to AR)."""

import json

import torch

from visualspec.assets import SHAPES_T2I
from visualspec.models.feature_drafter import FeatureDraftModel, weights_hash
from visualspec.pipelines import VisualSpecPipeline
from visualspec.training.feature_drafter import ImageFeatureDrafterConfig, train_image_feature_drafter


def test_an_image_feature_drafter_trains_resumes_and_decodes_exactly(tmp_path):
    cfg = ImageFeatureDrafterConfig(batch=2, steps=2, warmup_steps=1, checkpoint_seconds=0.0)
    out = train_image_feature_drafter(None, str(tmp_path / "drafter"), str(tmp_path / "work"), cfg, progress=False)
    again = train_image_feature_drafter(None, str(tmp_path / "again"), str(tmp_path / "work"), cfg, progress=False)
    a, b = (FeatureDraftModel.from_pretrained(f).state_dict() for f in (out, again))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the second run resumed at the end
    net = FeatureDraftModel.from_pretrained(out, torch_dtype=torch.float32)
    pipe = VisualSpecPipeline.from_pretrained(SHAPES_T2I, feature_drafter=net)
    pipe.set_progress_bar_config(disable=True)
    assert net.config.target_hash == weights_hash(pipe.transformer)
    ar = pipe("a red circle", decoding="ar", temperature=0, output_type="latent").images
    spec = pipe("a red circle", decoding="feature", window=4, temperature=0, output_type="latent")
    assert torch.equal(ar, spec.images) and spec.stats.target_forwards < 256
    assert json.loads((out / "training.json").read_text())["config"]["steps"] == 2
