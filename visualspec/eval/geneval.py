"""GenEval-protocol scoring of image folders, with pluggable object detectors.

GenEval (Ghosh et al., 2023) scores a text-to-image model on six compositional tasks
(``single_object``, ``two_object``, ``counting``, ``colors``, ``position``, ``color_attr``): an object
detector finds the objects in every generated image and a fixed rule checks them against the prompt's
metadata. This module re-implements that rule and GenEval's summary on top of a small detector
protocol, so the same scorer runs on two backends:

* :class:`visualspec.eval.detectors.ShapesDetector` -- an exact, analytic detector for :mod:`visualspec.worlds.shapes` images
  (grey canvas, filled circles / squares / triangles in eight colours). No weights, a few ms per image.
* :class:`visualspec.eval.detectors.TransformersDetector` -- real photographs: a COCO detector plus CLIP for colours, both loaded
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
  ...) are mapped with :data:`visualspec.eval.detectors.LABEL_ALIASES`. Scores of this backend are comparable with published
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

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np
from PIL import Image, ImageOps

from ..core.checks import check_positive_int
from ..worlds.shapes import TASKS, relative_position
from .images import read_image

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
    """One detected object. ``box`` is (x0, y0, x1, y1) in pixels, x1/y1 exclusive. ``broken`` says
    the object is counted but imperfect, ``flaws`` how (None: the detector does not say)."""

    class_name: str
    score: float
    box: tuple[float, float, float, float]
    color: str | None = None
    mask: np.ndarray | None = field(default=None, repr=False)  # (H, W) bool over the whole image
    broken: bool | None = None
    flaws: tuple[str, ...] = ()


class Detector(Protocol):
    def detect(self, image) -> list[Detection]: ...


def to_pil(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] not in (3, 4):
        raise ValueError(f"expected a PIL image or an (H, W, 3) uint8 array, got {array.dtype} {array.shape}")
    return Image.fromarray(np.ascontiguousarray(array[..., :3]))


def to_array(image) -> np.ndarray:
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    return np.asarray(to_pil(image))


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
    check_positive_int(f"{at}: 'count'", count)


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
    """An image file as RGB, EXIF orientation applied (as GenEval does for its crops); a file that
    is not a whole image raises ValueError naming it (:func:`visualspec.eval.images.read_image`)."""
    return ImageOps.exif_transpose(read_image(path)).convert("RGB")


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
    image = to_pil(image)
    threshold = opts["counting_threshold"] if metadata["tag"] == "counting" else opts["threshold"]
    objects = select_objects(detector.detect(image), threshold, opts["max_objects"], opts["max_overlap"])
    correct, reason = judge(objects, metadata, lambda objs, name: _colors_of(detector, image, objs, name),
                            opts["position_threshold"])
    details = {name: [[float(v) for v in d.box] + [float(d.score)] for d in dets] for name, dets in objects.items()}
    record = {
        "filename": str(filename),
        "tag": metadata["tag"],
        "prompt": metadata["prompt"],
        "correct": bool(correct),
        "reason": reason,
        "metadata": json.dumps(metadata),
        "details": json.dumps(details),
    }
    if any(d.broken is not None for dets in objects.values() for d in dets):
        # what is wrong with each kept object, in the order of ``details`` ([] for a whole one)
        record["flaws"] = json.dumps({name: [list(d.flaws) for d in dets] for name, dets in objects.items()})
    return record


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
