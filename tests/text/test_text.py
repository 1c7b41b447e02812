"""visualspec.generate_text on transformers causal LMs: greedy equality with generate for every
drafter, batches, sampling reproducibility, and clear errors."""

import pytest

from conftest import TEXT_PROMPTS, generate_reference, tiny_hf
from visualspec.text import generate_text

PROMPTS = TEXT_PROMPTS


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter", [None, "ngram", "jacobi", "model"])
def test_greedy_output_equals_generate_for_every_drafter(family, drafter, tokenizer):
    model = tiny_hf(family, vocab_size=64)
    draft = tiny_hf(family, seed=1, vocab_size=64) if drafter == "model" else drafter
    out = generate_text(model, tokenizer, PROMPTS, drafter=draft, max_new_tokens=20, temperature=0, window=5)
    for prompt, ids in zip(PROMPTS, out.token_ids):
        ref = generate_reference(model, tokenizer, prompt, 20)
        assert ids == ref[: len(ids)] and (len(ids) == 20 or ids[-1] == tokenizer.eos_token_id)
    assert isinstance(out.text, list) and len(out.text) == 3
    assert out.stats.num_tokens == 20 and out.stats.target_forwards <= 20


def test_one_prompt_gives_one_text_and_sampling_is_seeded(tokenizer):
    model = tiny_hf("llama", vocab_size=64)
    a = generate_text(model, tokenizer, PROMPTS[0], drafter="ngram", max_new_tokens=12, seed=3)
    b = generate_text(model, tokenizer, PROMPTS[0], drafter="ngram", max_new_tokens=12, seed=3)
    assert isinstance(a.text, str) and a.token_ids == b.token_ids
    typical = [generate_text(model, tokenizer, PROMPTS[0], drafter="jacobi", acceptance="typical", max_new_tokens=12,
                             seed=seed).token_ids[0] for seed in (3, 3, 4)]
    assert typical[0] == typical[1] and typical[0] != typical[2]  # seeded, and the seed matters
    for ids in typical:  # all 12 tokens, or fewer only when the text ended
        assert len(ids) == 12 or (len(ids) < 12 and ids[-1] == tokenizer.eos_token_id)


def test_bad_input_is_named(tokenizer):
    model = tiny_hf("llama", vocab_size=64)
    with pytest.raises(ValueError, match="vocabulary"):
        generate_text(model, tokenizer, "w1", drafter=tiny_hf("llama", vocab_size=32), max_new_tokens=4)
    with pytest.raises(ValueError, match="unknown drafter"):
        generate_text(model, tokenizer, "w1", drafter="medusa", max_new_tokens=4)
    with pytest.raises(ValueError, match="acceptance"):
        generate_text(model, tokenizer, "w1", acceptance="lenient", max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_text(model, tokenizer, "w1", max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt"):
        generate_text(model, tokenizer, [], max_new_tokens=4)
    model.config.use_cache = False
    with pytest.raises(ValueError, match="KV cache"):
        generate_text(model, tokenizer, "w1", max_new_tokens=4)
