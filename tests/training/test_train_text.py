"""The text-pair training command: a tiny run on a few standard-library files writes a tokenizer,
a target and a draft that transformers loads and visualspec decodes with; it resumes exactly."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from visualspec import generate_text
from visualspec.training.text import TextPairConfig, stdlib_files, train_text_pair

TINY = dict(vocab_size=300, context=32, target_dim=64, target_layers=1, draft_dim=32, draft_layers=1,
            target_steps=3, draft_steps=2, batch=2, max_files=24, held_out_every=4, warmup_steps=1, checkpoint_seconds=0.0)


def test_stdlib_corpus_splits_deterministically():
    train, held = stdlib_files()
    assert len(train) > 200 and held and not set(train) & set(held)
    assert (train, held) == stdlib_files()


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text-pair")
    return tmp, train_text_pair(str(tmp / "pair"), str(tmp / "work"), TextPairConfig(**TINY), progress=False)


def test_tiny_pair_trains_loads_decodes_and_resumes(tiny_pair):
    tmp_path, out = tiny_pair
    cfg = TextPairConfig(**TINY)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32)
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == 300
    plain = generate_text(target, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(target, tokenizer, "def f(x):", drafter=draft, max_new_tokens=8, temperature=0)
    assert plain.token_ids == spec.token_ids
    assert json.loads((out / "training.json").read_text())["training_tokens"] > 1000

    again = train_text_pair(str(tmp_path / "pair2"), str(tmp_path / "work"), cfg, progress=False)  # all resumed
    a = AutoModelForCausalLM.from_pretrained(again / "target").state_dict()
    b = AutoModelForCausalLM.from_pretrained(out / "target").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def tiny_drafter(tiny_pair):
    """A feature drafter trained 3 steps for the tiny pair's target, written into the pair folder."""
    from visualspec.training.feature_drafter import FeatureDrafterConfig, train_text_feature_drafter

    tmp, out = tiny_pair
    cfg = FeatureDrafterConfig(context=32, batch=2, steps=3, warmup_steps=1, n_head=2, max_files=24,
                               checkpoint_seconds=0.0)
    return train_text_feature_drafter(str(out), str(out / "feature-drafter"), str(tmp / "work-drafter"), cfg,
                                      progress=False), cfg


def test_a_feature_drafter_trains_for_the_target_loads_and_decodes_exactly(tiny_pair, tiny_drafter):
    from visualspec.models.feature_drafter import FeatureDraftModel, weights_hash

    folder, cfg = tiny_drafter
    _, out = tiny_pair
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    net = FeatureDraftModel.from_pretrained(folder, torch_dtype=torch.float32)
    assert net.config.target_hash == weights_hash(target) and net.config.feature_size == 64
    plain = generate_text(target, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(target, tokenizer, "def f(x):", drafter=net, window=4, max_new_tokens=8, temperature=0)
    assert plain.token_ids == spec.token_ids and spec.stats.mode == "feature drafter"
    assert json.loads((folder / "training.json").read_text())["command"] == "visualspec train-drafter"


def test_a_fusing_feature_drafter_trains_its_fusion_loads_and_decodes_exactly(tiny_pair, tmp_path):
    """EAGLE-3's fusion (``feature_layers``): the tiny one-layer target's embeddings and normed
    output, fused by a ``reduce`` layer the training moves; the folder loads as such and decodes
    the target's own tokens."""
    from visualspec.models.feature_drafter import FeatureDraftModel
    from visualspec.training.feature_drafter import FeatureDrafterConfig, text_losses, train_text_feature_drafter

    _, out = tiny_pair
    cfg = FeatureDrafterConfig(context=32, batch=2, steps=3, warmup_steps=1, n_head=2, max_files=24,
                               checkpoint_seconds=0.0, feature_layers=[0, 1])
    folder = train_text_feature_drafter(str(out), str(tmp_path / "fused"), str(tmp_path / "work"), cfg, progress=False)
    net = FeatureDraftModel.from_pretrained(folder, torch_dtype=torch.float32)
    assert net.config.feature_layers == [0, 1] and net.reduce.weight.shape == (64, 128)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    text_losses(net, target, torch.randint(0, 300, (2, 9)), unroll=1, kl_weight=1.0)["loss"].backward()
    assert net.reduce.weight.grad.abs().sum() > 0  # the loss trains the fusion
    plain = generate_text(target, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(target, tokenizer, "def f(x):", drafter=net, window=4, max_new_tokens=8, temperature=0)
    assert plain.token_ids == spec.token_ids
    with pytest.raises(ValueError, match="reads hidden state 2, but the target has 2"):
        train_text_feature_drafter(str(out), str(tmp_path / "bad"), str(tmp_path / "work-bad"),
                                   FeatureDrafterConfig(**{**vars(cfg), "feature_layers": [0, 2]}), progress=False)


def test_a_step_wise_unroll_trains_and_is_recorded(tiny_pair, tmp_path):
    """``--unroll 2 --step-wise`` (EAGLE-3's training-time test) runs through the recipe, is recorded
    in the folder's training record, and the drafter decodes the target's own tokens."""
    from visualspec.training.feature_drafter import FeatureDrafterConfig, train_text_feature_drafter

    _, out = tiny_pair
    cfg = FeatureDrafterConfig(context=32, batch=2, steps=2, warmup_steps=1, n_head=2, max_files=24,
                               checkpoint_seconds=0.0, unroll=2, step_wise=True)
    folder = train_text_feature_drafter(str(out), str(tmp_path / "stepped"), str(tmp_path / "work"), cfg,
                                        progress=False)
    recipe = json.loads((folder / "training.json").read_text())["config"]
    assert recipe["unroll"] == 2 and recipe["step_wise"] is True
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    plain = generate_text(target, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(target, tokenizer, "def f(x):", drafter=str(folder), window=4, max_new_tokens=8,
                         temperature=0)
    assert plain.token_ids == spec.token_ids


@pytest.fixture(scope="module")
def tiny_distilled(tiny_pair):
    """The tiny pair's draft distilled 3 steps toward its target (DistillSpec), into the pair folder."""
    from visualspec.training.distill import DistillConfig, train_distilled_draft

    tmp, out = tiny_pair
    cfg = DistillConfig(batch=2, steps=3, warmup_steps=1, prompt_tokens=8, new_tokens=8, on_policy=0.5, max_files=24,
                        checkpoint_seconds=0.0)
    return train_distilled_draft(str(out), str(out / "draft-distilled"), str(tmp / "work-distill"), cfg,
                                 progress=False), cfg


def test_a_distilled_draft_moves_toward_its_target_and_decodes_exactly(tiny_pair, tiny_distilled):
    folder, cfg = tiny_distilled
    tmp, out = tiny_pair
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    before = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32)
    after = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
    plain = generate_text(target, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(target, tokenizer, "def f(x):", drafter=after, window=4, max_new_tokens=8, temperature=0)
    assert plain.token_ids == spec.token_ids
    record = json.loads((folder / "training.json").read_text())
    assert record["command"] == "visualspec train-drafter --kind distill" and record["config"]["divergence"] == "tvd"


def test_text_benchmark_runs_every_method_on_a_tiny_pair(tiny_pair, tiny_drafter, tiny_distilled):
    from visualspec.tools.bench_text import multidraft_gap, run_text_benchmark

    _, out = tiny_pair
    result = run_text_benchmark(out, prompts=2, new_tokens=12, window=4, prompt_tokens=16)
    rows = result["results"]
    assert rows["generate"]["tau"] == 1.0 and rows["visualspec AR"]["tau"] == 1.0
    for name, row in rows.items():  # every greedy method reproduces generate's output exactly
        assert row["greedy_output_equal"] == "2/2", (name, row)
    assert rows["visualspec draft model"]["target_forwards"] < rows["generate"]["target_forwards"]
    assert {"visualspec feature drafter", "visualspec feature drafter, compiled",
            "visualspec distilled draft model"} <= set(rows)
    gap = multidraft_gap(out, positions=2, k=2, top=3, prompt_tokens=16)["mean_acceptance"]
    for rule in ("rsd (without replacement)", "spectr (iid)", "recursive_iid (iid)"):
        optimum = gap["optimal, without replacement" if "without" in rule else "optimal, iid"]
        assert 0 <= gap[rule] <= optimum + 1e-6


def test_a_chimera_drafter_trains_for_the_target_loads_and_decodes_exactly(tiny_pair):
    """``train-drafter --kind chimera`` on the tiny pair: three steps, saved with the target's hash,
    loaded by its class, greedy output equal to plain decoding, and its heads trained away from
    their zero start."""
    from visualspec.models.chimera import ChimeraDraftModel
    from visualspec.models.feature_drafter import load_draft_model, weights_hash
    from visualspec.training.feature_drafter import ChimeraConfig, train_text_chimera

    tmp, out = tiny_pair
    cfg = ChimeraConfig(context=32, batch=2, steps=3, warmup_steps=1, n_head=2, max_files=24, heads=3,
                        checkpoint_seconds=0.0)
    folder = train_text_chimera(str(out), str(tmp / "chimera"), str(tmp / "work-chimera"), cfg, progress=False)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    net = load_draft_model(folder, torch_dtype=torch.float32)
    assert isinstance(net, ChimeraDraftModel) and net.config.heads == 3
    assert net.config.target_hash == weights_hash(target)
    assert all(float(head.weight.abs().max()) > 0 for head in net.residual_heads)
    plain = generate_text(target, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(target, tokenizer, "def f(x):", drafter=str(folder), window=4, max_new_tokens=8,
                         temperature=0)
    assert plain.token_ids == spec.token_ids and spec.stats.mode == "chimera"
    assert json.loads((folder / "training.json").read_text())["command"] == "visualspec train-drafter --kind chimera"


def test_train_drafter_names_a_misplaced_fusion_or_unroll(tmp_path, capsys):
    from visualspec.tools.cli import main

    out = str(tmp_path / "x")
    assert main(["train-drafter", "--kind", "kangaroo", "--feature-layers", "0", "1", "--out", out]) == 2
    assert "--feature-layers is the feature drafter's (--kind eagle)" in capsys.readouterr().err
    assert main(["train-drafter", "--unroll", "-1", "--out", out]) == 2
    assert "--unroll is the feature drafter's (--kind eagle), 0 or more; got -1" in capsys.readouterr().err
    assert main(["train-drafter", "--step-wise", "--out", out]) == 2
    assert "--step-wise is the feature drafter's (--kind eagle) and shapes its --unroll passes" in capsys.readouterr().err
    assert main(["train-drafter", "--pass-decay", "0", "--out", out]) == 2
    assert "--pass-decay is the feature drafter's (--kind eagle), above 0; got 0.0" in capsys.readouterr().err
    assert main(["train-drafter", "--kind", "chimera", "--no-feature-loss", "--out", out]) == 2
    assert "--no-feature-loss is the feature drafter's (--kind eagle)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
