"""The GenEval-shapes detector against the truth on corrupted renders (benchmarks/detector_validation.py
at a tenth of its size), and single objects whole or broken."""

import json

import numpy as np
import pytest

from benchmarks.detector_validation import objects_table
from visualspec.eval import detectors as D
from visualspec.eval import shapes_validation as V
from visualspec.eval.geneval import evaluate_image
from visualspec.worlds import shapes as W


class DropsBrokenObjects(D.ShapesDetector):
    """The failure a user reported: imperfect objects (two colours, misshapen) not counted at all."""

    def detect(self, image):
        return [d for d in super().detect(image) if not d.broken]


def test_verdicts_agree_with_the_truth_on_corrupted_scenes():
    """300 scenes (50 per task, a seed of its own): the full benchmark's 3,000 agree on 99.3 %
    (98.8 % on the hardest task), so 95 % overall and 90 % per task are far outside noise. The
    control drops the objects it reports broken and must fall well below."""
    table = V.agreement(D.ShapesDetector(), per_task=50, seed=7)
    assert table["all"]["agreement"] >= 0.95, table["all"]
    assert all(row["agreement"] >= 0.9 for key, row in table.items() if key.startswith("task: ")), table
    assert 0.1 < table["all"]["truly_correct"] < 0.9  # both verdicts occur
    assert table["all"]["on_incorrect"] >= 0.9
    control = V.agreement(DropsBrokenObjects(), per_task=50, seed=7)
    assert control["all"]["agreement"] < table["all"]["agreement"] - 0.03, control["all"]


def test_corruptions_keep_the_truth_and_are_drawn():
    rng = np.random.default_rng(3)
    seen = set()
    for i in range(60):
        scene = V.scene(W.TASKS[i % 6], rng)
        seen |= set(scene.corruptions)
        assert scene.image.shape == (64, 64, 3) and scene.image.dtype == np.uint8
        assert scene.correct == V.truth(scene.objects, scene.metadata)
        if scene.edit is None:  # the world's own answer, however it is drawn
            assert scene.correct
    assert seen == set(V.CORRUPTIONS)


@pytest.mark.parametrize("kind", ["L", "T", "cross"])
def test_shapeless_blobs_are_not_objects(kind):
    side, arm = 15, 5
    tile = np.zeros((side, side), bool)
    if kind == "L":
        tile[:, :arm] = tile[-arm:, :] = True
    elif kind == "T":
        tile[:arm, :] = True
        tile[:, 5:10] = True
    else:  # thick arms: nearly convex, and 0.7 of a circle's template
        tile[5:10, :] = tile[:, 5:10] = True
    image = W.render([]).copy()
    image[20:20 + side, 20:20 + side][tile] = W.COLORS["red"]
    # a thick cross is nearly convex and fills 0.7 of a circle's template: not counted (0.9), though
    # still above GenEval's ordinary threshold (about 0.59)
    limit = 0.9 if kind == "cross" else 0.3
    assert all(d.score < limit for d in D.ShapesDetector().detect(image))


def test_a_two_coloured_or_smudged_object_is_counted_and_reported_broken():
    square = W.ShapeObject("square", "black", (10, 10, 28, 28))
    triangle = W.ShapeObject("triangle", "white", (36, 30, 56, 50))
    image = W.render([square, triangle]).copy()
    image[24:30, 14:20] = (30, 80, 40)  # a dark green smudge over the square's lower edge
    tip = image[30:41, 36:56]  # the triangle's upper half (a quarter of it) in yellow
    tip[(tip != 128).any(-1)] = W.COLORS["yellow"]
    found = {d.class_name: d for d in D.ShapesDetector().detect(image)}
    assert set(found) == {"square", "triangle"}
    assert found["square"].color == "black" and found["square"].score > 0.9
    assert found["triangle"].color == "white" and found["triangle"].score > 0.9
    assert found["triangle"].broken and "two colours" in found["triangle"].flaws
    metadata = {"tag": "two_object", "prompt": "a photo of a square and a triangle",
                "include": [{"class": "square", "count": 1}, {"class": "triangle", "count": 1}]}
    record = evaluate_image(image, metadata, D.ShapesDetector())
    assert record["correct"] and "two colours" in json.loads(record["flaws"])["triangle"][0]


def test_whole_objects_count_and_broken_ones_are_reported():
    """Single objects: every whole kind is counted (score > 0.9, right shape and colour); broken
    kinds are reported broken far more often than whole ones."""
    table = objects_table(cases=40, seed=5)
    for kind, row in table.items():
        if row["group"] == "whole":
            assert row["above_0.9"] >= 0.9, (kind, row)
    assert table["two colours"]["broken"] >= 0.9
    assert table["exact"]["broken"] == 0.0


def test_pixels_fading_between_colours_stay_object_and_edges_cut_at_half():
    detector = D.ShapesDetector()
    green, orange, red = (np.asarray(W.COLORS[c], np.float32) for c in ("green", "orange", "red"))
    grey = np.asarray(W.BACKGROUND, np.float32)
    names = detector.palette_names
    pixels = np.stack([(green + orange) / 2,  # a fade between two colours: object, not background
                       0.52 * red + 0.48 * grey, 0.48 * red + 0.52 * grey,  # a blurred edge, either side of half
                       orange + (10, 15, -10)])[None]  # off-colour orange (it lies near the red-yellow segment)
    got = D.pixel_colours(pixels, detector.background, detector.palette)[0]
    assert got[0] >= 0 and [names[i] if i >= 0 else None for i in got[1:]] == ["red", None, "orange"]
    # a triangle fading from green to orange is one triangle, not two pieces cut by a grey seam
    image = W.render([W.ShapeObject("triangle", "green", (20, 20, 42, 42))]).astype(np.float32)
    xs = np.arange(64)[None, :, None]
    fade = np.clip((xs - 28) / 6.0, 0, 1) * (image != 128).any(-1, keepdims=True)
    image = np.round(image * (1 - fade) + orange * fade).astype(np.uint8)
    dets = [d for d in detector.detect(image) if d.score > 0.3]
    assert [d.class_name for d in dets] == ["triangle"], dets
