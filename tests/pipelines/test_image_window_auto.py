"""window="auto" in the image pipelines: windows chosen from the measured cost of whole decode
steps (the drafts, the forward, the rule, the commit), so that speculation falls back to AR's step
wherever a longer window does not pay for itself."""

from functools import partial

import pytest
import torch

import visualspec.core.window_costs as wc
from visualspec.core.verify import lantern_verify, speculative_verify
from visualspec.pipelines.tiny import tiny_random_pipeline

PROMPT = "a photo of a red circle"


@pytest.fixture(scope="module")
def pipe():
    p = tiny_random_pipeline(seed=0)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture
def priced(monkeypatch):
    """Whole-step tables without a clock: a step of W tokens costs 1 + slope[0] (W - 1) seconds
    and committed (W + 1) / 2 tokens, plain AR's step 1 second (its tag is not recorded). Returns
    the (model rows, tag) asked for and the slope, to set."""
    asked, slope = [], [0.0]

    def tables(model, decode_at, max_new_tokens, rows, tag, windows=wc.WINDOWS, ar_at=None, **kw):
        asked.append((rows, tag))
        kept = [w for w in windows if w <= max_new_tokens]
        costs, tokens = {w: 1.0 + slope[0] * (w - 1) for w in kept}, {w: (w + 1) / 2 for w in kept}
        if ar_at is not None:  # plain AR's step, kept as W = 0
            costs[0], tokens[0] = 1.0, 1.0
        return costs, tokens

    monkeypatch.setattr(wc, "decode_step_costs", tables)
    return asked, slope


def test_where_no_window_beats_plain_ar_the_call_decodes_without_drafts(pipe, monkeypatch):
    """The timed decodes committed 1.5 tokens a step at every window, each step costing 2 AR steps:
    the call decodes as AR, no probes, and says so; at 2.5 tokens a step (the control) it speculates."""
    seen = [1.5]

    def tables(model, decode_at, max_new_tokens, rows, tag, windows=wc.WINDOWS, ar_at=None, **kw):
        return {0: 1.0, **{w: 2.0 for w in windows}}, {0: 1.0, **{w: 1.0 if w == 1 else seen[0] for w in windows}}

    monkeypatch.setattr(wc, "decode_step_costs", tables)
    out = pipe(PROMPT, decoding="sjd", seed=0, output_type="latent")
    assert out.stats.mode == "sjd as AR" and out.stats.target_forwards == 256
    assert pipe.last_window_policy.as_ar
    seen[0] = 2.5
    out = pipe(PROMPT, decoding="sjd", seed=0, output_type="latent")
    assert out.stats.mode == "sjd" and out.stats.target_forwards < 256


def test_speculation_pays_by_its_best_window():
    from visualspec.core.window import speculation_pays

    costs = {1: 1.2, 2: 1.5, 4: 2.0}
    assert not speculation_pays(costs, {1: 1.0, 2: 1.4, 4: 1.9}, ar_cost=1.0)  # 0.93, 0.95 tokens per AR step
    assert speculation_pays(costs, {1: 1.0, 2: 1.4, 4: 2.2}, ar_cost=1.0)  # W = 4: 1.1
    assert speculation_pays(costs, {1: 1.0}, ar_cost=1.0)  # nothing seen beyond W = 1: the search finds out
    # a gain inside the timings' noise does not count: 1.1 tokens per AR step against a 15 % margin
    assert not speculation_pays(costs, {1: 1.0, 2: 1.4, 4: 2.2}, ar_cost=1.0, margin=0.15)
    assert speculation_pays(costs, {1: 1.0, 2: 1.4, 4: 2.2}, ar_cost=1.0, margin=0.05)
    # a W = 1 step timed cheaper than AR's (0.9 against 1.0) is noise, not a reason to speculate
    assert not speculation_pays({1: 0.9, 2: 1.5, 4: 2.0}, {1: 1.0, 2: 1.4, 4: 1.9}, ar_cost=1.0)


@pytest.mark.parametrize("decoding", ["sjd", "lantern"])
def test_steps_that_do_not_pay_decode_as_ar_and_free_ones_speculate(pipe, priced, decoding):
    """The same call twice: where a step's cost does not grow with its window (the control) the
    call speculates at the largest window; where each extra token costs a whole step, no window
    beats AR and it decodes as AR. Both ask for the table of their own kind of step at the
    call's model rows (guidance doubles them)."""
    asked, slope = priced
    forwards = {}
    for s in (0.0, 1.0):
        slope[0] = s
        out = pipe(PROMPT, decoding=decoding, seed=0, lantern_k=8, output_type="latent")
        forwards[s] = out.stats.target_forwards
    rule = "speculative_verify" if decoding == "sjd" else "lantern_verify(delta=0.1,lam=None,neighbours=8)"
    assert asked == [(2, f"JacobiDrafter|rule={rule}|sampled")] * 2
    assert forwards[0.0] < 64  # 256 tokens
    assert forwards[1.0] == 256 and pipe.last_window_policy.as_ar


def test_ar_and_fixed_windows_time_nothing(pipe, priced, monkeypatch):
    """AR and a fixed window measure no table, and a compiled call compiles only their windows
    (recorded here in place of compiling: the call then runs eagerly)."""
    import visualspec.pipelines.llamagen as llamagen

    asked, _ = priced
    compiled = []
    monkeypatch.setattr(llamagen, "compiled_step", lambda *args: True)
    monkeypatch.setattr(type(pipe.transformer), "compiled_step", property(lambda self: True))  # its steps eager
    monkeypatch.setattr(pipe.transformer, "precompile",
                        lambda prefix, n, windows, post=None, **kw: compiled.append((windows, type(post).__name__)))
    assert pipe(PROMPT, decoding="ar", seed=0, output_type="latent").stats.target_forwards == 256
    pipe(PROMPT, decoding="sjd", window=4, seed=0, output_type="latent")
    pipe(PROMPT, decoding="lantern", window=4, seed=0, output_type="latent")
    # each with what the engine runs inside the step: the sampling, the lossless rule and the commit (a Jacobi
    # step whole), or under another rule (LANTERN's) the sampling alone
    assert asked == [] and compiled == [([1], "StepCommitter"), ([4], "JacobiStep"), ([4], "StepSampler")]
    pipe(PROMPT, decoding="sjd", seed=0, output_type="latent")
    # every window, before they are timed, and plain AR's step, should none beat it
    assert len(asked) == 1 and compiled[-3:] == [([w for w in wc.WINDOWS if w > 1], "JacobiStep"),
                                                 ([1], "StepCommitter"), ([1], "StepCommitter")]


def test_whole_steps_are_measured_once_and_kept(tmp_path, monkeypatch, capsys):
    """Unpatched: the first call times decodes at every window (announced) and keeps the table of
    seconds per forward and the tokens each window committed; the next call reads it."""
    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))
    pipe = tiny_random_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    pipe(PROMPT, decoding="sjd", seed=0, output_type="latent")
    assert "timing whole decode steps" in capsys.readouterr().err
    policy = pipe.last_window_policy
    assert set(policy.tables) == {2} and set(policy.tables[2]) == set(wc.WINDOWS)
    assert policy.tokens[1] == 1.0 and policy.tokens[32] > policy.tokens[2] > 1.0
    pipe(PROMPT, decoding="sjd", seed=1, output_type="latent")
    assert "timing" not in capsys.readouterr().err
    assert pipe.last_window_policy.tables == policy.tables


def test_window_tables_are_the_policy_of_the_calls_to_come(pipe, priced):
    asked, _ = priced
    found = pipe.window_tables(PROMPT, batch_size=2, decoding="lantern", lantern_k=8)
    assert asked == [(4, "JacobiDrafter|rule=lantern_verify(delta=0.1,lam=None,neighbours=8)|sampled")]
    assert set(found) == {"tables", "tokens", "as_ar", "fixed"} and set(found["tables"]) == {4} and found["fixed"]
    assert pipe.window_tables(PROMPT, batch_size=2, decoding="ar") == {}


def test_rule_tags_keep_the_settings_that_change_a_step_apart():
    neighbours = torch.zeros(16, 4, dtype=torch.long)
    assert wc.rule_tag(speculative_verify) == "speculative_verify"
    assert (wc.rule_tag(partial(lantern_verify, neighbours=neighbours, delta=0.05, lam=None))
            == "lantern_verify(delta=0.05,lam=None,neighbours=4)")
    assert wc.rule_tag(partial(lantern_verify, neighbours=neighbours, delta=0.4, lam=None)) != \
        wc.rule_tag(partial(lantern_verify, neighbours=neighbours, delta=0.05, lam=None))


def test_carried_drafts_take_the_best_fixed_window_and_fresh_ones_search(pipe, priced, monkeypatch):
    """Jacobi's drafts carry over between steps, so its calls hold the best fixed window of the
    timed decodes; drafts made afresh each step (here Jacobi's, told it does not carry) search."""
    from visualspec.drafters import JacobiDrafter

    pipe(PROMPT, decoding="sjd", seed=0, output_type="latent")
    assert pipe.last_window_policy.fixed and pipe.last_window_policy.search().window(2) == 32
    monkeypatch.setattr(JacobiDrafter, "carries_drafts", False)
    pipe(PROMPT, decoding="sjd", seed=0, output_type="latent")
    assert not pipe.last_window_policy.fixed
