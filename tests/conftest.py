"""Tiny random models shared by the tests (all built offline from configs)."""

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from visualspec.models.llamagen import LlamaGenGPT

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers on two cores: one torch thread each
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent  # the repository
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))  # app.py and benchmarks/ are scripts at the top, not installed


def assert_guards_checked_once_a_decode(prefill, step, head: torch.nn.Module) -> None:
    """A compiled step's guard contract (``StepCompiler.recheck``): after ``prefill()``, the first
    ``step(position)`` checks torch's guards and the next two skip them; with ``head``'s weight
    swapped for a column-major copy (the same values: no bucket key names a layout), the first step
    after the next prefill fails with the error that names the bucket instead of running."""
    skipped, set_stance = [], torch.compiler.set_stance
    prefill()
    with mock.patch.object(torch.compiler, "set_stance",
                           side_effect=lambda *a, **kw: skipped.append(kw["skip_guard_eval_unsafe"]) or set_stance(*a, **kw)):
        for position in range(3):
            step(position)
    assert skipped == [False, True, True]
    weight = head.weight
    try:
        head.weight = torch.nn.Parameter(weight.t().contiguous().t())
        prefill()
        with pytest.raises(RuntimeError, match="wanted to recompile"):
            step(0)
    finally:
        head.weight = weight


def tiny_llamagen(seed=0, vocab_size=4, block_size=4, dim=32, n_layer=2, n_head=2, model_type="c2i",
                  std=0.5, dtype=torch.float64, **kw):
    """A random LlamaGen GPT whose output distributions are far from uniform."""
    torch.manual_seed(seed)
    model = LlamaGenGPT(vocab_size=vocab_size, dim=dim, n_layer=n_layer, n_head=n_head, multiple_of=16,
                        num_classes=3, block_size=block_size, model_type=model_type, **kw)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=std)
    return model.to(dtype).eval()


def tiny_hf(family="llama", seed=0, vocab_size=64, dtype=torch.float64):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=64, vocab_size=vocab_size,
                                             bos_token_id=0, eos_token_id=1, pad_token_id=0))
    else:
        model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=vocab_size,
                                           bos_token_id=0, eos_token_id=1, pad_token_id=0))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.to(dtype).eval()


@pytest.fixture(scope="session", autouse=True)
def visualspec_home(tmp_path_factory):
    """The suite's own VISUALSPEC_HOME: tests neither read what this machine measured or compiled
    (which would change what ``window="auto"`` or ``compile="auto"`` choose, test by test) nor
    write into the user's cache. A test that needs a fresh one sets its own."""
    import visualspec.core.window_costs as window_costs

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VISUALSPEC_HOME", str(tmp_path_factory.mktemp("visualspec-home")))
        # tests check what a table decides, not how steadily it was timed: two rounds (the first
        # warms), as many decodes as the tables took before AR joined their rounds
        mp.setattr(window_costs, "STEP_ROUNDS", 2)
        yield


@pytest.fixture(autouse=True)
def no_pooled_calls():
    """Each test starts with no calls pooled into a window table (the pool lives in the process,
    so one test's calls would otherwise move another's window)."""
    from visualspec.core.window import CallPool

    CallPool.clear()
    yield


@pytest.fixture
def make_tiny_llamagen():
    return tiny_llamagen


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch intra-op thread for a module's tests, restored after: tiny workloads avoid
    thread-spinning on a busy 2-core machine, and float rounding matches a one-thread process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------- text models

TEXT_WORDS = [f"w{i}" for i in range(61)]  # + 3 special tokens = 64, the tiny models' vocabulary
TEXT_PROMPTS = ["w5 w6 w7 w8 w5 w6", "w9 w10 w11", "w12 w13 w14 w15 w16 w17 w18"]


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer over TEXT_WORDS with the tiny transformers models' 64 tokens."""
    from visualspec.pipelines.tiny import word_tokenizer

    tok = word_tokenizer(TEXT_WORDS, model_max_length=64)
    assert len(tok) == 64
    return tok


def generate_reference(model, tokenizer, prompt, n):
    """transformers' own greedy ``generate``: the n new tokens after ``prompt`` (no EOS stop)."""
    enc = tokenizer([prompt], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=None)
    return out[0, enc.input_ids.shape[1]:].tolist()
