"""generate_text(window="auto"): windows chosen from the measured cost of whole decode steps (the
drafts, the forward, the rule, the commit), so that text speculation falls back to AR where
drafting costs more than it saves."""

import pytest

import visualspec.core.window_costs as wc
from conftest import TEXT_PROMPTS, generate_reference, tiny_hf
from visualspec.core.stats import DecodeStats
from visualspec.text import generate_text


@pytest.fixture
def priced(monkeypatch):
    """Whole-step cost tables without a clock: a step of W tokens costs 1 + 0.01 W seconds, plus
    ``per_draft[0]`` for each of its W - 1 drafts where the drafter's tag names a draft model; the
    timed decodes committed ``seen[0]`` tokens a step at every W (W, every draft accepted, when
    None); plain AR's step costs 1.05 seconds. Returns the tags asked for, the per-draft price and
    the tokens seen, to set."""
    asked, per_draft, seen = [], [0.0], [None]

    def tables(model, decode_at, max_new_tokens, rows, tag, windows=wc.WINDOWS, ar_at=None, **kw):
        asked.append(tag)
        draft = per_draft[0] if tag.startswith("DraftModelDrafter=") else 0.0
        costs = {w: 1.0 + 0.01 * w + draft * (w - 1) for w in windows if w <= max_new_tokens}
        tokens = {w: float(w) if seen[0] is None else seen[0] for w in costs}
        if ar_at is not None:  # plain AR's step (W = 0), a little dearer than W = 1's: speculation may pay
            costs[0], tokens[0] = 1.05, 1.0
        return costs, tokens

    monkeypatch.setattr(wc, "decode_step_costs", tables)
    return asked, per_draft, seen


def test_costly_drafts_decode_as_ar_and_free_ones_speculate(priced, tokenizer):
    """The draft model is the target itself, so every draft is accepted: with drafts that cost
    nothing the call takes the longest window that fits (a control for the path), with drafts
    that cost two steps each it decodes as AR, and both give generate's greedy tokens."""
    asked, per_draft, _ = priced
    model = tiny_hf("llama", vocab_size=64)
    ref = generate_reference(model, tokenizer, TEXT_PROMPTS[0], 24)
    forwards, modes = {}, {}
    for price in (0.0, 2.0):
        per_draft[0] = price
        out = generate_text(model, tokenizer, TEXT_PROMPTS[0], drafter=tiny_hf("llama", vocab_size=64),
                            max_new_tokens=24, temperature=0)
        assert out.token_ids[0] == ref[:len(out.token_ids[0])]
        forwards[price], modes[price] = out.stats.target_forwards, out.stats.mode
    tag = "DraftModelDrafter=" + wc.config_hash(model) + "|rule=greedy_verify|greedy"
    assert asked == [tag] * 2
    assert forwards[0.0] <= 3  # W = 16 at every step, all accepted
    assert forwards[2.0] == 24 and modes[2.0].endswith("as AR")


def test_the_timed_decodes_tokens_pick_the_window(priced, tokenizer):
    """Free drafts that are all accepted (the draft model is the target), but the timed decodes
    committed one token a step at every window (as a drafter that is never right would): the
    table's best fixed window is W = 1, so the call decodes as AR, though its drafts would have
    been accepted (the control, in the test above, speculates)."""
    _, _, seen = priced
    seen[0] = 1.0
    model = tiny_hf("llama", vocab_size=64)
    out = generate_text(model, tokenizer, TEXT_PROMPTS[0], drafter=tiny_hf("llama", vocab_size=64),
                        max_new_tokens=24, temperature=0)
    assert out.stats.target_forwards == 24 and out.stats.mode.endswith("as AR")


def test_free_drafts_are_tagged_by_class_and_ar_asks_nothing(priced, tokenizer):
    asked, _, _ = priced
    model = tiny_hf("llama", vocab_size=64)
    out = generate_text(model, tokenizer, TEXT_PROMPTS, drafter="ngram", max_new_tokens=12, temperature=0.7, seed=1)
    assert len(out.token_ids) == len(TEXT_PROMPTS)
    assert asked == ["NGramDrafter|rule=speculative_verify|sampled"]
    asked.clear()
    generate_text(model, tokenizer, TEXT_PROMPTS[0], max_new_tokens=4, temperature=0)
    assert asked == []  # plain AR has no window to choose


def test_whole_steps_are_timed_per_forward_the_slow_first_call_dropped_and_kept(tmp_path, monkeypatch):
    """A fake decode that takes 1 + W seconds of a fake clock for 10 / W forwards: the cost is
    seconds over forwards, each window's first call (10x slower, as a new shape's first run can be)
    left out by the minimum of three rounds, which interleave the windows; a second call reads the
    cache."""
    clock, calls = [0.0], []
    monkeypatch.setattr(wc, "_clock", lambda: clock[0])

    def decode_at(w, seed):
        calls.append(w)
        clock[0] += (1 + w) * (10 if calls.count(w) == 1 else 1)
        return DecodeStats(mode="fake", batch_size=1, num_tokens=10, target_forwards=10 // w,
                           accepted_lengths=[min(w, 3)] * (10 // w))

    model = tiny_hf("llama", vocab_size=64)
    costs, tokens = wc.decode_step_costs(model, decode_at, 10, 1, "fake", windows=(1, 2, 4, 16), cache_dir=tmp_path,
                                         repeats=3)
    assert costs == {1: 2 / 10, 2: 3 / 5, 4: 5 / 2}  # 16 > 10 new tokens
    assert calls == [1, 2, 4] * 3  # in rounds over the windows, no separate warm-up
    assert tokens == {1: 1.0, 2: 2.0, 4: 5.0}  # 10 tokens a row over 10, 5 and 2 steps
    again = wc.decode_step_costs(model, decode_at, 10, 1, "fake", windows=(1, 2, 4), cache_dir=tmp_path)
    assert again == (costs, tokens) and len(calls) == 9
    assert wc.decode_step_costs(model, decode_at, 10, 1, "other", windows=(1,), cache_dir=tmp_path)[0] == {1: 2 / 10}


def test_each_round_decodes_at_its_own_seed_and_the_yield_pools_them(tmp_path, monkeypatch):
    """Round r decodes at seed r, and a window's tokens a step pool the rounds: 10 tokens over 5,
    2 and 3 steps is 30 / 10 = 3.0 a step (the last round alone, the control, would say 3.33; one
    seed in every round would say whatever that one image did)."""
    clock, seeds = [0.0], []
    monkeypatch.setattr(wc, "_clock", lambda: clock[0])
    steps = {0: 5, 1: 2, 2: 3}

    def decode_at(w, seed):
        seeds.append(seed)
        clock[0] += 1.0
        return DecodeStats(mode="fake", batch_size=1, num_tokens=10, target_forwards=steps[seed],
                           accepted_lengths=[1] * steps[seed])

    costs, tokens = wc.decode_step_costs(tiny_hf("llama", vocab_size=64), decode_at, 10, 1, "fake", windows=(4,),
                                         cache_dir=tmp_path, repeats=3)
    assert seeds == [0, 1, 2] and tokens == {4: 3.0} and costs == {4: 1.0 / 5}


def test_a_step_that_drafts_with_the_target_is_priced_whole(tmp_path, monkeypatch):
    """ASSD's rounds: a draft forward of the target and a verification. The cost of W is seconds
    over steps (target forwards less the drafting ones), so that it compares with AR's step: 12
    seconds for a prefill and 5 rounds (11 forwards, 5 of them drafting) is 2 seconds a step.
    Counted per forward (the control) it would be 1.09 and make each round look half as dear."""
    clock = [0.0]
    monkeypatch.setattr(wc, "_clock", lambda: clock[0])

    def decode_at(w, seed):
        clock[0] += 12.0
        return DecodeStats(mode="fake", batch_size=1, num_tokens=12, target_forwards=11, query_forwards=5,
                           accepted_lengths=[2] * 5)

    costs, tokens = wc.decode_step_costs(tiny_hf("llama", vocab_size=64), decode_at, 12, 1, "fake", windows=(3,),
                                         cache_dir=tmp_path, repeats=1)
    assert costs == {3: 2.0} and tokens == {3: 2.0}  # 12 tokens over 6 steps


def test_a_batchs_rate_counts_the_steps_its_fast_rows_wait(tmp_path, monkeypatch):
    """Two rows of 12 tokens: one commits its 11 after the prefill in 3 steps, the other in 6, and
    the batch steps until both are done. Its rate is 12 tokens a row over 7 steps, not the 2.44
    tokens a row-step the rows committed on average (the control), which would promise a speed
    the batch never reached."""
    clock = [0.0]
    monkeypatch.setattr(wc, "_clock", lambda: clock[0])
    lengths = [4, 2, 4, 2, 3, 2, 2, 2, 1]

    def decode_at(w, seed):
        clock[0] += 7.0
        return DecodeStats(mode="fake", batch_size=2, num_tokens=12, target_forwards=7, accepted_lengths=lengths)

    costs, tokens = wc.decode_step_costs(tiny_hf("llama", vocab_size=64), decode_at, 12, 2, "fake", windows=(4,),
                                         cache_dir=tmp_path, repeats=1)
    assert costs == {4: 1.0} and tokens == {4: 12 / 7} and sum(lengths) / len(lengths) > 2.4


def test_plain_ar_is_timed_in_the_windows_rounds(tmp_path, monkeypatch):
    """With ``ar_at`` plain AR's decode is one more window of every round (kept as W = 0): a
    machine that runs at half speed during the second round slows both sides of the ratio alike,
    and the minimum keeps each side's fast round."""
    clock, calls = [0.0], []
    monkeypatch.setattr(wc, "_clock", lambda: clock[0])

    def timed(name, seconds, forwards, tokens):
        calls.append(name)
        clock[0] += seconds * (2 if len(calls) in range(4, 7) else 1)  # round 2 of 3 calls a round
        return DecodeStats(mode="fake", batch_size=1, num_tokens=10, target_forwards=forwards,
                           accepted_lengths=[tokens] * forwards)

    model = tiny_hf("llama", vocab_size=64)
    costs, tokens = wc.decode_step_costs(model, lambda w, seed: timed(w, 2.0 * w, 10 // w, min(w, 3)), 10, 1, "fake",
                                         windows=(1, 2), cache_dir=tmp_path, ar_at=lambda: timed("AR", 1.0, 10, 1),
                                         repeats=3)
    assert calls == ["AR", 1, 2] * 3
    assert costs == {0: 0.1, 1: 0.2, 2: 0.8} and tokens == {0: 1.0, 1: 1.0, 2: 2.0}
    again = wc.decode_step_costs(model, None, 10, 1, "fake", windows=(1, 2), cache_dir=tmp_path, ar_at=lambda: None)
    assert again == (costs, tokens) and len(calls) == 9  # kept, AR's step with it


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


def test_a_policys_tokens_seed_the_search_until_a_step_is_seen():
    """Flat costs with W = 8 best on the prior (0.7): seeded with one token a step at every W > 1,
    the search starts at W = 1; the control without the seed starts at 8. A step seen at W
    replaces its seed."""
    from visualspec.core.window import WindowPolicy

    costs = {1: {1: 1.0, 2: 1.1, 4: 1.2, 8: 1.3}}
    assert WindowPolicy(costs).search().window(1) == 8
    seeded = WindowPolicy(costs, tokens={1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}).search()
    assert seeded.window(1) == 1
    seeded.observe(1, [1])
    seeded.observe(8, [8])  # a larger window than the step before: not counted (a Jacobi warm-up)
    seeded.observe(8, [8])
    assert seeded.estimate(8) == 8.0 and seeded.window(1) == 8


def test_fresh_drafts_count_the_step_whose_window_grew():
    """Jacobi's drafts carry over, so a step whose window grew is left out (its new positions had
    nothing carried); drafts made afresh (a draft model, n-gram, the feature drafter) count it."""
    from visualspec.core.window import WindowPolicy
    from visualspec.drafters import FeatureDrafter, JacobiDrafter, NGramDrafter

    policy = WindowPolicy({1: {1: 1.0, 8: 1.0}})
    for carried, counted in ((True, False), (False, True)):
        search = policy.search(carried=carried)
        search.observe(1, [1])
        search.observe(8, [2])
        assert (8 in search.tokens) == counted
    assert JacobiDrafter.carries_drafts and not NGramDrafter.carries_drafts and not FeatureDrafter.carries_drafts


def test_the_engine_tells_the_search_whether_drafts_carry():
    """decode hands its window search the drafter's carries_drafts: Jacobi's drafts carry over,
    n-gram's do not (and generate_text reaches the same engine)."""
    import torch

    from visualspec.core.engine import decode
    from visualspec.core.sampling import SamplingConfig
    from visualspec.core.window import WindowPolicy
    from visualspec.drafters import JacobiDrafter, NGramDrafter
    from visualspec.models.hf import HFCausalLM

    asked = []

    class Recording(WindowPolicy):
        def search(self, **kwargs):
            asked.append(kwargs.get("carried"))
            return super().search(**kwargs)

    target = HFCausalLM(tiny_hf("llama", vocab_size=64))
    prompt = torch.tensor([[3, 5, 7, 3, 5]])
    policy = Recording({1: {1: 1.0, 2: 1.0, 4: 1.0}})
    greedy = SamplingConfig(temperature=0.0)
    for drafter in (JacobiDrafter(64, "repeat_left"), NGramDrafter([[3, 5, 7, 3, 5]])):
        decode(target, prompt, 8, greedy, drafter=drafter, window=policy)
    assert asked == [True, False]


def test_calls_pool_their_yield_into_the_table_and_a_new_process_starts_from_it(monkeypatch, tokenizer):
    """The table (timed on one prompt) says every draft is accepted, and steps cost 1 + 0.1 W
    (AR's 1.1): the first call takes W = 16. Its draft model never agrees with the target, so each
    call's pooled yield pulls the next call's window down (a window not run since keeps its last
    estimate, so 16, 4, 8, 2, ...), to AR, which pools nothing and so stays; the tokens stay
    generate's. Forgetting the pool (a new process) starts from the table's W = 16
    again (the control). A call of several prompts does not pool."""
    import visualspec.text.generate as gen
    from visualspec.core.window import CallPool, best_fixed_window

    def tables(model, decode_at, max_new_tokens, rows, tag, windows=wc.WINDOWS, ar_at=None, **kw):
        costs = {w: 1.0 + 0.1 * w for w in windows if w <= max_new_tokens}
        return {**costs, 0: 1.1}, {**{w: float(w) for w in costs}, 0: 1.0}

    policies = []

    def step_policy(*args, **kw):
        policies.append(wc.step_policy(*args, **kw))
        return policies[-1]

    monkeypatch.setattr(wc, "decode_step_costs", tables)
    monkeypatch.setattr(gen, "step_policy", step_policy)
    model = tiny_hf("llama", vocab_size=64)
    ref = generate_reference(model, tokenizer, TEXT_PROMPTS[2], 24)

    def window():
        out = generate_text(model, tokenizer, TEXT_PROMPTS[2], drafter=tiny_hf("llama", seed=1, vocab_size=64),
                            max_new_tokens=24, temperature=0)
        assert out.token_ids[0] == ref[:len(out.token_ids[0])]
        policy = policies[-1]
        return 1 if policy.as_ar else best_fixed_window(policy.costs(1), policy.tokens)

    windows = [window() for _ in range(12)]
    assert windows[0] == 16 and max(windows[1:]) <= 8 and windows[-1] == 1, windows
    assert windows[windows.index(1):] == [1] * (len(windows) - windows.index(1)), windows  # AR pools nothing
    CallPool.clear()
    assert window() == 16
    generate_text(model, tokenizer, TEXT_PROMPTS, drafter=tiny_hf("llama", seed=1, vocab_size=64), max_new_tokens=24,
                  temperature=0)
    assert policies[-1].pool is None  # several rows: their table holds several prompts already
