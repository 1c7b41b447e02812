"""Compatibility with the official LlamaGen checkpoints: key layout and the converter round trip.

tests/fixtures/llamagen_keys.json records every state-dict key and shape of the official modules
(FoundationVision/LlamaGen, built on the meta device without weights).
"""

import argparse
import json
import re
import subprocess
import sys

import pytest
import torch

from visualspec import VisualSpecPipeline
from visualspec.models.llamagen import GPT_CONFIGS, LlamaGenGPT
from visualspec.models.llamagen_vq import LlamaGenVQModel
from visualspec.pipelines.convert import convert_llamagen
from conftest import FIXTURES

FIXTURE = json.loads((FIXTURES / "llamagen_keys.json").read_text())


@pytest.mark.parametrize("name", sorted(FIXTURE["gpt"]))
def test_every_official_gpt_config_has_the_official_keys(name):
    entry = FIXTURE["gpt"][name]
    cfg = entry["config"]
    size = name.rsplit("-", 1)[0]
    assert GPT_CONFIGS[size] == dict(n_layer=cfg["n_layer"], n_head=cfg["n_head"], dim=cfg["dim"])
    with torch.device("meta"):
        model = LlamaGenGPT.from_name(size, model_type=cfg["model_type"], cls_token_num=cfg["cls_token_num"],
                                      block_size=cfg["block_size"])
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == entry["keys"]
    assert model.rope.shape[1] * 2 == cfg["head_dim"]


# official layouts (VQ-16's ch_mult, two residual blocks) at tiny widths
TINY_VQ = dict(codebook_size=64, codebook_embed_dim=8, ch=16, ch_mult=(1, 1, 2, 2, 4), z_channels=16,
               num_res_blocks=2, norm_groups=4)


def _official_names(entry, n_layer):
    """The official key names of a model, cut down to its first n_layer blocks."""
    return {k for k in entry["keys"] if not re.match(r"layers\.(\d+)\.", k) or int(k.split(".")[1]) < n_layer}


@pytest.mark.parametrize("layout", ["ddp", "ema", "fsdp", "ddp-module-prefix"])
@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_converter_round_trip_of_synthetic_official_checkpoints(tmp_path, monkeypatch, layout, model_type):
    """Synthetic checkpoints laid out like the official files convert strictly and generate."""
    import visualspec.models.llamagen as llamagen_module
    import visualspec.models.llamagen_vq as llamagen_vq_module

    monkeypatch.setitem(llamagen_module.GPT_CONFIGS, "GPT-tiny", dict(n_layer=2, n_head=4, dim=64))
    extra = dict(model_type="t2i", cls_token_num=6, caption_dim=16) if model_type == "t2i" else dict(num_classes=10)
    torch.manual_seed(0)
    gpt = LlamaGenGPT(dim=64, n_layer=2, n_head=4, vocab_size=64, block_size=16, **extra)
    torch.nn.init.normal_(gpt.output.weight, std=0.5)
    official = FIXTURE["gpt"]["GPT-XL-t2i" if model_type == "t2i" else "GPT-B-c2i"]
    assert set(gpt.state_dict()) == _official_names(official, 2)
    vq = LlamaGenVQModel(**TINY_VQ)
    assert set(vq.state_dict()) == set(FIXTURE["vq"]["VQ-16"]["keys"])

    def wrap(state):
        args = argparse.Namespace(gpt_model="GPT-tiny", image_size=64)
        if layout == "ddp":
            return {"model": state, "optimizer": {}, "steps": 1000, "args": args}
        if layout == "ema":
            return {"model": state, "ema": state, "optimizer": {}, "steps": 1000, "args": args}
        if layout == "fsdp":
            return dict(state)
        return {"model": {f"module.{k}": v for k, v in state.items()}, "steps": 1}

    torch.save(wrap(gpt.state_dict()), tmp_path / "gpt.pt")
    torch.save({"model": vq.state_dict(), "optimizer": {}, "discriminator": {}, "steps": 5,
                "args": argparse.Namespace(vq_model="VQ-16")}, tmp_path / "vq.pt")
    monkeypatch.setitem(llamagen_vq_module.LLAMAGEN_VQ_CONFIGS, "VQ-tiny", TINY_VQ)
    out = tmp_path / "pipe"
    convert_llamagen(str(tmp_path / "gpt.pt"), str(tmp_path / "vq.pt"), str(out), gpt_model="GPT-tiny",
                     vq_model="VQ-tiny", image_size=64)
    pipe = VisualSpecPipeline.from_pretrained(out)
    for name, tensor in gpt.state_dict().items():
        assert torch.equal(pipe.transformer.state_dict()[name], tensor), name
    assert (out / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
    pipe.set_progress_bar_config(disable=True)
    if model_type == "c2i":
        out_images = pipe([3], decoding="sjd", seed=0)
        assert out_images.images[0].size == (64, 64)
        assert pipe.config.default_guidance_scale == 4.0
    else:
        assert pipe.config.default_guidance_scale == 7.5 and pipe.transformer.config.cls_token_num == 6


def test_converter_names_a_wrong_size(tmp_path):
    gpt = LlamaGenGPT(dim=64, n_layer=2, n_head=4, vocab_size=64, block_size=16, num_classes=10)
    torch.save({"model": gpt.state_dict()}, tmp_path / "gpt.pt")
    with pytest.raises(ValueError, match="missing.*shape mismatch"):
        LlamaGenGPT.from_llamagen_checkpoint(str(tmp_path / "gpt.pt"), "GPT-B", block_size=16)
    with pytest.raises(ValueError, match="unknown LlamaGen size"):
        LlamaGenGPT.from_llamagen_checkpoint(str(tmp_path / "gpt.pt"), "GPT-Q", block_size=16)


def test_convert_command_line_reports_errors_cleanly(tmp_path):
    torch.save({"model": {"foo": torch.zeros(1)}}, tmp_path / "bad.pt")
    result = subprocess.run([sys.executable, "-m", "visualspec.tools.cli", "convert-llamagen", "--gpt", str(tmp_path / "bad.pt"),
                             "--gpt-model", "GPT-B", "--vq", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "error:" in result.stderr and "Traceback" not in result.stderr
