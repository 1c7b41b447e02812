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


def test_compiled_heads_give_the_eager_images_and_say_so(folder):
    """``compile=True`` compiles both heads' sampler (chunks of 5 steps: 7 steps run 5 + 2); CSpD's
    drafts, verdicts and tokens are the eager ones (the same noise, the same steps)."""
    pipe = VisualSpecPipeline.from_pretrained(folder)
    kw = dict(seed=0, gamma=3, prefill=0.25, num_steps=7, output_type="latent")
    eager = pipe([1, 2], **kw)
    compiled = pipe([1, 2], compile=True, **kw)
    assert compiled.stats.mode == "cspd+compiled" and pipe.transformer.diffloss._compiled_step is not None
    assert pipe.draft_model.diffloss._compiled_step is not None
    assert torch.allclose(compiled.images, eager.images, atol=1e-5)
    assert compiled.stats.draft_acceptance == eager.stats.draft_acceptance
    assert pipe([1, 2], compile=False, **kw).stats.mode == "cspd" and pipe.transformer.diffloss._compiled_step is None
    with pytest.raises(ValueError, match="compile must be True or False, got 'auto'"):
        pipe([1], compile="auto")


def test_num_steps_sets_both_heads_steps_for_the_call_only(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    calls = []
    for model in (pipe.transformer, pipe.draft_model):
        model.diffloss.net.register_forward_hook(lambda m, i, o, name=model: calls.append(name))
    pipe([1], decoding="ar", seed=0, output_type="latent")
    assert len(calls) == 16 * 5  # the folder's 5 steps for each of 16 tokens
    calls.clear()
    fewer = pipe([1], decoding="ar", seed=0, num_steps=2, output_type="latent").images
    assert len(calls) == 16 * 2 and len(pipe.transformer.diffloss.schedule) == 5  # restored after the call
    assert not torch.equal(fewer, pipe([1], decoding="ar", seed=0, output_type="latent").images)
    calls.clear()
    sp = pipe([1], decoding="cspd", seed=0, num_steps=3, gamma=2, output_type="latent")
    assert sp.images.shape == (1, 16, 4) and len(pipe.draft_model.diffloss.schedule) == 5
    assert pipe.draft_model in calls and pipe.transformer in calls


def test_bad_input_names_the_problem(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    for kwargs, message in [(dict(decoding="sjd"), "not built for a continuous-token model"), (dict(gamma=0), "gamma"),
                            (dict(prefill=1.0), "pre-fill fraction"), (dict(guidance_scale=0.5), "guidance_scale"),
                            (dict(flatten=0.5), "flatten"), (dict(output_type="gif"), "output_type"),
                            (dict(num_steps=0), "num_steps"), (dict(num_steps=2.5), "num_steps")]:
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
                 "--num-steps", "3", "-o", str(out), "--stats", "--acceptance-map", str(amap)]) == 0
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


def test_the_benchmark_compares_ar_cspd_and_fewer_steps_side_by_side(folder, tmp_path, capsys):
    from visualspec.pipelines import ContinuousARPipeline
    from visualspec.tools.cli import main

    assert ContinuousARPipeline.bench_mode("ar@25") == dict(decoding="ar", num_steps=25, compile=False)
    assert ContinuousARPipeline.bench_mode("cspd+flat") == dict(decoding="cspd", flatten=42.0, compile=False)
    assert ContinuousARPipeline.bench_mode("cspd@25+compiled") == dict(decoding="cspd", num_steps=25, compile=True)
    with pytest.raises(ValueError, match="unknown benchmark mode 'sjd'"):
        ContinuousARPipeline.bench_mode("sjd")
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(folder), "--modes", "ar,cspd,cspd+flat,ar@2", "--images", "2",
                 "--batch-sizes", "1", "2", "--gamma", "3", "--json", str(out)]) == 0
    import json

    for result in json.loads(out.read_text()):
        r = result["results"]
        assert set(r) == {"ar", "cspd", "cspd+flat", "ar@2"}
        assert r["ar"]["target_forwards_per_image"] == 16 and "draft_acceptance" not in r["ar"]
        for mode in ("cspd", "cspd+flat"):
            assert 0 <= r[mode]["draft_acceptance"] <= 1 and r[mode]["draft_forwards_per_image"] > 0
            # each step keeps the accepted drafts and one token more
            assert r[mode]["target_forwards_per_image"] < 16 or r[mode]["draft_acceptance"] == 0
    assert main(["bench", "--model", str(folder), "--modes", "ar,lantern", "--images", "1"]) == 2
    assert "unknown benchmark mode 'lantern'" in capsys.readouterr().err


def test_stats_show_the_continuous_counts_only_where_drafts_were_scored(folder):
    pipe = VisualSpecPipeline.from_pretrained(folder)
    ar = pipe([1], decoding="ar", seed=0, output_type="latent").stats.to_dict()
    assert "drafts_proposed" not in ar and "residual_fallbacks" not in ar and ar["target_forwards"] == 16
    sp = pipe([1], decoding="cspd", seed=0, gamma=3, output_type="latent").stats
    d = sp.to_dict()
    assert d["drafts_proposed"] == sp.drafts_proposed > 0 and 0 <= d["drafts_accepted"] <= d["drafts_proposed"]
    assert sp.draft_acceptance == sp.drafts_accepted / sp.drafts_proposed
