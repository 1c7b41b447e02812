"""The any-order pipeline: AR, ASSD and parallel decoding along a per-image order, infilling, and
clear errors for bad orders, masks and settings."""

import numpy as np
import pytest
import torch

from visualspec import VisualSpecPipeline
from visualspec.models.any_order import AnyOrderGPT
from visualspec.pipelines import AnyOrderPipeline
from visualspec.pipelines.tiny import tiny_random_pipeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny CPU workloads

PROMPT = "a photo of a red circle"
FIXED = dict(compile=False, output_type="latent")


@pytest.fixture(scope="module")
def pipe():
    raster = tiny_random_pipeline(seed=0)
    torch.manual_seed(0)
    gpt = AnyOrderGPT.from_raster(raster.transformer)
    torch.nn.init.normal_(gpt.query_embeddings.weight, std=0.3)
    p = AnyOrderPipeline(transformer=gpt.eval(), vq_model=raster.vq_model, text_encoder=raster.text_encoder,
                         tokenizer=raster.tokenizer, default_guidance_scale=2.0, default_k=4)
    p.set_progress_bar_config(disable=True)
    return p


def generators(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_greedy_assd_gives_ars_tokens_in_fewer_forwards(pipe):
    ar = pipe(PROMPT, decoding="ar", temperature=0, seed=3, **FIXED)
    assd = pipe(PROMPT, decoding="assd", k=4, temperature=0, seed=3, **FIXED)
    assert torch.equal(ar.images, assd.images)
    assert ar.stats.target_forwards == 256 and assd.stats.target_forwards < 256
    assert assd.stats.mode == "assd@4" and assd.stats.fixed_at.shape == (1, 256)


@pytest.mark.parametrize("decoding", ["ar", "assd"])
def test_an_images_tokens_depend_on_its_prompt_and_generator_only(pipe, decoding):
    prompts = [PROMPT, "a photo of two blue squares", PROMPT]
    out = pipe(prompts, decoding=decoding, generator=generators(3), **FIXED)
    together = out.images
    queued = pipe(prompts, decoding=decoding, generator=generators(3), batch_size=2, **FIXED).images
    alone = pipe(prompts[2:], decoding=decoding, generator=generators(1, seed=2), **FIXED).images
    assert torch.equal(together, queued) and torch.equal(together[2:], alone)
    if decoding == "ar":  # the same prompt, another generator: another order
        assert not torch.equal(out.stats.fixed_at[0], out.stats.fixed_at[2])


def test_auto_k_decodes_as_ar_where_no_round_pays(pipe, monkeypatch):
    """k="auto" prices whole ASSD rounds (draft forward and verification) at k = 2, 4, 8, 16 beside
    plain AR's step, at the call's model rows. Rounds that cost two AR steps for 1.5 cells: the
    call decodes as AR (AR's very tokens) and says so; rounds at one AR step's cost (the control)
    draft, every round at the fastest fixed k (here the smallest of equals, k = 2: 128 rounds at
    most). A batch records the policy and passes it back as k."""
    import visualspec.core.window_costs as wc
    from visualspec.pipelines.any_order import ASSD_WINDOWS

    asked, cost = [], [2.0]

    def tables(model, decode_at, max_new_tokens, rows, tag, windows=wc.WINDOWS, ar_at=None, **kw):
        asked.append((rows, tag, tuple(windows)))
        return {0: 1.0, **{w: cost[0] for w in windows}}, {0: 1.0, **{w: 1.0 if w == 1 else 1.5 for w in windows}}

    monkeypatch.setattr(wc, "decode_step_costs", tables)
    out = pipe(PROMPT, decoding="assd", k="auto", seed=0, **FIXED)
    assert out.stats.mode == "assd@auto as AR" and out.stats.target_forwards == 256
    assert torch.equal(out.images, pipe(PROMPT, decoding="ar", seed=0, **FIXED).images)
    cost[0] = 1.0
    out = pipe(PROMPT, decoding="assd", k="auto", seed=0, **FIXED)
    assert out.stats.mode == "assd@auto" and out.stats.target_forwards < 256 and set(out.stats.accepted_lengths) <= {1, 2, 3}
    assert asked == [(2, "AnySubsetDrafter|rule=speculative_verify|sampled", ASSD_WINDOWS)] * 2
    found = pipe.window_tables(PROMPT, batch_size=2, decoding="assd", k="auto", compile=False)
    assert set(found["tables"]) == {4} and not found["as_ar"] and found["fixed"]  # the best fixed k
    assert pipe.window_tables(PROMPT, decoding="assd", compile=False) == {}  # the fixture's k = 4
    replay = pipe(PROMPT, decoding="assd", k=pipe.last_window_policy, seed=0, **FIXED)
    assert replay.stats.mode == "assd@auto" and len(asked) == 3  # nothing timed again


def test_a_batch_records_the_auto_k_and_resumes_with_it(pipe, tmp_path, monkeypatch):
    """``visualspec batch`` with k="auto": the policy is timed once, recorded with the run's
    settings, and handed back as k to every call, so a resumed run decodes as the first did and
    times nothing again."""
    import json

    import visualspec.core.window_costs as wc
    from visualspec.tools.batch import CONFIG_NAME, generate_batch

    timed = []

    def tables(model, decode_at, max_new_tokens, rows, tag, windows=wc.WINDOWS, ar_at=None, **kw):
        timed.append(rows)
        return {0: 1.0, **{w: 1.0 for w in windows}}, {0: 1.0, **{w: (w + 1) / 2 for w in windows}}

    monkeypatch.setattr(wc, "decode_step_costs", tables)
    run = dict(images_per_prompt=2, decoding="assd", batch_size=2, k="auto", compile=False, progress=False)
    first = generate_batch(pipe, [PROMPT], tmp_path, **run)
    recorded = json.loads((tmp_path / CONFIG_NAME).read_text())["window_costs"]
    assert first["generated"] == 2 and recorded["fixed"] and not recorded["as_ar"] and timed == [4]
    (tmp_path / "00000" / "samples" / "0001.png").unlink()
    again = generate_batch(pipe, [PROMPT], tmp_path, **run)
    assert again["generated"] == 1 and timed == [4]


def test_a_given_order_is_followed(pipe):
    order = torch.arange(256).flip(0)
    out = pipe(PROMPT, decoding="ar", order=order, seed=0, **FIXED)
    assert torch.equal(out.stats.fixed_at[0], torch.arange(256, 0, -1))  # the last cell first, at the prefill


def test_infilling_keeps_the_masked_cells_and_generates_the_rest(pipe):
    source = pipe(PROMPT, decoding="ar", seed=4, **FIXED).images
    keep = torch.zeros(16, 16, dtype=torch.bool)
    keep[:, :8] = True
    out = pipe([PROMPT, PROMPT], decoding="assd", image=source, mask=keep, generator=generators(2, seed=5), **FIXED)
    grid = out.images.view(2, 16, 16)
    assert torch.equal(grid[:, :, :8], source.view(1, 16, 16)[:, :, :8].expand(2, 16, 8))
    assert not torch.equal(grid[0, :, 8:], grid[1, :, 8:])
    assert out.stats.num_tokens == 128 and bool((out.stats.fixed_at.view(2, 16, 16)[:, :, :8] == 0).all())
    # a picture works as well as its tokens
    picture = pipe(PROMPT, decoding="ar", seed=4, compile=False).images[0]
    again = pipe(PROMPT, decoding="ar", image=picture, mask=keep, seed=6, **FIXED).images
    assert again.shape == (1, 256)


def test_parallel_decoding_takes_its_steps_and_is_not_assds_law(pipe):
    out = pipe(PROMPT, decoding="parallel", parallel_steps=20, seed=0, **FIXED)
    assert out.stats.target_forwards == 21 and out.stats.mode == "parallel"
    assert int(out.stats.fixed_at.max()) == 21
    default = pipe(PROMPT, decoding="parallel", seed=0, **FIXED)
    assert default.stats.target_forwards == 1 + 88  # RandAR's 88 steps for 256 tokens


def test_the_folder_round_trips(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    loaded = VisualSpecPipeline.from_pretrained(tmp_path)
    assert isinstance(loaded, AnyOrderPipeline) and isinstance(loaded.transformer, AnyOrderGPT)
    loaded.set_progress_bar_config(disable=True)
    a = pipe(PROMPT, decoding="assd", seed=1, **FIXED).images
    assert torch.equal(loaded(PROMPT, decoding="assd", seed=1, **FIXED).images, a)


def test_bench_modes_spell_k_and_steps():
    assert AnyOrderPipeline.bench_mode("assd@6") == {"decoding": "assd", "k": 6, "compile": False}
    assert AnyOrderPipeline.bench_mode("assd@auto+compiled") == {"decoding": "assd", "k": "auto", "compile": True}
    assert AnyOrderPipeline.bench_mode("parallel@40+compiled")["parallel_steps"] == 40


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="assd", k=0), "k must be"),
    (dict(decoding="assd", k="fast"), "k must be an integer >= 1 .* or 'auto'"),
    (dict(decoding="ar", k=3), "k is the number of cells ASSD drafts"),
    (dict(decoding="assd", parallel_steps=3), "parallel_steps is for decoding='parallel'"),
    (dict(decoding="parallel", parallel_steps=0), "parallel_steps must be"),
    (dict(decoding="sjd"), "unknown decoding mode 'sjd'"),
    (dict(order=torch.arange(255)), r"permutation of the 256 cells"),
    (dict(order=torch.zeros(256, dtype=torch.long)), "permutation of 0..255"),
    (dict(image=torch.zeros(1, 256, dtype=torch.long)), "both image= .* and mask="),
    (dict(image=torch.zeros(1, 256, dtype=torch.long), mask=torch.ones(8, 8, dtype=torch.bool)),
     r"mask marks the cells to keep: shape \(16, 16\)"),
    (dict(image=torch.zeros(1, 256, dtype=torch.long), mask=torch.ones(16, 16, dtype=torch.bool)), "keeps every cell"),
    (dict(image=torch.zeros(1, 100, dtype=torch.long), mask=torch.eye(16, dtype=torch.bool)), r"image tokens are \(B, 256\)"),
    (dict(image=torch.zeros(1, 3, 32, 32), mask=torch.eye(16, dtype=torch.bool)), "image must be 64x64 RGB"),
    (dict(image=torch.zeros(1, 256, dtype=torch.long), mask=torch.eye(16, dtype=torch.bool), order=torch.arange(256)),
     "the order must list the 16 kept cells first"),
])
def test_bad_input_gets_a_clear_error(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(PROMPT, seed=0, **FIXED, **kwargs)


def test_masks_of_a_call_keep_as_many_cells(pipe):
    masks = np.zeros((2, 16, 16), dtype=bool)
    masks[0, 0, 0] = True
    with pytest.raises(ValueError, match="keeps as many cells"):
        pipe([PROMPT, PROMPT], image=torch.zeros(1, 256, dtype=torch.long), mask=masks, seed=0, **FIXED)


def test_bench_times_another_pipeline_beside_it(pipe, tmp_path, monkeypatch):
    from visualspec.tools.bench import run_benchmark

    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))
    raster = tiny_random_pipeline(seed=0)
    raster.set_progress_bar_config(disable=True)
    result = run_benchmark(pipe, prompts=[PROMPT], modes=["assd@3", "parallel@30", "raster:ar", "raster:sjd"],
                           images=1, others={"raster": raster})
    rows = result["results"]
    assert list(rows) == ["ar", "assd@3", "parallel@30", "raster:ar", "raster:sjd"]  # the any-order AR added
    assert rows["parallel@30"]["target_forwards_per_image"] == 31
    assert rows["raster:ar"]["target_forwards_per_image"] == 256 and rows["raster:sjd"]["target_forwards_per_image"] < 256
    assert result["baseline"] in ("ar", "raster:ar")
    with pytest.raises(ValueError, match=r"name no pipeline of the run \(given: \['raster'\]\)"):
        run_benchmark(pipe, prompts=[PROMPT], modes=["other:sjd"], images=1, others={"raster": raster})


def test_the_commands_take_the_folder(pipe, tmp_path, monkeypatch, capsys):
    import json

    from visualspec.tools.cli import main

    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path / "home"))
    folder = tmp_path / "any-order"
    pipe.save_pretrained(folder)
    out, amap = tmp_path / "out.png", tmp_path / "map.png"
    assert main(["generate", PROMPT, "--model", str(folder), "--decoding", "assd", "--k", "3", "--compile", "off",
                 "-o", str(out), "--stats", "--acceptance-map", str(amap)]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["mode"] == "assd@3" and stats["target_forwards"] < 256 and out.is_file() and amap.is_file()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT, "tag": "single_object"}) + "\n")
    assert main(["batch", "--model", str(folder), "--prompts", str(prompts), "--out", str(tmp_path / "images"),
                 "--images-per-prompt", "2", "--decoding", "parallel", "--parallel-steps", "16",
                 "--compile", "off"]) == 0
    assert len(list((tmp_path / "images").rglob("*.png"))) == 2
    assert main(["generate", PROMPT, "--model", str(folder), "--decoding", "assd", "--window", "4",
                 "-o", str(out)]) == 2
    assert "--window is not an option of the any-order model" in capsys.readouterr().err


def test_the_apps_image_tab_draws_and_compares_ar_with_assd(pipe, tmp_path, monkeypatch):
    from visualspec.tools import app

    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))
    demo = app.ImageDemo(pipe)
    assert demo.speculative == "assd" and "assd" in pipe.available_decodings()
    image, amap, stats = demo.generate(PROMPT, "parallel", 2.0, 0)
    assert image is not None and amap is not None and '"mode": "parallel"' in stats
    _, _, rows = demo.compare(PROMPT, 2.0, 0)
    forwards = rows[0]
    assert forwards[0] == "target forwards" and forwards[1] == 256 and forwards[2] < 256


def test_a_folders_batched_default_k_serves_calls_of_more_than_one_image(pipe, monkeypatch):
    """``default_k_batched`` is the k of a decode of several images at once (a call's batch, or its
    ``batch_size``); one image at a time keeps ``default_k``; an explicit k wins over both; a folder
    without it (None) uses ``default_k`` everywhere; a bad folder value is named."""
    monkeypatch.setitem(pipe.config, "default_k_batched", 2)
    one = pipe(PROMPT, decoding="assd", temperature=0, seed=3, **FIXED)
    two = pipe([PROMPT] * 2, decoding="assd", temperature=0, seed=3, **FIXED)
    queued = pipe([PROMPT] * 2, decoding="assd", temperature=0, seed=3, batch_size=1, **FIXED)
    given = pipe([PROMPT] * 2, decoding="assd", k=8, temperature=0, seed=3, **FIXED)
    assert (one.stats.mode, two.stats.mode, queued.stats.mode, given.stats.mode) == (
        "assd@4", "assd@2", "assd@4", "assd@8")
    assert pipe.default_k_for(None, 16) == 2 and pipe.default_k_for(None, 1) == 4 and pipe.default_k_for(5, 16) == 5
    monkeypatch.setitem(pipe.config, "default_k_batched", None)
    assert pipe([PROMPT] * 2, decoding="assd", temperature=0, seed=3, **FIXED).stats.mode == "assd@4"
    monkeypatch.setitem(pipe.config, "default_k_batched", 0)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        pipe(PROMPT, decoding="assd", **FIXED)
