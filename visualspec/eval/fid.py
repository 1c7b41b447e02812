"""Fréchet distance (FID) between image feature distributions.

What is computed
----------------
Each image set is summarised by the mean ``mu`` (D,) and the covariance ``sigma`` (D, D) of its
features (float64, covariance with the unbiased ``N - 1`` denominator, i.e. ``numpy.cov(f, rowvar=False)``).
The Fréchet distance between the Gaussians N(mu1, sigma1) and N(mu2, sigma2) is::

    FD = ||mu1 - mu2||^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^(1/2))

With the features of :class:`visualspec.eval.inception.FIDInceptionV3` (2048-d ``pool_3`` features of the TensorFlow Inception
graph of 2015-12-05, loaded from pytorch-fid's weights file ``pt_inception-2015-12-05-6726825d.pth``)
and the same preprocessing as pytorch-fid (float images in [0, 1] -> bilinear resize to 299x299 with
``align_corners=False`` and no antialiasing -> ``2 x - 1``), the numbers are comparable to
**pytorch-fid** (``python -m pytorch_fid``) and to clean-fid's ``mode="legacy_pytorch"``. They are *not*
bit-identical to TF/ADM/torch-fidelity FID (those use the TF1 bilinear resize on uint8 inputs) nor to
clean-fid's default ``mode="clean"`` (PIL bicubic resize); differences are usually small but real, so
only compare FIDs computed with the same pipeline and the same reference statistics.

``tr((sigma1 sigma2)^(1/2))`` is evaluated exactly without ``scipy.linalg.sqrtm``: for symmetric PSD
matrices, the eigenvalues of ``sigma1 sigma2`` equal the squared singular values of
``sqrt(sigma1) sqrt(sigma2)``, so the trace is the nuclear norm of ``sqrt(sigma1) @ sqrt(sigma2)``, where
the symmetric square roots come from ``numpy.linalg.eigh`` (negative round-off eigenvalues clipped to 0).
This is well defined for rank-deficient covariances (fewer samples than dimensions) and needs no
``eps * I`` regularisation, unlike pytorch-fid's ``calculate_frechet_distance``.

Feature extractors
------------------
Anything implementing :class:`FeatureExtractor` (``extractor(images_uint8_NHWC) -> (N, D) array``) can be
used: :func:`visualspec.eval.inception.inception_extractor` for standard FID, or :class:`TorchFeatureExtractor` wrapping any
``nn.Module`` that maps float ``(N, 3, H, W)`` images in [0, 1] to ``(N, D)`` features (e.g. a small
network trained on a synthetic world).

Nothing here downloads anything: weights and reference statistics come from local files.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence, Union, runtime_checkable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.checks import check_positive_int

__all__ = [
    "IMAGE_EXTENSIONS",
    "FeatureExtractor",
    "FeatureStats",
    "RunningStatistics",
    "TorchFeatureExtractor",
    "compute_statistics",
    "fid_from_folder",
    "fid_from_folders",
    "fid_of_images",
    "frechet_distance",
    "image_folder_features",
    "images_to_float_nchw",
    "list_image_files",
    "load_statistics",
    "save_statistics",
    "trace_sqrt_product",
]


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
"""Extensions (case-insensitive) picked up by :func:`list_image_files`."""


# ----------------------------------------------------------------------------------------------
# Fréchet distance
# ----------------------------------------------------------------------------------------------

def _as_stats(mu, sigma, which: str) -> tuple[np.ndarray, np.ndarray]:
    mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
    sigma = np.atleast_2d(np.asarray(sigma, dtype=np.float64))
    if mu.ndim != 1:
        raise ValueError(f"mu{which} must be a vector of shape (D,), got shape {mu.shape}")
    d = mu.shape[0]
    if sigma.shape != (d, d):
        raise ValueError(f"sigma{which} must have shape (D, D) = ({d}, {d}) to match mu{which}, "
                         f"got {sigma.shape}")
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(sigma))):
        raise ValueError(f"mu{which} / sigma{which} contain NaN or inf")
    return mu, sigma


def _psd_sqrt(sigma: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric PSD matrix (negative round-off eigenvalues -> 0)."""
    sym = 0.5 * (sigma + sigma.T)
    w, v = np.linalg.eigh(sym)
    np.clip(w, 0.0, None, out=w)
    return (v * np.sqrt(w)) @ v.T


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """``tr((sigma1 sigma2)^(1/2))`` for symmetric PSD matrices, as the nuclear norm of
    ``sqrt(sigma1) @ sqrt(sigma2)`` (its singular values are the square roots of the eigenvalues of
    ``sigma1 sigma2``)."""
    m = _psd_sqrt(sigma1) @ _psd_sqrt(sigma2)
    return float(np.linalg.svd(m, compute_uv=False).sum())


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2), in float64.

    ``FD = ||mu1 - mu2||^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^(1/2))``.

    Same quantity as pytorch-fid's ``calculate_frechet_distance`` (which uses ``scipy.linalg.sqrtm``),
    computed with symmetric eigendecompositions instead (see the module docstring); covariances are
    symmetrised and treated as PSD. The result is clipped at 0 (it can only go below through round-off).

    Raises ``ValueError`` for mis-shaped or non-finite inputs.
    """
    mu1, sigma1 = _as_stats(mu1, sigma1, "1")
    mu2, sigma2 = _as_stats(mu2, sigma2, "2")
    if mu1.shape != mu2.shape:
        raise ValueError(f"feature dimensions differ: mu1 has shape {mu1.shape}, mu2 has shape {mu2.shape}")
    diff = mu1 - mu2
    fd = float(diff @ diff) + float(np.trace(sigma1)) + float(np.trace(sigma2)) \
        - 2.0 * trace_sqrt_product(sigma1, sigma2)
    return max(fd, 0.0)


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------

def compute_statistics(features) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of ``features`` (N, D) in float64.

    ``sigma`` uses the unbiased ``N - 1`` denominator, identical to ``numpy.cov(features, rowvar=False)``
    (the convention of pytorch-fid, TTUR and clean-fid). Needs N >= 2.
    """
    if isinstance(features, torch.Tensor):
        features = features.detach().cpu().numpy()
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2:
        raise ValueError(f"features must have shape (N, D), got {f.shape}")
    if f.shape[0] < 2:
        raise ValueError(f"need at least 2 feature vectors to estimate a covariance, got {f.shape[0]}")
    if not np.all(np.isfinite(f)):
        raise ValueError("features contain NaN or inf")
    mu = f.mean(axis=0)
    centered = f - mu
    sigma = centered.T @ centered / (f.shape[0] - 1)
    return mu, 0.5 * (sigma + sigma.T)


class RunningStatistics:
    """Streaming mean / covariance (float64), for feature sets too large to hold at once.

    Keeps ``n``, the feature sum and the sum of outer products (shifted by the first batch's mean to
    limit cancellation); :meth:`compute` gives the same ``(mu, sigma)`` as :func:`compute_statistics` on
    the concatenated features, up to float64 round-off.
    """

    def __init__(self):
        self.n = 0
        self._shift = None
        self._sum = None
        self._outer = None

    def update(self, features) -> "RunningStatistics":
        if isinstance(features, torch.Tensor):
            features = features.detach().cpu().numpy()
        f = np.asarray(features, dtype=np.float64)
        if f.ndim != 2:
            raise ValueError(f"features must have shape (N, D), got {f.shape}")
        if f.shape[0] == 0:
            return self
        if not np.all(np.isfinite(f)):
            raise ValueError("features contain NaN or inf")
        if self._shift is None:
            self._shift = f.mean(axis=0)
            d = f.shape[1]
            self._sum = np.zeros(d)
            self._outer = np.zeros((d, d))
        elif f.shape[1] != self._shift.shape[0]:
            raise ValueError(f"feature dimension changed from {self._shift.shape[0]} to {f.shape[1]}")
        g = f - self._shift
        self._sum += g.sum(axis=0)
        self._outer += g.T @ g
        self.n += f.shape[0]
        return self

    def compute(self) -> tuple[np.ndarray, np.ndarray]:
        if self.n < 2:
            raise ValueError(f"need at least 2 feature vectors to estimate a covariance, got {self.n}")
        mean_g = self._sum / self.n
        sigma = (self._outer - self.n * np.outer(mean_g, mean_g)) / (self.n - 1)
        return self._shift + mean_g, 0.5 * (sigma + sigma.T)


def save_statistics(path, mu, sigma) -> Path:
    """Write ``mu`` / ``sigma`` to an ``.npz`` file (keys ``mu`` and ``sigma``, pytorch-fid's layout).

    The write is atomic: a temporary file in the same folder is written, then ``os.replace``-d onto
    ``path``. A ``.npz`` suffix is *not* appended implicitly: the file is written exactly at ``path``.
    """
    mu, sigma = _as_stats(mu, sigma, "")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, mu=mu, sigma=sigma)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def load_statistics(path) -> tuple[np.ndarray, np.ndarray]:
    """Read ``(mu, sigma)`` (float64) from an ``.npz`` file with keys ``mu`` and ``sigma``.

    Raises ``FileNotFoundError`` if the file does not exist and ``ValueError`` (naming the file) if it is
    not a readable ``.npz``, lacks a key, or holds mis-shaped arrays.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FID statistics file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            keys = set(data.files)
            missing = [k for k in ("mu", "sigma") if k not in keys]
            if missing:
                raise ValueError(f"FID statistics file {path} lacks key(s) {missing}; found {sorted(keys)} "
                                 "(expected an .npz with arrays 'mu' (D,) and 'sigma' (D, D))")
            mu, sigma = data["mu"], data["sigma"]
    except ValueError as e:
        if str(path) in str(e):
            raise
        raise ValueError(f"could not read FID statistics file {path}: {e}") from e
    except (OSError, EOFError) as e:
        raise ValueError(f"could not read FID statistics file {path}: {e}") from e
    try:
        return _as_stats(mu, sigma, "")
    except ValueError as e:
        raise ValueError(f"invalid FID statistics in {path}: {e}") from e


@dataclass
class FeatureStats:
    """Gaussian summary ``(mu, sigma)`` of a feature set, with save / load / distance helpers."""

    mu: np.ndarray
    sigma: np.ndarray

    def __post_init__(self):
        self.mu, self.sigma = _as_stats(self.mu, self.sigma, "")

    @property
    def dim(self) -> int:
        return int(self.mu.shape[0])

    @classmethod
    def from_features(cls, features) -> "FeatureStats":
        return cls(*compute_statistics(features))

    @classmethod
    def load(cls, path) -> "FeatureStats":
        return cls(*load_statistics(path))

    def save(self, path) -> Path:
        return save_statistics(path, self.mu, self.sigma)

    def frechet_distance(self, other: "FeatureStats") -> float:
        return frechet_distance(self.mu, self.sigma, other.mu, other.sigma)


# ----------------------------------------------------------------------------------------------
# Feature extractors
# ----------------------------------------------------------------------------------------------

ImagesLike = Union[np.ndarray, torch.Tensor, Sequence]


@runtime_checkable
class FeatureExtractor(Protocol):
    """Maps a batch of RGB images to features.

    ``extractor(images) -> np.ndarray`` of shape (N, D), where ``images`` is a uint8 array or tensor of
    shape (N, H, W, 3) (channel-last, values 0..255). Implementations may also accept float images in
    [0, 1] of the same layout.
    """

    def __call__(self, images) -> np.ndarray: ...


def images_to_float_nchw(images) -> torch.Tensor:
    """(N, H, W, 3) or (H, W, 3) uint8 / float-in-[0, 1] (numpy or torch) -> float32 (N, 3, H, W) in [0, 1].

    uint8 is divided by 255 (as ``torchvision.transforms.ToTensor`` does in pytorch-fid's data loader).
    """
    if isinstance(images, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(images))
    elif isinstance(images, torch.Tensor):
        t = images.detach()
    else:
        raise TypeError(f"expected a numpy array or torch tensor of images, got {type(images).__name__}")
    if t.ndim == 3:
        t = t.unsqueeze(0)
    if t.ndim != 4 or t.shape[-1] != 3:
        raise ValueError(f"expected images of shape (N, H, W, 3), got {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        t = t.to(torch.float32) / 255.0
    elif torch.is_floating_point(t):
        t = t.to(torch.float32)
        if t.numel() and (t.min() < 0 or t.max() > 1):
            raise ValueError("float images must lie in [0, 1]; pass uint8 for 0..255 data")
    else:
        raise ValueError(f"images must be uint8 (0..255) or float in [0, 1], got dtype {t.dtype}")
    return t.permute(0, 3, 1, 2).contiguous()


class TorchFeatureExtractor:
    """Wrap an ``nn.Module`` (float (N, 3, H, W) in [0, 1] -> (N, D)) as a :class:`FeatureExtractor`.

    Args:
        module: the feature network; outputs of shape (N, ...) are flattened to (N, D).
        image_size: if given (int or (H, W)), images are resized to it with bilinear interpolation
            (``align_corners=False``, no antialias) before ``preprocess``; ``None`` feeds them as they are.
        preprocess: optional callable applied to the float (N, 3, H, W) [0, 1] tensor (after resizing),
            e.g. a normalisation.
        device / dtype: where and in which precision the module runs (default: the module's device,
            float32).
        batch_size: images per forward pass.

    Returns float32 numpy features of shape (N, D) (float64 if ``dtype=torch.float64``).
    """

    def __init__(self, module: nn.Module, image_size=None, preprocess: Callable | None = None,
                 device=None, dtype: torch.dtype = torch.float32, batch_size: int = 64):
        check_positive_int("batch_size", batch_size)
        if device is None:
            try:
                device = next(module.parameters()).device
            except StopIteration:
                device = torch.device("cpu")
        self.device = torch.device(device)
        self.dtype = dtype
        params = list(module.parameters())
        if any(p.device != self.device or p.dtype != dtype for p in params):
            module = module.to(device=self.device, dtype=dtype)
        self.module = module.eval()
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.image_size = tuple(image_size) if image_size is not None else None
        self.preprocess = preprocess
        self.batch_size = batch_size

    @torch.inference_mode()
    def __call__(self, images) -> np.ndarray:
        x_all = images_to_float_nchw(images)
        out = []
        for i in range(0, x_all.shape[0], self.batch_size):
            x = x_all[i:i + self.batch_size].to(device=self.device, dtype=self.dtype)
            if self.image_size is not None and tuple(x.shape[-2:]) != self.image_size:
                x = F.interpolate(x, size=self.image_size, mode="bilinear", align_corners=False)
            if self.preprocess is not None:
                x = self.preprocess(x)
            y = self.module(x)
            if isinstance(y, (tuple, list)):
                y = y[0]
            y = y.reshape(y.shape[0], -1)
            out.append((y if y.dtype == torch.float64 else y.float()).cpu())
        if not out:
            raise ValueError("no images given")
        return torch.cat(out).numpy()


# ----------------------------------------------------------------------------------------------
# Image files -> features -> FID
# ----------------------------------------------------------------------------------------------

def list_image_files(folder_or_paths) -> list[Path]:
    """Image files of a folder (non-recursive, sorted, extensions in :data:`IMAGE_EXTENSIONS`), or the
    given list of paths. Raises ``FileNotFoundError`` / ``ValueError`` (empty) naming the folder."""
    if isinstance(folder_or_paths, (str, os.PathLike)):
        folder = Path(folder_or_paths)
        if not folder.is_dir():
            raise FileNotFoundError(f"image folder not found: {folder}")
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not files:
            raise ValueError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in folder {folder}")
        return files
    files = [Path(p) for p in folder_or_paths]
    if not files:
        raise ValueError("empty list of image paths")
    for p in files:
        if not p.is_file():
            raise FileNotFoundError(f"image file not found: {p}")
    return files


def _read_rgb(path: Path) -> np.ndarray:
    from .images import read_image

    return np.asarray(read_image(path).convert("RGB"), dtype=np.uint8)


def _same_shape_batches(arrays: Iterable[np.ndarray], batch_size: int) -> Iterable[np.ndarray]:
    """Stack consecutive (H, W, 3) arrays into batches of at most ``batch_size``; a batch is cut early
    where the image size changes (so folders with mixed sizes work)."""
    run: list[np.ndarray] = []
    for img in arrays:
        if run and (len(run) == batch_size or img.shape != run[0].shape):
            yield np.stack(run)
            run = []
        run.append(img)
    if run:
        yield np.stack(run)


def image_folder_features(folder_or_paths, extractor: FeatureExtractor, batch_size: int = 50) -> np.ndarray:
    """Features (N, D) of the images in a folder (or a list of image paths), read with PIL as RGB uint8
    and passed to ``extractor`` in batches of ``batch_size``."""
    check_positive_int("batch_size", batch_size)
    files = list_image_files(folder_or_paths)
    batches = _same_shape_batches((_read_rgb(p) for p in files), batch_size)
    feats = [_check_features(extractor(batch), len(batch)) for batch in batches]
    return np.concatenate(feats, axis=0)


def _check_features(f, n: int) -> np.ndarray:
    if isinstance(f, torch.Tensor):
        f = f.detach().cpu().numpy()
    f = np.asarray(f)
    if f.ndim != 2 or f.shape[0] != n:
        raise ValueError(f"feature extractor must return an (N, D) array with N={n}, got shape {f.shape}")
    return f


def _images_features(images, extractor: FeatureExtractor, batch_size: int) -> np.ndarray:
    if isinstance(images, (np.ndarray, torch.Tensor)):
        if images.ndim != 4:
            raise ValueError(f"expected images of shape (N, H, W, 3), got {tuple(images.shape)}")
        batches = [images[i:i + batch_size] for i in range(0, images.shape[0], batch_size)]
    else:
        from PIL import Image

        arrs = (np.asarray(im.convert("RGB")) if isinstance(im, Image.Image) else np.asarray(im) for im in images)
        batches = list(_same_shape_batches(arrs, batch_size))
    if not batches:
        raise ValueError("no images given")
    return np.concatenate([_check_features(extractor(b), len(b)) for b in batches], axis=0)


StatsSource = Union[FeatureStats, tuple, str, os.PathLike, Sequence]


def _resolve_stats(source, extractor: FeatureExtractor | None, batch_size: int) -> FeatureStats:
    if isinstance(source, FeatureStats):
        return source
    if isinstance(source, tuple) and len(source) == 2 and not isinstance(source[0], (str, os.PathLike)):
        return FeatureStats(*source)
    if isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == ".npz":
        return FeatureStats.load(source)
    if extractor is None:
        raise ValueError(f"an extractor is needed to compute statistics from images ({source!r})")
    return FeatureStats.from_features(image_folder_features(source, extractor, batch_size))


def fid_of_images(images, reference, extractor: FeatureExtractor, batch_size: int = 50) -> float:
    """FID between in-memory images and a reference.

    ``images``: uint8 (N, H, W, 3) array / tensor, or a list of PIL images / (H, W, 3) arrays.
    ``reference``: a :class:`FeatureStats`, a ``(mu, sigma)`` tuple, an ``.npz`` statistics file, an image
    folder or a list of image paths (the latter two are run through ``extractor``).
    """
    ref = _resolve_stats(reference, extractor, batch_size)
    gen = FeatureStats.from_features(_images_features(images, extractor, batch_size))
    if gen.dim != ref.dim:
        raise ValueError(f"feature dimension {gen.dim} of the images does not match the reference's {ref.dim}")
    return gen.frechet_distance(ref)


def fid_from_folders(source1, source2, extractor: FeatureExtractor | None = None, batch_size: int = 50) -> float:
    """FID between two sources, like ``python -m pytorch_fid path1 path2``.

    Each source is an image folder, a list of image paths, an ``.npz`` statistics file (keys ``mu`` /
    ``sigma``), a :class:`FeatureStats` or a ``(mu, sigma)`` tuple. ``extractor`` is needed for image
    sources (use :func:`visualspec.eval.inception.inception_extractor` for standard FID).
    """
    s1 = _resolve_stats(source1, extractor, batch_size)
    s2 = _resolve_stats(source2, extractor, batch_size)
    if s1.dim != s2.dim:
        raise ValueError(f"feature dimensions differ: {s1.dim} vs {s2.dim}")
    return s1.frechet_distance(s2)


def fid_from_folder(folder_or_paths, reference, extractor: FeatureExtractor, batch_size: int = 50) -> float:
    """FID between the images of a folder (or list of paths) and ``reference`` (see :func:`fid_from_folders`)."""
    return fid_from_folders(folder_or_paths, reference, extractor, batch_size)
