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

from ..worlds.shapes import BACKGROUND, CANVAS, COLORS
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


def solidity(mask: np.ndarray) -> float:
    """Area over convex-hull area of ``mask`` after a closing and an opening with a 3 x 3 cross
    (single-pixel notches filled, spurs cut, so a ragged edge is not a concave outline): ~0.95 for a
    drawn circle, square or triangle, 0.55 to 0.75 for an L or a T (a thick cross: ~0.8)."""
    from scipy import ndimage
    from scipy.spatial import ConvexHull

    cross = ndimage.generate_binary_structure(2, 1)
    smooth = ndimage.binary_opening(ndimage.binary_closing(np.pad(mask, 2), cross), cross)
    if smooth.sum() < 3:
        smooth = np.pad(mask, 2)
    ys, xs = np.nonzero(smooth)
    corners = np.concatenate([np.stack([xs + dx, ys + dy], 1) for dx in (0, 1) for dy in (0, 1)])
    return float(smooth.sum() / ConvexHull(corners).volume)


def shape_confidence(ious: dict[str, float], temperature: float) -> dict[str, float]:
    """How sure the shape is, as a classifier's softmax over template fits:
    ``p(shape) = exp(IoU_shape / T) / sum_k exp(IoU_k / T)``.

    The ideal shapes are far apart (a circle's IoU with a square's template is pi/4), so at T = 0.01
    a clean circle is a circle with p > 0.9999; two fits 0.02 apart give the better one 0.88."""
    top = max(ious.values())
    weights = {shape: float(np.exp((iou - top) / temperature)) for shape, iou in ious.items()}
    total = sum(weights.values())
    return {shape: w / total for shape, w in weights.items()}


def pixel_colours(rgb: np.ndarray, background: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """Each pixel's palette colour, or -1 for the background: (H, W) int from (H, W, 3) RGB.

    Whether a pixel is background: it is explained by the nearest point ``a + t (b - a)``, ``t`` in
    [0, 1], of the segments between the background and each palette colour and between every two
    palette colours (RGB Euclidean). On a background-to-colour segment it is background when
    ``t < 0.5`` (a blurred edge is cut at its 50 % point); on a colour-to-colour segment it is never
    background, so where one colour fades into another the object stays whole. A pixel that is not
    background takes the nearest palette colour.
    """
    rgb = rgb.astype(np.float32)[:, :, None, :]
    ends = np.concatenate([background[None], palette]).astype(np.float32)  # 0 = background
    pairs = np.asarray([(a, b) for a in range(len(ends)) for b in range(a + 1, len(ends))])
    a, d = ends[pairs[:, 0]], ends[pairs[:, 1]] - ends[pairs[:, 0]]
    x = rgb - a  # (H, W, segments, 3)
    t = np.clip((x * d).sum(-1) / (d * d).sum(-1), 0.0, 1.0)
    best = ((x - t[..., None] * d) ** 2).sum(-1).argmin(-1)
    t = np.take_along_axis(t, best[..., None], -1)[..., 0]
    background = (pairs[best, 0] == 0) & (t < 0.5)
    colour = ((rgb - palette) ** 2).sum(-1).argmin(-1)
    return np.where(background, -1, colour)


class ShapesDetector:
    """Analytic detector for shapes-world images that counts objects as a person does.

    Every connected object of a palette colour is one detection, whole or not; how whole it is is a
    separate attribute (``broken``, with ``flaws`` naming why), not a reason to drop it. Rule, for
    an image of side ``S`` (scale ``s = S / 64``; pixel sizes below are multiplied by it, areas by
    its square):

    1. *Pixels*: each pixel is a palette colour or background by :func:`pixel_colours`: a blurred
       edge is cut at its 50 % point, and an off-colour, smudged or two-coloured object (one colour
       fading into another) stays foreground as a whole.
    2. *Objects*: 4-connected components of the foreground; under ``min_area`` (30 px) they are
       specks. A component is one object unless it fits no shape well (``fit`` below
       ``split_below``, 0.6) and splits into two or more palette colours (each at least
       ``min_area`` and 25 % of it) whose pieces fit shapes clearly better than the whole does
       (``split_margin``: 0.1 of fit quality): touching objects of different colours are two, a
       triangle with a yellow tip is one.
    3. *Shape*: IoU of the object with the world's own rasterisation of a circle, a square and a
       triangle filling a candidate box (the object's box, the box after trimming single-pixel spurs
       and sparse outer rows / columns; the best box wins). ``fit = IoU_best * aspect``, with
       ``aspect`` = 1 while the box's long side is at most ``max_aspect`` (1.35) times its short
       one, falling linearly to 0 at 1.8 times: shapes are drawn in square boxes, and a generated
       one stretched by a third is still that shape, while two shapes side by side are not one.
    4. *Score* (the class confidence, as GenEval's detector gives one; GenEval keeps a detection
       above 0.3, above 0.9 for counting): ``score = p(shape) * objectness``, ``p`` the softmax of
       :func:`shape_confidence` at ``temperature`` (0.01). ``objectness`` multiplies two ramps,
       so a shapeless blob (an L, a T, a cross, two shapes of one colour run together) or a patch
       of noise is no object: 1 while ``fit * solidity`` (:func:`solidity`: every drawn shape is
       convex) is at least ``shape_whole`` (0.6), falling linearly to 0 at ``shape_none`` (0.5)
       -- the objects a person counted in the shipped model's images reach 0.66 and more, L, T
       and cross blobs at most 0.58 --; and 1 while its two commonest colours cover at least
       60 % of it, falling to 0 at 40 % (an object is drawn in one colour, blended into at most
       one more). Size does not matter beyond ``min_area``.
    5. *Colour*: the palette colour most of the object's pixels are nearest to.
    6. *Flaws*: ``"two colours"`` when a second colour covers at least 20 % of the object,
       ``"misshapen"`` when ``fit < 0.8``; ``broken`` when there is any.

    Boxes are (x0, y0, x1, y1), exclusive (the chosen candidate box); ``mask`` is the object.
    ``temperature``, ``shape_whole``, ``shape_none`` and ``split_below`` were chosen by a rule on
    corrupted renders (``benchmarks/detector_validation.py --calibrate``;
    docs/experiments/2026-11-27-detector-counts-like-a-person.md).
    """

    def __init__(self, background=BACKGROUND, min_area: int = 30, palette: dict | None = None,
                 max_aspect: float = 1.35, temperature: float = 0.01, shape_whole: float = 0.6,
                 shape_none: float = 0.5, split_below: float = 0.6, split_margin: float = 0.1):
        self.background = np.asarray(background, dtype=np.float32)
        self.min_area = int(min_area)
        self.max_aspect = float(max_aspect)
        self.temperature = float(temperature)
        self.shape_whole, self.shape_none = float(shape_whole), float(shape_none)
        self.split_below, self.split_margin = float(split_below), float(split_margin)
        self.palette_names = list((palette or COLORS).keys())
        self.palette = np.asarray([(palette or COLORS)[c] for c in self.palette_names], dtype=np.float32)

    def detect(self, image) -> list[Detection]:
        from scipy import ndimage

        rgb = to_array(image).astype(np.float32)
        H, W = rgb.shape[:2]
        scale = min(H, W) / CANVAS
        min_area = max(1, int(round(self.min_area * scale * scale)))
        nearest = pixel_colours(rgb, self.background, self.palette)
        labels, _ = ndimage.label(nearest >= 0)  # 4-connectivity
        detections = []
        for index, sl in enumerate(ndimage.find_objects(labels), start=1):
            comp = labels[sl] == index
            if comp.sum() < min_area:
                continue
            for piece, piece_sl, fitted in self._objects(comp, sl, nearest[sl], scale, min_area):
                det = self._describe(piece, piece_sl, fitted, nearest, (H, W))
                if det is not None:
                    detections.append(det)
        detections.sort(key=lambda d: -d.score)
        return detections

    def _objects(self, comp, sl, nearest, scale, min_area):
        """The component as one object, or split by colour where its pieces fit clearly better:
        [(mask, slice, :meth:`_fit` of the mask)]."""
        from scipy import ndimage

        whole = [(comp, sl, self._fit(comp, scale))]
        ids, counts = np.unique(nearest[comp], return_counts=True)
        major = [c for c, k in zip(ids, counts) if k >= min_area and k >= 0.25 * comp.sum()]
        if len(major) < 2 or whole[0][2][2] >= self.split_below:
            return whole
        parts = []
        for c in major:
            sub, _ = ndimage.label(comp & (nearest == c))
            for j, sub_sl in enumerate(ndimage.find_objects(sub), start=1):
                piece = sub[sub_sl] == j
                if piece.sum() >= min_area:
                    parts.append((piece, (slice(sl[0].start + sub_sl[0].start, sl[0].start + sub_sl[0].stop),
                                          slice(sl[1].start + sub_sl[1].start, sl[1].start + sub_sl[1].stop)),
                                  self._fit(piece, scale)))
        fits = [fitted[2] for _, _, fitted in parts]
        areas = [int(piece.sum()) for piece, _, _ in parts]
        if len(parts) < 2 or np.average(fits, weights=areas) < whole[0][2][2] + self.split_margin:
            return whole
        return parts

    def _fit(self, comp: np.ndarray, scale: float):
        """(IoU per shape, box, fit) of the best candidate box: ``fit = IoU_best * aspect``."""
        area = int(comp.sum())
        best = ({"circle": 0.0, "square": 0.0, "triangle": 0.0}, (0, 0, comp.shape[1], comp.shape[0]), 0.0)
        for box in self._candidate_boxes(comp, scale):
            bx0, by0, bx1, by1 = box
            w, h = bx1 - bx0, by1 - by0
            inside = comp[by0:by1, bx0:bx1]
            ious = {}
            for shape in ("circle", "square", "triangle"):
                t = _template(shape, w, h)
                inter = int(np.count_nonzero(t & inside))
                ious[shape] = inter / (area + int(np.count_nonzero(t)) - inter)
            aspect = _ramp(max(w, h) / min(w, h) - self.max_aspect, 1.8 - self.max_aspect)
            fit = max(ious.values()) * aspect
            if fit > best[2] or (fit == best[2] == 0 and max(ious.values()) > max(best[0].values())):
                best = (ious, box, fit)
        return best

    def _describe(self, comp: np.ndarray, sl, fitted, nearest: np.ndarray, shape_hw) -> Detection | None:
        ious, (bx0, by0, bx1, by1), fit = fitted
        colours = np.bincount(nearest[sl][comp], minlength=len(self.palette_names))
        order = np.argsort(-colours)
        two_colours = (colours[order[0]] + colours[order[1]]) / comp.sum()
        shapeliness = fit * solidity(comp)
        objectness = (_ramp(self.shape_whole - shapeliness, self.shape_whole - self.shape_none)
                      * _ramp(0.6 - two_colours, 0.2))
        confidence = shape_confidence(ious, self.temperature)
        shape = max(confidence, key=confidence.get)
        score = confidence[shape] * objectness
        if score <= 0:
            return None
        flaws = []
        if colours[order[1]] >= 0.2 * comp.sum():
            flaws.append("two colours")
        if fit < 0.8:
            flaws.append("misshapen")
        y0, x0 = sl[0].start, sl[1].start
        mask = np.zeros(shape_hw, dtype=bool)
        mask[sl][comp] = True
        return Detection(shape, round(score, 6), (x0 + bx0, y0 + by0, x0 + bx1, y0 + by1),
                         self.palette_names[int(order[0])], mask, broken=bool(flaws), flaws=tuple(flaws))

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
