"""The shipped Lumina-layout model (assets/shapes-lumina, trained by ``visualspec train-unified``)
loads as a unified-vocabulary pipeline, stays small, draws what it is asked for, and speculation
pays off on it (so a broken asset cannot land)."""

import json

import pytest

from visualspec import VisualSpecPipeline
from visualspec.assets import SHAPES_LUMINA
from visualspec.eval.detectors import ShapesDetector
from visualspec.eval.geneval import evaluate_image, summarize
from visualspec.pipelines import UnifiedARPipeline
from visualspec.worlds.shapes import evaluation_prompts


@pytest.fixture(scope="module")
def pipe():
    p = VisualSpecPipeline.from_pretrained(SHAPES_LUMINA)
    p.set_progress_bar_config(disable=True)
    return p


def test_it_is_a_chameleon_in_lumina_layout_under_30_mb(pipe):
    size = sum(f.stat().st_size for f in SHAPES_LUMINA.rglob("*") if f.is_file())
    assert size <= 30 * 2**20, f"{size / 2**20:.1f} MiB"
    assert type(pipe) is UnifiedARPipeline and pipe.family.model_type == "chameleon"
    layout = pipe.layout
    assert (layout.height, layout.width, layout.num_tokens) == (16, 16, 16 * 17 + 1)
    assert (SHAPES_LUMINA / "README.md").is_file()


def test_it_draws_scorable_images_well_above_chance(pipe):
    """Four prompts per GenEval task, AR sampling at the folder's defaults. A broken asset draws
    noise or nothing, in which the analytic detector finds no shape: 0."""
    prompts = evaluation_prompts(per_task=4, seed=123)
    out = pipe([p["prompt"] for p in prompts], decoding="ar", seed=0)
    detector = ShapesDetector()
    summary = summarize([evaluate_image(image, meta, detector) for image, meta in zip(out.images, prompts)])
    assert summary["overall"] >= 0.25, json.dumps(summary["tasks"])


def test_speculation_pays_off_on_the_trained_model(pipe):
    """Over four prompts at a window of 16, SJD needs at most half of AR's 273 target forwards and
    LANTERN at most a third: a random-weight model, or a broken drafter, needs far more."""
    prompts = [p["prompt"] for p in evaluation_prompts(per_task=1, seed=5)][:4]
    forwards = {mode: sum(pipe(p, decoding=mode, seed=i, window=16).stats.target_forwards
                          for i, p in enumerate(prompts)) / 4 for mode in ("sjd", "lantern")}
    assert forwards["sjd"] <= 273 / 2 and forwards["lantern"] <= 273 / 3, forwards
