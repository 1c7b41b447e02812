"""visualspec train-denoising (SJD2's fine-tune, #50) on a tiny pipeline: it writes a folder whose
transformer says its denoising steps and decodes with SJD2's drafts as AR does, a rerun resumes;
the training noise levels have the profile a decode's window has."""

import pytest
import torch

from visualspec.pipelines.llamagen import LlamaGenPipeline
from visualspec.pipelines.tiny import tiny_random_pipeline
from visualspec.training.denoising import DenoisingConfig, train_denoising_target, training_levels


def test_it_writes_a_denoising_folder_and_resumes(tmp_path):
    start = tiny_random_pipeline(seed=0)
    start.save_pretrained(tmp_path / "raster")
    cfg = DenoisingConfig(steps=2, batch=2, checkpoint_seconds=0.0)
    train_denoising_target(str(tmp_path / "raster"), str(tmp_path / "out"), str(tmp_path / "work"), cfg, progress=False)
    pipe = LlamaGenPipeline.from_pretrained(tmp_path / "out")
    assert pipe.transformer.config.denoising_steps == cfg.denoising_steps
    assert not torch.equal(pipe.transformer.output.weight, start.transformer.output.weight)
    pipe.set_progress_bar_config(disable=True)
    greedy = dict(seed=0, temperature=0.0, output_type="latent")
    sjd2 = pipe("a photo of a red circle", decoding="sjd", drafts="denoising", window=8, **greedy)
    ar = pipe("a photo of a red circle", decoding="ar", **greedy)
    assert torch.equal(sjd2.images, ar.images)
    train_denoising_target(str(tmp_path / "raster"), str(tmp_path / "out2"), str(tmp_path / "work"), cfg,
                           progress=False)  # resumes at its last step: nothing left to train
    again = LlamaGenPipeline.from_pretrained(tmp_path / "out2")
    assert torch.equal(again.transformer.output.weight, pipe.transformer.output.weight)
    with pytest.raises(ValueError, match="needs a transformer fine-tuned"):
        LlamaGenPipeline.from_pretrained(tmp_path / "raster")("a red circle", decoding="sjd", drafts="denoising")
    with pytest.raises(ValueError, match="runs its noised step eagerly"):
        pipe("a red circle", decoding="sjd", drafts="denoising", compile=True)


def test_training_levels_rise_past_a_cut():
    steps, levels = 4, training_levels(400, 30, 4, clean=0.3, max_band=8.0, flat=0.2,
                                       generator=torch.Generator().manual_seed(0))
    grid = levels * steps
    assert torch.equal(grid, grid.round()) and levels.min() == 0 and levels.max() == 1
    assert bool((levels[:, 1:] >= levels[:, :-1]).all())  # never cleaner further along
    clean = (levels == 0).all(1).float().mean()
    assert 0.2 < clean < 0.45  # the clean rows, and noised rows whose cut is at the end
    assert bool((levels[:, 0] == 0).float().mean() > 0.9)  # a cut at 0 may noise the first input, rarely
