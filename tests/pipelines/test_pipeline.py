"""The public pipeline API: loading, decoding modes, outputs, seeds and clear errors."""

import json

import numpy as np
import pytest
import torch

from visualspec import VisualSpecPipeline
from visualspec.core.compiled import compile_pays
from visualspec.models.llamagen import LlamaGenGPT
from visualspec.models.llamagen_vq import LlamaGenVQModel
from visualspec.pipelines import LlamaGenPipeline
from visualspec.pipelines.tiny import tiny_random_pipeline

PROMPT = "a photo of a red circle"


@pytest.fixture(scope="module")
def t2i_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("t2i")
    tiny_random_pipeline(seed=0).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def pipe(t2i_dir):
    p = VisualSpecPipeline.from_pretrained(t2i_dir)
    p.set_progress_bar_config(disable=True)
    return p


def tiny_c2i_pipeline(seed=0):
    torch.manual_seed(seed)
    gpt = LlamaGenGPT(vocab_size=64, dim=32, n_layer=2, n_head=2, multiple_of=16, num_classes=5, block_size=16)
    torch.nn.init.normal_(gpt.output.weight, std=0.5)
    vq = LlamaGenVQModel(codebook_size=64, codebook_embed_dim=4, ch=16, ch_mult=(1, 2), z_channels=8,
                         num_res_blocks=1, norm_groups=4)
    pipe = LlamaGenPipeline(transformer=gpt.eval(), vq_model=vq.eval())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_from_pretrained_returns_the_saved_pipeline_class(t2i_dir, pipe):
    assert type(pipe) is LlamaGenPipeline
    assert (t2i_dir / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
    assert json.loads((t2i_dir / "model_index.json").read_text())["_class_name"] == "LlamaGenPipeline"


@pytest.mark.parametrize("decoding", ["ar", "sjd", "lantern"])
def test_every_mode_generates_images_and_stats(pipe, decoding):
    out = pipe(PROMPT, decoding=decoding, seed=0, num_images_per_prompt=2, lantern_k=8)
    assert len(out.images) == 2 and out.images[0].size == (64, 64)
    assert out.stats.num_tokens == 256 and out.stats.batch_size == 2
    if decoding == "ar":
        assert out.stats.target_forwards == 256
    else:
        assert out.stats.target_forwards < 256


def test_same_seed_same_images_and_generators_work(pipe):
    a = pipe(PROMPT, seed=3, output_type="np").images
    b = pipe(PROMPT, generator=torch.Generator().manual_seed(3), output_type="np").images
    c = pipe(PROMPT, seed=4, output_type="np").images
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    per_image = [torch.Generator().manual_seed(s) for s in (1, 2)]
    out = pipe([PROMPT, "a photo of a blue square"], generator=per_image, output_type="latent")
    assert out.images.shape == (2, 256)


def test_output_types(pipe):
    assert pipe(PROMPT, seed=0, output_type="np").images.shape == (1, 64, 64, 3)
    pt = pipe(PROMPT, seed=0, output_type="pt").images
    assert pt.shape == (1, 3, 64, 64) and 0 <= pt.min() and pt.max() <= 1
    ids = pipe(PROMPT, seed=0, output_type="latent").images
    assert ids.dtype == torch.long and ids.shape == (1, 256)
    images, stats = pipe(PROMPT, seed=0, return_dict=False)
    assert len(images) == 1 and stats.num_tokens == 256


def test_greedy_modes_give_the_ar_image(pipe):
    ar = pipe(PROMPT, decoding="ar", temperature=0, output_type="latent").images
    sjd = pipe(PROMPT, decoding="sjd", temperature=0, output_type="latent", jacobi_init="repeat_above").images
    assert torch.equal(ar, sjd)


def test_proactive_drafting_runs_through_the_pipeline(pipe):
    out = pipe([PROMPT, "a photo of a blue square"], decoding="sjd", siblings=3, sibling_depth=2, window=8, seed=0,
               output_type="latent")
    assert out.stats.mode == "sjd+pd" and out.stats.sibling_steps > 0
    assert out.stats.to_dict()["sibling_steps"] == out.stats.sibling_steps
    assert "sibling_steps" not in pipe(PROMPT, decoding="sjd", seed=0, output_type="latent").stats.to_dict()
    assert pipe.bench_mode("sjd+coupling+pd") == dict(decoding="sjd", coupling=True, siblings=3, sibling_depth=2,
                                                      compile=False)
    assert pipe.bench_mode("sjd+coupling+pd+compiled") == dict(decoding="sjd", coupling=True, siblings=3,
                                                               sibling_depth=2, compile=True)
    with pytest.raises(ValueError, match="unknown benchmark mode"):
        pipe.bench_mode("sjd+pd+pd")


def test_class_conditional_pipeline_with_a_draft_model(tmp_path):
    pipe = tiny_c2i_pipeline()
    pipe.save_pretrained(tmp_path)
    draft = tiny_c2i_pipeline(seed=1).transformer
    loaded = VisualSpecPipeline.from_pretrained(tmp_path, draft_model=draft)
    loaded.set_progress_bar_config(disable=True)
    out = loaded([1, 3], decoding="speculative", window=4, seed=0)
    assert len(out.images) == 2 and out.stats.draft_forwards > 0
    greedy_ar = loaded(class_labels=[1, 3], decoding="ar", temperature=0, output_type="latent").images
    greedy_spec = loaded([1, 3], decoding="speculative", temperature=0, output_type="latent").images
    assert torch.equal(greedy_ar, greedy_spec)


def test_a_pipeline_with_a_feature_drafter_saves_loads_and_decodes_exactly(tmp_path):
    from visualspec.models.feature_drafter import FeatureDraftModel, weights_hash

    pipe = tiny_c2i_pipeline()
    gpt = pipe.transformer
    torch.manual_seed(0)
    net = FeatureDraftModel(feature_size=gpt.config.dim, n_head=2, ffn_hidden=32, max_len=gpt.config.block_size + 8,
                            target_hash=weights_hash(gpt)).to(gpt.dtype)
    pipe.register_modules(feature_drafter=net)
    pipe.save_pretrained(tmp_path)
    loaded = VisualSpecPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert isinstance(loaded.feature_drafter, FeatureDraftModel) and "feature" in loaded.available_decodings()
    greedy_ar = loaded(class_labels=[1, 3], decoding="ar", temperature=0, output_type="latent").images
    out = loaded([1, 3], decoding="feature", window=3, temperature=0, output_type="latent")
    assert torch.equal(greedy_ar, out.images) and out.stats.draft_forwards > 0
    assert len(loaded([1, 3], decoding="feature", window=3, seed=0).images) == 2
    # the window policy prices the drafter's steps; Jacobi's rules take its drafts too (LANTERN over learned drafts)
    auto = loaded([1, 3], decoding="sjd", drafts="feature", temperature=0, output_type="latent")
    assert torch.equal(greedy_ar, auto.images) and auto.stats.mode in ("sjd+feature", "sjd+feature as AR")
    relaxed = loaded([1, 3], decoding="lantern", drafts="feature", window=3, seed=0, output_type="latent")
    assert relaxed.stats.mode == "lantern+feature" and relaxed.stats.draft_forwards > 0
    # the hybrid: its first drafts, Jacobi's past them (greedy exact; coupling and a relaxed rule take them too)
    hybrid = loaded([1, 3], decoding="sjd", drafts="hybrid", feature_depth=2, window=5, temperature=0,
                    output_type="latent")
    assert torch.equal(greedy_ar, hybrid.images) and hybrid.stats.mode == "sjd+hybrid"
    assert hybrid.stats.draft_forwards > 0
    coupled = loaded([1, 3], decoding="lantern", drafts="hybrid", coupling=True, window=4, seed=0, output_type="latent")
    assert coupled.stats.mode == "lantern+hybrid+coupling" and coupled.images.shape == greedy_ar.shape
    with pytest.raises(ValueError, match="feature_depth must be an integer >= 1"):
        loaded([1], decoding="sjd", drafts="hybrid", feature_depth=0)
    other = tiny_c2i_pipeline(seed=1)
    other.register_modules(feature_drafter=net)
    with pytest.raises(ValueError, match="trained against a target whose weights hash"):
        other([1], decoding="feature")


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="medusa"), "unknown decoding mode"),
    (dict(decoding="feature"), "needs a feature_drafter"),
    (dict(decoding="lantern", drafts="feature"), "with feature drafts needs a feature_drafter"),
    (dict(decoding="sjd", drafts="hybrid"), "with hybrid drafts needs a feature_drafter"),
    (dict(feature_depth=2), "feature_depth is for drafts='hybrid', not 'jacobi'"),
    (dict(decoding="sjd", drafts="eagle"), "unknown drafts 'eagle'"),
    (dict(decoding="ar", drafts="jacobi"), "decoding='ar' makes no drafts"),
    (dict(window=0), "window"),
    (dict(guidance_scale=-1.0), "guidance_scale"),
    (dict(top_k=-5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.2), "top_p"),
    (dict(epsilon_cutoff=1.0), "epsilon_cutoff"),
    (dict(output_type="gif"), "output_type"),
    (dict(decoding="speculative"), "draft_model"),
    (dict(decoding="lantern", lantern_delta=2.0), "lantern_delta"),
    (dict(num_images_per_prompt=0), "num_images_per_prompt"),
    (dict(siblings=0), "siblings must be an integer >= 1"),
    (dict(compile="yes"), "compile must be True, False or 'auto'"),
    (dict(decoding="lantern", siblings=2), "siblings .proactive drafting. are verified exactly"),
])
def test_bad_arguments_get_clear_errors(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(PROMPT, **kwargs)


def test_bad_conditions_get_clear_errors(pipe):
    with pytest.raises(ValueError, match="text-conditional"):
        pipe(3)
    with pytest.raises(ValueError, match="does not know.*'zebra'"):
        pipe("a photo of a zebra")
    c2i = tiny_c2i_pipeline()
    with pytest.raises(ValueError, match="class-conditional"):
        c2i("a photo of a cat")
    with pytest.raises(ValueError, match=r"class labels must be integers in \[0, 5\)"):
        c2i([7])


def test_folders_that_are_not_pipelines_get_clear_errors(tmp_path, t2i_dir):
    with pytest.raises(ValueError, match="no model_index.json"):
        VisualSpecPipeline.from_pretrained(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not a visualspec pipeline folder"):
        VisualSpecPipeline.from_pretrained(tmp_path / "file.txt")
    (tmp_path / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    with pytest.raises(ValueError, match="does not know"):
        VisualSpecPipeline.from_pretrained(tmp_path)


def test_weights_that_do_not_fit_the_config_get_a_clear_error(tmp_path):
    tiny_random_pipeline(seed=0).save_pretrained(tmp_path)
    config_file = tmp_path / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config["dim"] = 96
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="could not load the pipeline.*") as info:
        VisualSpecPipeline.from_pretrained(tmp_path)
    assert "size" in str(info.value) or "shape" in str(info.value)


def test_the_model_supplies_top_k_and_lantern_defaults(tmp_path):
    from visualspec.pipelines.tiny import tiny_random_pipeline

    pipe = tiny_random_pipeline()
    pipe.set_progress_bar_config(disable=True)
    pipe.register_to_config(default_lantern_delta=0.9)
    # a fixed window: "auto" chooses from timings, and under load two runs could choose differently
    run = lambda **kw: pipe("a photo of a red circle", decoding="lantern", seed=0, output_type="latent",  # noqa: E731
                            window=4, **kw)
    by_default, explicit, tight = run(), run(lantern_delta=0.9), run(lantern_delta=0.0)
    assert torch.equal(by_default.images, explicit.images)  # the folder's delta applied
    assert by_default.stats.target_forwards < tight.stats.target_forwards  # and it matters
    pipe.register_to_config(default_top_k=1, default_lantern_k=7)
    sampled = pipe("a photo of a red circle", decoding="ar", seed=3, output_type="latent").images
    greedy = pipe("a photo of a red circle", decoding="ar", temperature=0, seed=3, output_type="latent").images
    assert torch.equal(sampled, greedy)  # top-1 sampling is greedy: the default applied
    pipe._neighbour_tables.clear()
    pipe("a photo of a red circle", decoding="lantern", seed=0, output_type="latent")
    assert [k for k, _ in pipe._neighbour_tables] == [7]
    free = pipe("a photo of a red circle", decoding="ar", top_k=0, seed=3, output_type="latent").images
    assert not torch.equal(free, greedy)  # an explicit top_k overrides the default
    pipe.save_pretrained(tmp_path / "p")
    loaded = type(pipe).from_pretrained(tmp_path / "p")
    assert loaded.config.default_top_k == 1 and loaded.config.default_lantern_k == 7
    assert loaded.config.default_lantern_delta == 0.9


def test_the_epsilon_cutoff_reads_the_conditional_and_defaults_to_the_folders(tmp_path):
    from visualspec.pipelines.tiny import tiny_random_pipeline

    pipe = tiny_random_pipeline()
    pipe.set_progress_bar_config(disable=True)
    assert pipe.config.default_epsilon_cutoff == 0.0  # off for folders that name none
    prompt = "a photo of a red circle"
    # a cut-off of 0.99 keeps only the conditional's most likely token, whatever guidance says:
    # every mode then gives the greedy unguided image
    unguided = pipe(prompt, decoding="ar", guidance_scale=1.0, temperature=0, output_type="latent").images
    guided = pipe(prompt, decoding="ar", guidance_scale=4.0, temperature=0, output_type="latent").images
    assert not torch.equal(unguided, guided)
    for decoding in ("ar", "sjd", "lantern"):
        cut = pipe(prompt, decoding=decoding, guidance_scale=4.0, epsilon_cutoff=0.99, seed=0, output_type="latent")
        assert torch.equal(cut.images, unguided), decoding
    pipe.register_to_config(default_epsilon_cutoff=0.99)
    assert torch.equal(pipe(prompt, decoding="sjd", seed=1, output_type="latent").images, unguided)
    free = pipe(prompt, decoding="sjd", epsilon_cutoff=0.0, seed=1, output_type="latent").images
    assert not torch.equal(free, unguided)  # an explicit value overrides the folder's
    pipe.save_pretrained(tmp_path / "p")
    assert type(pipe).from_pretrained(tmp_path / "p").config.default_epsilon_cutoff == 0.99


def test_the_model_supplies_the_jacobi_init(tmp_path):
    from visualspec.pipelines.tiny import tiny_random_pipeline

    pipe = tiny_random_pipeline()
    pipe.set_progress_bar_config(disable=True)
    assert pipe.config.default_jacobi_init == "random"  # SJD's own, for folders that name none
    run = lambda **kw: pipe("a photo of a red circle", decoding="sjd", seed=0, output_type="latent", **kw)  # noqa: E731
    random_init, above = run(jacobi_init="random"), run(jacobi_init="repeat_above")
    assert not torch.equal(random_init.images, above.images)  # the init changes which drafts are made
    pipe.register_to_config(default_jacobi_init="repeat_above")
    assert torch.equal(run().images, above.images)
    assert torch.equal(run(jacobi_init="random").images, random_init.images)  # an explicit init overrides
    pipe.save_pretrained(tmp_path / "p")
    assert type(pipe).from_pretrained(tmp_path / "p").config.default_jacobi_init == "repeat_above"
    pipe.register_to_config(default_jacobi_init="sideways")
    with pytest.raises(ValueError, match="sideways"):
        run()


def test_prefix_rope_identity_keeps_the_caption_unrotated():
    from visualspec.models.llamagen import LlamaGenGPT, rope_2d

    zeros, identity = rope_2d(4, 16, 10000.0, 3), rope_2d(4, 16, 10000.0, 3, prefix="identity")
    assert torch.all(zeros[:3] == 0) and torch.all(identity[:3, :, 0] == 1) and torch.all(identity[:3, :, 1] == 0)
    assert torch.equal(zeros[3:], identity[3:])
    with pytest.raises(ValueError, match="prefix_rope"):
        LlamaGenGPT(vocab_size=16, dim=32, n_layer=1, n_head=2, block_size=16, prefix_rope="ones")
    gpt = LlamaGenGPT(vocab_size=16, dim=32, n_layer=1, n_head=2, block_size=16, model_type="t2i", caption_dim=8,
                      cls_token_num=3, prefix_rope="identity")
    assert torch.equal(gpt.rope, rope_2d(4, 16, 10000.0, 3, prefix="identity"))


def test_caption_positions_tell_the_order_of_the_caption_apart():
    """Without positions the prefix of a caption whose slots are permuted is the same tokens,
    permuted; with them it is a different set (and official layouts gain no key)."""
    kw = dict(vocab_size=16, dim=32, n_layer=1, n_head=2, block_size=16, model_type="t2i", caption_dim=8,
              cls_token_num=3, prefix_rope="identity")
    plain, placed = LlamaGenGPT(**kw), LlamaGenGPT(**kw, caption_positions=True)
    assert "cls_embedding.position_embedding" not in plain.state_dict()
    assert placed.state_dict()["cls_embedding.position_embedding"].shape == (3, 8)
    torch.manual_seed(0)
    placed.load_state_dict({**plain.state_dict(), "cls_embedding.position_embedding": torch.randn(3, 8)})
    caption, order = torch.randn(1, 3, 8), torch.tensor([2, 0, 1])
    with torch.no_grad():
        a, b = plain.embed_condition(caption), plain.embed_condition(caption[:, order])
        assert torch.allclose(a[:, order], b, atol=1e-6)  # the same set: order is lost here
        a, b = placed.embed_condition(caption), placed.embed_condition(caption[:, order])
        # no token of one is a token of the other
        assert torch.cdist(a[0], b[0]).min(1).values.min() > 0.1 * a.norm(dim=-1).mean()
        null = placed.null_condition(1)  # the learned null caption gets the slot positions too
        assert not torch.allclose(placed.embed_condition(null), plain.embed_condition(null))


@pytest.mark.parametrize("masked", [False, True])
def test_written_out_training_attention_matches_the_fused_kernel(masked):
    """On a CPU, training attention is written out (``attend``); its values and gradients equal
    PyTorch's fused kernel's, with a padding mask (a query always sees itself) and without one."""
    from visualspec.models.llamagen import LlamaGenGPT, attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, requires_grad=True) for _ in range(3))
    mask = None
    if masked:
        valid = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7]).bool()
        mask = LlamaGenGPT._attention_mask(torch.arange(7), valid)
    written = attend(q, k, v, mask)
    grads = torch.autograd.grad(written.square().sum(), (q, k, v))
    with torch.no_grad():  # no gradient: the fused kernel
        assert torch.allclose(attend(q, k, v, mask), written, atol=1e-5)
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    assert torch.allclose(fused, written, atol=1e-5)
    for a, b in zip(torch.autograd.grad(fused.square().sum(), (q, k, v)), grads):
        assert torch.allclose(a, b, atol=1e-4)
    if masked:  # the control: a wrong mask changes the result
        assert not torch.allclose(attend(q, k, v, torch.ones_like(mask)), written, atol=1e-3)


def test_the_compiled_step_gives_the_eager_greedy_images(pipe, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))
    kw = dict(decoding="sjd", window=4, temperature=0, output_type="latent")
    ref = pipe(PROMPT, compile=False, **kw)
    out = pipe(PROMPT, compile=True, **kw)
    assert torch.equal(out.images, ref.images)
    assert out.stats.mode == "sjd+compiled" and ref.stats.mode == "sjd"
    assert "compiling the LlamaGenGPT decode step" in capsys.readouterr().err
    again = pipe(PROMPT, compile=True, **kw)  # every bucket compiled: nothing more to do or say
    assert torch.equal(again.images, ref.images) and capsys.readouterr().err == ""
    # compile=True measured the one-token step both ways, for "auto" to weigh later: it follows them
    stored = json.loads((tmp_path / "window_costs.json").read_text())
    assert len(stored) == 3
    eager, fast, compile_s = (next(t for k, t in stored.items() if k.endswith(end))
                              for end in ("new=256", "|compiled", "|compile-s"))
    pays = compile_pays(eager["1"], fast["1"], sum(compile_s.values()), 256)
    assert pipe(PROMPT, **kw).stats.mode == ("sjd+compiled" if pays else "sjd")


@pytest.mark.parametrize("images, stored, compiles", [
    (4, True, True),    # 4 x 256 steps x 1 ms saved = 1.02 s > 1 s of compiling
    (3, True, False),   # 0.77 s < 1 s
    (100, False, False),  # nothing measured on this machine: stay eager
])
def test_auto_compiles_only_where_stored_measurements_say_it_pays(monkeypatch, images, stored, compiles):
    from visualspec.core import compiled
    from visualspec.core.compiled import compiled_step

    class Model:
        compiled_step = False

        def compile_step(self, enabled):
            self.compiled_step = enabled

    tables = {(False, None): {1: 2e-3}, (True, None): {1: 1e-3}, (True, "compile-s"): {1: 0.5, 4: 0.5}}
    monkeypatch.setattr(compiled, "stored_window_costs",
                        lambda model, rows, n, compiled=None, tag=None: tables[compiled, tag] if stored else {})
    model = Model()
    assert compiled_step(model, "auto", lambda images: torch.zeros(images), 256, images, 1) is compiles
    assert model.compiled_step is compiles


def test_compile_true_on_a_model_without_a_compiled_step_is_refused():
    from visualspec.core.compiled import compiled_step

    with pytest.raises(ValueError, match="compile=True: object has no compiled step yet; use compile=False"):
        compiled_step(object(), True, lambda images: torch.zeros(images), 16, 1, 1)
    assert compiled_step(object(), "auto", lambda images: torch.zeros(images), 16, 1, 1) is False
