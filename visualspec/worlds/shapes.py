"""The shapes world: a fixed, exactly checkable text-to-image world in GenEval's six tasks.

Specification (fixed, so anyone can check it):

- 64x64 RGB images on a uniform grey background (128, 128, 128);
- filled circles, squares and (upward isosceles) triangles, each in a square bounding box of 12 to
  22 px, fully inside the canvas, never overlapping (boxes at least ``GAP`` px apart);
- eight colours with GenEval's names (:data:`COLORS`);
- prompts in GenEval's phrasing for its six tasks, with GenEval-format metadata (``tag``,
  ``include`` = [{class, count, color?, position?: [relation, index]}], ``exclude``, ``prompt``).
  A prompt fixes exactly the objects it names; everything it does not fix (sizes, places, the
  colour of an uncoloured object) is random.

Positions are judged like GenEval: by box centres, with :func:`relative_position`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image, ImageDraw

CANVAS = 64
BACKGROUND = (128, 128, 128)
MIN_SIZE, MAX_SIZE = 12, 22
GAP = 2  # minimum distance between two boxes, so objects never touch
SHAPES = ("circle", "square", "triangle")
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COLORS = {
    "red": (220, 40, 40),
    "orange": (245, 140, 30),
    "yellow": (240, 220, 40),
    "green": (50, 170, 70),
    "blue": (40, 90, 220),
    "purple": (140, 60, 190),
    "black": (20, 20, 20),
    "white": (240, 240, 240),
}
TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RELATIONS = ("left of", "right of", "above", "below")
NUMBERS = {2: "two", 3: "three", 4: "four"}
POSITION_THRESHOLD = 0.1  # GenEval's default


@dataclass(frozen=True)
class ShapeObject:
    shape: str
    color: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive), x1 - x0 == y1 - y0

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return (x0 + x1) / 2, (y0 + y1) / 2


# ------------------------------------------------------------------------------------ rendering


def render(objects: list[ShapeObject]) -> np.ndarray:
    """Draw objects on the grey canvas (no anti-aliasing): (64, 64, 3) uint8."""
    image = Image.new("RGB", (CANVAS, CANVAS), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        x0, y0, x1, y1 = obj.box
        fill = COLORS[obj.color]
        if obj.shape == "square":
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=fill)
        elif obj.shape == "circle":
            draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=fill)
        elif obj.shape == "triangle":
            draw.polygon([(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1 - 1) / 2, y0)], fill=fill)
        else:
            raise ValueError(f"unknown shape {obj.shape!r}")
    return np.asarray(image)


# ------------------------------------------------------------------------------------ GenEval's position rule


def relative_position(box_a, box_b, threshold: float = POSITION_THRESHOLD) -> set[str]:
    """Relations of box A to box B, as GenEval judges them.

    offset = centre(A) - centre(B); each component is shrunk towards 0 by ``threshold`` times the
    sum of the two boxes' extents along that axis, then divided by |offset|. A component below
    -0.5 means "left of" / "above", above 0.5 "right of" / "below" (image y grows downwards).
    """
    a = np.asarray(box_a, dtype=np.float64)
    b = np.asarray(box_b, dtype=np.float64)
    offset = (a[:2] + a[2:]) / 2 - (b[:2] + b[2:]) / 2
    dims = (a[2:] - a[:2]) + (b[2:] - b[:2])
    revised = np.maximum(np.abs(offset) - threshold * dims, 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


# ------------------------------------------------------------------------------------ prompts


def with_article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def prompt_metadata(task: str, rng: np.random.Generator) -> dict:
    """A random prompt of ``task`` with its GenEval-format metadata."""
    shape = lambda: str(rng.choice(SHAPES))  # noqa: E731
    color = lambda: str(rng.choice(list(COLORS)))  # noqa: E731
    if task == "single_object":
        s = shape()
        return {"tag": task, "include": [{"class": s, "count": 1}], "prompt": f"a photo of {with_article(s)}"}
    if task == "two_object":
        s1, s2 = (str(x) for x in rng.choice(SHAPES, 2, replace=False))
        return {"tag": task, "include": [{"class": s1, "count": 1}, {"class": s2, "count": 1}],
                "prompt": f"a photo of {with_article(s1)} and {with_article(s2)}"}
    if task == "counting":
        s, n = shape(), int(rng.integers(2, 5))
        return {"tag": task, "include": [{"class": s, "count": n}], "exclude": [{"class": s, "count": n + 1}],
                "prompt": f"a photo of {NUMBERS[n]} {PLURALS[s]}"}
    if task == "colors":
        s, c = shape(), color()
        return {"tag": task, "include": [{"class": s, "count": 1, "color": c}], "prompt": f"a photo of {with_article(c + ' ' + s)}"}
    if task == "position":
        s1, s2 = (str(x) for x in rng.choice(SHAPES, 2, replace=False))  # s1 <relation> s2
        rel = str(rng.choice(RELATIONS))
        return {"tag": task, "include": [{"class": s2, "count": 1}, {"class": s1, "count": 1, "position": [rel, 0]}],
                "prompt": f"a photo of {with_article(s1)} {rel} {with_article(s2)}"}
    if task == "color_attr":
        s1, s2 = (str(x) for x in rng.choice(SHAPES, 2, replace=False))
        c1, c2 = (str(x) for x in rng.choice(list(COLORS), 2, replace=False))
        return {"tag": task, "include": [{"class": s1, "count": 1, "color": c1}, {"class": s2, "count": 1, "color": c2}],
                "prompt": f"a photo of {with_article(c1 + ' ' + s1)} and {with_article(c2 + ' ' + s2)}"}
    raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")


def vocabulary() -> list[str]:
    """Every word any world prompt can use."""
    words = {"a", "an", "photo", "of", "and", "left", "right", "above", "below"}
    words |= set(SHAPES) | set(PLURALS.values()) | set(COLORS) | set(NUMBERS.values())
    return sorted(words)


# ------------------------------------------------------------------------------------ scenes


def random_box(rng, size=None):
    """A square box of a random (or the given) size anywhere on the canvas."""
    s = int(size if size is not None else rng.integers(MIN_SIZE, MAX_SIZE + 1))
    x, y = (int(v) for v in rng.integers(0, CANVAS - s + 1, size=2))
    return (x, y, x + s, y + s)


def apart(box, others) -> bool:
    """Whether ``box`` keeps at least ``GAP`` px from every box of ``others``."""
    x0, y0, x1, y1 = box
    return all(x1 + GAP <= b[0] or b[2] + GAP <= x0 or y1 + GAP <= b[1] or b[3] + GAP <= y0 for b in others)


def clear_relation(box_a, box_b, relation) -> bool:
    """The relation holds under GenEval's rule with a margin, and no perpendicular relation does."""
    rels = relative_position(box_a, box_b)
    tight = relative_position(box_a, box_b, threshold=POSITION_THRESHOLD + 0.15)
    return rels == {relation} and relation in tight


def sample_scene(metadata: dict, rng: np.random.Generator, max_tries: int = 1000) -> list[ShapeObject]:
    """Objects that satisfy ``metadata`` exactly; what it does not fix is random."""
    wanted = []  # (shape, color or None) per object, in include order
    for clause in metadata["include"]:
        wanted += [(clause["class"], clause.get("color"))] * int(clause["count"])
    relation = None
    for i, clause in enumerate(metadata["include"]):
        if "position" in clause:
            relation = (i, clause["position"][1], clause["position"][0])
    for _ in range(max_tries):
        boxes = []
        for _ in wanted:
            for _ in range(100):
                box = random_box(rng)
                if apart(box, boxes):
                    boxes.append(box)
                    break
            else:
                break
        if len(boxes) < len(wanted):
            continue
        if relation is not None:
            a, b, rel = relation  # include clauses with count 1: object index == clause index
            if not clear_relation(boxes[a], boxes[b], rel):
                continue
        colors = [c if c is not None else str(rng.choice(list(COLORS))) for _, c in wanted]
        return [ShapeObject(s, c, box) for (s, _), c, box in zip(wanted, colors, boxes)]
    raise RuntimeError(f"could not place the objects of {metadata['prompt']!r}")


def sample(rng: np.random.Generator, task: str | None = None) -> tuple[np.ndarray, dict, list[ShapeObject]]:
    """One (image, metadata, objects) triple; a uniformly random task unless one is given."""
    metadata = prompt_metadata(task or str(rng.choice(TASKS)), rng)
    objects = sample_scene(metadata, rng)
    return render(objects), metadata, objects


def iterate(seed: int, task: str | None = None) -> Iterator[tuple[np.ndarray, dict, list[ShapeObject]]]:
    rng = np.random.default_rng(seed)
    while True:
        yield sample(rng, task)


# ------------------------------------------------------------------------------------ files


def evaluation_prompts(per_task: int = 50, seed: int = 0) -> list[dict]:
    """A GenEval-style evaluation set: ``per_task`` random prompts of each of the six tasks."""
    rng = np.random.default_rng(seed)
    return [prompt_metadata(task, rng) for task in TASKS for _ in range(per_task)]


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_prompt_file(path, prompts: list[dict]) -> None:
    """GenEval's prompt format: one JSON metadata object per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(path, "".join(json.dumps(p) + "\n" for p in prompts).encode())


def write_geneval_folder(out_dir, prompts: list[dict], samples_per_prompt: int = 4, seed: int = 0) -> None:
    """Ground-truth images in GenEval's layout: <index:05d>/metadata.jsonl and samples/<k:04d>.png."""
    import io

    rng = np.random.default_rng(seed)
    for index, metadata in enumerate(prompts):
        folder = Path(out_dir) / f"{index:05d}"
        (folder / "samples").mkdir(parents=True, exist_ok=True)
        _atomic_write_bytes(folder / "metadata.jsonl", (json.dumps(metadata) + "\n").encode())
        for k in range(samples_per_prompt):
            buf = io.BytesIO()
            Image.fromarray(render(sample_scene(metadata, rng))).save(buf, format="PNG")
            _atomic_write_bytes(folder / "samples" / f"{k:04d}.png", buf.getvalue())
