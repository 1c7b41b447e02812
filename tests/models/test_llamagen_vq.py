"""Tests for the LlamaGen VQ tokenizer (visualspec.models.llamagen_vq).

The key-layout tests compare against tests/fixtures/llamagen_keys.json, a
record of the official LlamaGen state_dict keys and shapes.
"""

import argparse
import json

import pytest
import torch
import torch.nn.functional as F

from visualspec.models.llamagen_vq import LLAMAGEN_VQ_CONFIGS, LlamaGenVQModel, nearest_codes
from conftest import FIXTURES

FIXTURE = FIXTURES / "llamagen_keys.json"

TINY = dict(
    codebook_size=64,
    codebook_embed_dim=8,
    ch=32,
    ch_mult=(1, 2),
    z_channels=16,
    num_res_blocks=1,
    norm_groups=8,
    codebook_usage_window=256,
)


@pytest.fixture(scope="module")
def official_keys():
    with open(FIXTURE) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaGenVQModel(**TINY).eval()
    # Spread the codebook so that different latents map to different codes.
    with torch.no_grad():
        model.quantize.embedding.weight.normal_()
    return model


def _images(batch=2, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, size, size, generator=g) * 2 - 1


# -- official layout ------------------------------------------------------


@pytest.mark.parametrize("variant", ["VQ-16", "VQ-8"])
def test_full_config_matches_official_keys(official_keys, variant):
    expected = official_keys["vq"][variant]["keys"]
    with torch.device("meta"):
        model = LlamaGenVQModel(**LLAMAGEN_VQ_CONFIGS[variant])
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert sorted(set(expected) - set(got)) == []  # missing
    assert sorted(set(got) - set(expected)) == []  # unexpected
    assert got == expected
    assert model.downsample_factor == official_keys["vq"][variant]["config"]["downsample_factor"]


def test_fixture_records_source_and_gpt_facts(official_keys):
    assert official_keys["source"].startswith("FoundationVision/LlamaGen ")
    gpt = official_keys["gpt"]
    assert gpt["GPT-3B-c2i"]["config"]["head_dim"] == 100
    assert "cls_embedding.uncond_embedding" in gpt["GPT-XL-t2i"]["keys"]
    assert all("freqs_cis" not in entry["keys"] for entry in gpt.values())


# -- tiny model behaviour -------------------------------------------------


def test_encode_decode_shapes(tiny):
    x = _images()
    with torch.no_grad():
        latents, indices = tiny.encode(x)
        images = tiny.decode(latents)
    f = tiny.downsample_factor
    assert f == 2
    assert latents.shape == (2, 8, 16 // f, 16 // f)
    assert indices.shape == (2, 16 // f, 16 // f) and indices.dtype == torch.long
    assert images.shape == x.shape
    assert tiny.decode(latents, clamp=True).abs().max() <= 1.0
    # encode returns exactly the (normalised) codebook vectors of its indices
    assert torch.equal(latents, tiny.get_codebook_entry(indices))
    assert torch.allclose(latents.norm(dim=1), torch.ones(()), atol=1e-5)


def test_decode_code_matches_decode_of_codebook_entry(tiny):
    g = torch.Generator().manual_seed(1)
    b, h, w = 2, 3, 5
    indices = torch.randint(0, TINY["codebook_size"], (b, h, w), generator=g)
    shape = [b, TINY["codebook_embed_dim"], h, w]
    with torch.no_grad():
        ref = tiny.decode(tiny.get_codebook_entry(indices))
        assert ref.shape == (b, 3, h * 2, w * 2)
        assert torch.equal(tiny.decode_code(indices), ref)
        assert torch.equal(tiny.decode_code(indices.flatten(1), shape), ref)
        assert torch.equal(tiny.decode_code(indices.flatten(), shape), ref)
        square = indices[:, :3, :3].reshape(b, 9)
        assert torch.equal(tiny.decode_code(square), tiny.decode_code(square.view(b, 3, 3)))
    with pytest.raises(ValueError):
        tiny.get_codebook_entry(indices.flatten(1))  # 15 codes: not square, no shape


def test_lookup_picks_nearest_normalised_code(tiny):
    x = _images(seed=2)
    with torch.no_grad():
        raw = tiny.encode_latents(x)  # (B, C, h, w)
        indices = tiny.quantize_indices(raw)
        z = F.normalize(raw.permute(0, 2, 3, 1).reshape(-1, 8), dim=-1).double()
        codebook = F.normalize(tiny.quantize.embedding.weight, dim=-1).double()
        brute = ((z[:, None, :] - codebook[None, :, :]) ** 2).sum(-1).argmin(dim=1)
        assert torch.equal(indices.flatten(), brute)
        assert len(indices.unique()) > 1
        entry = tiny.get_codebook_entry(indices)
        assert torch.allclose(entry.permute(0, 2, 3, 1).reshape(-1, 8).double(), codebook[brute])


def test_forward_losses_and_straight_through():
    torch.manual_seed(0)
    model = LlamaGenVQModel(**TINY).train()
    x = _images()
    recon, indices, losses = model(x)
    assert recon.shape == x.shape and indices.shape == (2, 8, 8)
    assert set(losses) == {"codebook_loss", "commitment_loss", "entropy_loss"}
    total = F.mse_loss(recon, x) + sum(losses.values())
    total.backward()
    # gradients reach the encoder (straight-through + commitment) and the codebook
    assert model.encoder.conv_in.weight.grad.abs().sum() > 0
    assert model.quantize.embedding.weight.grad.abs().sum() > 0
    # training records the used codes in the rolling window
    assert torch.equal(model.quantize.codebook_used[-128:].long(), indices.flatten())


def test_save_pretrained_round_trip(tiny, tmp_path):
    tiny.save_pretrained(tmp_path)
    assert (tmp_path / "diffusion_pytorch_model.safetensors").exists()
    assert (tmp_path / "config.json").exists()
    loaded = LlamaGenVQModel.from_pretrained(tmp_path).eval()
    assert tuple(loaded.config.ch_mult) == TINY["ch_mult"]
    x = _images(seed=3)
    with torch.no_grad():
        a_latents, a_idx = tiny.encode(x)
        b_latents, b_idx = loaded.encode(x)
        assert torch.equal(a_idx, b_idx)
        assert torch.equal(tiny.decode(a_latents), loaded.decode(b_latents))


def test_official_style_checkpoint_loads_strict(tiny, tmp_path):
    path = tmp_path / "vq_tiny.pt"
    torch.save({"model": tiny.state_dict(), "optimizer": {}, "steps": 0}, path)
    ckpt = torch.load(path, weights_only=True)
    fresh = LlamaGenVQModel(**TINY).eval()
    result = fresh.load_state_dict(ckpt["model"], strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    idx = torch.randint(0, 64, (1, 4, 4))
    with torch.no_grad():
        assert torch.equal(fresh.decode_code(idx), tiny.decode_code(idx))


def test_from_llamagen_checkpoint_with_training_args(tiny, tmp_path):
    # LlamaGen's training script also stores its argparse.Namespace.
    path = tmp_path / "0001000.pt"
    args = argparse.Namespace(vq_model="VQ-16", codebook_size=64)
    torch.save({"model": tiny.state_dict(), "optimizer": {}, "steps": 1000, "args": args}, path)
    model = LlamaGenVQModel.from_llamagen_checkpoint(str(path), **TINY)
    assert not model.training
    assert torch.equal(model.quantize.embedding.weight, tiny.quantize.embedding.weight)


# -- nearest_codes --------------------------------------------------------


@pytest.mark.parametrize("l2_normalize", [False, True])
def test_nearest_codes_matches_brute_force(l2_normalize):
    g = torch.Generator().manual_seed(4)
    codebook = torch.randn(50, 8, generator=g)
    k = 5
    got = nearest_codes(codebook, k, l2_normalize=l2_normalize, chunk_size=7)
    assert got.shape == (50, k) and got.dtype == torch.long
    vectors = F.normalize(codebook, dim=-1) if l2_normalize else codebook
    dist = torch.cdist(vectors.double(), vectors.double())
    dist.fill_diagonal_(float("inf"))
    expected = dist.argsort(dim=1)[:, :k]
    assert torch.equal(got, expected)
    assert not (got == torch.arange(50)[:, None]).any()


def test_nearest_codes_excludes_self_with_duplicates():
    codebook = torch.tensor([[0.0, 0.0], [0.0, 0.0], [3.0, 0.0], [0.0, 5.0]])
    got = nearest_codes(codebook, 2, chunk_size=3)
    assert got[0].tolist() == [1, 2]
    assert got[1].tolist() == [0, 2]
    assert not (got == torch.arange(4)[:, None]).any()
    with pytest.raises(ValueError):
        nearest_codes(codebook, 4)
