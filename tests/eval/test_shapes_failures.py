"""The failure breakdown of ``benchmarks/shapes_failures.py`` tells broken objects from whole ones."""

import json

import numpy as np
from PIL import Image

from benchmarks.shapes_failures import LOOSE, MIN_STRAY, failure_breakdown, stray_pixels
from visualspec.eval.detectors import ShapesDetector
from visualspec.eval.geneval import evaluate_image, evaluate_images
from visualspec.worlds import shapes


def test_ground_truth_images_pass_with_no_stray_pixels(tmp_path):
    shapes.write_geneval_folder(tmp_path, shapes.evaluation_prompts(per_task=4, seed=11), samples_per_prompt=2, seed=3)
    breakdown = failure_breakdown(tmp_path)
    assert set(breakdown) == set(shapes.TASKS)
    for task, counts in breakdown.items():
        assert counts["images"] == 8 and counts["pass"] == 8, (task, counts)
    assert breakdown["counting"][LOOSE] == 8
    for record in evaluate_images(tmp_path, ShapesDetector()):
        assert stray_pixels(Image.open(record["filename"]), record) == 0, record["prompt"]


def test_a_loose_blob_is_broken_and_a_wrong_colour_is_whole(tmp_path):
    metadata = {"tag": "color_attr", "prompt": "a photo of a red circle and a blue square",
                "include": [{"class": "circle", "count": 1, "color": "red"},
                            {"class": "square", "count": 1, "color": "blue"}]}
    circle = shapes.ShapeObject("circle", "red", (4, 4, 22, 22))
    detector = ShapesDetector()

    swapped = shapes.render([circle, shapes.ShapeObject("square", "green", (36, 36, 54, 54))])
    record = evaluate_image(swapped, metadata, detector)
    assert not record["correct"] and stray_pixels(Image.fromarray(swapped), record) == 0

    # an L-shaped blob is no shape, so no kept object explains its 45 pixels
    blob = swapped.copy()
    blob[50:59, 4:7] = shapes.COLORS["blue"]
    blob[56:59, 4:13] = shapes.COLORS["blue"]
    record = evaluate_image(blob, metadata, detector)
    assert stray_pixels(Image.fromarray(blob), record) == 45 >= MIN_STRAY

    folder = tmp_path / "00000"
    (folder / "samples").mkdir(parents=True)
    (folder / "metadata.jsonl").write_text(json.dumps(metadata) + "\n")
    Image.fromarray(swapped).save(folder / "samples" / "0000.png")
    Image.fromarray(np.ascontiguousarray(blob)).save(folder / "samples" / "0001.png")
    counts = failure_breakdown(tmp_path)["color_attr"]
    assert counts == {"images": 2, "broken": 1, "whole": 1, "both shapes, a colour wrong": 1}
