"""The two object detectors of the GenEval protocol (:mod:`visualspec.eval.geneval`):

* :class:`ShapesDetector`: exact and analytic, for the shapes world's images (no weights);
* :class:`TransformersDetector`: a COCO detector plus CLIP for colours, from local folders.

:func:`get_detector` builds one by name.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from ..worlds.shapes import BACKGROUND, CANVAS, COLORS, MAX_SIZE, MIN_SIZE
from .geneval import COLOR_TEMPLATES, GENEVAL_COLORS, Detection, to_array, to_pil


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
       falling linearly to 0 four px further out; ``aspect_factor`` = 1 while |w - h| <=
       ``aspect_tolerance`` px (3; 1 before 2026-11-26), falling linearly to 0 four px further out:
       a generated shape a few pixels off square is still whole
       (``benchmarks/detector_validation.py``).

    ``score = shape_factor * separation * size_factor * aspect_factor * color_factor`` in [0, 1]: 1 for a
    ground-truth object, lower as the blob deviates from an ideal shape (GenEval keeps a detection
    above 0.3, or above 0.9 for counting prompts). Detections scoring 0 are not returned. Boxes are
    (x0, y0, x1, y1), exclusive (the chosen candidate box); ``mask`` is the piece.
    """

    def __init__(self, background=BACKGROUND, background_tol: float = 40.0, min_area: int = 30,
                 palette: dict | None = None, aspect_tolerance: float = 3.0):
        self.background = np.asarray(background, dtype=np.float32)
        self.background_tol = float(background_tol)
        self.min_area = int(min_area)
        self.aspect_tolerance = float(aspect_tolerance)
        self.palette_names = list((palette or COLORS).keys())
        self.palette = np.asarray([(palette or COLORS)[c] for c in self.palette_names], dtype=np.float32)

    def detect(self, image) -> list[Detection]:
        from scipy import ndimage

        rgb = to_array(image).astype(np.float32)
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
        aspect_factor = _ramp(abs(w - h) - self.aspect_tolerance, 4.0)
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

        image = to_pil(image)
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
        image = to_pil(image)
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
