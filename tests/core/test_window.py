"""Choosing the decode window: expected tokens, the choice, the acceptance estimate, the cost cache."""

import json

import pytest
import torch

from conftest import tiny_llamagen
from visualspec.core import window_costs as win
from visualspec.core.window import WindowPolicy, choose_window, expected_tokens
from visualspec.core.window_costs import cached_window_costs, measure_window_costs


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeModel:
    """A token model whose forward_window costs ``rows * (fixed + per_token * W)`` fake seconds
    (plus ``warmup`` on the first call of each W), and that checks the protocol is kept."""

    vocab_size = 5

    def __init__(self, clock, fixed=1e-3, per_token=1e-4, warmup=1.0):
        self.clock, self.fixed, self.per_token, self.warmup = clock, fixed, per_token, warmup
        self.calls, self.seen, self.length = [], set(), None

    def prefill(self, prefix, max_new_tokens):
        self.rows, self.max_new, self.length = prefix.shape[0], max_new_tokens, 0
        return torch.zeros(self.rows, self.vocab_size)

    def forward_window(self, tokens, start):
        rows, w = tokens.shape
        assert rows == self.rows and self.length == start and start + w <= self.max_new
        self.calls.append((w, start))
        self.clock.now += rows * (self.fixed + self.per_token * w) + (0 if w in self.seen else self.warmup)
        self.seen.add(w)
        self.length = start + w
        return torch.zeros(rows, w, self.vocab_size)

    def crop(self, length):
        self.length = min(self.length, length)


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(win, "_clock", clock)
    return clock


# ---------------------------------------------------------------------------- formulas and choice

def test_expected_tokens_on_hand_values():
    assert expected_tokens([0.5], 1) == 1.0
    assert expected_tokens([0.5], 2) == 1.5
    assert expected_tokens([0.5, 0.5, 0.5], 4) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([0.8, 0.5], 3) == pytest.approx(1 + 0.8 + 0.4)
    assert expected_tokens([0.8, 0.5], 5) == pytest.approx(1 + 0.8 + 0.4 + 0.2 + 0.1)  # last value reused
    assert expected_tokens(1.0, 6) == 6.0 and expected_tokens(0.0, 6) == 1.0
    with pytest.raises(ValueError):
        expected_tokens([1.5], 2)
    with pytest.raises(ValueError):
        expected_tokens([0.5], 0)


def test_choose_window_avoids_costly_drafts_at_low_acceptance():
    steep = {1: 1.0, 2: 1.6, 4: 2.8, 8: 5.0, 16: 9.0}  # a CPU at batch 16
    assert choose_window(steep, 0.3) == 1
    assert choose_window(steep, [0.5, 0.3]) == 1


def test_choose_window_takes_a_large_window_when_forwards_are_flat():
    flat = {1: 1.0, 2: 1.01, 4: 1.02, 8: 1.05, 16: 1.1, 32: 1.3}  # batch 1, or a GPU
    assert choose_window(flat, 0.95) == 32
    assert choose_window(flat, 0.95, max_window=10) == 8
    assert choose_window(flat, 0.0) == 1  # nothing accepted: drafts only cost


def test_choose_window_ties_go_to_the_smaller_window():
    # E(2) = 1.5 at alpha 0.5: 1.5 tokens for 1.5 s, the same rate as AR
    assert choose_window({1: 1.0, 2: 1.5}, 0.5) == 1
    # alpha 1: E(W) = W, so every window of cost proportional to W ties with AR
    assert choose_window({1: 1.0, 2: 2.0, 4: 4.0}, 1.0) == 1
    assert choose_window({1: 2.0, 2: 2.0, 3: 3.0}, 1.0) == 2  # 2 and 3 both give 1 token/s
    with pytest.raises(ValueError):
        choose_window({2: 1.0, 4: 1.0}, 0.5)  # no AR baseline


# ---------------------------------------------------------------------------- acceptance profile

def test_window_search_learns_each_windows_tokens_and_probes_its_neighbours():
    policy = WindowPolicy({2: {1: 1.0, 2: 1.1, 4: 1.3, 8: 2.0}})
    search = policy.search(prior=0.5, rate=0.5, probe_every=4, probe_steps=2)
    # the prior's geometric estimates: 1, 1.5, 1.875, 1.99 tokens -> W=4 is best (1.44 tokens/cost)
    assert search.window(2) == 4
    search.observe(4, torch.tensor([4, 4]))  # W=4 turns out better than the prior said
    assert search.tokens == {4: 4.0} and search.window(2) == 4
    search.observe(4, torch.tensor([2, 4]))  # weight 1/2 on the second step: 3.5
    assert search.tokens[4] == 3.5 and search.window(2) == 4
    assert search.window(2) == 8  # step 4: probe the next larger window, for two steps
    search.observe(8, torch.tensor([8, 8]))  # the window just grew: not counted
    assert 8 not in search.tokens and search.window(2) == 8
    search.observe(8, torch.tensor([8, 8]))  # 8 tokens for 2.0: better than 3.5 for 1.3
    assert search.tokens[8] == 8.0 and search.window(2) == 8
    for _ in range(3):
        search.observe(8, torch.tensor([1, 1]))  # then W=8 stops paying: 8 -> 4.5 -> 2.75 -> 1.875
    windows = [search.window(2) for _ in range(4)]
    assert windows == [4, 2, 2, 4]  # back to 4; step 8 probes the next smaller for two steps


def test_window_search_is_ar_when_drafts_never_pay():
    search = WindowPolicy({32: {1: 1.0, 2: 1.8, 4: 3.0}}).search(prior=0.5, probe_every=3, probe_steps=2)
    picks = []
    for _ in range(12):
        w = search.window(32)
        picks.append(w)
        search.observe(w, torch.ones(3, dtype=torch.long))  # nothing is ever accepted
    assert picks.count(1) >= 6 and picks[-1] in (1, 2)


def test_window_search_takes_sibling_trees_only_where_they_pay():
    """Each window is also offered with its tree, priced at the cost of its extra nodes and
    measured apart: a tree that commits no more than its chain is dropped, one that commits more
    for little cost is kept."""
    policy = WindowPolicy({2: {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4}})
    extra = lambda w: 2 if w > 1 else 0  # noqa: E731
    search = policy.search(prior=0.7, rate=0.5, probe_every=100, probe_steps=2)
    assert search.option(2, extra) == (4, False)  # the prior gives trees no more tokens than chains
    for _ in range(2):
        search.observe(4, torch.tensor([3, 3]), tree=True)  # 3 tokens for the cost of 6 tokens (2.0)
        search.observe(4, torch.tensor([2, 2]))  # the chain: 2 tokens for 1.6
    assert search.option(2, extra) == (4, True)
    for _ in range(4):
        search.observe(4, torch.tensor([2, 2]), tree=True)  # the tree stops paying
    assert search.option(2, extra)[1] is False
    assert search.window(2) in (1, 2, 4, 8)  # chains only without extra


def test_the_search_prices_trees_from_their_measured_table():
    """A tree that commits 4 tokens would pay at its forward's interpolated cost (2.0 against a
    chain's 1.6) but not at its measured step cost (9.0): the measured table decides."""
    extra = lambda w: 2 if w > 1 else 0  # noqa: E731
    for trees, taken in ((None, True), ({2: {1: 1.0, 2: 5.0, 4: 9.0, 8: 12.0}}, False)):
        policy = WindowPolicy({2: {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4}}, tree_tables=trees)
        search = policy.search(prior=0.7, rate=0.5, probe_every=100, probe_steps=2)
        for _ in range(3):
            search.observe(4, torch.tensor([4, 4]), tree=True)
        assert search.option(2, extra)[1] is taken


def test_with_trees_the_search_still_probes_the_neighbouring_chains():
    """Probes alternate the next larger and smaller window of the chosen kind, and every third
    probe tries the other kind at the same window: trees offered beside chains must not hide the
    chains next to the choice."""
    policy = WindowPolicy({2: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}})  # flat: W = 8 is best
    search = policy.search(prior=0.5, probe_every=3, probe_steps=2)
    picks = [search.option(2, lambda w: 2 if w > 1 else 0) for _ in range(18)]
    assert picks.count((8, False)) >= 10 and (4, False) in picks and (8, True) in picks
    assert not {(2, True), (4, True)} & set(picks)


# ---------------------------------------------------------------------------- measuring and policy

def test_measure_times_each_window_at_one_start_after_a_warmup(clock):
    model = FakeModel(clock)
    costs = measure_window_costs(model, torch.zeros(3), 20, windows=(1, 2, 4, 8, 16, 32), repeats=3)
    assert sorted(costs) == [1, 2, 4, 8, 16]  # 32 > max_new_tokens
    for w, c in costs.items():
        assert c == pytest.approx(3 * (1e-3 + 1e-4 * w))  # the warm-up is not in the median
    start = win.window_start(20, [16])
    assert start == 4 and model.calls[0] == (start, 0)  # the cache is filled once
    assert all(s == start for _, s in model.calls[1:]) and len(model.calls) == 1 + 5 * 4


def test_window_policy_is_ar_when_batched_drafts_are_costly(clock):
    tables = {}
    for rows in (1, 32):
        model = FakeModel(clock, fixed=1.0 if rows == 1 else 0.002, per_token=0.01)
        tables[rows] = measure_window_costs(model, torch.zeros(rows), 64, repeats=1)
    policy = WindowPolicy(tables)
    assert policy.costs(2) is policy.tables[32] and policy.costs(64) is policy.tables[32]
    assert policy.costs(1) is policy.tables[1]
    assert policy.search(prior=0.6).window(1) > 1  # forwards almost flat in W: speculate
    assert policy.search(prior=0.6).window(32) == 1  # cost grows with W: plain AR is faster


def test_measure_window_costs_on_tiny_llamagen():
    model = tiny_llamagen(vocab_size=16, block_size=16, dtype=torch.float32)
    prefix = torch.tensor([0, 1, 3, 3])  # two classes doubled with the null class, as with guidance
    costs = measure_window_costs(model, prefix, 16, repeats=1)
    assert sorted(costs) == [w for w in win.WINDOWS if w <= 16]
    assert all(c > 0 for c in costs.values())


def test_measure_window_costs_keeps_a_dynamic_cache_consistent():
    from conftest import tiny_hf
    from visualspec.models.hf import HFCausalLM

    model = HFCausalLM(tiny_hf())
    ids = torch.randint(2, 64, (2, 5))
    costs = measure_window_costs(model, ids, 8, windows=(1, 2, 4), repeats=2)
    assert sorted(costs) == [1, 2, 4] and all(c > 0 for c in costs.values())
    assert model.cache.get_seq_length() == 5 + win.window_start(8, [4]) == 5 + 4


# ---------------------------------------------------------------------------- disk cache

@pytest.fixture
def counted(monkeypatch):
    calls = []

    def fake_measure(model, prefix, max_new_tokens, windows, repeats=5, forward=None, warmup=None, start=None):
        calls.append((prefix.shape[0], tuple(windows)) + (() if start is None else (start,)))
        if warmup is not None:
            warmup.update({w: 2.0 for w in windows})  # a compiled step's first calls compile
        return {w: 1e-3 * w * prefix.shape[0] for w in windows}

    monkeypatch.setattr(win, "measure_window_costs", fake_measure)
    return calls


def test_cost_cache_measures_once_then_reads(tmp_path, counted, capsys):
    model = tiny_llamagen(vocab_size=16, block_size=16)
    first = cached_window_costs(model, torch.zeros(4, dtype=torch.long), 16, cache_dir=tmp_path)
    said = capsys.readouterr().err  # the one-time work says what it measures, that it is once, and where it goes
    assert "measuring LlamaGenGPT at 4 model rows on this machine, once" in said and str(tmp_path) in said
    again = cached_window_costs(model, torch.zeros(4, dtype=torch.long), 16, cache_dir=tmp_path)
    assert first == again and len(counted) == 1 and capsys.readouterr().err == ""  # read: nothing to say
    assert sorted(first) == [w for w in win.WINDOWS if w <= 16]
    stored = json.loads((tmp_path / "window_costs.json").read_text())
    assert len(stored) == 1 and "rows=4" in next(iter(stored)) and "LlamaGenGPT" in next(iter(stored))
    assert [p.name for p in tmp_path.iterdir()] == ["window_costs.json"]  # no temporary file left
    # a subset of stored windows is read too; a window not stored is measured
    assert cached_window_costs(model, torch.zeros(4, dtype=torch.long), 16, windows=(1, 4), cache_dir=tmp_path) \
        == {1: first[1], 4: first[4]}
    assert len(counted) == 1
    cached_window_costs(model, torch.zeros(4, dtype=torch.long), 16, windows=(1, 5), cache_dir=tmp_path)
    assert len(counted) == 2


def test_a_compiled_step_keeps_its_costs_and_compile_times_apart(tmp_path, counted):
    model = tiny_llamagen(vocab_size=16, block_size=16)
    prefix = torch.zeros(4, dtype=torch.long)
    eager = cached_window_costs(model, prefix, 16, windows=(1, 2), cache_dir=tmp_path)
    model._compiled = True  # what compile_step(True) switches: the tables of another step
    compiled = cached_window_costs(model, prefix, 16, windows=(1, 2), cache_dir=tmp_path)
    # measured at a quarter and three quarters of the sequence (its slot buckets), and averaged
    assert counted[1:] == [(4, (1, 2), 4), (4, (1, 2), 12)] and eager == compiled
    stored = json.loads((tmp_path / "window_costs.json").read_text())
    assert sorted(key.split("|new=16")[1] for key in stored) == ["", "|compiled", "|compiled|compile-s"]
    compile_s = win.stored_window_costs(model, 4, 16, compiled=True, tag="compile-s", cache_dir=tmp_path)
    assert compile_s == {1: 4.0, 2: 4.0}  # the first calls at both starts: both buckets compiled
    assert win.stored_window_costs(model, 4, 16, compiled=False, cache_dir=tmp_path) == eager
    assert win.stored_window_costs(model, 8, 16, compiled=False, cache_dir=tmp_path) == {}  # none stored


@pytest.mark.parametrize("n, windows, expected", [(256, [1, 32], [64, 192]), (16, [1, 8], [4, 8]),
                                                  (8, [8], [0]), (256, [1, 100], [64, 156])])
def test_a_compiled_step_is_timed_at_a_quarter_and_three_quarters(n, windows, expected):
    assert win.quarter_starts(n, windows) == expected


def test_cost_cache_keys_differ_by_batch_and_model(tmp_path, counted, monkeypatch):
    model = tiny_llamagen(vocab_size=16, block_size=16)
    small = cached_window_costs(model, torch.zeros(2, dtype=torch.long), 16, cache_dir=tmp_path)
    large = cached_window_costs(model, torch.zeros(32, dtype=torch.long), 16, cache_dir=tmp_path)
    assert small != large and len(counted) == 2
    other = tiny_llamagen(vocab_size=16, block_size=16, n_layer=3)
    cached_window_costs(other, torch.zeros(2, dtype=torch.long), 16, cache_dir=tmp_path)
    assert len(counted) == 3
    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path))  # the same file through the environment
    cached_window_costs(model, torch.zeros(2, dtype=torch.long), 16)
    assert len(counted) == 3
    assert len(json.loads((tmp_path / "window_costs.json").read_text())) == 3


def test_a_table_timed_by_other_code_is_measured_again(tmp_path, counted, monkeypatch):
    """The key holds a hash of the step's source: a change to a file of it (here a stand-in
    package) is a new key, so the table is timed again; the unchanged code reads it."""
    from visualspec.core import window_costs

    package = tmp_path / "stepcode"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "step.py").write_text("COST = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(window_costs, "STEP_CODE", ("stepcode",))
    window_costs.code_version.cache_clear()
    model = tiny_llamagen(vocab_size=16, block_size=16)
    measure = lambda: cached_window_costs(model, torch.zeros(2, dtype=torch.long), 16, cache_dir=tmp_path)  # noqa: E731
    measure()
    measure()
    assert len(counted) == 1
    (package / "step.py").write_text("COST = 2\n")
    window_costs.code_version.cache_clear()
    measure()
    assert len(counted) == 2
    window_costs.code_version.cache_clear()  # the next test reads the real code's version


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"x": 3}', ""])
def test_corrupt_cost_cache_is_measured_again(tmp_path, counted, content):
    (tmp_path / "window_costs.json").write_text(content)
    model = tiny_llamagen(vocab_size=16, block_size=16)
    costs = cached_window_costs(model, torch.zeros(2, dtype=torch.long), 16, cache_dir=tmp_path)
    assert len(counted) == 1 and costs[1] > 0
    assert cached_window_costs(model, torch.zeros(2, dtype=torch.long), 16, cache_dir=tmp_path) == costs
    assert len(counted) == 1


def test_unwritable_cost_cache_only_warns(tmp_path, counted):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    model = tiny_llamagen(vocab_size=16, block_size=16)
    with pytest.warns(UserWarning, match="could not write"):
        costs = cached_window_costs(model, torch.zeros(2, dtype=torch.long), 16, windows=(1, 2), cache_dir=blocker)
    assert sorted(costs) == [1, 2] and len(counted) == 1


def test_a_cpu_is_named_with_its_instruction_set_and_cores():
    """Virtual machines report one model name for CPUs of different generations: cost tables are
    kept apart by the vector instructions torch uses and the core count."""
    import os

    from visualspec.core.window_costs import machine_name

    name = machine_name("cpu")
    assert torch.backends.cpu.get_cpu_capability() in name and f"{os.cpu_count()} cores" in name


def test_a_step_with_costly_drafts_is_priced_with_them_and_then_stays_ar(clock):
    """drafted_step: c(W) = forward(W) + drafts(W - 1). Drafts that cost more than they save make
    the policy take W = 1; the control, the same forwards priced alone, speculates."""
    proposals = []

    def draft_timer(n, k):  # 2 ms a draft: a small draft network's forward
        proposals.append((n, k))
        clock.now += 0.002 * k

    model = FakeModel(clock, fixed=1e-3, per_token=1e-5)
    plain = measure_window_costs(model, torch.zeros(1), 64, repeats=1)
    priced = measure_window_costs(model, torch.zeros(1), 64, repeats=1, forward=win.drafted_step(model, lambda: draft_timer))
    for w in plain:
        assert priced[w] == pytest.approx(plain[w] + 0.002 * (w - 1))
    start = win.window_start(64, win.WINDOWS)
    assert set(proposals) == {(start, w - 1) for w in plain if w > 1}  # W = 1 drafts nothing
    assert WindowPolicy({1: plain}).search(prior=0.6).window(1) > 1
    assert WindowPolicy({1: priced}).search(prior=0.6).window(1) == 1


def test_a_policy_that_decodes_as_ar_drops_the_drafter_in_the_engine():
    """A policy with ``as_ar`` decodes with plain AR's law and forwards whatever drafter and rule
    the caller passed (the same tokens as no drafter, one forward a token, the mode saying so);
    the same policy without it speculates (the control)."""
    from visualspec.core.engine import decode
    from visualspec.core.sampling import SamplingConfig
    from visualspec.core.verify import speculative_verify
    from visualspec.drafters import JacobiDrafter

    model = tiny_llamagen(vocab_size=8, block_size=64)
    prefix, sampling = torch.tensor([0, 1]), SamplingConfig(temperature=1.0)
    costs = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}

    def run(**kw):
        return decode(model, prefix, 64, sampling, generator=torch.Generator().manual_seed(3), mode="sjd", **kw)

    ar, ar_stats = run()
    tokens, stats = run(drafter=JacobiDrafter(8, "random"), rule=speculative_verify,
                        window=WindowPolicy({2: costs}, as_ar=True))
    assert torch.equal(tokens, ar) and stats.mode == "sjd as AR"
    assert stats.target_forwards == ar_stats.target_forwards == 64  # the prefill and 63 one-token steps
    _, control = run(drafter=JacobiDrafter(8, "random"), rule=speculative_verify, window=WindowPolicy({2: costs}))
    assert control.mode == "sjd" and control.target_forwards < 64


def test_a_fixed_policy_takes_the_window_whose_fixed_decode_committed_fastest():
    """tokens / cost: 1, 1.2 / 1.1, 2.4 / 1.5 = 1.6, 3.0 / 2.5 = 1.2 a second: W = 4 every step,
    whatever the steps commit; the same policy unfixed searches (the control: it moves)."""
    from visualspec.core.window import best_fixed_window

    costs, tokens = {1: 1.0, 2: 1.1, 4: 1.5, 8: 2.5}, {1: 1.0, 2: 1.2, 4: 2.4, 8: 3.0}
    assert best_fixed_window(costs, tokens) == 4
    assert best_fixed_window(costs, {}) == 1  # nothing seen beyond W = 1
    assert best_fixed_window({1: 1.0, 2: 2.0}, {2: 2.0}) == 1  # a tie goes to the smaller window
    fixed = WindowPolicy({2: costs}, tokens=tokens, fixed=True).search()
    for _ in range(20):
        assert fixed.window(2) == 4
        fixed.observe(4, torch.tensor([4.0]))
    moving = WindowPolicy({2: costs}, tokens=tokens).search(probe_every=4, probe_steps=2)
    seen = set()
    for _ in range(20):
        w = moving.window(2)
        seen.add(w)
        moving.observe(w, torch.tensor([float(w)]))
    assert seen != {4}


def test_split_steps():
    """sum ceil(c / w): 3 and 2 tokens take 3 + 2 steps of 1, 2 + 1 of 2, 1 + 1 of 4."""
    from visualspec.core.window import split_steps

    committed = torch.tensor([3, 2])
    assert [split_steps(committed, w) for w in (1, 2, 4, 8)] == [5, 3, 2, 2]
    with pytest.raises(ValueError, match="window"):
        split_steps(committed, 0)


def test_pooled_tokens_weigh_the_table_as_one_call():
    """t(W) = (N + S_W) / (N / t_0(W) + n_W): a table of N = 12 tokens at 4 a step (3 steps) and a
    call of 9 steps committing 1 each give (12 + 9) / (3 + 9) = 1.75; a window above every pooled
    one is the table's scaled as the largest pooled window moved (6 x 1.75 / 4), within [1, W];
    without pooled steps the table stays as it is; a pool adds a call's tokens and the steps of
    every w up to its window they stand for (ceil(c / w) each), and nothing above it."""
    from visualspec.core.window import CallPool, pooled_tokens

    assert pooled_tokens({1: 1.0, 4: 4.0, 8: 6.0}, {4: (9.0, 9)}, 12) == {1: 1.0, 4: 1.75, 8: 2.625}
    assert pooled_tokens({1: 1.0, 4: 4.0, 8: 2.0}, {4: (9.0, 9)}, 12)[8] == 1.0  # 0.875, clamped to 1
    assert pooled_tokens({1: 1.0, 2: 1.0, 4: 3.5}, {2: (30.0, 15)}, 12)[4] == 4.0  # 3.5 x 42 / 27, within 4
    assert pooled_tokens({1: 1.0, 4: 4.0, 8: 6.0}, {}, 12) == {1: 1.0, 4: 4.0, 8: 6.0}
    pool = CallPool("k", [1, 2, 4, 8])
    pool.add(4, [3, 1, 4])
    assert pool.pool == {2: (8.0, 5), 4: (8.0, 3)}
    pool.add(2, torch.tensor([2, 2]))
    assert pool.pool == {2: (12.0, 7), 4: (8.0, 3)}
    assert CallPool("other", [1, 2]).pool == {}  # kept per table
    CallPool.clear()
    assert pool.pool == {}


def test_the_cost_cache_is_parsed_again_only_when_it_changed(tmp_path, monkeypatch):
    """Calls read the cost file a few times each: an unchanged file is not parsed again, a rewritten
    one is (the control), and each read is the caller's own copy."""
    parsed = []
    parse = win._parse_tables
    monkeypatch.setattr(win, "_parse_tables", lambda path: parsed.append(path) or parse(path))
    path = tmp_path / "win.json"
    win._write_tables(path, {"a": {1: 0.5}})
    first = win._read_tables(path)
    first["a"][1] = 9.0  # a caller's own copy
    first["b"] = {1: 1.0}
    assert win._read_tables(path) == {"a": {1: 0.5}} and len(parsed) == 1
    win._write_tables(path, {"a": {1: 0.5}, "c": {2: 0.25}})
    assert win._read_tables(path) == {"a": {1: 0.5}, "c": {2: 0.25}} and len(parsed) == 2
    assert win._read_tables(tmp_path / "missing.json") == {}
