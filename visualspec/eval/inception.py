"""The FID Inception network: TensorFlow's Inception graph of 2015-12-05 in pytorch-fid's module
layout, so pytorch-fid's weights file loads as it is, and the standard FID feature extractor
built on it (:func:`inception_extractor`). The distance itself is in :mod:`visualspec.eval.fid`."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fid import TorchFeatureExtractor

__all__ = ["FID_WEIGHTS_FILENAME", "FIDInceptionV3", "inception_extractor"]

FID_WEIGHTS_FILENAME = "pt_inception-2015-12-05-6726825d.pth"
"""File name of pytorch-fid's FID Inception weights (a plain ``state_dict``)."""



class _ConvBNReLU(nn.Module):
    """conv (no bias) -> BatchNorm (eps 1e-3, TF's value) -> ReLU; submodules named ``conv`` / ``bn``."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _tf_avg_pool3(x):
    # TF's SAME-padded average pool divides by the number of valid (non-padded) inputs.
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)


class _MixedA(nn.Module):
    """35x35 block (Mixed_5b/c/d): 1x1 | 1x1->5x5 | 1x1->3x3->3x3 | avgpool->1x1."""

    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = _ConvBNReLU(cin, 64, 1)
        self.branch5x5_1 = _ConvBNReLU(cin, 48, 1)
        self.branch5x5_2 = _ConvBNReLU(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = _ConvBNReLU(cin, 64, 1)
        self.branch3x3dbl_2 = _ConvBNReLU(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _ConvBNReLU(96, 96, 3, padding=1)
        self.branch_pool = _ConvBNReLU(cin, pool_features, 1)

    def forward(self, x):
        a = self.branch1x1(x)
        b = self.branch5x5_2(self.branch5x5_1(x))
        c = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        d = self.branch_pool(_tf_avg_pool3(x))
        return torch.cat((a, b, c, d), dim=1)


class _ReductionB(nn.Module):
    """35x35 -> 17x17 (Mixed_6a): 3x3/2 | 1x1->3x3->3x3/2 | maxpool/2."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = _ConvBNReLU(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = _ConvBNReLU(cin, 64, 1)
        self.branch3x3dbl_2 = _ConvBNReLU(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _ConvBNReLU(96, 96, 3, stride=2)

    def forward(self, x):
        a = self.branch3x3(x)
        b = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        c = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat((a, b, c), dim=1)


class _MixedC(nn.Module):
    """17x17 block with factorised 7x7 convolutions (Mixed_6b..6e)."""

    def __init__(self, cin: int, c7: int):
        super().__init__()
        row, col = (1, 7), (7, 1)
        prow, pcol = (0, 3), (3, 0)
        self.branch1x1 = _ConvBNReLU(cin, 192, 1)
        self.branch7x7_1 = _ConvBNReLU(cin, c7, 1)
        self.branch7x7_2 = _ConvBNReLU(c7, c7, row, padding=prow)
        self.branch7x7_3 = _ConvBNReLU(c7, 192, col, padding=pcol)
        self.branch7x7dbl_1 = _ConvBNReLU(cin, c7, 1)
        self.branch7x7dbl_2 = _ConvBNReLU(c7, c7, col, padding=pcol)
        self.branch7x7dbl_3 = _ConvBNReLU(c7, c7, row, padding=prow)
        self.branch7x7dbl_4 = _ConvBNReLU(c7, c7, col, padding=pcol)
        self.branch7x7dbl_5 = _ConvBNReLU(c7, 192, row, padding=prow)
        self.branch_pool = _ConvBNReLU(cin, 192, 1)

    def forward(self, x):
        a = self.branch1x1(x)
        b = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        c = x
        for layer in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3,
                      self.branch7x7dbl_4, self.branch7x7dbl_5):
            c = layer(c)
        d = self.branch_pool(_tf_avg_pool3(x))
        return torch.cat((a, b, c, d), dim=1)


class _ReductionD(nn.Module):
    """17x17 -> 8x8 (Mixed_7a): 1x1->3x3/2 | 1x1->1x7->7x1->3x3/2 | maxpool/2."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1 = _ConvBNReLU(cin, 192, 1)
        self.branch3x3_2 = _ConvBNReLU(192, 320, 3, stride=2)
        self.branch7x7x3_1 = _ConvBNReLU(cin, 192, 1)
        self.branch7x7x3_2 = _ConvBNReLU(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = _ConvBNReLU(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = _ConvBNReLU(192, 192, 3, stride=2)

    def forward(self, x):
        a = self.branch3x3_2(self.branch3x3_1(x))
        b = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        c = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat((a, b, c), dim=1)


class _MixedE(nn.Module):
    """8x8 block with split 1x3 / 3x1 outputs (Mixed_7b, Mixed_7c).

    ``pool="avg"`` (Mixed_7b) uses TF's average pool without padded zeros; ``pool="max"`` (Mixed_7c)
    uses a 3x3/1 max pool, as in the TF 2015-12-05 graph (pytorch-fid's FIDInceptionE_2).
    """

    def __init__(self, cin: int, pool: str):
        super().__init__()
        if pool not in ("avg", "max"):
            raise ValueError(f"pool must be 'avg' or 'max', got {pool!r}")
        self.pool = pool
        self.branch1x1 = _ConvBNReLU(cin, 320, 1)
        self.branch3x3_1 = _ConvBNReLU(cin, 384, 1)
        self.branch3x3_2a = _ConvBNReLU(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = _ConvBNReLU(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = _ConvBNReLU(cin, 448, 1)
        self.branch3x3dbl_2 = _ConvBNReLU(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = _ConvBNReLU(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _ConvBNReLU(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = _ConvBNReLU(cin, 192, 1)

    def forward(self, x):
        a = self.branch1x1(x)
        t = self.branch3x3_1(x)
        b = torch.cat((self.branch3x3_2a(t), self.branch3x3_2b(t)), dim=1)
        u = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        c = torch.cat((self.branch3x3dbl_3a(u), self.branch3x3dbl_3b(u)), dim=1)
        if self.pool == "avg":
            p = _tf_avg_pool3(x)
        else:
            p = F.max_pool2d(x, kernel_size=3, stride=1, padding=1)
        d = self.branch_pool(p)
        return torch.cat((a, b, c, d), dim=1)


class FIDInceptionV3(nn.Module):
    """The "TF FID Inception" (TensorFlow Inception graph of 2015-12-05) in pytorch-fid's layout.

    Parameter names and shapes match pytorch-fid's weights file ``pt_inception-2015-12-05-6726825d.pth``
    (``Conv2d_1a_3x3.conv.weight``, ``Mixed_5b.branch1x1.bn.running_mean``, ..., ``fc.weight`` [1008, 2048]);
    the TF-specific blocks are reproduced: average pools that ignore padding in Mixed_5b..5d, 6b..6e and
    7b, a max pool in Mixed_7c's pool branch, BatchNorm eps 1e-3, a 1008-way ``fc`` (unused for FID).

    ``forward(x)``: ``x`` float (N, 3, H, W) in [0, 1] -> (N, 2048) ``pool_3`` features. Preprocessing as
    pytorch-fid: ``F.interpolate(x, (299, 299), mode="bilinear", align_corners=False)`` then ``2 x - 1``
    (each step can be switched off with ``resize_input`` / ``normalize_input``).
    """

    INPUT_SIZE = 299
    FEATURE_DIM = 2048
    NUM_CLASSES = 1008

    def __init__(self, resize_input: bool = True, normalize_input: bool = True):
        super().__init__()
        self.resize_input = resize_input
        self.normalize_input = normalize_input
        self.Conv2d_1a_3x3 = _ConvBNReLU(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = _ConvBNReLU(32, 32, 3)
        self.Conv2d_2b_3x3 = _ConvBNReLU(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = _ConvBNReLU(64, 80, 1)
        self.Conv2d_4a_3x3 = _ConvBNReLU(80, 192, 3)
        self.Mixed_5b = _MixedA(192, 32)
        self.Mixed_5c = _MixedA(256, 64)
        self.Mixed_5d = _MixedA(288, 64)
        self.Mixed_6a = _ReductionB(288)
        self.Mixed_6b = _MixedC(768, 128)
        self.Mixed_6c = _MixedC(768, 160)
        self.Mixed_6d = _MixedC(768, 160)
        self.Mixed_6e = _MixedC(768, 192)
        self.Mixed_7a = _ReductionD(768)
        self.Mixed_7b = _MixedE(1280, pool="avg")
        self.Mixed_7c = _MixedE(2048, pool="max")
        self.fc = nn.Linear(self.FEATURE_DIM, self.NUM_CLASSES)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected images of shape (N, 3, H, W), got {tuple(x.shape)}")
        if not torch.is_floating_point(x):
            raise ValueError(f"expected float images in [0, 1], got dtype {x.dtype}")
        if self.resize_input:
            x = F.interpolate(x, size=(self.INPUT_SIZE, self.INPUT_SIZE), mode="bilinear", align_corners=False)
        if self.normalize_input:
            x = 2.0 * x - 1.0
        return x

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        """Network body on already-preprocessed input -> (N, 2048)."""
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b,
                      self.Mixed_6c, self.Mixed_6d, self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool_features(self.preprocess(x))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """1008-way logits (``fc`` on the pool features); not used by FID."""
        return self.fc(self.forward(x))

    @classmethod
    def from_weights_file(cls, path, map_location="cpu", **kwargs) -> "FIDInceptionV3":
        """Build the network and strictly load pytorch-fid's FID Inception weights from a local file.

        The file is ``torch.load``-ed with ``weights_only=True``. BatchNorm ``num_batches_tracked``
        counters (unused in eval mode) may be absent from the file and are then filled with 0; every
        other key must match exactly. The module is returned in eval mode with gradients disabled.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"FID Inception weights not found at {path}. Place pytorch-fid's FID Inception weights "
                f"({FID_WEIGHTS_FILENAME}, the state_dict pytorch-fid caches under "
                f"$TORCH_HOME/hub/checkpoints/) there; visualspec never downloads it.")
        state = torch.load(path, map_location=map_location, weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise ValueError(f"{path} does not hold a state_dict (got {type(state).__name__})")
        with torch.device("meta"):  # no random init: every tensor comes from the file
            model = cls(**kwargs)
        state = dict(state)
        for name, buf in model.named_buffers():
            if name.endswith("num_batches_tracked") and name not in state:
                state[name] = torch.zeros((), dtype=torch.long)
        try:
            model.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as e:
            raise ValueError(f"{path} is not a FID Inception state_dict ({FID_WEIGHTS_FILENAME} layout): {e}") from e
        model.float()
        model.eval()
        model.requires_grad_(False)
        return model


def inception_extractor(weights_path, device=None, batch_size: int = 50,
                        dtype: torch.dtype = torch.float32) -> TorchFeatureExtractor:
    """Standard FID feature extractor: :class:`FIDInceptionV3` with pytorch-fid's weights file
    (``pt_inception-2015-12-05-6726825d.pth`` at ``weights_path``) and pytorch-fid's preprocessing."""
    model = FIDInceptionV3.from_weights_file(weights_path)
    return TorchFeatureExtractor(model, image_size=None, device=device or "cpu", dtype=dtype,
                                 batch_size=batch_size)
