"""generate_text(window="auto"): the image pipelines' window policy, with a draft model's drafts
priced, so that text speculation falls back to AR where drafting costs more than it saves."""

import pytest

import visualspec.core.window_costs as wc
from conftest import TEXT_PROMPTS, generate_reference, tiny_hf
from visualspec.text import generate_text


@pytest.fixture
def priced(monkeypatch):
    """Cost tables without a clock: a step of W tokens costs 1 + 0.01 W forward seconds, plus
    ``per_draft[0]`` for each of its W - 1 drafts where the table prices drafts (its tag says
    ``drafts=``). Returns the tags asked for and the per-draft price, to set."""
    asked, per_draft = [], [0.0]

    def tables(model, prefix, max_new_tokens, windows=wc.WINDOWS, cache_dir=None, repeats=5, forward=None,
               tag=None):
        asked.append(tag)
        draft = per_draft[0] if tag and tag.startswith("drafts=") else 0.0
        return {w: 1.0 + 0.01 * w + draft * (w - 1) for w in windows if w <= max_new_tokens}

    monkeypatch.setattr(wc, "cached_window_costs", tables)
    return asked, per_draft


def test_costly_drafts_decode_as_ar_and_free_ones_speculate(priced, tokenizer):
    """The draft model is the target itself, so every draft is accepted: with drafts that cost
    nothing the policy speculates (a control for the path), with drafts that cost two forwards each
    it keeps W = 1 except for its probes, and both give generate's greedy tokens."""
    asked, per_draft = priced
    model = tiny_hf("llama", vocab_size=64)
    ref = generate_reference(model, tokenizer, TEXT_PROMPTS[0], 24)
    forwards = {}
    for price in (0.0, 2.0):
        per_draft[0] = price
        out = generate_text(model, tokenizer, TEXT_PROMPTS[0], drafter=tiny_hf("llama", vocab_size=64),
                            max_new_tokens=24, temperature=0)
        assert out.token_ids[0] == ref[:len(out.token_ids[0])]
        forwards[price] = out.stats.target_forwards
    assert asked == ["drafts=DraftModelDrafter=" + wc.config_hash(model)] * 2
    assert forwards[0.0] <= 8  # long windows, all accepted
    assert forwards[2.0] >= 24 - 3  # AR but for one probe of three W = 2 steps


def test_free_drafts_price_the_forward_alone_and_ar_asks_nothing(priced, tokenizer):
    asked, _ = priced
    model = tiny_hf("llama", vocab_size=64)
    out = generate_text(model, tokenizer, TEXT_PROMPTS, drafter="ngram", max_new_tokens=12, temperature=0)
    for prompt, ids in zip(TEXT_PROMPTS, out.token_ids):
        assert ids == generate_reference(model, tokenizer, prompt, 12)[:len(ids)]
    assert asked and set(asked) == {None}  # n-gram drafts cost nothing to price
    asked.clear()
    generate_text(model, tokenizer, TEXT_PROMPTS[0], max_new_tokens=4, temperature=0)
    assert asked == []  # plain AR has no window to choose


def test_a_tree_needs_its_shape_under_auto(tokenizer):
    model = tiny_hf("llama", vocab_size=64)
    with pytest.raises(ValueError, match="fixed shape; give its depth"):
        generate_text(model, tokenizer, "w1", drafter="stand", branches=2, max_new_tokens=4)
    out = generate_text(model, tokenizer, TEXT_PROMPTS[0], drafter="stand", branches=2, depth=2, max_new_tokens=8,
                        temperature=0)
    assert out.token_ids[0] == generate_reference(model, tokenizer, TEXT_PROMPTS[0], 8)[:len(out.token_ids[0])]
    assert "tree 2x2" in out.stats.mode


@pytest.mark.parametrize("window", ["big", 0, 2.5])
def test_a_bad_window_is_named(window, tokenizer):
    with pytest.raises(ValueError, match="window"):
        generate_text(tiny_hf("llama", vocab_size=64), tokenizer, "w1", drafter="ngram", window=window,
                      max_new_tokens=4)
