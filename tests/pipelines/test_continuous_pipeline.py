"""The continuous-token pipeline on tiny models built offline: it loads through
VisualSpecPipeline, generates by AR and CSpD, and refuses bad input by name."""

import pytest
import torch

from visualspec.models.continuous_ar import ContinuousARTransformer
from visualspec.models.kl_vae import KLAutoencoder
from visualspec.pipelines import ContinuousARPipeline, VisualSpecPipeline


def tiny_model(seed, dim=32, token_dim=4):
    torch.manual_seed(seed)
    return ContinuousARTransformer(token_dim=token_dim, dim=dim, n_layer=1, n_head=2, model_type="c2i", num_classes=10,
                                   cls_token_num=1, block_size=16, prefix_rope="zeros", caption_positions=False,
                                   head_depth=1, head_width=32, num_sampling_steps=5).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    vae = KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1).eval()
    pipe = ContinuousARPipeline(transformer=tiny_model(0), vae=vae, draft_model=tiny_model(1, dim=32))
    path = tmp_path_factory.mktemp("continuous") / "tiny"
    pipe.save_pretrained(path)
    return path


def test_the_folder_loads_and_generates_by_ar_and_cspd(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    assert isinstance(pipe, ContinuousARPipeline)
    ar = pipe([1, 2], decoding="ar", seed=0)
    assert len(ar.images) == 2 and ar.images[0].size == (16, 16) and ar.stats.target_forwards == 16
    sp = pipe([1, 2], seed=0, gamma=3, prefill=0.25, output_type="latent")  # cspd: the folder has a draft
    assert sp.images.shape == (2, 16, 4) and sp.stats.mode == "cspd" and sp.stats.draft_forwards > 0
    again = pipe([1, 2], seed=0, gamma=3, prefill=0.25, output_type="latent").images
    assert torch.equal(sp.images, again)


def test_bad_input_names_the_problem(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    for kwargs, message in [(dict(decoding="sjd"), "continuous tokens"), (dict(gamma=0), "gamma"),
                            (dict(prefill=1.0), "pre-fill fraction"), (dict(guidance_scale=0.5), "guidance_scale"),
                            (dict(flatten=0.5), "flatten"), (dict(output_type="gif"), "output_type")]:
        with pytest.raises(ValueError, match=message):
            pipe([1], **kwargs)
    with pytest.raises(ValueError, match="class-conditional"):
        pipe("a red circle")
    pipe.register_modules(draft_model=tiny_model(2, token_dim=8))
    with pytest.raises(ValueError, match=r"token_dim \(8\) differs from the target's \(4\)"):
        pipe([1], decoding="cspd")
    pipe.register_modules(draft_model=None)
    with pytest.raises(ValueError, match="needs a draft_model"):
        pipe([1], decoding="cspd")


def test_the_command_line_generates_with_cspd(folder, tmp_path, capsys):
    from visualspec.tools.cli import main

    out, amap = tmp_path / "c.png", tmp_path / "map.png"
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--gamma", "2", "--prefill", "0.25",
                 "-o", str(out), "--stats", "--acceptance-map", str(amap)]) == 0
    assert out.is_file() and amap.is_file() and "cspd:" in capsys.readouterr().out
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--window", "4", "-o", str(out)]) == 2
    assert "--window is not an option of a continuous-token model" in capsys.readouterr().err
    assert main(["generate", "--class-label", "3", "--model", str(folder), "--decoding", "sjd", "-o", str(out)]) == 2


def test_the_batch_command_takes_a_text_model_and_grouping_changes_no_image(tmp_path):
    from visualspec.assets import SHAPES_T2I
    from visualspec.tools.cli import main

    text = VisualSpecPipeline.from_pretrained(SHAPES_T2I)
    torch.manual_seed(0)
    kw = dict(token_dim=4, dim=32, n_layer=1, n_head=2, model_type="t2i", caption_dim=text.transformer.config.caption_dim,
              cls_token_num=text.transformer.config.cls_token_num, block_size=16, head_depth=1, head_width=32,
              num_sampling_steps=5)
    pipe = ContinuousARPipeline(transformer=ContinuousARTransformer(**kw).eval(),
                                vae=KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1).eval(),
                                text_encoder=text.text_encoder, tokenizer=text.tokenizer,
                                draft_model=ContinuousARTransformer(**{**kw, "dim": 32}).eval())
    pipe.save_pretrained(tmp_path / "model")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a red circle\na photo of two blue squares\na photo of a green triangle\n")
    for name, size in (("a", "2"), ("b", "8")):
        assert main(["batch", "--prompts", str(prompts), "--out", str(tmp_path / name), "--model", str(tmp_path / "model"),
                     "--images-per-prompt", "2", "--batch-size", size, "--gamma", "2", "--no-progress"]) == 0
    a = sorted((tmp_path / "a").rglob("*.png"))
    b = sorted((tmp_path / "b").rglob("*.png"))
    assert len(a) == 6 and [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert main(["batch", "--prompts", str(prompts), "--out", str(tmp_path / "c"), "--model", str(tmp_path / "model"),
                 "--top-k", "3", "--no-progress"]) == 2
