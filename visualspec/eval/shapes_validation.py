"""Scenes of the shapes world with known truth, drawn the way the shipped model draws them, to check
the GenEval-shapes detector against what a person counts.

A scene starts as the world's own answer to a prompt (:func:`visualspec.worlds.shapes.sample`). Half
the scenes are then edited once so that they may no longer answer it (an object added, removed,
reshaped, recoloured, or two objects swapped). Each scene is then drawn with some of the flaws the
model's images show (``CORRUPTIONS``):

- *stretched*: a box up to a third longer one way (a person still sees the shape);
- *polygonal circle*: a circle drawn as a polygon of 8 to 14 sides;
- *blended colours*: a second palette colour fading over up to a third of an object;
- *smudge*: a dark disc of radius 1.5 to 3 px on an object;
- *border sliver*: a shape almost wholly outside the canvas, fewer than 30 px showing (not an object);
- *specks*: one to four blobs of at most 12 px (not objects);
- *shapeless blob*: an L, a T, a cross or a bar 12 to 20 px long in a palette colour (not a circle,
  a square or a triangle, so not counted);
- *edge noise*, *blur*, *colour shift*: as a decoded image differs from a rendering.

The truth is GenEval's verdict (:func:`visualspec.eval.geneval.judge`) on the objects as drawn
(after edits and stretching), so a detector agrees when it reaches the same verdict from the pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ..worlds.shapes import (BACKGROUND, CANVAS, COLORS, GAP, MAX_SIZE, MIN_SIZE, SHAPES, TASKS, ShapeObject, apart,
                             prompt_metadata, random_box, sample_scene)
from .geneval import Detection, evaluate_image, judge

CORRUPTIONS = ("stretched", "polygonal circle", "blended colours", "smudge", "border sliver", "specks",
               "shapeless blob", "edge noise", "blur", "colour shift")
EDITS = ("add", "remove", "reshape", "recolour", "swap")
SPECK_AREA = 12  # largest speck, px
SLIVER_AREA = 30  # a sliver shows fewer pixels than this (the detector's smallest object)


@dataclass
class Scene:
    image: np.ndarray  # (64, 64, 3) uint8
    metadata: dict
    objects: list[ShapeObject]  # what a person counts, as drawn
    correct: bool  # GenEval's verdict on ``objects``
    corruptions: tuple[str, ...]
    edit: str | None


# ------------------------------------------------------------------------------------ drawing


def _draw(obj: ShapeObject, sides: int | None = None, angle: float = 0.0) -> np.ndarray:
    """(64, 64) bool mask of the part of one object inside the canvas (drawn on a canvas padded to
    hold all of it); a circle with ``sides`` is drawn as that regular polygon."""
    pad = MAX_SIZE
    mask = Image.new("L", (CANVAS + 2 * pad, CANVAS + 2 * pad), 0)
    draw = ImageDraw.Draw(mask)
    x0, y0, x1, y1 = (v + pad for v in obj.box)
    if obj.shape == "square":
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=255)
    elif obj.shape == "circle" and sides:
        cx, cy, rx, ry = (x0 + x1 - 1) / 2, (y0 + y1 - 1) / 2, (x1 - x0 - 1) / 2, (y1 - y0 - 1) / 2
        t = angle + 2 * np.pi * np.arange(sides) / sides
        draw.polygon([(cx + rx * np.cos(a), cy + ry * np.sin(a)) for a in t], fill=255)
    elif obj.shape == "circle":
        draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=255)
    else:
        draw.polygon([(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1 - 1) / 2, y0)], fill=255)
    return (np.asarray(mask) > 0)[pad:pad + CANVAS, pad:pad + CANVAS]


def _near(mask: np.ndarray, others: np.ndarray, distance: int) -> bool:
    """Whether ``mask`` comes within ``distance`` px (square neighbourhood) of ``others``."""
    from scipy import ndimage

    return bool((ndimage.binary_dilation(mask, iterations=distance, structure=np.ones((3, 3))) & others).any())


def _free(box, boxes) -> bool:
    """Inside the canvas and apart from ``boxes`` as the world keeps its objects."""
    x0, y0, x1, y1 = box
    return 0 <= x0 and 0 <= y0 and x1 <= CANVAS and y1 <= CANVAS and apart(box, boxes)


def _random_free_box(rng, boxes, tries: int = 200):
    for _ in range(tries):
        box = random_box(rng)
        if apart(box, boxes):
            return box
    return None


# ------------------------------------------------------------------------------------ edits


def _mentioned(metadata: dict) -> set[str]:
    return {clause["class"] for clause in metadata.get("include", []) + metadata.get("exclude", [])}


def edit_scene(objects: list[ShapeObject], metadata: dict, rng) -> tuple[list[ShapeObject], str | None]:
    """One random edit that may make the scene fail its prompt (its truth is judged afterwards).

    Objects are added only where GenEval's verdict stays defined: a class the prompt counts
    (single, two objects, counting) may gain one; prompts that pick one object of a class by score
    (colours, position, colour attribution) gain only classes they do not name."""
    objects = list(objects)
    kind = str(rng.choice(EDITS if metadata["tag"] == "position" else EDITS[:-1]))
    i = int(rng.integers(len(objects)))
    if kind == "add":
        classes = SHAPES if metadata["tag"] in ("single_object", "two_object", "counting") else \
            [s for s in SHAPES if s not in _mentioned(metadata)]
        box = _random_free_box(rng, [o.box for o in objects])
        if box is None or not classes:
            return objects, None
        objects.append(ShapeObject(str(rng.choice(classes)), str(rng.choice(list(COLORS))), box))
    elif kind == "remove":
        if len(objects) < 2 and metadata["tag"] != "single_object":
            return objects, None
        objects.pop(i)
    elif kind == "reshape":
        objects[i] = replace(objects[i], shape=str(rng.choice([s for s in SHAPES if s != objects[i].shape])))
    elif kind == "recolour":
        objects[i] = replace(objects[i], color=str(rng.choice([c for c in COLORS if c != objects[i].color])))
    else:  # swap the centres of the two objects
        a, b = objects[0], objects[1]
        (ax, ay), (bx, by) = a.center, b.center
        moved_a = _moved(a.box, bx - ax, by - ay)
        moved_b = _moved(b.box, ax - bx, ay - by)
        if not (_free(moved_a, [moved_b]) and _free(moved_b, [moved_a])):
            return objects, None
        objects[0], objects[1] = replace(a, box=moved_a), replace(b, box=moved_b)
    return objects, kind


def _moved(box, dx, dy):
    dx, dy = int(round(dx)), int(round(dy))
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def truth(objects: list[ShapeObject], metadata: dict) -> bool:
    """GenEval's verdict on the objects themselves (every one found, with its own box and colour)."""
    found: dict[str, list[Detection]] = {}
    for obj in objects:
        found.setdefault(obj.shape, []).append(Detection(obj.shape, 1.0, obj.box, obj.color))
    return judge(found, metadata)[0]


# ------------------------------------------------------------------------------------ corruptions


def _stretch(objects, rng):
    """Lengthen one object's box by up to a third along one axis, where it stays apart from the rest."""
    for _ in range(10 if objects else 0):
        i = int(rng.integers(len(objects)))
        x0, y0, x1, y1 = objects[i].box
        extra = int(rng.integers(2, max(3, (x1 - x0) // 3 + 1)))
        box = (x0, y0, x1 + extra, y1) if rng.random() < 0.5 else (x0, y0, x1, y1 + extra)
        if _free(box, [o.box for j, o in enumerate(objects) if j != i]):
            objects = list(objects)
            objects[i] = replace(objects[i], box=box)
            return objects
    return None


def _blend(image, mask, colour, rng):
    """Fade ``colour`` over the far end of ``mask`` along a random direction (up to a third of it)."""
    ys, xs = np.nonzero(mask)
    angle = rng.uniform(0, 2 * np.pi)
    proj = xs * np.cos(angle) + ys * np.sin(angle)
    cut = np.quantile(proj, 1 - rng.uniform(0.15, 0.33))
    alpha = np.clip((proj - cut) / 3.0 + 0.5, 0.0, 1.0)[:, None]
    out = image.astype(np.float64)
    out[ys, xs] = (1 - alpha) * out[ys, xs] + alpha * np.asarray(colour, dtype=np.float64)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _smudge(image, mask, others, rng):
    yy, xx = np.mgrid[0:CANVAS, 0:CANVAS]
    ys, xs = np.nonzero(mask)
    for _ in range(10):
        k = int(rng.integers(len(ys)))
        radius = rng.uniform(1.5, 3.0)
        disc = (yy - ys[k]) ** 2 + (xx - xs[k]) ** 2 <= radius ** 2
        if not _near(disc, others, 2):
            dark = rng.integers(10, 70, size=3)
            out = image.copy()
            out[disc] = dark
            return out
    return image


def _sliver(rng, occupied):
    """A shape mostly beyond one canvas edge, 3 to 29 px of it showing, away from the objects."""
    for _ in range(50):
        s = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
        depth = int(rng.integers(1, 4))
        side = int(rng.integers(4))
        along = int(rng.integers(0, CANVAS - s + 1))
        x0, y0 = [(depth - s, along), (CANVAS - depth, along), (along, depth - s), (along, CANVAS - depth)][side]
        obj = ShapeObject(str(rng.choice(SHAPES)), str(rng.choice(list(COLORS))), (x0, y0, x0 + s, y0 + s))
        mask = _draw(obj)
        if 3 <= mask.sum() < SLIVER_AREA and not _near(mask, occupied, GAP):
            return obj, mask
    return None, None


def _shapeless_blob(rng, occupied):
    """An L, T, cross or bar (arms a third of its 12-20 px side, a bar at most 2/5 as wide as long),
    turned by a multiple of 90 degrees, away from the objects."""
    for _ in range(50):
        side = int(rng.integers(12, 21))
        arm = max(4, side // 3)
        tile = np.zeros((side, side), bool)
        kind = str(rng.choice(["L", "T", "cross", "bar"]))
        if kind == "L":
            tile[:, :arm] = tile[-arm:, :] = True
        elif kind == "T":
            tile[:arm, :] = True
            tile[:, (side - arm) // 2:(side + arm) // 2] = True
        elif kind == "cross":
            tile[(side - arm) // 2:(side + arm) // 2, :] = True
            tile[:, (side - arm) // 2:(side + arm) // 2] = True
        else:
            tile[:, :max(2, int(side * rng.uniform(0.2, 0.4)))] = True
        tile = np.rot90(tile, int(rng.integers(4)))
        y, x = (int(v) for v in rng.integers(0, CANVAS - side + 1, size=2))
        mask = np.zeros((CANVAS, CANVAS), bool)
        mask[y:y + side, x:x + side] = tile
        if not _near(mask, occupied, GAP):
            return mask
    return None


def _specks(rng, occupied):
    masks = []
    yy, xx = np.mgrid[0:CANVAS, 0:CANVAS]
    for _ in range(int(rng.integers(1, 5))):
        for _ in range(20):
            h, w = (int(v) for v in rng.integers(1, 4, size=2))
            y, x = (int(v) for v in rng.integers(0, CANVAS - 3, size=2))
            speck = (yy >= y) & (yy < y + h) & (xx >= x) & (xx < x + w)
            if speck.sum() <= SPECK_AREA and not _near(speck, occupied, GAP):
                masks.append(speck)
                occupied = occupied | speck
                break
    return masks


def blur(image, rng):
    """Gaussian blur of radius 0.5 to 1 px, as a decoded image is soft."""
    return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.0)))))


def edge_noise(image, rng, share=0.1):
    """Flip a share of the pixels on either side of every edge: inside ones to the background,
    outside ones to the colour of a foreground neighbour."""
    fg = np.any(image != BACKGROUND, axis=-1)
    padded = np.pad(fg, 1, mode="edge")
    edge = fg & ~(padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
    out = image.copy()
    ys, xs = np.nonzero(edge)
    pick = rng.random(len(ys)) < share
    out[ys[pick], xs[pick]] = BACKGROUND
    source = np.pad(image, ((1, 1), (1, 1), (0, 0)), mode="edge")
    fg_p = np.pad(fg, 1)
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        neighbour = fg_p[1 + dy:CANVAS + 1 + dy, 1 + dx:CANVAS + 1 + dx] & ~fg
        ys, xs = np.nonzero(neighbour & (rng.random(fg.shape) < share / 2))
        out[ys, xs] = source[ys + 1 + dy, xs + 1 + dx]
    return out


def corrupt_and_draw(objects: list[ShapeObject], rng, probability: float = 0.4):
    """Draw ``objects`` with each corruption applied with ``probability``: (image, objects as drawn,
    corruptions applied)."""
    applied = []
    use = {c: rng.random() < probability for c in CORRUPTIONS}
    if use["stretched"]:
        stretched = _stretch(objects, rng)
        if stretched is not None:
            objects, _ = stretched, applied.append("stretched")
    polygonal = [i for i, o in enumerate(objects) if o.shape == "circle"] if use["polygonal circle"] else []
    if polygonal:
        applied.append("polygonal circle")
    masks = [_draw(o, int(rng.integers(8, 15)) if i in polygonal else None, rng.uniform(0, np.pi))
             for i, o in enumerate(objects)]
    image = np.empty((CANVAS, CANVAS, 3), np.uint8)
    image[:] = BACKGROUND
    for obj, mask in zip(objects, masks):
        colour = np.asarray(COLORS[obj.color], dtype=np.int16)
        if use["colour shift"]:
            colour = colour + rng.integers(-20, 21, size=3)
        image[mask] = np.clip(colour, 0, 255).astype(np.uint8)
    if use["colour shift"]:
        applied.append("colour shift")
    occupied = np.any(masks, axis=0) if masks else np.zeros((CANVAS, CANVAS), bool)
    if use["blended colours"] and objects:
        i = int(rng.integers(len(objects)))
        other = str(rng.choice([c for c in COLORS if c != objects[i].color]))
        image = _blend(image, masks[i], COLORS[other], rng)
        applied.append("blended colours")
    if use["smudge"] and objects:
        i = int(rng.integers(len(objects)))
        others = np.any([m for j, m in enumerate(masks) if j != i], axis=0) if len(masks) > 1 else \
            np.zeros_like(occupied)
        image = _smudge(image, masks[i], others, rng)
        applied.append("smudge")
    if use["border sliver"]:
        obj, mask = _sliver(rng, occupied)
        if obj is not None:
            image[mask] = COLORS[obj.color]
            occupied = occupied | mask
            applied.append("border sliver")
    if use["shapeless blob"]:
        blob = _shapeless_blob(rng, occupied)
        if blob is not None:
            image[blob] = COLORS[str(rng.choice(list(COLORS)))]
            occupied = occupied | blob
            applied.append("shapeless blob")
    if use["specks"]:
        for speck in _specks(rng, occupied):
            image[speck] = COLORS[str(rng.choice(list(COLORS)))]
        applied.append("specks")
    if use["edge noise"]:
        image = edge_noise(image, rng)
        applied.append("edge noise")
    if use["blur"]:
        image = blur(image, rng)
        applied.append("blur")
    return image, objects, tuple(applied)


# ------------------------------------------------------------------------------------ scenes and agreement


def scene(task: str, rng, edit_probability: float = 0.5, corruption_probability: float = 0.4) -> Scene:
    """One scene of ``task``: the world's answer to a random prompt, edited with ``edit_probability``,
    drawn with corruptions."""
    metadata = prompt_metadata(task, rng)
    objects = sample_scene(metadata, rng)
    kind = None
    if rng.random() < edit_probability:
        objects, kind = edit_scene(objects, metadata, rng)
    image, objects, applied = corrupt_and_draw(objects, rng, corruption_probability)
    return Scene(image, metadata, objects, truth(objects, metadata), applied, kind)


def agreement(detector, per_task: int = 500, seed: int = 0, **options) -> dict:
    """How often ``detector``'s GenEval verdict equals the truth: per task, per corruption (over the
    scenes that have it), over clean scenes, and overall; with each group's scene count, the share
    of scenes whose truth is "correct", and the agreement on those and on the others apart (a
    detector that always says "correct" agrees on none of the others)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {}
    for task in TASKS:
        for _ in range(per_task):
            s = scene(task, rng)
            agree = evaluate_image(s.image, s.metadata, detector, **options)["correct"] == s.correct
            for key in (f"task: {task}", *(f"corruption: {c}" for c in s.corruptions or ("none",)), "all"):
                rows.setdefault(key, []).append((agree, s.correct))
    def rate(pairs, correct):
        chosen = [a for a, c in pairs if c == correct]
        return float(np.mean(chosen)) if chosen else float("nan")

    return {key: {"scenes": len(v), "agreement": float(np.mean([a for a, _ in v])),
                  "truly_correct": float(np.mean([c for _, c in v])),
                  "on_correct": rate(v, True), "on_incorrect": rate(v, False)} for key, v in rows.items()}
