"""The unified-vocabulary pipeline on tiny random folders of each family (Lumina-mGPT's layout on
transformers' Chameleon, Emu3, Janus): loading, AR, SJD and LANTERN with the layout's tokens
forced, greedy equality, outputs, the command line, and clear errors."""

import pytest
import torch

from visualspec import VisualSpecPipeline
from visualspec.pipelines import UnifiedARPipeline
from visualspec.pipelines.tiny import tiny_unified_pipeline

PROMPT = "a photo of a red circle"


FAMILIES = {  # family: (image side in pixels, structural tokens per image: row ends and ending)
    "chameleon": (16, 4 + 1),
    "emu3": (8, 4 + 2),
    "janus": (8, 0),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    paths = {}
    for family in FAMILIES:
        paths[family] = tmp_path_factory.mktemp(family)
        tiny_unified_pipeline(seed=0, family=family).save_pretrained(paths[family])
    return paths


@pytest.fixture(scope="module")
def folder(folders):
    return folders["chameleon"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_pipe(request, folders):
    p = VisualSpecPipeline.from_pretrained(folders[request.param])
    p.set_progress_bar_config(disable=True)
    return request.param, p


@pytest.fixture(scope="module")
def pipe(folder):
    p = VisualSpecPipeline.from_pretrained(folder)
    p.set_progress_bar_config(disable=True)
    return p


def test_each_folder_loads_as_a_unified_pipeline_of_its_family(family_pipe):
    family, pipe = family_pipe
    assert type(pipe) is UnifiedARPipeline and pipe.family.model_type == family
    layout = pipe.layout
    assert (layout.height, layout.width, layout.num_tokens) == (4, 4, 4 * layout.row_length + len(layout.ending))


@pytest.mark.parametrize("decoding", ["ar", "sjd", "lantern"])
def test_ar_and_sjd_make_images_with_the_layout_forced(family_pipe, decoding):
    family, pipe = family_pipe
    side, structural = FAMILIES[family]
    out = pipe([PROMPT, "a photo of a blue square"], decoding=decoding, seed=0, window=6)
    assert len(out.images) == 2 and out.images[0].size == (side, side)
    assert out.stats.structural_tokens == 2 * structural
    tokens = pipe(PROMPT, decoding=decoding, seed=0, window=6, output_type="latent").images
    layout = pipe.layout
    assert bool((tokens[:, layout.forced() >= 0] == layout.forced()[layout.forced() >= 0]).all())
    assert layout.codes(tokens).shape == (1, 4, 4)


def test_greedy_sjd_gives_the_ar_image(family_pipe):
    _, pipe = family_pipe
    ar = pipe(PROMPT, decoding="ar", temperature=0, output_type="latent").images
    sjd = pipe(PROMPT, decoding="sjd", temperature=0, window=8, output_type="latent").images
    assert torch.equal(ar, sjd)


def test_guidance_follows_each_family(family_pipe):
    """Lumina's and Emu3's unconditional rows hold the image opening alone; Janus's hold the prompt
    with every token but the opening padded out, at the prompt's length."""
    family, pipe = family_pipe
    ids, mask = pipe.encode_prompts([PROMPT], guided=True)
    opening = list(pipe.layout.opening)
    cond, uncond = ids[0][mask[0].bool()].tolist(), ids[1][mask[1].bool()].tolist()
    assert cond[-len(opening):] == opening and len(cond) > len(opening)
    if family == "janus":
        pad = pipe.tokenizer.pad_token_id
        assert uncond == [pad] * (len(cond) - len(opening)) + opening
    else:
        assert uncond == opening


def test_a_negative_prompt_is_the_unconditional_row(family_pipe):
    """With ``negative_prompt`` the unconditional rows are that text written as a prompt (Emu3's
    card guides so), for every family; one per prompt, or one string for all."""
    _, pipe = family_pipe
    negative = "a photo of a green square"
    ids, mask = pipe.encode_prompts([PROMPT, PROMPT], guided=True, negative_prompts=[negative, PROMPT])
    as_prompt, _ = pipe.encode_prompts([negative], guided=False)
    rows = [ids[i][mask[i].bool()].tolist() for i in range(4)]
    assert rows[2] == as_prompt[0].tolist() and rows[3] == rows[0]
    out = pipe([PROMPT, "a photo of a blue square"], negative_prompt=negative, seed=0, window=6, output_type="latent")
    assert out.images.shape[0] == 2
    with pytest.raises(ValueError, match="one per prompt"):
        pipe([PROMPT, PROMPT], negative_prompt=[negative])


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
    (dict(guidance_schedule="cosine"), "guidance_schedule"),
    (dict(negative_prompt=[3]), "negative_prompt"),
])
def test_bad_arguments_get_clear_errors(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(PROMPT, **kwargs)


def test_components_that_do_not_fit_the_family_get_clear_errors(pipe):
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(ValueError, match="model_type 'llama'.*not a unified-vocabulary image generator"):
        UnifiedARPipeline(transformer=llama, tokenizer=pipe.tokenizer, vq_model=pipe.vq_model)
    with pytest.raises(ValueError, match="needs an image tokenizer"):
        UnifiedARPipeline(transformer=pipe.transformer, tokenizer=pipe.tokenizer)
    emu3 = tiny_unified_pipeline(family="emu3")
    with pytest.raises(ValueError, match="emu3 model decodes with its own VQ"):
        UnifiedARPipeline(transformer=emu3.transformer, tokenizer=emu3.tokenizer, vq_model=pipe.vq_model)


def test_the_epsilon_cut_off_reads_the_conditional_model_among_image_codes(pipe):
    """A cut-off just below 1 leaves each position only the image code the conditional model finds
    likeliest: the seed no longer matters, and SJD gives AR's tokens. Without it, seeds differ."""
    def tokens(decoding, seed, epsilon):
        return pipe(PROMPT, decoding=decoding, seed=seed, epsilon_cutoff=epsilon, guidance_scale=3.0, window=4,
                    output_type="latent").images

    assert not torch.equal(tokens("ar", 0, 0.0), tokens("ar", 1, 0.0))
    cut = tokens("ar", 0, 0.999)
    assert torch.equal(cut, tokens("ar", 1, 0.999)) and torch.equal(cut, tokens("sjd", 2, 0.999))
    codes = pipe.layout.codes(cut)  # only image codes, the layout's tokens still forced
    assert codes.min() >= 0 and pipe.config.default_epsilon_cutoff == 0.0


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
    assert main(["generate", PROMPT, "--model", str(folder), "--epsilon-cutoff", "0.01", "-o", str(out)]) == 0
    assert main(["generate", PROMPT, "--model", str(folder), "--gsd-group-size", "2", "-o", str(out)]) == 2
    assert "--gsd-group-size is not an option of a unified-vocabulary model" in capsys.readouterr().err
    assert main(["generate", PROMPT, "--model", str(folder), "--negative-prompt", "a photo of a blue square",
                 "--guidance-schedule", "lumina2", "--guidance-scale", "7", "-o", str(out)]) == 0
    assert main(["generate", PROMPT, "--model", str(folder), "--guidance-schedule", "cosine", "-o", str(out)]) == 2
    assert "unknown guidance_schedule 'cosine'" in capsys.readouterr().err


def test_batch_sizes_decode_alike_and_the_batch_command_resumes(pipe, folders, tmp_path, capsys):
    """Images are the same whatever the batch size (one generator per image); the batch command
    writes GenEval's layout and a second run finds everything done."""
    prompts = [PROMPT, "a photo of a blue square", "a photo of two circles"]
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]  # noqa: E731
    whole = pipe(prompts, generator=gens(), window=4, output_type="latent")
    halves = pipe(prompts, generator=gens(), window=4, batch_size=2, output_type="latent")
    assert torch.equal(whole.images, halves.images) and halves.stats.batch_size == 3 and halves.stats.slots == 2
    with pytest.raises(ValueError, match="batch_size"):
        pipe(PROMPT, batch_size=0)
    from visualspec.tools.cli import main

    lines = tmp_path / "prompts.txt"
    lines.write_text("\n".join(prompts) + "\n")
    args = ["batch", "--model", str(folders["janus"]), "--prompts", str(lines), "--out", str(tmp_path / "out"),
            "--batch-size", "2", "--window", "4", "--no-progress"]
    assert main(args) == 0
    assert len(list((tmp_path / "out").glob("0000*/samples/0000.png"))) == 3
    capsys.readouterr()
    assert main(args) == 0 and '"generated": 0' in capsys.readouterr().out
    bad = tmp_path / "bad.txt"
    bad.write_text("a photo of a zebra\n")
    assert main(["batch", "--model", str(folders["chameleon"]), "--prompts", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert "line 1" in capsys.readouterr().err


def test_bench_compares_the_unified_modes_side_by_side(folder, tmp_path, capsys):
    from visualspec.tools.cli import main

    result = tmp_path / "bench.json"
    assert main(["bench", "--model", str(folder), "--images", "2", "--batch-sizes", "1", "2", "--modes",
                 "ar,sjd,sjd+coupling,lantern", "--window", "4", "--json", str(result)]) == 0
    import json

    runs = json.loads(result.read_text())
    assert [r["batch_size"] for r in runs] == [1, 2]
    assert set(runs[0]["results"]) == {"ar", "sjd", "sjd+coupling", "lantern"}
    assert runs[0]["results"]["sjd"]["forwards_ratio_to_ar"] < 1
    capsys.readouterr()
    assert main(["bench", "--model", str(folder), "--modes", "ar,gsd"]) == 2
    assert "unknown benchmark mode 'gsd': it is not built for a unified-vocabulary model" in capsys.readouterr().err


def test_a_unified_folder_sharded_and_resumed_writes_the_files_of_one_run(folder, tmp_path, capsys):
    """The batch promise covers unified folders: with window="auto" the first run records the
    measured window costs, and two shards, one of them interrupted and resumed, write the same
    bytes as one process."""
    import json
    import os

    from visualspec.tools.cli import main

    lines = tmp_path / "prompts.txt"
    lines.write_text(f"{PROMPT}\na photo of a blue square\na photo of two circles\n")
    common = ["batch", "--model", str(folder), "--prompts", str(lines), "--images-per-prompt", "2",
              "--batch-size", "2", "--chunk-size", "2", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    config = json.loads((tmp_path / "one" / "batch_config.json").read_text())
    assert config["window_costs"], "window='auto' must record its measured costs for a unified folder too"
    shards = str(tmp_path / "shards")
    for rank in ("0", "1"):
        assert main([*common, "--out", shards, "--rank", rank, "--world-size", "2"]) == 0
    os.remove(tmp_path / "shards" / "00001" / "samples" / "0001.png")  # an interrupted shard
    capsys.readouterr()
    assert main([*common, "--out", shards, "--rank", "0", "--world-size", "2"]) == 0
    assert main([*common, "--out", shards, "--rank", "1", "--world-size", "2"]) == 0
    assert '"generated": 1' in capsys.readouterr().out

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
                and not p.name.startswith("batch_stats")}

    assert files(tmp_path / "one") == files(tmp_path / "shards")


def test_the_compiled_step_gives_every_familys_eager_images(family_pipe, tmp_path, monkeypatch, capfd):
    """``compile=True`` on Chameleon (Lumina's layout), Emu3 and Janus: the static cache and the
    compiled window forward (a whole Jacobi step in one graph) make the eager images, sampled with
    one generator (and greedy on Chameleon: each sampling is a graph of its own), at batch 2 with
    continuous batching (refills on the static cache); then every bucket is known."""
    family, pipe = family_pipe
    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))
    prompts = [PROMPT, "a photo of a blue square", "a photo of two circles"]
    for kw in ((dict(temperature=0),) if family == "chameleon" else ()) + (dict(seed=0),):
        kw.update(decoding="sjd", window=3, batch_size=2, output_type="latent")
        ref = pipe(prompts, compile=False, **kw)
        out = pipe(prompts, compile=True, **kw)
        assert torch.equal(out.images, ref.images), family
        assert out.stats.mode == "sjd+compiled" and ref.stats.mode == "sjd"
    capfd.readouterr()
    assert torch.equal(pipe(prompts, compile=True, **kw).images, ref.images)
    assert "compiling" not in capfd.readouterr().err
