"""Why GenEval-shapes images fail: broken objects, or whole objects put together wrongly.

    visualspec bench --quality --modes ar --per-task 100 --seed 9000 --keep-images runs/
    python benchmarks/shapes_failures.py runs/ar

For each task of a GenEval-layout folder of shapes-world images this prints how many images pass
and splits the failures in two:

- *broken*: at least ``MIN_STRAY`` foreground pixels lie outside every object GenEval kept (a shape
  with a piece missing or added, two colours in one shape, two shapes run together, a loose blob).
  Ground-truth images of the world have none (``tests/test_shapes_failures.py``).
- *whole*: every foreground pixel belongs to a kept object, so the image fails on what it shows:
  a wrong count, class, colour or relation. For colour attribution these are split further.

It also scores counting with GenEval's ordinary detection threshold (0.3) instead of its counting
threshold (0.9), which shows how much of counting is lost to imperfect shapes alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

from visualspec.eval.detectors import ShapesDetector
from visualspec.eval.geneval import evaluate_image, load_image, read_geneval_folder, to_array
from visualspec.worlds.shapes import BACKGROUND

MIN_STRAY = 30  # pixels: the detector's own smallest object
FOREGROUND = 24  # a pixel is foreground when a channel differs from the background grey by more
LOOSE = "pass at threshold 0.3"  # counting scored with GenEval's ordinary detection threshold


def stray_pixels(image, record: dict) -> int:
    """Foreground pixels of ``image`` outside the boxes (grown by one pixel) of the objects that
    GenEval kept for ``record`` (a result record of :func:`evaluate_images`)."""
    rgb = to_array(image).astype(int)
    foreground = np.abs(rgb - np.asarray(BACKGROUND)).max(-1) > FOREGROUND
    covered = np.zeros_like(foreground)
    for boxes in json.loads(record["details"]).values():
        for box in boxes:
            x0, y0, x1, y1 = (int(round(v)) for v in box[:4])
            covered[max(y0 - 1, 0):y1 + 1, max(x0 - 1, 0):x1 + 1] = True
    return int((foreground & ~covered).sum())


def colour_attribution_failure(record: dict) -> str:
    """What a whole-object colour-attribution failure shows."""
    wanted = {clause["class"] for clause in json.loads(record["metadata"])["include"]}
    found = {name: len(boxes) for name, boxes in json.loads(record["details"]).items()}
    if all(found.get(name, 0) >= 1 for name in wanted):
        return "both shapes, a colour wrong"
    if sum(found.values()) >= 2:
        return "two objects, a shape repeated or wrong"
    return "fewer than two objects"


def failure_breakdown(folder) -> dict:
    """Per task: images, passes, broken and whole failures (and what whole colour-attribution
    failures show); for counting also the passes at GenEval's ordinary threshold (``LOOSE``).
    Each image is read once, as :func:`evaluate_images` reads it."""
    detector = ShapesDetector()
    tasks = collections.defaultdict(collections.Counter)
    for entry in read_geneval_folder(folder):
        for path in entry.images:
            image = load_image(path)
            record = evaluate_image(image, entry.metadata, detector, filename=str(path))
            counts = tasks[record["tag"]]
            counts["images"] += 1
            if record["tag"] == "counting":
                counts[LOOSE] += evaluate_image(image, entry.metadata, detector, counting_threshold=0.3)["correct"]
            if record["correct"]:
                counts["pass"] += 1
            elif stray_pixels(image, record) >= MIN_STRAY:
                counts["broken"] += 1
            else:
                counts["whole"] += 1
                if record["tag"] == "color_attr":
                    counts[colour_attribution_failure(record)] += 1
    return {task: dict(counts) for task, counts in tasks.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="GenEval-layout folder of shapes-world images")
    parser.add_argument("--json", help="also write the breakdown to this file")
    args = parser.parse_args(argv)
    breakdown = failure_breakdown(args.folder)
    print(f"{'task':<16}{'images':>8}{'pass':>6}{'broken':>8}{'whole':>7}")
    for task, c in breakdown.items():
        print(f"{task:<16}{c['images']:>8}{c['pass']:>6}{c.get('broken', 0):>8}{c.get('whole', 0):>7}")
        if task == "color_attr":
            for kind in ("both shapes, a colour wrong", "two objects, a shape repeated or wrong",
                         "fewer than two objects"):
                print(f"    whole, {kind}: {c.get(kind, 0)}")
    counting = breakdown.get("counting")
    if counting:
        print(f"counting at detection threshold 0.3 instead of 0.9: {counting[LOOSE] / counting['images']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(breakdown, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
