"""The shipped any-order model (``visualspec train-any-order``) loads, stays small, draws what it is
asked for in random orders, and ASSD pays off on it (so a broken asset cannot land)."""

import json

import pytest

from visualspec import VisualSpecPipeline
from visualspec.assets import SHAPES_ANY_ORDER
from visualspec.eval.detectors import ShapesDetector
from visualspec.eval.geneval import evaluate_image, summarize
from visualspec.pipelines import AnyOrderPipeline
from visualspec.worlds.shapes import evaluation_prompts


@pytest.fixture(scope="module")
def pipe():
    p = VisualSpecPipeline.from_pretrained(SHAPES_ANY_ORDER)
    p.set_progress_bar_config(disable=True)
    return p


def test_it_is_an_any_order_pipeline_under_15_mb_with_its_card(pipe):
    size = sum(f.stat().st_size for f in SHAPES_ANY_ORDER.rglob("*") if f.is_file())
    assert size <= 15 * 2**20, f"{size / 2**20:.1f} MiB"
    assert type(pipe) is AnyOrderPipeline and (SHAPES_ANY_ORDER / "README.md").is_file()


def test_assd_draws_scorable_images_well_above_chance_in_fewer_forwards(pipe):
    """Four prompts per GenEval task with ASSD (the model's own law). The shipped model is weak
    (0.083 here when it was shipped, its card says why); a broken asset draws noise, in which the
    analytic detector finds no shape: 0. ASSD took 0.46 of AR's 256 forwards on these prompts."""
    prompts = evaluation_prompts(per_task=4, seed=123)
    out = pipe([p["prompt"] for p in prompts], decoding="assd", seed=0, compile=False)
    detector = ShapesDetector()
    summary = summarize([evaluate_image(image, meta, detector) for image, meta in zip(out.images, prompts)])
    assert summary["overall"] > 0, json.dumps(summary["tasks"])
    assert out.stats.forwards_per_sequence <= 256 * 0.6, out.stats.forwards_per_sequence
