"""Quality on the shapes world: GenEval-shapes (analytic detector) and FID-shapes (shipped features)."""

from __future__ import annotations

from pathlib import Path

from ..assets import SHAPES_FID
from ..models.shapes_features import ShapesFeatureNet
from .detectors import ShapesDetector
from .fid import TorchFeatureExtractor, fid_from_folder, list_image_files
from .geneval import evaluate_folder, read_geneval_folder

FEATURES_DIR = SHAPES_FID
REFERENCE_STATS = FEATURES_DIR / "reference_stats.npz"


def shapes_fid_extractor(folder=None) -> TorchFeatureExtractor:
    """The FID-shapes feature extractor (the shipped network unless ``folder`` names another)."""
    if folder is None and not (FEATURES_DIR / "config.json").is_file():
        raise FileNotFoundError(f"the shipped FID-shapes feature network is missing from this installation "
                                f"({FEATURES_DIR} has no config.json); reinstall visualspec")
    folder = Path(folder or FEATURES_DIR)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no FID-shapes feature network in {folder} (train one with "
                                f"`visualspec train-shapes --features-out {folder}`)")
    return TorchFeatureExtractor(ShapesFeatureNet.from_pretrained(folder, use_safetensors=True), batch_size=250)


def score_shapes_folder(folder, reference=None, outfile=None) -> dict:
    """GenEval-shapes summary and FID-shapes of a GenEval-layout folder of world prompts."""
    geneval = evaluate_folder(folder, ShapesDetector(), outfile)
    images = [p for entry in read_geneval_folder(folder) for p in entry.images]
    fid = fid_from_folder(list_image_files(images), reference or REFERENCE_STATS, shapes_fid_extractor())
    return {"geneval": geneval, "fid_shapes": fid}
