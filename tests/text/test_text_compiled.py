"""The static cache and compiled step of transformers models (#48): the rules that shape it, the
same tokens as the eager step, every window bucket compiled before a decode and never in it."""

import pytest
import torch

from conftest import TEXT_PROMPTS, assert_guards_checked_once_a_decode, tiny_hf
from visualspec.models.hf import HFCausalLM, static_length, visible, window_bucket
from visualspec.text import generate_text


def test_window_buckets_are_powers_of_two_and_static_lengths_round_up():
    assert [window_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 31, 32)] == [1, 2, 4, 4, 8, 8, 16, 32, 32]
    assert (static_length(1), static_length(128), static_length(129), static_length(300, 100)) == (128, 128, 256, 300)
    with pytest.raises(ValueError, match="at least one token"):
        window_bucket(0)


def test_a_window_sees_the_valid_columns_before_it_and_itself_causally():
    valid = torch.tensor([[True, False, True, True, True, False]])  # column 1 invalid; window at 2..4
    seen = visible(valid, torch.tensor(2), 3)[0, 0]
    assert seen.tolist() == [[True, False, True, False, False, False],
                             [True, False, True, True, False, False],
                             [True, False, True, True, True, False]]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_static_step_gives_the_dynamic_steps_logits_at_every_window_length(family):
    model = tiny_hf(family)
    ids = torch.randint(2, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    dynamic, static = HFCausalLM(model), HFCausalLM(model, static=True)
    tokens = torch.randint(2, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    for lm in (dynamic, static):
        lm.prefill(ids, 16)
    start = 0
    for length in (1, 3, 5):
        torch.testing.assert_close(static.forward_window(tokens[:, start:start + length], start),
                                   dynamic.forward_window(tokens[:, start:start + length], start), rtol=1e-9, atol=1e-9)
        start += length
        static.crop(start - 1)  # drop the last token of each window: it is fed again
        dynamic.crop(start - 1)
        start -= 1


def test_the_static_cache_grows_when_a_window_does_not_fit():
    model = tiny_hf("llama")
    lm, ref = HFCausalLM(model, static=True), HFCausalLM(model)
    ids = torch.randint(2, 64, (1, 4), generator=torch.Generator().manual_seed(0))
    lm.prefill(ids, 2)  # room for 4 + 2 tokens and the slack: a 128-column bucket
    ref.prefill(ids, 2)
    tokens = torch.randint(2, 64, (1, 200), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(lm.forward_window(tokens, 0), ref.forward_window(tokens, 0), rtol=1e-9, atol=1e-9)
    assert lm.cache.layers[0].keys.shape[2] == 384 == static_length(4 + 200 + 64)


def test_a_second_static_prefill_empties_and_reuses_the_cache():
    """The buffers' addresses stay from one prefill to the next of the same shape (a CUDA graph of
    the step has them baked in); the logits are a fresh cache's; another shape gets a new cache."""
    model = tiny_hf("llama")
    lm, fresh = HFCausalLM(model, static=True), HFCausalLM(model, static=True)
    ids = torch.randint(2, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(2, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    lm.prefill(ids, 16)
    lm.forward_window(tokens, 0)
    cache, keys = lm.cache, lm.cache.layers[0].keys.data_ptr()
    lm.prefill(ids, 16)
    assert lm.cache is cache and lm.cache.layers[0].keys.data_ptr() == keys
    fresh.prefill(ids, 16)
    torch.testing.assert_close(lm.forward_window(tokens, 0), fresh.forward_window(tokens, 0), rtol=0, atol=0)
    lm.prefill(ids[:1], 16)
    assert lm.cache is not cache


@pytest.fixture(scope="module")
def compiled_pair():
    return tiny_hf("llama"), tiny_hf("llama", seed=1)


@pytest.mark.parametrize("drafter", [None, "ngram", "model", "jacobi"])
def test_the_compiled_step_gives_the_eager_tokens(drafter, compiled_pair, tokenizer, capfd, tmp_path, monkeypatch):
    """The same tokens, greedy and sampled, with the sampling, the rule and the commit inside the
    compiled step (windows of every length up to 5 padded to their buckets of 1 to 8; Jacobi's
    whole step at its own length)."""
    from visualspec.core.rows import StepCommitter
    from visualspec.drafters import JacobiStep
    from visualspec.models.hf import _COMPILERS

    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))  # the costs compile=True stores stay here
    model, draft_model = compiled_pair
    draft = draft_model if drafter == "model" else drafter
    kw = dict(drafter=draft, max_new_tokens=16, window=5)
    ref = generate_text(model, tokenizer, TEXT_PROMPTS, temperature=0, compile=False, **kw)
    out = generate_text(model, tokenizer, TEXT_PROMPTS, temperature=0, compile=True, **kw)
    assert out.token_ids == ref.token_ids and out.stats.mode.endswith("+compiled")
    posts = {type(key[-1]) for key in _COMPILERS[model].compile_s}
    assert StepCommitter in posts and (JacobiStep in posts) is (drafter == "jacobi")
    # sampled tokens too, for one generator (float64 models: the compiled step rounds as the eager one)
    sampled = [generate_text(model, tokenizer, TEXT_PROMPTS, seed=3, compile=c, **kw).token_ids for c in (False, True)]
    assert sampled[0] == sampled[1]
    capfd.readouterr()
    again = generate_text(model, tokenizer, TEXT_PROMPTS, temperature=0, compile=True, **kw)
    assert again.token_ids == ref.token_ids
    assert "compiling" not in capfd.readouterr().err  # every bucket was compiled before the first decode


def test_precompile_compiles_each_window_bucket_once_and_says_so(compiled_pair, capfd):
    model, _ = compiled_pair
    lm = HFCausalLM(model)
    with pytest.raises(RuntimeError, match="call compile_step"):
        lm.precompile(torch.ones(1, 3, dtype=torch.long), 8, [1])
    lm.compile_step()
    assert lm.static and lm.compiled_step
    prefix = torch.randint(2, 64, (1, 3), generator=torch.Generator().manual_seed(0))
    lm.precompile(prefix, 8, range(1, 6))  # windows 1..5: buckets 1, 2, 4, 8
    err = capfd.readouterr().err
    assert err.count("compiling the LlamaForCausalLM decode step") == 4
    assert "window 8, a 128-column cache" in err
    lm.precompile(prefix, 8, range(1, 6))
    assert capfd.readouterr().err == ""


@torch.no_grad()
def test_guards_are_checked_once_a_decode_then_skipped(compiled_pair):
    """As the LlamaGen GPT's step does: after a prefill each compiled bucket's first call checks
    torch's guards and the later calls skip them, and a change its bucket key does not name (the
    head's layout) is caught at the first call after the next prefill, with the error that names
    the bucket."""
    model, _ = compiled_pair
    lm = HFCausalLM(model)
    lm.compile_step()
    prefix, tokens = torch.randint(2, 64, (1, 3), generator=torch.Generator().manual_seed(0)), torch.zeros(1, 1, dtype=torch.long)
    lm.precompile(prefix, 8, [1])
    assert_guards_checked_once_a_decode(lambda: lm.prefill(prefix, 8), lambda position: lm.forward_window(tokens, position),
                                        model.get_output_embeddings())


def test_compile_auto_follows_the_costs_a_compiled_call_stored(tokenizer, tmp_path, monkeypatch, capfd):
    """``compile="auto"`` (the default) stays eager with nothing measured; a ``compile=True`` call
    measures the one-token step both ways and its compile time, and from then on "auto" compiles
    exactly when those costs say it pays over the call's steps."""
    import json

    from visualspec.core.compiled import compile_pays

    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))
    model = tiny_hf("llama", seed=4)
    assert generate_text(model, tokenizer, TEXT_PROMPTS, max_new_tokens=12, temperature=0).stats.mode == "ar"
    generate_text(model, tokenizer, TEXT_PROMPTS, max_new_tokens=12, temperature=0, compile=True)
    assert "window costs: measuring HFCausalLM at 3 model rows" in capfd.readouterr().err
    stored = json.loads((tmp_path / "window_costs.json").read_text())
    eager, fast, compile_s = (next(t for k, t in stored.items() if k.endswith(end))
                              for end in ("new=12", "|compiled", "|compile-s"))
    pays = compile_pays(eager["1"], fast["1"], sum(compile_s.values()), 12)
    out = generate_text(model, tokenizer, TEXT_PROMPTS, max_new_tokens=12, temperature=0)
    assert out.stats.mode == ("ar+compiled" if pays else "ar")


def test_compile_must_be_true_false_or_auto(tokenizer):
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        generate_text(tiny_hf("llama"), tokenizer, "w1", compile="yes", max_new_tokens=2)


def test_rows_accepting_different_drafts_keep_the_static_cache_in_its_bucket():
    """Rows that accept different numbers of drafts leave holes in the shared columns, so the
    columns outgrow every row: here two rows take turns keeping 8 tokens of a window and 1, so the
    dynamic cache (the control) grows 8 columns a step while each row grows 4.5 tokens. The static
    cache packs its columns instead of growing past its bucket, with the same logits."""
    model = tiny_hf("llama")
    ids = torch.randint(2, 64, (2, 4), generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(2, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    dynamic, static = HFCausalLM(model), HFCausalLM(model, static=True)
    for lm in (dynamic, static):
        lm.prefill(ids, 150)
    length = static_length(4 + 150 + 64)
    done = torch.zeros(2, dtype=torch.long)
    for step in range(32):
        keep = torch.tensor([8, 1]) if step % 2 else torch.tensor([1, 8])
        torch.testing.assert_close(static.forward_window(tokens, done), dynamic.forward_window(tokens, done),
                                   rtol=1e-9, atol=1e-9)
        done += keep
        for lm in (dynamic, static):
            lm.crop(done)
    assert int(done.max()) <= 150 and dynamic.column_valid.shape[1] > length, "the control never outgrew the bucket"
    assert static.cache.layers[0].keys.shape[2] == length == 256
