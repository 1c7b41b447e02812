"""visualspec train-any-order on a tiny raster pipeline: it writes an any-order folder that generates,
and a rerun resumes from the checkpoint instead of training again."""

import torch

from visualspec import VisualSpecPipeline
from visualspec.pipelines import AnyOrderPipeline
from visualspec.pipelines.tiny import tiny_random_pipeline
from visualspec.training.any_order import AnyOrderConfig, random_orders, train_any_order


def test_it_writes_an_any_order_folder_and_resumes(tmp_path):
    tiny_random_pipeline(seed=0).save_pretrained(tmp_path / "raster")
    cfg = AnyOrderConfig(steps=2, batch=2, compile=False, checkpoint_seconds=0.0)
    pipe = train_any_order(str(tmp_path / "raster"), str(tmp_path / "out"), str(tmp_path / "work"), cfg, progress=False)
    assert isinstance(pipe, AnyOrderPipeline) and pipe.transformer.query_embeddings.weight.abs().sum() > 0
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a photo of a red circle", decoding="assd", k=4, seed=0, compile=False, output_type="latent")
    assert out.images.shape == (1, 256)
    again = train_any_order(str(tmp_path / "raster"), str(tmp_path / "out2"), str(tmp_path / "work"), cfg,
                            progress=False)  # resumes at its last step: nothing left to train
    assert torch.equal(again.transformer.query_embeddings.weight, pipe.transformer.query_embeddings.weight)
    assert isinstance(VisualSpecPipeline.from_pretrained(tmp_path / "out"), AnyOrderPipeline)


def test_training_orders_are_permutations_fixed_by_seed_and_step():
    a, b = random_orders(0, 5, 3, 16), random_orders(0, 5, 3, 16)
    assert torch.equal(a, b) and not torch.equal(a, random_orders(0, 6, 3, 16))
    assert bool((a.sort(1).values == torch.arange(16)).all())
