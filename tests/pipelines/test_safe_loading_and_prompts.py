"""What a new user met in the second hour: weights that fall back to pickle, prompts cut silently."""

import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from visualspec import VisualSpecPipeline
from visualspec.assets import SHAPES_T2I
from visualspec.tools.cli import main


@pytest.fixture(scope="module")
def pipe():
    return VisualSpecPipeline.from_pretrained(SHAPES_T2I)


@pytest.mark.parametrize("weights, pickle", [("transformer/diffusion_pytorch_model", "transformer/"
                                              "diffusion_pytorch_model.bin"),
                                             ("text_encoder/model", "text_encoder/pytorch_model.bin")])
def test_a_missing_safetensors_file_is_named_and_a_pickle_beside_it_is_never_loaded(tmp_path, weights, pickle):
    folder = tmp_path / "model"
    shutil.copytree(SHAPES_T2I, folder)
    assert VisualSpecPipeline.from_pretrained(folder) is not None  # control: the copy loads
    state = load_file(folder / f"{weights}.safetensors")
    (folder / f"{weights}.safetensors").unlink()
    torch.save(state, folder / pickle)  # the same weights, pickled: diffusers would fall back to them
    name = weights.split("/")[1] + ".safetensors"
    with pytest.raises(ValueError, match=f"no file named {name} found in directory"):
        VisualSpecPipeline.from_pretrained(folder)


def test_a_prompt_longer_than_the_caption_is_refused_naming_the_limit(pipe, tmp_path, capsys):
    long = " ".join(["a photo of a red circle"] * 400)  # 2,400 words, every one known
    with pytest.raises(ValueError, match="is 2400 caption tokens; this model reads at most 16"):
        pipe(long, seed=0, output_type="latent")
    out = tmp_path / "x.png"
    assert main(["generate", long, "-o", str(out)]) == 2 and not out.exists()
    assert "this model reads at most 16" in capsys.readouterr().err
    sixteen = "a photo of two red circles and a blue square above a green triangle a a"  # exactly the limit
    pipe.check_prompt(sixteen)
    with pytest.raises(ValueError, match="17 caption tokens"):
        pipe.check_prompt(sixteen + " a")
    with pytest.raises(ValueError, match=r"does not know: \['zebra'\]"):  # words past the cut are checked too
        pipe.check_prompt("a photo of a red circle " + "a " * 20 + "zebra")


def test_capitals_and_a_final_full_stop_read_as_the_caption(pipe):
    plain = pipe.encode_prompt(["a photo of a red circle"])
    for written in ("A photo of a RED circle.", "  a photo of a red circle . "):
        pipe.check_prompt(written)
        assert all(torch.equal(a, b) for a, b in zip(pipe.encode_prompt([written]), plain))
    images = [np.asarray(pipe(p, seed=3, decoding="ar").images[0]) for p in ("A photo of a RED circle.",
                                                                              "a photo of a red circle")]
    assert np.array_equal(*images)
    for bad in ("a photo of a red circle..", "a photo of a red circle!"):  # one full stop, nothing else
        with pytest.raises(ValueError, match="does not know"):
            pipe.check_prompt(bad)


def test_the_lumina_layout_shapes_model_reads_a_final_full_stop_too():
    from visualspec.assets import SHAPES_LUMINA

    lumina = VisualSpecPipeline.from_pretrained(SHAPES_LUMINA)
    lumina.check_prompt("A photo of a RED circle.")
    plain = lumina.encode_prompts(["a photo of a red circle"], guided=False)
    assert all(torch.equal(a, b) for a, b in zip(lumina.encode_prompts(["A photo of a RED circle."], guided=False),
                                                 plain))
    with pytest.raises(ValueError, match="does not know"):
        lumina.check_prompt("a photo of a red circle!")
