"""GenEval-protocol scoring of image folders, with pluggable object detectors.

GenEval (Ghosh et al., 2023) scores a text-to-image model on six compositional tasks
(``single_object``, ``two_object``, ``counting``, ``colors``, ``position``, ``color_attr``): an object
detector finds the objects in every generated image and a fixed rule checks them against the prompt's
metadata. This module re-implements that rule and GenEval's summary on top of a small detector
protocol, so the same scorer runs on two backends:

* :class:`ShapesDetector` -- an exact, analytic detector for :mod:`visualspec.worlds.shapes` images
  (grey canvas, filled circles / squares / triangles in eight colours). No weights, a few ms per image.
* :class:`TransformersDetector` -- real photographs: a COCO detector plus CLIP for colours, both loaded
  with ``transformers`` from LOCAL folders (``local_files_only=True``; nothing is downloaded).

  Point ``detector_path`` at a COCO-80 checkpoint folder (``config.json`` with ``id2label``, weights and
  ``preprocessor_config.json``):

  - closest to GenEval (which uses an mmdetection Mask2Former Swin-S COCO instance model): a Hugging
    Face *Mask2Former Swin-S COCO instance-segmentation* checkpoint -- instance masks are then used
    for the colour crops exactly like GenEval;
  - any ``AutoModelForObjectDetection`` COCO checkpoint: YOLOS (small / base; needs no extra library),
    DETR / Conditional DETR ResNet-50 (their configs ask for ``timm``), RT-DETR, ... -- box-only, so
    colour crops are the plain box crops (GenEval's behaviour when no mask is available).

  Point ``clip_path`` at an OpenAI CLIP ViT-L/14 checkpoint folder (``CLIPModel`` weights, tokenizer
  files and ``preprocessor_config.json``), the colour model GenEval uses (through open_clip).
  COCO label spellings that differ from GenEval's class names (``mouse``, ``remote``, ``keyboard``,
  ...) are mapped with :data:`LABEL_ALIASES`. Scores of this backend are comparable with published
  GenEval numbers only in so far as its detector matches GenEval's.

The evaluation logic follows ``djghosh13/geneval`` (``evaluation/evaluate_images.py`` and
``evaluation/summary_scores.py`` at commit af4902f):

* detections of a class are kept when their score is strictly above ``threshold`` (0.3), or above
  ``counting_threshold`` (0.9) for ``counting`` prompts; they are sorted by score, at most
  ``max_objects`` (16) are kept per class, then greedy per-class NMS at IoU ``max_overlap`` (1.0 = off);
* ``include`` clauses are AND-ed. A clause needs at least ``count`` detections of its class. Its
  colour (if any) is checked on the ``count`` most confident of them: all of them must be classified
  as that colour. Its position ``[relation, i]`` (checked only if the clause matched so far) needs
  every one of those ``count`` objects to stand in ``relation`` to every object of the objects matched
  by include clause ``i`` (``relative_position`` of the shapes world, GenEval's rule); if clause ``i``
  did not match, the clause fails ("no target");
* ``exclude`` clauses are OR-ed: ``count`` or more kept detections of the class make the image wrong;
* per image a record ``filename, tag, prompt, correct, reason, metadata, details`` (``metadata`` and
  ``details`` as JSON strings, ``details`` = ``{class: [[x0, y0, x1, y1, score], ...]}``), one JSON line
  each -- the format GenEval's ``summary_scores.py`` reads;
* the summary: % correct images, % correct prompts (a prompt is correct when any of its images is),
  accuracy per task, and ``overall`` = the mean of the per-task image accuracies (the six tasks).

Detector protocol: any object with ``detect(image) -> list[Detection]`` where ``image`` is a PIL image
or an (H, W, 3) uint8 array. A detector may also define ``classify_colors(image, detections,
class_name) -> list[str]``; it is then asked for colours only when a colour clause needs them (as
GenEval runs CLIP lazily); otherwise ``Detection.color`` is used.

Folder layout (GenEval's): ``<folder>/<index>/metadata.jsonl`` (one JSON line: the prompt's metadata)
and ``<folder>/<index>/samples/<k>.png``; only all-digit subfolders and ``\\d+.png`` files are read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageOps

from ..worlds.shapes import BACKGROUND, CANVAS, COLORS, MAX_SIZE, MIN_SIZE, TASKS, relative_position

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOR_TEMPLATES = ("a photo of a {c} {obj}", "a photo of a {c}-colored {obj}", "a photo of a {c} object")
RELATIONS = ("left of", "right of", "above", "below")
DEFAULT_OPTIONS = {
    "threshold": 0.3,
    "counting_threshold": 0.9,
    "max_objects": 16,
    "max_overlap": 1.0,
    "position_threshold": 0.1,
}
_SAMPLE_NAME = re.compile(r"\d+\.png")  # matched in full (GenEval's re.match would also take "0.png.tmp")


# ====================================================================================== detections


@dataclass
class Detection:
    """One detected object. ``box`` is (x0, y0, x1, y1) in pixels, x1/y1 exclusive."""

    class_name: str
    score: float
    box: tuple[float, float, float, float]
    color: str | None = None
    mask: np.ndarray | None = field(default=None, repr=False)  # (H, W) bool over the whole image


class Detector(Protocol):
    def detect(self, image) -> list[Detection]: ...


def _to_pil(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] not in (3, 4):
        raise ValueError(f"expected a PIL image or an (H, W, 3) uint8 array, got {array.dtype} {array.shape}")
    return Image.fromarray(np.ascontiguousarray(array[..., :3]))


def _to_array(image) -> np.ndarray:
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    return np.asarray(_to_pil(image))


# ====================================================================================== metadata and files


def _fail(where: str, message: str):
    raise ValueError(f"{where}: {message}")


def validate_metadata(metadata: Any, where: str = "metadata") -> dict:
    """Check one GenEval metadata object; raise ``ValueError`` starting with ``where`` if malformed."""
    if not isinstance(metadata, dict):
        _fail(where, f"expected a JSON object, got {type(metadata).__name__}")
    for key in ("tag", "include", "prompt"):
        if key not in metadata:
            _fail(where, f"missing {key!r}")
    if metadata["tag"] not in TASKS:
        _fail(where, f"unknown tag {metadata['tag']!r}; GenEval's tags are {', '.join(TASKS)}")
    if not isinstance(metadata["prompt"], str) or not metadata["prompt"]:
        _fail(where, "'prompt' must be a non-empty string")
    include = metadata["include"]
    if not isinstance(include, list) or not include:
        _fail(where, "'include' must be a non-empty list of clauses")
    for i, clause in enumerate(include):
        at = f"{where}: include[{i}]"
        if not isinstance(clause, dict):
            _fail(at, "expected an object")
        _check_class_count(clause, at)
        if "color" in clause and clause["color"] not in GENEVAL_COLORS:
            _fail(at, f"unknown color {clause['color']!r}; GenEval's colours are {', '.join(GENEVAL_COLORS)}")
        if "position" in clause:
            pos = clause["position"]
            if (not isinstance(pos, list) or len(pos) != 2 or pos[0] not in RELATIONS
                    or not isinstance(pos[1], int) or isinstance(pos[1], bool)):
                _fail(at, f"'position' must be [relation, index] with relation in {RELATIONS}, got {pos!r}")
            if not 0 <= pos[1] < i:
                _fail(at, f"position target {pos[1]} must be the index of an earlier include clause")
    exclude = metadata.get("exclude", [])
    if not isinstance(exclude, list):
        _fail(where, "'exclude' must be a list of clauses")
    for i, clause in enumerate(exclude):
        at = f"{where}: exclude[{i}]"
        if not isinstance(clause, dict):
            _fail(at, "expected an object")
        _check_class_count(clause, at)
    return metadata


def _check_class_count(clause: dict, at: str) -> None:
    if not isinstance(clause.get("class"), str) or not clause["class"]:
        _fail(at, "missing or empty 'class'")
    count = clause.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        _fail(at, f"'count' must be a positive integer, got {count!r}")


def _parse_json_line(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        _fail(where, f"malformed JSON ({exc.msg} at column {exc.colno})")
    return validate_metadata(obj, where)


def read_prompt_file(path) -> list[dict]:
    """A GenEval-format prompt file: one metadata JSON object per line (trailing blank lines allowed)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such prompt file")
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"{path}: empty prompt file")
    prompts = []
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if not line.strip():
            _fail(where, "empty line (every line must be one prompt's metadata)")
        prompts.append(_parse_json_line(line, where))
    return prompts


@dataclass
class PromptFolder:
    """One ``<folder>/<index>`` entry: its metadata and its sample images (sorted by number)."""

    index: str
    path: Path
    metadata: dict
    images: list[Path]


def read_geneval_folder(folder) -> list[PromptFolder]:
    """The prompt folders of a GenEval image folder, sorted by index; ``ValueError`` on a wrong layout."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a directory (expected GenEval's <folder>/<index>/samples/<k>.png layout)")
    subfolders = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not subfolders:
        present = sorted(p.name for p in folder.iterdir())[:5]
        raise ValueError(f"{folder}: no numeric subfolders (expected <index>/metadata.jsonl and <index>/samples/; "
                         f"found {present if present else 'nothing'})")
    entries = []
    for sub in subfolders:
        meta_path = sub / "metadata.jsonl"
        if not meta_path.is_file():
            raise ValueError(f"{sub}: no metadata.jsonl")
        lines = [(n, line) for n, line in enumerate(meta_path.read_text(encoding="utf-8").splitlines(), start=1)
                 if line.strip()]
        if not lines:
            raise ValueError(f"{meta_path}: empty (expected one JSON line of prompt metadata)")
        if len(lines) > 1:
            raise ValueError(f"{meta_path}:{lines[1][0]}: more than one JSON line (expected exactly one)")
        number, line = lines[0]
        metadata = _parse_json_line(line, f"{meta_path}:{number}")
        samples = sub / "samples"
        if not samples.is_dir():
            raise ValueError(f"{sub}: no samples/ folder")
        images = sorted((p for p in samples.iterdir() if p.is_file() and _SAMPLE_NAME.fullmatch(p.name)),
                        key=lambda p: (int(p.stem), p.name))
        if not images:
            raise ValueError(f"{samples}: no samples (expected files named like 0000.png)")
        entries.append(PromptFolder(sub.name, sub, metadata, images))
    return entries


def load_image(path) -> Image.Image:
    """An image file as RGB, EXIF orientation applied (as GenEval does for its crops)."""
    with Image.open(path) as im:
        return ImageOps.exif_transpose(im).convert("RGB")


# ====================================================================================== GenEval's rule


def _iou_plus_one(a, b) -> float:
    """Box IoU with GenEval's (+1 pixel) area convention, used only by its optional NMS."""
    def area(box):
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def select_objects(detections: Iterable[Detection], threshold: float, max_objects: int = 16,
                   max_overlap: float = 1.0) -> dict[str, list[Detection]]:
    """Per class: detections scoring above ``threshold``, most confident first, capped, then NMS."""
    by_class: dict[str, list[Detection]] = {}
    for det in detections:
        by_class.setdefault(det.class_name, []).append(det)
    kept = {}
    for name, dets in by_class.items():
        ordered = sorted((d for d in dets if d.score > threshold), key=lambda d: -d.score)[:max_objects]
        chosen = []
        while ordered:
            best = ordered.pop(0)
            chosen.append(best)
            if max_overlap < 1:
                ordered = [d for d in ordered if _iou_plus_one(best.box, d.box) < max_overlap]
        if chosen:
            kept[name] = chosen
    return kept


def _colors_of(detector, image, objects: list[Detection], class_name: str) -> list[str | None]:
    classify = getattr(detector, "classify_colors", None)
    if classify is not None:
        return list(classify(image, objects, class_name))
    return [d.color for d in objects]


def judge(objects: dict[str, list[Detection]], metadata: dict, colors_of=None,
          position_threshold: float = 0.1) -> tuple[bool, str]:
    """GenEval's verdict for one image: (correct, reason) from the kept objects per class.

    ``colors_of(objects, class_name)`` returns the colour names of those objects (default: their
    ``color`` attribute).
    """
    if colors_of is None:
        def colors_of(objs, _name):
            return [d.color for d in objs]
    correct = True
    reasons = []
    matched_groups: list[list[Detection] | None] = []
    for clause in metadata.get("include", []):
        name, count = clause["class"], int(clause["count"])
        found = objects.get(name, [])[:count]
        matched = True
        if len(found) < count:
            matched = False
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        else:
            if "color" in clause:
                colors = colors_of(found, name)
                hits = colors.count(clause["color"])
                if hits < count:
                    matched = False
                    seen = ", ".join(f"{colors.count(c)} {c}" for c in dict.fromkeys(colors) if c is not None)
                    reasons.append(f"expected {clause['color']} {name}>={count}, found {hits} {clause['color']}; "
                                   f"and {seen}")
            if "position" in clause and matched:
                relation, target = clause["position"]
                group = matched_groups[target] if target < len(matched_groups) else None
                if group is None:
                    matched = False
                    reasons.append(f"no target for {name} to be {relation}")
                else:
                    for obj in found:
                        for other in group:
                            actual = relative_position(obj.box, other.box, threshold=position_threshold)
                            if relation not in actual:
                                matched = False
                                reasons.append(f"expected {name} {relation} target, found "
                                               f"{' and '.join(sorted(actual)) or 'no clear relation to the'} target")
                                break
                        if not matched:
                            break
        correct = correct and matched
        matched_groups.append(found if matched else None)
    for clause in metadata.get("exclude", []):
        name, count = clause["class"], int(clause["count"])
        n = len(objects.get(name, []))
        if n >= count:
            correct = False
            reasons.append(f"expected {name}<{count}, found {n}")
    return correct, "\n".join(reasons)


def _options(options: dict) -> dict:
    unknown = set(options) - set(DEFAULT_OPTIONS)
    if unknown:
        raise ValueError(f"unknown GenEval option(s) {sorted(unknown)}; known: {sorted(DEFAULT_OPTIONS)}")
    merged = {**DEFAULT_OPTIONS, **{k: v for k, v in options.items() if v is not None}}
    merged["max_objects"] = int(merged["max_objects"])
    for key in ("threshold", "counting_threshold", "max_overlap", "position_threshold"):
        merged[key] = float(merged[key])
    return merged


def evaluate_image(image, metadata: dict, detector, filename: str = "", **options) -> dict:
    """One GenEval result record for ``image`` (PIL / uint8 array) under ``metadata``."""
    opts = _options(options)
    image = _to_pil(image)
    threshold = opts["counting_threshold"] if metadata["tag"] == "counting" else opts["threshold"]
    objects = select_objects(detector.detect(image), threshold, opts["max_objects"], opts["max_overlap"])
    correct, reason = judge(objects, metadata, lambda objs, name: _colors_of(detector, image, objs, name),
                            opts["position_threshold"])
    details = {name: [[float(v) for v in d.box] + [float(d.score)] for d in dets] for name, dets in objects.items()}
    return {
        "filename": str(filename),
        "tag": metadata["tag"],
        "prompt": metadata["prompt"],
        "correct": bool(correct),
        "reason": reason,
        "metadata": json.dumps(metadata),
        "details": json.dumps(details),
    }


def evaluate_images(folder, detector, **options) -> list[dict]:
    """Result records of every sample image of a GenEval image folder, in index / sample order."""
    opts = _options(options)
    results = []
    for entry in read_geneval_folder(folder):
        for path in entry.images:
            results.append(evaluate_image(load_image(path), entry.metadata, detector, filename=str(path), **opts))
    return results


def write_results(path, results: Sequence[dict]) -> None:
    """Per-image records as JSON lines, written atomically (temporary file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            for record in results:
                fp.write(json.dumps(record) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_results(path) -> list[dict]:
    path = Path(path)
    results = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                results.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: malformed JSON ({exc.msg})") from None
    return results


def _prompt_key(record: dict) -> tuple[str, str]:
    """Which prompt a record belongs to: its <index> folder when the filename has GenEval's layout.

    GenEval groups by the metadata string alone; that is the same whenever prompts are distinct (as in
    GenEval's prompt file), while random shapes-world prompt sets may repeat a prompt in two folders.
    """
    metadata = record["metadata"] if isinstance(record["metadata"], str) else json.dumps(record["metadata"])
    parent = Path(str(record.get("filename", ""))).parent
    folder = str(parent.parent) if parent.name == "samples" else ""
    return folder, metadata


def summarize(results) -> dict:
    """GenEval's summary of result records (a list of dicts or a results .jsonl path).

    Returns ``images``, ``prompts``, ``correct_images`` (fraction of correct images), ``correct_prompts``
    (fraction of prompts with at least one correct image), ``tasks`` = {tag: {accuracy, correct, total}}
    (GenEval's six tasks first, in their canonical order), ``overall`` (the mean of the per-task image
    accuracies, GenEval's "Overall score") and ``missing_tasks`` (those of the six with no image; GenEval
    then averages the tasks present, and so does this).
    """
    if isinstance(results, (str, os.PathLike)):
        results = read_results(results)
    results = list(results)
    if not results:
        raise ValueError("no results to summarize")
    per_prompt: dict[tuple[str, str], bool] = {}
    per_task: dict[str, list[int]] = {}
    for record in results:
        ok = bool(record["correct"])
        key = _prompt_key(record)
        per_prompt[key] = per_prompt.get(key, False) or ok
        counts = per_task.setdefault(record["tag"], [0, 0])
        counts[0] += ok
        counts[1] += 1
    order = [t for t in TASKS if t in per_task] + [t for t in per_task if t not in TASKS]
    tasks = {t: {"accuracy": per_task[t][0] / per_task[t][1], "correct": per_task[t][0], "total": per_task[t][1]}
             for t in order}
    return {
        "images": len(results),
        "prompts": len(per_prompt),
        "correct_images": sum(bool(r["correct"]) for r in results) / len(results),
        "correct_prompts": sum(per_prompt.values()) / len(per_prompt),
        "tasks": tasks,
        "overall": float(np.mean([v["accuracy"] for v in tasks.values()])),
        "missing_tasks": [t for t in TASKS if t not in per_task],
    }


def format_summary(summary: dict) -> str:
    lines = [
        f"images: {summary['images']}   prompts: {summary['prompts']}",
        f"% correct images:  {summary['correct_images']:.2%}",
        f"% correct prompts: {summary['correct_prompts']:.2%}",
        "",
    ]
    for tag, task in summary["tasks"].items():
        lines.append(f"{tag:<16} = {task['accuracy']:.2%} ({task['correct']} / {task['total']})")
    if summary["missing_tasks"]:
        lines.append(f"missing tasks: {', '.join(summary['missing_tasks'])}")
    lines += ["", f"Overall score (avg. over tasks): {summary['overall']:.5f}"]
    return "\n".join(lines)


def evaluate_folder(folder, detector, outfile=None, **options) -> dict:
    """Score a GenEval image folder; write per-image records to ``outfile`` (JSONL) if given.

    ``options``: ``threshold``, ``counting_threshold``, ``max_objects``, ``max_overlap``,
    ``position_threshold`` (GenEval's ``--options``; defaults in :data:`DEFAULT_OPTIONS`).
    """
    results = evaluate_images(folder, detector, **options)
    if outfile is not None:
        write_results(outfile, results)
    return summarize(results)


# ====================================================================================== backend A: shapes


@lru_cache(maxsize=4096)
def _template(shape: str, w: int, h: int) -> np.ndarray:
    """The world's rasterisation of ``shape`` filling a w x h box (same PIL calls as ``shapes.render``)."""
    im = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(im)
    if shape == "square":
        draw.rectangle([0, 0, w - 1, h - 1], fill=255)
    elif shape == "circle":
        draw.ellipse([0, 0, w - 1, h - 1], fill=255)
    else:
        draw.polygon([(0, h - 1), (w - 1, h - 1), ((w - 1) / 2, 0)], fill=255)
    out = np.asarray(im) > 0
    out.flags.writeable = False
    return out


def _ramp(excess: float, width: float) -> float:
    """1 for excess <= 0, falling linearly to 0 at excess == width."""
    return float(min(max(1.0 - excess / width, 0.0), 1.0))


class ShapesDetector:
    """Analytic detector for shapes-world images (grey background, flat-coloured filled shapes).

    Rule, for an image of side ``S`` (scale ``s = S / 64``; pixel sizes below are multiplied by it):

    1. *Foreground*: pixels farther than ``background_tol`` (40, RGB Euclidean) from the background grey.
    2. *Objects*: 4-connected components of the foreground (``scipy.ndimage.label``); components under
       ``min_area`` (30 px) are noise. A component whose pixels split into two or more palette colours
       with at least ``min_area`` pixels and 25 % of the component each is split by colour (touching
       objects). Each component then keeps only its pixels closer to its median colour than to the
       background -- the 50 % edge of a blurred / compressed object -- and of those its largest
       4-connected piece (again at least ``min_area``).
    3. *Colour*: the nearest :data:`COLORS` entry to the piece's per-channel median pixel;
       ``color_factor`` = 1 up to distance 30, falling linearly to 0 at 70 (then there is no detection).
    4. *Shape*: IoU of the piece with the world's own rasterisation of a circle, a square and a triangle
       filling a candidate box. Candidate sides: the piece's bounding box, the box after trimming
       single-pixel spurs, and the box after trimming sparse outer rows / columns (< 25 % of the
       fullest, at most 2 px per side); all mixes are tried, so stray pixels touching an object do not
       shift the template. The best (shape, box) wins. ``shape_factor`` = (IoU - 0.55) / 0.3 clipped
       to [0, 1] (full at IoU 0.85); ``separation`` = (IoU_best - IoU_second_shape) / 0.1 clipped to
       [0, 1] (for ideal shapes the gap is >= ~0.2, e.g. circle vs square 1 - pi/4).
    5. *Geometry*: ``size_factor`` = 1 while both box sides are within [MIN_SIZE - 1, MAX_SIZE + 1] px,
       falling linearly to 0 four px further out; ``aspect_factor`` = 1 while |w - h| <= 1 px, falling
       linearly to 0 at |w - h| = 5 px.

    ``score = shape_factor * separation * size_factor * aspect_factor * color_factor`` in [0, 1]: 1 for a
    ground-truth object, lower as the blob deviates from an ideal shape (GenEval keeps a detection
    above 0.3, or above 0.9 for counting prompts). Detections scoring 0 are not returned. Boxes are
    (x0, y0, x1, y1), exclusive (the chosen candidate box); ``mask`` is the piece.
    """

    def __init__(self, background=BACKGROUND, background_tol: float = 40.0, min_area: int = 30,
                 palette: dict | None = None):
        self.background = np.asarray(background, dtype=np.float32)
        self.background_tol = float(background_tol)
        self.min_area = int(min_area)
        self.palette_names = list((palette or COLORS).keys())
        self.palette = np.asarray([(palette or COLORS)[c] for c in self.palette_names], dtype=np.float32)

    def detect(self, image) -> list[Detection]:
        from scipy import ndimage

        rgb = _to_array(image).astype(np.float32)
        H, W = rgb.shape[:2]
        scale = min(H, W) / CANVAS
        min_area = max(1, int(round(self.min_area * scale * scale)))
        bg_dist = np.sqrt(((rgb - self.background) ** 2).sum(-1))
        labels, _ = ndimage.label(bg_dist > self.background_tol)  # 4-connectivity
        detections = []
        for index, sl in enumerate(ndimage.find_objects(labels), start=1):
            if sl is None:
                continue
            comp = labels[sl] == index
            if comp.sum() < min_area:
                continue
            for part, part_sl in self._split_by_colour(comp, sl, rgb[sl], min_area):
                refined = self._refine(part, rgb[part_sl], bg_dist[part_sl], min_area)
                if refined is None:
                    continue
                part, box = refined
                part_sl = (slice(part_sl[0].start + box[0].start, part_sl[0].start + box[0].stop),
                           slice(part_sl[1].start + box[1].start, part_sl[1].start + box[1].stop))
                det = self._describe(part, part_sl, rgb, scale, (H, W))
                if det is not None:
                    detections.append(det)
        detections.sort(key=lambda d: -d.score)
        return detections

    @staticmethod
    def _refine(comp, rgb, bg_dist, min_area):
        """Keep the component's pixels closer to its median colour than to the background (the midpoint
        between the two, i.e. the 50 % edge of a blurred or compressed object), largest 4-connected piece."""
        from scipy import ndimage

        colour = np.median(rgb[comp], axis=0)
        inside = comp & (np.sqrt(((rgb - colour) ** 2).sum(-1)) < bg_dist)
        pieces, n = ndimage.label(inside)
        if n == 0:
            return None
        sizes = np.bincount(pieces.ravel())[1:]
        keep = int(sizes.argmax()) + 1
        if sizes[keep - 1] < min_area:
            return None
        box = ndimage.find_objects((pieces == keep).astype(np.int32))[0]
        return pieces[box] == keep, box

    def _split_by_colour(self, comp, sl, rgb, min_area):
        from scipy import ndimage

        dist = np.sqrt(((rgb[:, :, None, :] - self.palette) ** 2).sum(-1))  # (h, w, palette)
        nearest = dist.argmin(-1)
        close = dist.min(-1) < 60
        ids, counts = np.unique(nearest[comp & close], return_counts=True)
        major = [c for c, k in zip(ids, counts) if k >= min_area and k >= 0.25 * comp.sum()]
        if len(major) < 2:
            return [(comp, sl)]
        parts = []
        for c in major:
            sub, _ = ndimage.label(comp & (nearest == c))
            for j, sub_sl in enumerate(ndimage.find_objects(sub), start=1):
                piece = sub[sub_sl] == j
                if piece.sum() >= min_area:
                    full = (slice(sl[0].start + sub_sl[0].start, sl[0].start + sub_sl[0].stop),
                            slice(sl[1].start + sub_sl[1].start, sl[1].start + sub_sl[1].stop))
                    parts.append((piece, full))
        return parts

    def _describe(self, comp: np.ndarray, sl, rgb: np.ndarray, scale: float, shape_hw) -> Detection | None:
        y0, x0 = sl[0].start, sl[1].start
        median = np.median(rgb[sl][comp], axis=0)
        cdist = np.linalg.norm(self.palette - median, axis=-1)
        color_index = int(cdist.argmin())
        color_factor = _ramp(float(cdist[color_index]) - 30.0, 40.0)
        if color_factor <= 0:
            return None
        comp_area = int(comp.sum())
        best = None  # (ranked [(shape, iou)], box)
        for box in self._candidate_boxes(comp, scale):
            bx0, by0, bx1, by1 = box
            w, h = bx1 - bx0, by1 - by0
            if w < 2 or h < 2:
                continue
            inside = comp[by0:by1, bx0:bx1]
            ious = {}
            for shape in ("circle", "square", "triangle"):
                t = _template(shape, w, h)
                inter = int(np.count_nonzero(t & inside))
                ious[shape] = inter / (comp_area + int(np.count_nonzero(t)) - inter)
            ranked = sorted(ious.items(), key=lambda kv: -kv[1])
            if best is None or ranked[0][1] > best[0][0][1]:
                best = (ranked, box)
        if best is None:
            return None
        ranked, (bx0, by0, bx1, by1) = best
        (shape, iou), (_, second) = ranked[0], ranked[1]
        w, h = (bx1 - bx0) / scale, (by1 - by0) / scale
        shape_factor = _ramp(0.85 - iou, 0.3)  # 0 at IoU 0.55
        separation = _ramp(0.1 - (iou - second), 0.1)
        size_excess = max(MIN_SIZE - 1 - min(w, h), max(w, h) - (MAX_SIZE + 1), 0.0)
        size_factor = _ramp(size_excess, 4.0)
        aspect_factor = _ramp(abs(w - h) - 1.0, 4.0)
        score = shape_factor * separation * size_factor * aspect_factor * color_factor
        if score <= 0:
            return None
        mask = np.zeros(shape_hw, dtype=bool)
        mask[sl][comp] = True
        return Detection(shape, round(score, 6), (x0 + bx0, y0 + by0, x0 + bx1, y0 + by1),
                         self.palette_names[color_index], mask)

    @staticmethod
    def _candidate_boxes(comp: np.ndarray, scale: float = 1.0) -> list[tuple[int, int, int, int]]:
        """Candidate boxes (local coordinates) for the template fit: each side is the raw component's,
        the one after trimming single-pixel spurs, or the one after trimming sparse outer rows / columns
        (fewer than 25 % of the fullest row / column, at most 2 px per side)."""
        h, w = comp.shape
        options = [{0}, {0}, {w}, {h}]
        padded = np.pad(comp, 1)
        neighbours = (padded[:-2, 1:-1].astype(np.int8) + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:])
        trimmed = comp & (neighbours >= 2)
        if trimmed.any():
            rows, cols = np.flatnonzero(trimmed.any(1)), np.flatnonzero(trimmed.any(0))
            for k, v in enumerate((cols[0], rows[0], cols[-1] + 1, rows[-1] + 1)):
                options[k].add(int(v))
        limit = max(1, int(round(2 * scale)))
        for axis, (lo, hi) in ((0, (0, 2)), (1, (1, 3))):
            profile = comp.sum(axis=axis)  # axis 0 -> per column (x), axis 1 -> per row (y)
            dense = np.flatnonzero(profile >= 0.25 * profile.max())
            options[lo].add(int(min(dense[0], limit)))
            options[hi].add(int(max(dense[-1] + 1, len(profile) - limit)))
        return [(a, b, c, d) for a in options[0] for b in options[1] for c in options[2] for d in options[3]
                if c - a >= 2 and d - b >= 2]


# ====================================================================================== backend B: transformers


LABEL_ALIASES = {
    # COCO spellings used by common checkpoints -> GenEval's class names (evaluation/object_names.txt)
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
    "motorbike": "motorcycle",
    "aeroplane": "airplane",
    "sofa": "couch",
    "tvmonitor": "tv",
    "tv monitor": "tv",
    "pottedplant": "potted plant",
    "diningtable": "dining table",
    "doughnut": "donut",
    "hair dryer": "hair drier",
    "cellphone": "cell phone",
    "teddybear": "teddy bear",
    "hot-dog": "hot dog",
    "hotdog": "hot dog",
}

_SEGMENTATION_TYPES = ("mask2former", "maskformer", "oneformer")


class TransformersDetector:
    """A COCO detector and CLIP colour classifier, both from local ``transformers`` checkpoint folders.

    ``detector_path``: an ``AutoModelForObjectDetection`` checkpoint (YOLOS, DETR, ...) or a Mask2Former /
    MaskFormer instance-segmentation checkpoint, with its image processor. ``clip_path``: a ``CLIPModel``
    checkpoint with tokenizer and image processor (GenEval: OpenAI CLIP ViT-L/14). Detections scoring
    at least ``min_score`` are returned; GenEval's thresholds are applied by the evaluator. Colours:
    zero-shot over :data:`GENEVAL_COLORS` with GenEval's three templates, text embeddings normalised
    per template, averaged and renormalised; each object is the crop of its box (with its mask, if any,
    composited over ``bgcolor``, GenEval's ``#999``; ``bgcolor="original"`` keeps the image).
    """

    def __init__(self, detector_path, clip_path, device: str | None = None, dtype=None,
                 min_score: float = 0.05, bgcolor: str = "#999", crop: bool = True, clip_batch_size: int = 16,
                 label_aliases: dict | None = None):
        import torch
        from transformers import (AutoConfig, AutoImageProcessor, AutoModelForObjectDetection,
                                  AutoModelForUniversalSegmentation, AutoTokenizer, CLIPModel)

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = dtype or torch.float32
        self.min_score = float(min_score)
        self.bgcolor = bgcolor
        self.crop = bool(crop)
        self.clip_batch_size = int(clip_batch_size)
        for name, path in (("detector_path", detector_path), ("clip_path", clip_path)):
            if not Path(path, "config.json").is_file():
                raise ValueError(f"{name}={path}: not a local transformers checkpoint folder (no config.json)")
        config = AutoConfig.from_pretrained(detector_path, local_files_only=True)
        self.segmentation = config.model_type in _SEGMENTATION_TYPES
        auto = AutoModelForUniversalSegmentation if self.segmentation else AutoModelForObjectDetection
        self.model = auto.from_pretrained(detector_path, local_files_only=True)
        self.model.to(self.device, self.dtype).eval()
        self.processor = AutoImageProcessor.from_pretrained(detector_path, local_files_only=True)
        aliases = {**LABEL_ALIASES, **(label_aliases or {})}
        self.labels = {int(i): aliases.get(str(name).lower().strip(), str(name).lower().strip())
                       for i, name in self.model.config.id2label.items()}
        self.clip = CLIPModel.from_pretrained(clip_path, local_files_only=True)
        self.clip.to(self.device, self.dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(clip_path, local_files_only=True)
        self.clip_processor = AutoImageProcessor.from_pretrained(clip_path, local_files_only=True)
        self._classifiers = {}

    # -------------------------------------------------------------------------- detection

    def detect(self, image) -> list[Detection]:
        import torch

        image = _to_pil(image)
        W, H = image.size
        inputs = self.processor(images=image, return_tensors="pt")
        inputs = {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                  for k, v in inputs.items()}
        with torch.inference_mode():
            outputs = self.model(**inputs)
        detections = []
        if self.segmentation:
            result = self.processor.post_process_instance_segmentation(
                outputs, threshold=self.min_score, target_sizes=[(H, W)], return_binary_maps=True)[0]
            maps = result["segmentation"]
            for k, info in enumerate(result["segments_info"]):
                mask = maps[k].cpu().numpy() > 0
                ys, xs = np.nonzero(mask)
                if len(xs) == 0:
                    continue
                box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
                detections.append(Detection(self.labels.get(int(info["label_id"]), str(info["label_id"])),
                                            float(info["score"]), box, None, mask))
        else:
            result = self.processor.post_process_object_detection(
                outputs, threshold=self.min_score, target_sizes=[(H, W)])[0]
            for score, label, box in zip(result["scores"].tolist(), result["labels"].tolist(),
                                         result["boxes"].float().tolist()):
                x0, y0, x1, y1 = box
                box = (min(max(x0, 0.0), W), min(max(y0, 0.0), H), min(max(x1, 0.0), W), min(max(y1, 0.0), H))
                detections.append(Detection(self.labels.get(int(label), str(label)), float(score), box))
        detections.sort(key=lambda d: -d.score)
        return detections

    # -------------------------------------------------------------------------- colour

    def _features(self, output):
        return output if hasattr(output, "dim") else output.pooler_output

    def _classifier(self, class_name: str):
        import torch

        if class_name not in self._classifiers:
            columns = []
            with torch.inference_mode():
                for color in GENEVAL_COLORS:
                    texts = [t.format(c=color, obj=class_name) for t in COLOR_TEMPLATES]
                    tokens = self.tokenizer(texts, padding=True, return_tensors="pt").to(self.device)
                    tokens = {k: v for k, v in tokens.items() if k in ("input_ids", "attention_mask")}
                    emb = self._features(self.clip.get_text_features(**tokens)).float()
                    emb = torch.nn.functional.normalize(emb, dim=-1).mean(0)
                    columns.append(emb / emb.norm())
            self._classifiers[class_name] = torch.stack(columns, dim=1)  # (D, n_colours)
        return self._classifiers[class_name]

    def crops(self, image, detections: Sequence[Detection]) -> list[Image.Image]:
        """GenEval's colour crops: mask composited over ``bgcolor`` (if a mask exists), then the box."""
        image = _to_pil(image)
        blank = image.copy() if self.bgcolor == "original" else Image.new("RGB", image.size, self.bgcolor)
        out = []
        for det in detections:
            crop = image
            if det.mask is not None:
                if tuple(det.mask.shape) != (image.size[1], image.size[0]):
                    raise ValueError(f"mask of shape {tuple(det.mask.shape)} does not match the image "
                                     f"({image.size[1]}, {image.size[0]})")
                crop = Image.composite(image, blank, Image.fromarray(np.asarray(det.mask, dtype=np.uint8) * 255))
            if self.crop:
                x0, y0, x1, y1 = (int(round(v)) for v in det.box)
                crop = crop.crop((x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)))
            out.append(crop)
        return out

    def classify_colors(self, image, detections: Sequence[Detection], class_name: str) -> list[str]:
        import torch

        if not detections:
            return []
        classifier = self._classifier(class_name)
        crops = self.crops(image, detections)
        names = []
        with torch.inference_mode():
            for i in range(0, len(crops), self.clip_batch_size):
                pixels = self.clip_processor(images=crops[i:i + self.clip_batch_size], return_tensors="pt")
                pixels = pixels["pixel_values"].to(self.device, self.dtype)
                feats = self._features(self.clip.get_image_features(pixel_values=pixels)).float()
                logits = torch.nn.functional.normalize(feats, dim=-1) @ classifier
                names += [GENEVAL_COLORS[j] for j in logits.argmax(1).tolist()]
        return names


# ====================================================================================== registry / CLI


DETECTORS = {"shapes": ShapesDetector, "transformers": TransformersDetector}


def get_detector(name: str, **kwargs):
    """A detector by name: ``shapes`` (keyword options of :class:`ShapesDetector`) or ``transformers``
    (``detector_path=...``, ``clip_path=...`` and options of :class:`TransformersDetector`)."""
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; choose one of {sorted(DETECTORS)}")
    if name == "transformers":
        missing = [k for k in ("detector_path", "clip_path") if not kwargs.get(k)]
        if missing:
            raise ValueError(f"the transformers detector needs local checkpoint folders: {', '.join(missing)}")
    return DETECTORS[name](**kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m visualspec.eval.geneval",
                                     description="Score a GenEval-layout image folder.")
    parser.add_argument("folder")
    parser.add_argument("--detector", default="shapes", choices=sorted(DETECTORS))
    parser.add_argument("--detector-path")
    parser.add_argument("--clip-path")
    parser.add_argument("--outfile")
    parser.add_argument("--json", help="also write the summary as JSON here")
    parser.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE",
                        help=f"GenEval options: {', '.join(DEFAULT_OPTIONS)}")
    args = parser.parse_args(argv)
    try:
        options = dict(opt.split("=", 1) for opt in args.options)
    except ValueError:
        parser.error("--options take KEY=VALUE")
    kwargs = {}
    if args.detector == "transformers":
        kwargs = {"detector_path": args.detector_path, "clip_path": args.clip_path}
    try:
        summary = evaluate_folder(args.folder, get_detector(args.detector, **kwargs), args.outfile, **options)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
