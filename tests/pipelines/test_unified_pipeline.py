"""The unified-vocabulary pipeline (Lumina-mGPT's layout on transformers' Chameleon), on a tiny
random folder: loading, AR and SJD with the layout's tokens forced, greedy equality, outputs, the
command line, and clear errors."""

import pytest
import torch

from visualspec import VisualSpecPipeline
from visualspec.pipelines import UnifiedARPipeline
from visualspec.pipelines.tiny import tiny_unified_pipeline

PROMPT = "a photo of a red circle"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("unified")
    tiny_unified_pipeline(seed=0).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pipe(folder):
    p = VisualSpecPipeline.from_pretrained(folder)
    p.set_progress_bar_config(disable=True)
    return p


def test_the_folder_loads_as_a_unified_pipeline(pipe):
    assert type(pipe) is UnifiedARPipeline
    layout = pipe.layout
    assert (layout.height, layout.width, layout.num_tokens) == (4, 4, 4 * 5 + 1)


@pytest.mark.parametrize("decoding", ["ar", "sjd"])
def test_ar_and_sjd_make_images_with_the_layout_forced(pipe, decoding):
    out = pipe([PROMPT, "a photo of a blue square"], decoding=decoding, seed=0, window=6)
    assert len(out.images) == 2 and out.images[0].size == (16, 16)
    assert out.stats.structural_tokens == 2 * (4 + 1)  # a row end per row and the end, per image
    tokens = pipe(PROMPT, decoding=decoding, seed=0, window=6, output_type="latent").images
    layout = pipe.layout
    assert bool((tokens[:, layout.forced() >= 0] == layout.forced()[layout.forced() >= 0]).all())
    assert layout.codes(tokens).shape == (1, 4, 4)


def test_greedy_sjd_gives_the_ar_image(pipe):
    ar = pipe(PROMPT, decoding="ar", temperature=0, output_type="latent").images
    sjd = pipe(PROMPT, decoding="sjd", temperature=0, window=8, output_type="latent").images
    assert torch.equal(ar, sjd)


def test_seeds_repeat_and_output_types(pipe):
    a = pipe(PROMPT, seed=3, output_type="np").images
    b = pipe(PROMPT, generator=torch.Generator().manual_seed(3), output_type="np").images
    assert a.shape == (1, 16, 16, 3) and (a == b).all()
    assert pipe(PROMPT, seed=3, output_type="pt").images.shape == (1, 3, 16, 16)


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="lantern"), "unknown decoding mode"),
    (dict(output_type="gif"), "output_type"),
    (dict(window=0), "window"),
    (dict(jacobi_init="zigzag"), "jacobi_init"),
    (dict(num_images_per_prompt=0), "num_images_per_prompt"),
])
def test_bad_arguments_get_clear_errors(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(PROMPT, **kwargs)


def test_bad_prompts_get_clear_errors(pipe):
    with pytest.raises(ValueError, match="non-empty string"):
        pipe(" ")
    with pytest.raises(ValueError, match="does not know"):
        pipe("a photo of a zebra")


def test_the_command_line_generates_from_a_unified_folder(folder, tmp_path, capsys):
    from visualspec.tools.cli import main

    out = tmp_path / "image.png"
    assert main(["generate", PROMPT, "--model", str(folder), "--seed", "0", "-o", str(out), "--stats",
                 "--window", "4"]) == 0
    assert out.is_file() and '"structural_tokens": 5' in capsys.readouterr().out
    assert main(["generate", PROMPT, "--model", str(folder), "--epsilon-cutoff", "0.01", "-o", str(out)]) == 2
    assert "--epsilon-cutoff is not built for unified-vocabulary models" in capsys.readouterr().err
    assert main(["bench", "--model", str(folder)]) == 2
    assert "bench does not take unified-vocabulary folders" in capsys.readouterr().err
