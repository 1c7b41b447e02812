"""FID (Fréchet distance, statistics, FID Inception layout, extractors) and CLIP score plumbing.

Everything runs offline on CPU with random weights; no real checkpoint is needed.
"""

import json
import os
import pickle

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import FIXTURES
from visualspec.eval import fid as fidmod
from visualspec.eval.fid import (
    FeatureExtractor,
    FeatureStats,
    RunningStatistics,
    TorchFeatureExtractor,
    compute_statistics,
    fid_from_folders,
    fid_of_images,
    frechet_distance,
    image_folder_features,
    load_statistics,
    save_statistics,
)
from visualspec.eval.inception import FID_WEIGHTS_FILENAME, FIDInceptionV3

FIXTURE = FIXTURES / "fid_inception_keys.json"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny CPU workloads


# ----------------------------------------------------------------------------------------------
# Fréchet distance
# ----------------------------------------------------------------------------------------------

def scipy_reference_fd(mu1, sigma1, mu2, sigma2):
    """The classic formula with scipy.linalg.sqrtm (pytorch-fid / TTUR style), real part."""
    covmean = scipy.linalg.sqrtm(sigma1 @ sigma2)
    if not np.isfinite(covmean).all():
        off = np.eye(sigma1.shape[0]) * 1e-6
        covmean = scipy.linalg.sqrtm((sigma1 + off) @ (sigma2 + off))
    covmean = np.real(covmean)
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def random_features(rng, n, d, scale=0.3, shift=0.0):
    mix = rng.standard_normal((d, d)) * scale
    return rng.standard_normal((n, d)) @ mix + shift * rng.standard_normal(d)


@pytest.mark.parametrize("d,n1,n2", [
    (8, 100, 60),
    (32, 300, 200),
    (64, 500, 400),
    (128, 1000, 800),
    (256, 1000, 900),
    (64, 20, 500),     # sigma1 rank-deficient (rank 19 < 64)
    (96, 40, 50),      # both rank-deficient
])
def test_frechet_distance_matches_scipy_sqrtm(d, n1, n2):
    rng = np.random.default_rng(d + n1 + n2)
    mu1, s1 = compute_statistics(random_features(rng, n1, d, shift=1.0))
    mu2, s2 = compute_statistics(random_features(rng, n2, d, scale=0.4))
    ours = frechet_distance(mu1, s1, mu2, s2)
    ref = scipy_reference_fd(mu1, s1, mu2, s2)
    assert ours == pytest.approx(ref, rel=1e-6)


def test_frechet_distance_self_zero_and_symmetric():
    rng = np.random.default_rng(1)
    mu1, s1 = compute_statistics(random_features(rng, 300, 48))
    mu2, s2 = compute_statistics(random_features(rng, 200, 48, shift=0.5))
    assert abs(frechet_distance(mu1, s1, mu1, s1)) < 1e-6
    mu3, s3 = compute_statistics(random_features(rng, 10, 48))  # rank-deficient self distance
    assert abs(frechet_distance(mu3, s3, mu3, s3)) < 1e-6
    a, b = frechet_distance(mu1, s1, mu2, s2), frechet_distance(mu2, s2, mu1, s1)
    assert a > 0 and a == pytest.approx(b, rel=1e-9)


def test_frechet_distance_diagonal_closed_form():
    rng = np.random.default_rng(2)
    d = 40
    mu1, mu2 = rng.standard_normal(d), rng.standard_normal(d)
    v1, v2 = rng.uniform(0.1, 3.0, d), rng.uniform(0.0, 2.0, d)
    v2[:5] = 0.0  # singular covariance
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(v1) - np.sqrt(v2)) ** 2)
    assert frechet_distance(mu1, np.diag(v1), mu2, np.diag(v2)) == pytest.approx(expected, rel=1e-10)
    # 1-d inputs given as scalars
    assert frechet_distance(1.0, 4.0, 0.0, 1.0) == pytest.approx(1.0 + (2.0 - 1.0) ** 2)


def test_frechet_distance_shape_errors():
    mu, s = np.zeros(4), np.eye(4)
    with pytest.raises(ValueError, match="sigma1"):
        frechet_distance(mu, np.eye(3), mu, s)
    with pytest.raises(ValueError, match="sigma2"):
        frechet_distance(mu, s, mu, np.ones(4))
    with pytest.raises(ValueError, match="mu1"):
        frechet_distance(np.zeros((2, 2)), s, mu, s)
    with pytest.raises(ValueError, match="dimension"):
        frechet_distance(np.zeros(3), np.eye(3), mu, s)
    with pytest.raises(ValueError, match="NaN"):
        frechet_distance(mu, s * np.nan, mu, s)


# ----------------------------------------------------------------------------------------------
# Statistics files
# ----------------------------------------------------------------------------------------------

def test_compute_statistics_matches_numpy_and_streaming():
    rng = np.random.default_rng(3)
    f = random_features(rng, 257, 20, shift=3.0).astype(np.float32)
    mu, sigma = compute_statistics(f)
    assert mu.dtype == np.float64 and sigma.dtype == np.float64
    np.testing.assert_allclose(mu, np.mean(f.astype(np.float64), axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sigma, np.cov(f, rowvar=False), rtol=1e-10, atol=1e-12)
    run = RunningStatistics()
    for i in range(0, len(f), 50):
        run.update(f[i:i + 50])
    mu_r, sigma_r = run.compute()
    np.testing.assert_allclose(mu_r, mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sigma_r, sigma, rtol=1e-9, atol=1e-11)
    with pytest.raises(ValueError, match="at least 2"):
        compute_statistics(f[:1])
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        compute_statistics(f[0])


def test_statistics_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    mu, sigma = compute_statistics(random_features(rng, 50, 12))
    path = save_statistics(tmp_path / "sub" / "ref_stats.npz", mu, sigma)
    assert path == tmp_path / "sub" / "ref_stats.npz"
    assert sorted(os.listdir(path.parent)) == ["ref_stats.npz"]  # no temp file left behind
    with np.load(path) as data:
        assert set(data.files) == {"mu", "sigma"}
    mu2, sigma2 = load_statistics(path)
    np.testing.assert_array_equal(mu2, mu)
    np.testing.assert_array_equal(sigma2, sigma)
    st = FeatureStats.load(path)
    st.save(tmp_path / "again.npz")
    assert FeatureStats.load(tmp_path / "again.npz").frechet_distance(st) < 1e-9
    # pytorch-fid writes with savez_compressed; that must load too
    np.savez_compressed(tmp_path / "compressed.npz", mu=mu, sigma=sigma)
    np.testing.assert_array_equal(load_statistics(tmp_path / "compressed.npz")[1], sigma)


def test_statistics_clear_errors(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        load_statistics(missing)
    np.savez(tmp_path / "nomu.npz", sigma=np.eye(3))
    with pytest.raises(ValueError, match=r"nomu\.npz.*'mu'"):
        load_statistics(tmp_path / "nomu.npz")
    (tmp_path / "garbage.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="garbage.npz"):
        load_statistics(tmp_path / "garbage.npz")
    np.savez(tmp_path / "bad.npz", mu=np.zeros(3), sigma=np.eye(4))
    with pytest.raises(ValueError, match="bad.npz"):
        load_statistics(tmp_path / "bad.npz")


# ----------------------------------------------------------------------------------------------
# FID Inception
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def inception():
    torch.manual_seed(0)
    return FIDInceptionV3().eval()


def test_fixture_is_consistent():
    fx = json.loads(FIXTURE.read_text())
    assert fx["weights_file"] == FID_WEIGHTS_FILENAME
    assert "pytorch-fid@" in fx["source"]["fid_blocks"] and "vision@" in fx["source"]["architecture"]
    assert len(fx["keys"]) == fx["num_keys"] == 472
    assert fx["keys"]["fc.weight"] == [1008, 2048]
    assert fx["keys"]["Conv2d_1a_3x3.conv.weight"] == [32, 3, 3, 3]
    assert fx["keys"]["Mixed_5b.branch1x1.conv.weight"] == [64, 192, 1, 1]
    assert not any(k.startswith("AuxLogits") for k in fx["keys"])


def test_inception_layout_matches_fixture():
    fx = json.loads(FIXTURE.read_text())
    with torch.device("meta"):
        model = FIDInceptionV3()
    sd = model.state_dict()
    required = {k: list(v.shape) for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    optional = sorted(k for k in sd if k.endswith("num_batches_tracked"))
    assert required == fx["keys"]
    assert list(required) == list(fx["keys"])  # same order as the reference module tree
    assert optional == sorted(fx["optional_keys"])
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == fx["num_parameters"]
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 94 and all(m.eps == 0.001 for m in bns)


def test_inception_forward_and_preprocessing(inception):
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    seen = {}

    def grab(module, inp, out):
        seen["in"] = inp[0].clone()

    h = inception.Conv2d_1a_3x3.register_forward_hook(grab)
    try:
        with torch.inference_mode():
            y = inception(x)
    finally:
        h.remove()
    assert y.shape == (2, FIDInceptionV3.FEATURE_DIM) and torch.isfinite(y).all()
    expected = 2 * F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False) - 1
    torch.testing.assert_close(seen["in"], expected)
    with pytest.raises(ValueError, match="float"):
        inception(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))


@pytest.mark.parametrize("block,channels,pool", [
    ("Mixed_5b", 192, "avg"), ("Mixed_6b", 768, "avg"), ("Mixed_7b", 1280, "avg"), ("Mixed_7c", 2048, "max"),
])
def test_inception_tf_pooling_branches(inception, block, channels, pool):
    """TF-specific pooling: avg pools exclude padding (count_include_pad=False); Mixed_7c max-pools."""
    mod = getattr(inception, block)
    x = torch.rand(1, channels, 5, 5, generator=torch.Generator().manual_seed(1))
    seen = {}

    def grab(module, inp, out):
        seen["in"] = inp[0].clone()

    h = mod.branch_pool.register_forward_hook(grab)
    try:
        with torch.inference_mode():
            mod(x)
    finally:
        h.remove()
    if pool == "avg":
        expected = F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
    else:
        expected = F.max_pool2d(x, 3, stride=1, padding=1)
    torch.testing.assert_close(seen["in"], expected)


def test_inception_from_weights_file(tmp_path, inception):
    sd = dict(inception.state_dict())
    sd["fc.bias"] = torch.randn(1008)
    sd["Mixed_7c.branch_pool.bn.running_var"] = torch.rand(192) + 0.5
    # a TF-converted file carries no BatchNorm num_batches_tracked counters; they are filled in
    path = tmp_path / FID_WEIGHTS_FILENAME
    torch.save({k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}, path)
    model = FIDInceptionV3.from_weights_file(path)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    loaded = model.state_dict()
    assert loaded.keys() == sd.keys()
    assert all(v.device.type == "cpu" for v in loaded.values())  # nothing left on the meta device
    assert all(torch.equal(loaded[k], sd[k]) for k in sd if not k.endswith("num_batches_tracked"))
    # strict: an unexpected key (or a missing one) is an error naming the key
    torch.save({"AuxLogits.fc.weight": torch.zeros(1008, 768)}, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match="AuxLogits"):
        FIDInceptionV3.from_weights_file(tmp_path / "bad.pth")
    with pytest.raises(FileNotFoundError, match=FID_WEIGHTS_FILENAME.replace(".", r"\.")):
        FIDInceptionV3.from_weights_file(tmp_path / "missing.pth")


class _NotAWeight:
    pass


def test_inception_weights_are_loaded_with_weights_only(tmp_path):
    torch.save({"fc.weight": torch.zeros(1), "evil": _NotAWeight()}, tmp_path / "pickled.pth")
    with pytest.raises(pickle.UnpicklingError, match="(?i)weights.only"):
        FIDInceptionV3.from_weights_file(tmp_path / "pickled.pth")


# ----------------------------------------------------------------------------------------------
# Extractors, folders, end-to-end FID
# ----------------------------------------------------------------------------------------------

class TinyNet(nn.Module):
    """A stand-in for a small custom feature network: (N, 3, 64, 64) in [0, 1] -> (N, 12)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 12, 8, stride=8)

    def forward(self, x):
        assert x.shape[-2:] == (64, 64)
        return self.conv(x).mean(dim=(2, 3))


def test_torch_feature_extractor_wraps_custom_module():
    calls = []

    def preprocess(x):
        calls.append((x.min().item(), x.max().item(), tuple(x.shape)))
        return x * 2 - 1

    ext = TorchFeatureExtractor(TinyNet(), image_size=64, preprocess=preprocess, batch_size=3)
    assert isinstance(ext, FeatureExtractor)
    imgs = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    f = ext(imgs)
    assert f.shape == (5, 12) and f.dtype == np.float32
    assert [c[2] for c in calls] == [(3, 3, 64, 64), (2, 3, 64, 64)]
    assert all(0.0 <= lo and hi <= 1.0 for lo, hi, _ in calls)
    np.testing.assert_allclose(ext(torch.from_numpy(imgs)), f)  # tensors work too
    np.testing.assert_allclose(ext(imgs.astype(np.float32) / 255), f, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\)"):
        ext(np.zeros((2, 3, 32, 32), np.uint8))


def pixel_features(images):
    """Deterministic extractor: 4x4 average-pooled pixels (48-d)."""
    x = fidmod.images_to_float_nchw(images)
    return F.adaptive_avg_pool2d(x, 4).reshape(x.shape[0], -1).numpy().astype(np.float64)


def sample_images(seed, n, kind):
    """Two toy distributions: 'warm' (red-ish, smooth) vs 'cold' (blue-ish, noisier) 32x32 images."""
    rng = np.random.default_rng(seed)
    base = np.array([0.7, 0.4, 0.2]) if kind == "warm" else np.array([0.2, 0.4, 0.7])
    noise = 0.08 if kind == "warm" else 0.2
    coarse = rng.normal(0, noise, (n, 4, 4, 3)).repeat(8, axis=1).repeat(8, axis=2)
    img = base + rng.normal(0, 0.1, (n, 1, 1, 3)) + coarse + rng.normal(0, 0.05, (n, 32, 32, 3))
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def test_fid_separates_distributions(tmp_path):
    from PIL import Image

    a1, a2 = sample_images(0, 150, "warm"), sample_images(1, 150, "warm")
    b = sample_images(2, 150, "cold")
    same = fid_of_images(a1, FeatureStats.from_features(pixel_features(a2)), pixel_features)
    diff = fid_of_images(a1, FeatureStats.from_features(pixel_features(b)), pixel_features)
    assert diff > 20 * same and same > 0

    # the same numbers through PNG folders and an .npz reference
    for name, arr in (("a1", a1), ("a2", a2)):
        (tmp_path / name).mkdir()
        for i, im in enumerate(arr):
            Image.fromarray(im).save(tmp_path / name / f"{i:04d}.png")
    ref = FeatureStats.from_features(image_folder_features(tmp_path / "a2", pixel_features, batch_size=64))
    ref.save(tmp_path / "a2_stats.npz")
    via_files = fid_from_folders(tmp_path / "a1", tmp_path / "a2_stats.npz", pixel_features, batch_size=64)
    assert via_files == pytest.approx(same, rel=1e-9)
    assert fid_from_folders(tmp_path / "a1", tmp_path / "a2", pixel_features) == pytest.approx(same, rel=1e-9)
    listed = sorted((tmp_path / "a1").glob("*.png"))
    assert fid_of_images(a1, listed, pixel_features) == pytest.approx(0.0, abs=1e-6)


def test_image_folder_errors(tmp_path):
    from PIL import Image

    with pytest.raises(FileNotFoundError, match="nowhere"):
        image_folder_features(tmp_path / "nowhere", pixel_features)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match="empty"):
        image_folder_features(tmp_path / "empty", pixel_features)
    d = tmp_path / "mixed"
    d.mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(d / "a.png")
    Image.fromarray(np.full((24, 20), 128, np.uint8)).save(d / "b.JPG")  # grayscale, other size
    Image.fromarray(np.zeros((16, 16, 4), np.uint8)).save(d / "c.png")   # RGBA
    assert image_folder_features(d, pixel_features, batch_size=8).shape == (3, 48)
    (d / "d_broken.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(ValueError, match="d_broken.png"):
        image_folder_features(d, pixel_features)
    with pytest.raises(ValueError, match="extractor"):
        image_folder_features([d / "a.png"], lambda x: np.zeros((5, 2)))


# ----------------------------------------------------------------------------------------------
# CLIP score plumbing (tiny random CLIP, offline tokenizer)
# ----------------------------------------------------------------------------------------------

WORDS = "a an the of on photo red blue green small big circle square triangle".split()


def tiny_clip():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="<unk>")
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=vocab["<bos>"],
                         eos_token_id=vocab["<eos>"], pad_token_id=vocab["<pad>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return model, CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    model, processor = tiny_clip()
    folder = tmp_path_factory.mktemp("tiny_clip")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, model, processor


CAPTIONS = ["a red circle", "big blue square on the green", "a photo of a small triangle", "the green circle"]


def _images(seed=0, n=4):
    return np.random.default_rng(seed).integers(0, 256, (n, 40, 48, 3), dtype=np.uint8)


def test_clip_score_range_and_formula(clip_folder):
    from visualspec.eval.clip_score import CLIPScorer

    _, model, processor = clip_folder
    scorer = CLIPScorer(model, processor)
    imgs = _images()
    s = scorer.pair_scores(imgs, CAPTIONS)
    assert s.shape == (4,) and np.all(np.abs(s) <= 100 + 1e-9)
    # independent recomputation of 100 * cos from the raw model outputs
    with torch.no_grad():
        px = processor.image_processor(images=list(imgs), return_tensors="pt")["pixel_values"]
        tok = processor.tokenizer(CAPTIONS, padding=True, return_tensors="pt")
        ie = model.get_image_features(pixel_values=px)
        te = model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
        ie = ie if isinstance(ie, torch.Tensor) else ie.pooler_output
        te = te if isinstance(te, torch.Tensor) else te.pooler_output
    np.testing.assert_allclose(s, 100 * F.cosine_similarity(ie, te, dim=-1).numpy(), rtol=1e-5, atol=1e-4)
    for clamp, expected in (("mean", max(s.mean(), 0.0)), ("pair", np.maximum(s, 0).mean())):
        v = scorer.score(imgs, CAPTIONS, clamp=clamp)
        assert 0.0 <= v <= 100.0 and v == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # image-caption agreement with itself (identical embeddings) is the maximum score
    same = scorer.image_embeddings(imgs)
    assert torch.allclose((same * same).sum(-1), torch.ones(4), atol=1e-5)
    with pytest.raises(ValueError, match="captions"):
        scorer.pair_scores(imgs, CAPTIONS[:3])
    with pytest.raises(ValueError, match="clamp"):
        scorer.score(imgs, CAPTIONS, clamp="none")


def test_clip_score_deterministic_and_input_formats(clip_folder):
    from visualspec.eval.clip_score import CLIPScorer

    _, model, processor = clip_folder
    scorer = CLIPScorer(model, processor, batch_size=3)
    imgs = _images(1)
    a = scorer.pair_scores(imgs, CAPTIONS)
    np.testing.assert_array_equal(a, scorer.pair_scores(imgs.copy(), list(CAPTIONS)))
    chw = torch.from_numpy(imgs).permute(0, 3, 1, 2)  # torchmetrics-style (N, 3, H, W) uint8
    np.testing.assert_allclose(scorer.pair_scores(chw, CAPTIONS), a, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(scorer.pair_scores(imgs.astype(np.float32) / 255, CAPTIONS), a, rtol=1e-6, atol=1e-5)
    # same image, same caption in every slot -> identical scores
    rep = scorer.pair_scores(np.repeat(imgs[:1], 3, axis=0), [CAPTIONS[0]] * 3)
    assert rep[0] == rep[1] == rep[2]


def test_clip_score_save_and_load_local(clip_folder, tmp_path):
    from visualspec.eval.clip_score import CLIPScorer, clip_score

    folder, model, processor = clip_folder
    imgs = _images(2)
    direct = CLIPScorer(model, processor).pair_scores(imgs, CAPTIONS)
    loaded = CLIPScorer.from_pretrained(folder)
    np.testing.assert_allclose(loaded.pair_scores(imgs, CAPTIONS), direct, rtol=1e-6, atol=1e-5)
    again = loaded.save_pretrained(tmp_path / "resaved")
    np.testing.assert_allclose(CLIPScorer.from_pretrained(again).pair_scores(imgs, CAPTIONS), direct,
                               rtol=1e-6, atol=1e-5)
    v = clip_score(imgs, CAPTIONS, folder)
    assert v == pytest.approx(max(direct.mean(), 0.0), rel=1e-6, abs=1e-6)
    with pytest.raises(FileNotFoundError, match="no_such_clip"):
        CLIPScorer.from_pretrained(tmp_path / "no_such_clip")
