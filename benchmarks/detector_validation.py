"""How the GenEval-shapes detector scores shapes a person sees as whole, and shapes that are broken.

Each case is one object on the world's grey canvas, drawn by the world's own renderer and then
changed the way a generated image differs from a rendering:

- whole: exact; aspect (box sides 1 to 3 px apart); edge noise (a tenth of the edge pixels
  flipped); blur (Gaussian, radius 0.5 to 1); colour shift (each channel moved up to 20); and all
  of these at once;
- broken: a piece missing (a third to a half of the box cut away by a straight line); two colours
  (half the shape in another palette colour); two shapes of one colour run together.

For each kind it prints the share of cases where the detector reports the object's shape and
colour with a score above GenEval's counting threshold (0.9) and above its ordinary one (0.3). A
good detector scores every whole case above 0.9 and no broken one.

    python benchmarks/detector_validation.py --cases 200 --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from visualspec.eval.detectors import ShapesDetector  # noqa: E402
from visualspec.worlds.shapes import BACKGROUND, CANVAS, COLORS, MAX_SIZE, MIN_SIZE, SHAPES, ShapeObject, render  # noqa: E402

WHOLE = ("exact", "aspect", "edge noise", "blur", "colour shift", "all at once")
BROKEN = ("piece missing", "two colours", "run together")


def _object(rng, w=None, h=None):
    size = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
    w, h = w or size, h or size
    x0 = int(rng.integers(4, CANVAS - 4 - w))
    y0 = int(rng.integers(4, CANVAS - 4 - h))
    return ShapeObject(str(rng.choice(SHAPES)), str(rng.choice(list(COLORS))), (x0, y0, x0 + w, y0 + h))


def _edge_noise(image, rng, share=0.1):
    fg = np.any(image != BACKGROUND, axis=-1)
    padded = np.pad(fg, 1, mode="edge")
    edge = fg & ~(padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
    outside = ~fg & (padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:])
    out = image.copy()
    colour = image[fg][0]
    for mask, value in ((edge, BACKGROUND), (outside, colour)):
        ys, xs = np.nonzero(mask)
        pick = rng.random(len(ys)) < share
        out[ys[pick], xs[pick]] = value
    return out


def _blur(image, rng):
    return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.0)))))


def _shift(image, rng):
    fg = np.any(image != BACKGROUND, axis=-1)
    out = image.astype(np.int16)
    out[fg] += rng.integers(-20, 21, size=3).astype(np.int16)
    return np.clip(out, 0, 255).astype(np.uint8)


def whole_case(kind, rng):
    if kind in ("aspect", "all at once"):
        side = int(rng.integers(MIN_SIZE + 3, MAX_SIZE - 2))
        d = int(rng.choice([-3, -2, -1, 1, 2, 3]))
        obj = _object(rng, side + d, side)
    else:
        obj = _object(rng)
    image = render([obj])
    if kind in ("edge noise", "all at once"):
        image = _edge_noise(image, rng)
    if kind in ("blur", "all at once"):
        image = _blur(image, rng)
    if kind in ("colour shift", "all at once"):
        image = _shift(image, rng)
    return image, obj


def broken_case(kind, rng):
    obj = _object(rng)
    image = render([obj])
    x0, y0, x1, y1 = obj.box
    yy, xx = np.mgrid[0:CANVAS, 0:CANVAS]
    if kind == "piece missing":
        angle = rng.uniform(0, 2 * np.pi)
        nx, ny = np.cos(angle), np.sin(angle)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        offset = rng.uniform(0.0, 0.35) * (x1 - x0) / 2  # a third to a half cut away
        cut = (xx - cx) * nx + (yy - cy) * ny > offset
        image = image.copy()
        image[cut & np.any(image != BACKGROUND, axis=-1)] = BACKGROUND
    elif kind == "two colours":
        other = str(rng.choice([c for c in COLORS if c != obj.color]))
        half = xx >= (x0 + x1) / 2 if rng.random() < 0.5 else yy >= (y0 + y1) / 2
        image = image.copy()
        image[half & np.any(image != BACKGROUND, axis=-1)] = COLORS[other]
    else:  # two shapes of one colour, overlapping by a quarter to a half of a side
        side = x1 - x0
        shift = int(side * rng.uniform(0.5, 0.75))
        second = ShapeObject(str(rng.choice(SHAPES)), obj.color, (x0 + shift, y0, x0 + shift + side, y1))
        if second.box[2] > CANVAS:
            second = ShapeObject(second.shape, obj.color, (x0 - shift, y0, x0 - shift + side, y1))
        image = render([obj, second])
    return image, obj


def best_score(detector, image, obj) -> float:
    return max((d.score for d in detector.detect(image) if d.class_name == obj.shape and d.color == obj.color), default=0.0)


def validate(cases: int = 200, seed: int = 0, detector=None) -> dict:
    detector = detector or ShapesDetector()
    rng = np.random.default_rng(seed)
    table = {}
    for group, kinds, make in (("whole", WHOLE, whole_case), ("broken", BROKEN, broken_case)):
        for kind in kinds:
            scores = np.array([best_score(detector, *make(kind, rng)) for _ in range(cases)])
            table[kind] = {"group": group, "above_0.9": float(np.mean(scores > 0.9)),
                           "above_0.3": float(np.mean(scores > 0.3)), "median": float(np.median(scores))}
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args(argv)
    table = validate(args.cases, args.seed)
    print("| kind | group | score > 0.9 | score > 0.3 | median score |\n| --- | --- | ---: | ---: | ---: |")
    for kind, row in table.items():
        print(f"| {kind} | {row['group']} | {row['above_0.9']:.2f} | {row['above_0.3']:.2f} | {row['median']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
