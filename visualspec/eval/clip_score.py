"""CLIP score (image-text agreement) with a locally stored transformers CLIP model.

Definition (torchmetrics ``CLIPScore`` / ``clip_score`` convention, also used by most text-to-image papers
that report "CLIP score" on a 0..100 scale)::

    s_i  = 100 * cos(E_img(image_i), E_txt(caption_i))        (per pair)
    CLIPScore = max(mean_i s_i, 0)                             (clamp="mean", the default)

``E_img`` / ``E_txt`` are ``CLIPModel.get_image_features`` / ``get_text_features`` (projected embeddings).
torchmetrics' code clamps the *mean* at 0 (its docstring writes the clamp per pair); ``clamp="pair"``
gives ``mean_i max(s_i, 0)`` instead. The two agree whenever every pair has a non-negative cosine, which
is the normal case for real CLIP models. The original CLIPScore paper (Hessel et al., 2021) uses
``2.5 * max(cos, 0)`` per pair: multiply by 0.025 for that scale.

Preprocessing is the checkpoint's own ``CLIPProcessor``: images (uint8 RGB) are resized / center-cropped /
normalised by its image processor; captions are tokenised with padding and truncated to the text model's
``max_position_embeddings`` (torchmetrics also truncates there, but after tokenisation, which drops the
end-of-text token of over-long captions; only captions longer than the context differ).

Models load with ``local_files_only=True`` from a folder: nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..core.checks import check_positive_int

__all__ = ["CLIPScorer", "clip_score"]


def _projected(out) -> torch.Tensor:
    """``get_*_features`` returns a tensor (transformers 4.x) or an output whose ``pooler_output`` holds
    the projected embedding (transformers 5.x)."""
    if isinstance(out, torch.Tensor):
        return out
    pooled = getattr(out, "pooler_output", None)
    if pooled is None and isinstance(out, (tuple, list)):
        pooled = out[1] if len(out) > 1 else out[0]
    if pooled is None:
        raise TypeError(f"unexpected CLIP feature output of type {type(out).__name__}")
    return pooled


def _to_uint8_hwc_list(images) -> list[np.ndarray]:
    """Images -> list of uint8 (H, W, 3) arrays.

    Accepts: a list of PIL images or arrays; a numpy array (N, H, W, 3) or (H, W, 3); a torch tensor
    (N, 3, H, W) / (3, H, W) (channel-first, as torchmetrics takes) or channel-last (N, H, W, 3).
    uint8 is used as is; float data is taken to be in [0, 1] and rounded to uint8.
    """
    from PIL import Image

    def one(a) -> np.ndarray:
        if isinstance(a, Image.Image):
            return np.asarray(a.convert("RGB"), dtype=np.uint8)
        if isinstance(a, torch.Tensor):
            a = a.detach().cpu()
            if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
                a = a.permute(1, 2, 0)
            a = a.numpy()
        a = np.asarray(a)
        if a.ndim == 2:
            a = a[..., None]
        if a.ndim != 3 or a.shape[-1] not in (1, 3):
            raise ValueError(f"expected an RGB image (H, W, 3), got shape {a.shape}")
        if a.shape[-1] == 1:
            a = np.repeat(a, 3, axis=-1)
        if a.dtype == np.uint8:
            return a
        if np.issubdtype(a.dtype, np.floating):
            if a.size and (a.min() < 0 or a.max() > 1):
                raise ValueError("float images must lie in [0, 1]; pass uint8 for 0..255 data")
            return np.round(a * 255.0).astype(np.uint8)
        raise ValueError(f"images must be uint8 or float in [0, 1], got dtype {a.dtype}")

    if isinstance(images, torch.Tensor):
        if images.ndim == 3:
            images = images.unsqueeze(0)
        if images.ndim != 4:
            raise ValueError(f"expected an image batch of 4 dims, got shape {tuple(images.shape)}")
        if images.shape[1] in (1, 3) and images.shape[-1] not in (1, 3):
            images = images.permute(0, 2, 3, 1)
        return [one(im) for im in images]
    if isinstance(images, np.ndarray):
        if images.ndim == 3:
            images = images[None]
        if images.ndim != 4:
            raise ValueError(f"expected images (N, H, W, 3), got shape {images.shape}")
        return [one(im) for im in images]
    return [one(im) for im in images]


class CLIPScorer:
    """CLIP score with a transformers ``CLIPModel`` and its processor (see the module docstring).

    Build it from a local folder with :meth:`from_pretrained`, or from objects already in memory.
    """

    def __init__(self, model, processor=None, *, tokenizer=None, image_processor=None, device=None,
                 dtype: torch.dtype | None = None, batch_size: int = 32):
        if processor is not None:
            if tokenizer is None:
                tokenizer = processor.tokenizer
            if image_processor is None:
                image_processor = processor.image_processor
        if tokenizer is None or image_processor is None:
            raise ValueError("CLIPScorer needs a processor, or both a tokenizer and an image processor")
        check_positive_int("batch_size", batch_size)
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        if device is None:
            device = next(model.parameters()).device
        self.device = torch.device(device)
        self.model = model.to(self.device) if dtype is None else model.to(self.device, dtype=dtype)
        self.model.eval()
        self.dtype = next(self.model.parameters()).dtype
        self.batch_size = batch_size
        self.max_length = int(self.model.config.text_config.max_position_embeddings)

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype: torch.dtype | None = torch.float32,
                        batch_size: int = 32) -> "CLIPScorer":
        """Load ``CLIPModel`` + ``CLIPProcessor`` from a local folder (``local_files_only=True``).

        If the folder has no processor config, the tokenizer (``AutoTokenizer``) and the image processor
        (``CLIPImageProcessor``) are loaded separately from the same folder.
        """
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel, CLIPProcessor

        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"CLIP model folder not found: {folder} (CLIP score loads local files only)")
        model = CLIPModel.from_pretrained(str(folder), local_files_only=True)
        try:
            processor = CLIPProcessor.from_pretrained(str(folder), local_files_only=True)
            return cls(model, processor, device=device, dtype=dtype, batch_size=batch_size)
        except (OSError, ValueError, TypeError):
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            ip = CLIPImageProcessor.from_pretrained(str(folder), local_files_only=True)
            return cls(model, tokenizer=tok, image_processor=ip, device=device, dtype=dtype,
                       batch_size=batch_size)

    def save_pretrained(self, path) -> Path:
        """Write model, tokenizer and image processor to ``path`` (loadable by :meth:`from_pretrained`)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        self.image_processor.save_pretrained(str(path))
        return path

    @torch.inference_mode()
    def image_embeddings(self, images) -> torch.Tensor:
        """L2-normalised image embeddings, float32 (N, E) on CPU."""
        arrs = _to_uint8_hwc_list(images)
        if not arrs:
            raise ValueError("no images given")
        out = []
        for i in range(0, len(arrs), self.batch_size):
            px = self.image_processor(images=arrs[i:i + self.batch_size], return_tensors="pt")["pixel_values"]
            emb = _projected(self.model.get_image_features(pixel_values=px.to(self.device, self.dtype)))
            out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu())
        return torch.cat(out)

    @torch.inference_mode()
    def text_embeddings(self, texts: Sequence[str] | str) -> torch.Tensor:
        """L2-normalised text embeddings, float32 (N, E) on CPU."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts:
            raise ValueError("no captions given")
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("captions must be strings")
        out = []
        for i in range(0, len(texts), self.batch_size):
            tok = self.tokenizer(texts[i:i + self.batch_size], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt")
            kwargs = {"input_ids": tok["input_ids"].to(self.device)}
            if "attention_mask" in tok:
                kwargs["attention_mask"] = tok["attention_mask"].to(self.device)
            emb = _projected(self.model.get_text_features(**kwargs))
            out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu())
        return torch.cat(out)

    def pair_scores(self, images, texts) -> np.ndarray:
        """Per-pair ``100 * cos(image_i, caption_i)`` (float64, not clamped), shape (N,)."""
        if isinstance(texts, str):
            texts = [texts]
        img = self.image_embeddings(images)
        txt = self.text_embeddings(texts)
        if img.shape[0] != txt.shape[0]:
            raise ValueError(f"got {img.shape[0]} images but {txt.shape[0]} captions; CLIP score needs pairs")
        return 100.0 * (img.double() * txt.double()).sum(-1).numpy()

    def score(self, images, texts, clamp: str = "mean") -> float:
        """CLIP score in [0, 100]: ``max(mean(s), 0)`` (``clamp="mean"``, torchmetrics) or
        ``mean(max(s, 0))`` (``clamp="pair"``), with ``s`` from :meth:`pair_scores`."""
        s = self.pair_scores(images, texts)
        if clamp == "mean":
            return float(max(s.mean(), 0.0))
        if clamp == "pair":
            return float(np.maximum(s, 0.0).mean())
        raise ValueError(f"clamp must be 'mean' or 'pair', got {clamp!r}")

    __call__ = score


def clip_score(images, texts, model_path: str | os.PathLike, device="cpu", clamp: str = "mean",
               batch_size: int = 32) -> float:
    """One-shot CLIP score with the CLIP model stored in the local folder ``model_path``."""
    return CLIPScorer.from_pretrained(model_path, device=device, batch_size=batch_size).score(
        images, texts, clamp=clamp)
