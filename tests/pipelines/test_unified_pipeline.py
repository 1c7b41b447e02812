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


@pytest.mark.parametrize("decoding", ["ar", "sjd", "lantern"])
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


def test_lantern_neighbourhoods_are_image_codes_in_token_ids(pipe):
    """Each code token's neighbours are the token ids of its nearest codes in the VQ codebook;
    every other token (text, layout) is its own neighbour and absorbs nothing."""
    table = pipe.neighbour_table(3)
    codes = torch.tensor(pipe.layout.code_tokens)
    assert table.shape == (pipe.transformer.config.vocab_size, 3)
    assert bool(torch.isin(table[codes], codes).all()) and not bool((table[codes] == codes[:, None]).any())
    others = torch.ones(table.shape[0], dtype=torch.bool)
    others[codes] = False
    assert torch.equal(table[others], torch.arange(table.shape[0])[others][:, None].expand(-1, 3))
    wide = pipe(PROMPT, decoding="lantern", lantern_delta=1.0, seed=0, window=6, output_type="latent")
    exact = pipe(PROMPT, decoding="sjd", seed=0, window=6, output_type="latent")
    assert wide.stats.target_forwards <= exact.stats.target_forwards  # a full budget accepts at least as much


def test_seeds_repeat_and_output_types(pipe):
    a = pipe(PROMPT, seed=3, output_type="np").images
    b = pipe(PROMPT, generator=torch.Generator().manual_seed(3), output_type="np").images
    assert a.shape == (1, 16, 16, 3) and (a == b).all()
    assert pipe(PROMPT, seed=3, output_type="pt").images.shape == (1, 3, 16, 16)


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="gsd"), "unknown decoding mode"),
    (dict(decoding="lantern", lantern_delta=2.0), "lantern_delta"),
    (dict(decoding="lantern", lantern_k=0), "lantern_k"),
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
