"""``visualspec train-drafter --kind kangaroo``: a Kangaroo adapter for a tiny two-layer target
trains a few steps with the target frozen, resumes after an interruption to the same weights,
saves only the adapter (with the target's hash) and decodes exactly (greedy equal to AR)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from visualspec.assets import TEXT_PAIR
from visualspec.models.feature_drafter import weights_hash
from visualspec.models.kangaroo import load_kangaroo
from visualspec.text import generate_text
from visualspec.training import kangaroo as training
from visualspec.training.kangaroo import KangarooConfig, train_kangaroo

CFG = KangarooConfig(batch=2, context=32, steps=3, warmup_steps=1, max_files=24, checkpoint_seconds=0.0)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The shipped pair's tokenizer and a tiny random two-layer Llama target of its vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("pair")
    shutil.copytree(TEXT_PAIR / "tokenizer", folder / "tokenizer")
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64, vocab_size=4096,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0))
    target.save_pretrained(folder / "target")
    return folder


def test_a_kangaroo_adapter_trains_frozen_resumes_and_decodes_exactly(tiny_pair, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    built = []
    build = training.kangaroo_lm
    monkeypatch.setattr(training, "kangaroo_lm", lambda adapter, target: built.append(target) or build(adapter, target))
    out = train_kangaroo(str(tiny_pair), str(tmp_path / "out"), str(tmp_path / "work"), CFG, progress=False)
    (target,) = built
    fresh = AutoModelForCausalLM.from_pretrained(tiny_pair / "target", dtype=torch.float32)
    assert not any(p.requires_grad for p in target.parameters())  # the shared layers stayed frozen
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), fresh.parameters()))

    # interrupted after two steps (each checkpointed), then run again: the same weights as one run
    calls = []
    losses = training.kangaroo_losses

    def interrupt(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return losses(*args)

    monkeypatch.setattr(training, "kangaroo_losses", interrupt)
    with pytest.raises(KeyboardInterrupt, match="step 2 of 3"):
        train_kangaroo(str(tiny_pair), str(tmp_path / "again"), str(tmp_path / "work2"), CFG, progress=False)
    monkeypatch.setattr(training, "kangaroo_losses", losses)
    again = train_kangaroo(str(tiny_pair), str(tmp_path / "again"), str(tmp_path / "work2"), CFG, progress=False)
    a, b = (load_file(str(f / "diffusion_pytorch_model.safetensors")) for f in (out, again))
    assert set(a) == {"layer.input_layernorm.weight", "norm.weight",
                      *(f"layer.self_attn.{x}_proj.weight" for x in "qkvo")}  # the adapter only
    assert all(v.dtype == torch.float16 for v in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)

    config = json.loads((out / "config.json").read_text())
    assert config["_class_name"] == "KangarooAdapter" and config["exit_layer"] == 1
    assert config["target_hash"] == weights_hash(fresh)
    assert json.loads((out / "training.json").read_text())["command"] == "visualspec train-drafter --kind kangaroo"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_pair / "tokenizer")
    assert load_kangaroo(out, fresh).model.layers[0] is fresh.model.layers[0]
    plain = generate_text(fresh, tokenizer, "def f(x):", max_new_tokens=8, temperature=0)
    spec = generate_text(fresh, tokenizer, "def f(x):", drafter=str(out), window=4, max_new_tokens=8, temperature=0)
    assert plain.token_ids == spec.token_ids and spec.stats.mode == "kangaroo"
