"""The MAR pipeline on a tiny MAR and KL autoencoder built offline: saving and loading through
VisualSpecPipeline, generation, conversion of official-layout files, the command line, and errors."""

import json

import numpy as np
import pytest
import torch

from visualspec.models.kl_vae import KLAutoencoder, to_official
from visualspec.models.mar import MAR
from visualspec.pipelines import MARPipeline, VisualSpecPipeline
from visualspec.pipelines.convert import convert_mar
from visualspec.tools.cli import main

MAR_CONFIG = dict(img_size=64, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2, decoder_embed_dim=32,
                  decoder_depth=1, decoder_num_heads=2, buffer_size=4, diffloss_d=1, diffloss_w=32, class_num=10,
                  num_sampling_steps=10)


def tiny_parts():
    torch.manual_seed(0)
    mar, vae = MAR(**MAR_CONFIG).eval(), KLAutoencoder(ch=32).eval()
    for p in mar.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return mar, vae


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    mar, vae = tiny_parts()
    path = tmp_path_factory.mktemp("mar") / "tiny-mar"
    MARPipeline(transformer=mar, vae=vae, default_num_iter=4).save_pretrained(path)
    return path


def test_the_folder_loads_as_a_mar_pipeline_and_generates(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    assert isinstance(pipe, MARPipeline)
    out = pipe([1, 2], seed=0, num_images_per_prompt=2)
    assert len(out.images) == 4 and out.images[0].size == (64, 64)
    again = pipe([1, 2], seed=0, num_images_per_prompt=2, output_type="np").images
    assert again.shape == (4, 64, 64, 3)
    assert (abs(again[0] - np.asarray(out.images[0]) / 255) < 1 / 255 + 1e-6).all()  # the same seed, the same image
    latent = pipe(3, seed=1, guidance_scale=2.0, cfg_schedule="constant", output_type="latent").images
    assert latent.shape == (1, 16, 16) and out.stats.target_forwards == 4


def test_the_compiled_head_gives_the_eager_tokens(folder):
    """``compile=True``: MAR's head samples through the compiled chunks (10 steps: 5 + 5), its
    guidance growing step by step without a recompile, and draws the eager tokens."""
    pipe = VisualSpecPipeline.from_pretrained(folder)
    eager = pipe([1, 2], seed=0, output_type="latent")
    compiled = pipe([1, 2], seed=0, output_type="latent", compile=True)
    assert compiled.stats.mode == "mar+compiled" and pipe.transformer.diffloss._compiled_step is not None
    assert torch.allclose(compiled.images, eager.images, rtol=1e-3, atol=1e-5)  # float rounding: this random head reaches 7e4


def test_bad_input_names_the_problem(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    for kwargs, message in [(dict(class_labels="a red circle"), "class-conditional"),
                            (dict(class_labels=[3, 12]), r"class labels must be integers in \[0, 10\)"),
                            (dict(class_labels=1, num_iter=0), "num_iter"),
                            (dict(class_labels=1, decoding="sjd"), "not built for MAR"),
                            (dict(class_labels=1, top_k=5), "top_k is not an option of MAR"),
                            (dict(class_labels=1, cfg_schedule="cosine"), "cfg_schedule"),
                            (dict(class_labels=1, guidance_scale=0.5), "guidance_scale")]:
        with pytest.raises(ValueError, match=message):
            pipe(**kwargs)


def test_official_files_convert_to_a_folder(tmp_path):
    mar, vae = tiny_parts()
    torch.save({"model_ema": mar.state_dict(), "model": mar.state_dict(), "epoch": 1}, tmp_path / "checkpoint-last.pth")
    torch.save({"model": {to_official(k, 5): v for k, v in vae.state_dict().items()}}, tmp_path / "kl16.ckpt")
    convert_mar(str(tmp_path / "checkpoint-last.pth"), str(tmp_path / "kl16.ckpt"), str(tmp_path / "out"),
                mar_config={k: v for k, v in MAR_CONFIG.items()}, vae_config=dict(ch=32))
    pipe = VisualSpecPipeline.from_pretrained(tmp_path / "out")
    assert pipe.config.default_guidance_scale == 2.9  # mar_base's
    assert torch.equal(pipe.transformer.mask_token, mar.mask_token)


def test_the_command_line_generates_with_mar(folder, tmp_path, capsys):
    out = tmp_path / "mar.png"
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--num-iter", "2", "-o", str(out),
                 "--stats"]) == 0
    printed = capsys.readouterr().out
    assert out.is_file() and "mar:" in printed
    assert json.loads(printed.strip().splitlines()[-1])["wall_time_s"] > 0  # the decode was timed (it read 0.00 s)
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--top-k", "5", "-o", str(out)]) == 2
    assert "--top-k is not an option of MAR" in capsys.readouterr().err
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--gamma", "3", "-o", str(out)]) == 2
    assert "--gamma is not an option of MAR" in capsys.readouterr().err
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--decoding", "sjd", "-o", str(out)]) == 2
    assert "is not built for MAR" in capsys.readouterr().err
    amap, other = tmp_path / "map.png", tmp_path / "other.png"  # MAR's masked order has no acceptance map:
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--num-iter", "2", "-o", str(other),
                 "--acceptance-map", str(amap)]) == 2  # refused by name, before any image is drawn
    assert "MAR (MARPipeline) draws no acceptance map" in capsys.readouterr().err
    assert not other.exists() and not amap.exists()
