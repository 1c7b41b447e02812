"""The compiled decode step (#48): its bucket rules, the compiler's promises (each bucket compiled
once and announced, no silent recompile, a clear error when torch cannot compile), and a compiled
LlamaGen step that gives the eager step's logits and tokens."""

from unittest import mock

import pytest
import torch

from conftest import assert_guards_checked_once_a_decode, tiny_llamagen
from visualspec.core.compiled import CPP_WRAPPER, CompileError, StepCompiler, bucket_slots, check_compile, compile_mode, compile_pays
from visualspec.core.engine import Requests, decode, precompile_decode, step_sampler
from visualspec.core.sampling import SamplingConfig
from visualspec.core.verify import default_rule
from visualspec.drafters import JacobiDrafter


@pytest.mark.parametrize("needed, total, parts, expected", [
    (1, 272, 2, 136), (136, 272, 2, 136), (137, 272, 2, 272), (272, 272, 2, 272),
    (5, 21, 2, 11), (12, 21, 2, 21), (7, 21, 1, 21), (7, 21, 3, 7), (8, 21, 3, 14),
])
def test_slot_buckets_round_up_to_a_part_of_the_cache(needed, total, parts, expected):
    assert bucket_slots(needed, total, parts) == expected


@pytest.mark.parametrize("needed", [0, 273])
def test_slots_outside_the_cache_are_refused(needed):
    with pytest.raises(ValueError, match="slots needed of a cache of 272"):
        bucket_slots(needed, 272)


def test_compiling_pays_when_the_steps_repay_its_time():
    assert compile_pays(eager_s=2e-3, compiled_s=1e-3, compile_s=1.0, steps=1001)
    assert not compile_pays(eager_s=2e-3, compiled_s=1e-3, compile_s=1.0, steps=999)
    assert not compile_pays(eager_s=1e-3, compiled_s=2e-3, compile_s=0.0, steps=10 ** 6)  # slower never pays


@pytest.mark.parametrize("bad", ["yes", 1, None, "on"])
def test_compile_takes_true_false_or_auto(bad):
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        check_compile(bad)
    for good in (True, False, "auto"):
        check_compile(good)


def test_the_automatic_mode_captures_cuda_graphs_on_a_gpu_and_calls_kernels_from_cpp_on_a_cpu(monkeypatch):
    monkeypatch.delenv("VISUALSPEC_CPP_WRAPPER", raising=False)
    assert compile_mode("auto", torch.device("cuda:1")) == "reduce-overhead"
    assert compile_mode("auto", "cpu") == CPP_WRAPPER


def test_the_cpp_wrapper_can_be_turned_off_for_a_cpu(monkeypatch):
    monkeypatch.setenv("VISUALSPEC_CPP_WRAPPER", "0")
    assert compile_mode("auto", "cpu") is None
    assert compile_mode("auto", "cuda") == "reduce-overhead"
    assert compile_mode("max-autotune", "cpu") == "max-autotune" and compile_mode(None, "cuda") is None


def test_under_cuda_graphs_each_call_hands_back_its_own_copy():
    """What a CUDA graph returns lives in its memory pool, and the next replay overwrites it: the
    compiler marks a new step and copies the output out (on a CPU torch skips the graph, so this
    checks the path and its values, not the pool)."""
    compiler = StepCompiler(lambda x: x * 3, "the toy step", mode="reduce-overhead")
    first = compiler("four", torch.ones(4))
    with mock.patch.object(torch.compiler, "cudagraph_mark_step_begin") as begin:
        second = compiler("four", torch.full((4,), 2.0))
    begin.assert_called_once()
    assert first.tolist() == [3.0] * 4 and second.tolist() == [6.0] * 4


def test_each_bucket_compiles_once_and_is_announced(capsys):
    compiler = StepCompiler(lambda x: x * 2 + 1, "the toy step", describe=lambda key: f"bucket {key}")
    x = torch.arange(4.0)
    for _ in range(3):
        torch.testing.assert_close(compiler("four", x), x * 2 + 1)
    torch.testing.assert_close(compiler("five", torch.arange(5.0)), torch.arange(5.0) * 2 + 1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["compiling the toy step for bucket four",
                                                      "compiling the toy step for bucket five"]
    assert set(compiler.compile_s) == {"four", "five"}


def test_a_known_bucket_never_recompiles_silently():
    compiler = StepCompiler(lambda x: x * 2, "the toy step", describe=lambda key: f"bucket {key}")
    compiler("four", torch.arange(4.0))
    with pytest.raises(RuntimeError, match="wanted to recompile the already compiled bucket bucket four"):
        compiler("four", torch.arange(6.0))  # a caller that lies about its bucket: torch would recompile


def test_past_its_graphs_a_compiler_runs_new_buckets_eagerly_with_one_warning():
    compiler = StepCompiler(lambda x: x + 1, "the toy step", max_graphs=1)
    compiler(1, torch.zeros(2))
    with pytest.warns(UserWarning, match="1 shape buckets are compiled already; new ones .first: 2. run eagerly"):
        assert compiler(2, torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]
    assert compiler(3, torch.zeros(1)).tolist() == [1.0]  # no second warning
    assert compiler.eager == {2, 3}


class _Precompiles:
    """A compiled target that records its precompiles and cannot compile the posts in ``fails``."""
    compiled_step, takes_post, vocab_size = True, True, 16

    def __init__(self, fails=()):
        self.fails, self.calls = fails, []

    def precompile(self, prefix, num_tokens, windows, post=None):
        label = None if post is None else post.label
        self.calls.append((list(windows), label))
        if label in self.fails:
            raise CompileError("the toy step", "InductorError: TypeError: list indices must be integers")


@pytest.mark.parametrize("drafts, fails, calls", [
    (False, (), [([1], "sampling, rule and commit")]),  # the control: nothing fails, every post stays inside
    (False, ("sampling, rule and commit",), [([1], "sampling, rule and commit"), ([1], None)]),
    (True, (), [([8], "Jacobi drafts, sampling, rule and commit"), ([1], "sampling, rule and commit")]),
    (True, ("Jacobi drafts, sampling, rule and commit",),
     [([8], "Jacobi drafts, sampling, rule and commit"), ([8], None), ([1], None)]),
])
def test_a_step_torch_cannot_compile_with_its_rule_inside_falls_back_to_the_rule_after_it(drafts, fails, calls):
    target, sampling = _Precompiles(fails), SamplingConfig(top_k=4)
    run = lambda: precompile_decode(target, torch.zeros(1, 3, dtype=torch.long), 8, sampling, [1, 8], drafts=drafts,  # noqa: E731
                                    drafter=JacobiDrafter(16) if drafts else None)
    if fails:
        with pytest.warns(UserWarning, match=r"the toy step: torch could not compile the step with its "
                                             rf"{fails[0]} inside \(InductorError: .*\); they run after the "
                                             r"compiled forward instead"):
            run()
    else:
        run()
    assert target.calls == calls
    assert target.takes_post is not bool(fails)
    # the decode hands the step what was compiled: nothing, once a post failed
    assert (step_sampler(target, sampling, verifies=True) is None) is bool(fails)


def test_a_bare_step_torch_cannot_compile_still_raises():
    target = _Precompiles(fails=("sampling, rule and commit", None))
    with pytest.raises(CompileError, match="could not compile the step on this machine"), pytest.warns(UserWarning):
        precompile_decode(target, torch.zeros(1, 3, dtype=torch.long), 8, SamplingConfig(), [1], drafts=False)


def test_a_step_torch_cannot_compile_gets_an_error_that_says_what_to_do(monkeypatch):
    compiler = StepCompiler(lambda x: x, "the toy step")

    def no_compiler(*args):
        raise OSError("no C++ compiler found")

    monkeypatch.setattr(compiler, "compiled", no_compiler)
    with pytest.raises(RuntimeError, match=r"could not compile the step on this machine \(OSError: no C\+\+ "
                                           r"compiler found\); use compile=False"):
        compiler("any", torch.zeros(1))


def _prefix(model, rows=3):
    g = torch.Generator().manual_seed(0)
    caps = torch.randn(rows, model.config.cls_token_num, model.config.caption_dim, generator=g, dtype=model.dtype)
    mask = torch.ones(rows, model.config.cls_token_num, dtype=torch.long)
    mask[1, :3] = 0  # a left-padded caption
    return caps, mask


@pytest.fixture(scope="module")
def compiled_pair():
    """A tiny text-conditional GPT eager, and a copy of it compiled."""
    kw = dict(vocab_size=32, block_size=16, model_type="t2i", caption_dim=8, cls_token_num=5, dtype=torch.float32)
    eager, compiled = tiny_llamagen(**kw), tiny_llamagen(**kw)
    compiled.compile_step(True)
    return eager, compiled


@torch.no_grad()
def test_compiled_windows_give_the_eager_logits_and_finished_rows_stay_out(compiled_pair):
    eager, compiled = compiled_pair
    assert compiled.compiled_step and not eager.compiled_step
    prefix = _prefix(eager)
    tokens = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(1))
    compiled.precompile(prefix, 16, [1, 4])  # windows 1 and 4, each at both slot buckets
    graphs = set(compiled._compiler.compile_s)
    assert len(graphs) == 4
    for model in (eager, compiled):
        model.prefill(prefix, 16)
    start = 0
    for length in (4, 1, 4, 1, 4):  # crossing from the first slot bucket (11 of 21) into the second
        torch.testing.assert_close(compiled.forward_window(tokens[:, start:start + length], start),
                                   eager.forward_window(tokens[:, start:start + length], start))
        start += length
    for model in (eager, compiled):  # row 1 finished: two live rows, the compiled step pads the third
        model.select(torch.tensor([0, 2]))
    torch.testing.assert_close(compiled.forward_window(tokens[[0, 2], 14:15], 14),
                               eager.forward_window(tokens[[0, 2], 14:15], 14))
    for model in (eager, compiled):  # one live row of three: the eager step runs it (all three cost more)
        model.select(torch.tensor([1]))
    with mock.patch.object(compiled, "_compiled_window", side_effect=AssertionError("the compiled step ran")):
        torch.testing.assert_close(compiled.forward_window(tokens[[2], 15:16], 15),
                                   eager.forward_window(tokens[[2], 15:16], 15))
    assert set(compiled._compiler.compile_s) == graphs  # nothing compiled after precompile


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("window", [1, 4])
def test_decodes_with_the_compiled_step_give_the_eager_tokens(compiled_pair, window, temperature):
    """Greedy exactly; sampled too, for the same generator: the compiled logits differ from eager
    by rounding (below 1e-5), and the same sampler draws from them, so the law is the eager one
    (whose losslessness tests/core/test_lossless.py checks). Window 4 runs each Jacobi step whole
    inside the compiled step (only its precompiled graphs run)."""
    eager, compiled = compiled_pair
    prefix, sampling = _prefix(eager), SamplingConfig(temperature=temperature)
    drafter = None if window == 1 else JacobiDrafter(32)
    precompile_decode(compiled, prefix, 16, sampling, [window], drafts=drafter is not None, drafter=drafter)
    graphs = set(compiled._compiler.compile_s)
    ref, _ = decode(eager, prefix, 16, sampling, drafter=drafter, window=window,
                    generator=torch.Generator().manual_seed(3))
    out, stats = decode(compiled, prefix, 16, sampling, drafter=drafter, window=window,
                        generator=torch.Generator().manual_seed(3))
    assert torch.equal(out, ref)
    assert stats.target_forwards < 17 if window > 1 else stats.target_forwards == 16
    assert set(compiled._compiler.compile_s) == graphs


def _guided(model, rows=3):
    caps, mask = _prefix(model, rows)
    return torch.cat([caps, model.null_condition(rows).to(caps.dtype)]), torch.cat([mask, torch.ones_like(mask)])


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_sampling_and_rule_inside_the_compiled_step_give_the_engines_own_tokens(compiled_pair, temperature):
    """The compiled step samples, verifies and commits inside its graph (guidance pairing rows, the
    epsilon cut-off, top-k, then the lossless rule at the uniforms it would draw, the commit and the
    rows that wrote the stop token ended) and gives the tokens of the engine sampling, verifying and
    committing outside the step (a target that takes no sampler), with rows finishing apart (a stop
    token; Jacobi's ragged acceptance) so that the step pads its rows and the rule's arguments;
    sampled and greedy. The drafts of a coupled Jacobi drafter (which has no
    fused step) come from the engine; the fused steps' are the next test's."""
    eager, compiled = compiled_pair
    sampling = SamplingConfig(temperature=temperature, guidance_scale=3.0, top_k=20, epsilon_cutoff=0.01)
    prefix = _guided(eager)
    eager.takes_post = False  # the engine's own distributions and rule
    try:
        for drafter, window in ((None, 1), (JacobiDrafter(32, coupling=True), 4)):
            post = step_sampler(compiled, sampling, verifies=True, commits=(16, 8))  # the decode's: stop token 8
            assert post is not None and step_sampler(eager, sampling) is None
            assert drafter is None or drafter.fused_step(sampling, default_rule(sampling), 16) is None
            compiled.precompile(prefix, 16, [window], post=post)
            graphs = set(compiled._compiler.compile_s)
            padded = []
            step = compiled._compiled_window
            with mock.patch.object(compiled, "_compiled_window",
                                   side_effect=lambda tokens, *a: padded.append(len(tokens) < 6) or step(tokens, *a)):
                runs = [decode(model, prefix, 16, sampling, drafter=drafter, window=window, stop_token=8,
                               generator=[torch.Generator().manual_seed(r) for r in range(3)])
                        for model in (eager, compiled)]
            (ref, _), (out, _) = runs
            assert torch.equal(out, ref)
            assert any(padded) and not all(padded), "a row should finish first, and the step pad its rows"
            assert set(compiled._compiler.compile_s) == graphs  # the precompiled graphs ran the decode
    finally:
        del eager.takes_post


class _Windows:
    """A window policy whose search takes the ``(window, sibling tree)`` options ``cycle`` in turn
    (a stand-in for the measured search, whose choices depend on timings)."""

    def __init__(self, cycle):
        self.cycle = cycle

    def search(self, **_):
        return self

    def option(self, rows, extra=None):
        self.cycle = self.cycle[1:] + self.cycle[:1]
        return self.cycle[-1]

    def observe(self, *_, **__):
        pass


@torch.no_grad()
def test_a_whole_jacobi_step_inside_the_compiled_step_gives_the_engines_own_tokens(compiled_pair):
    """A Jacobi step run whole inside the compiled step (the drafts from the carry and the
    initialisation, the forward, the sampling and rule, the commit, the Jacobi update: one graph,
    :class:`~visualspec.drafters.JacobiStep`) gives the engine's own tokens and acceptance map, with
    rows finishing apart and refilled from a queue (continuous batching, one generator per request)
    and windows that change from step to step, one-token steps (which run unfused) among them.
    Sampled, with drafts initialised by repeating the row above; the ``random`` initialisation,
    sampled and greedy, is the test of compiled decodes above (each case a few graphs more to
    compile)."""
    eager, compiled = compiled_pair
    sampling, init = SamplingConfig(guidance_scale=3.0, top_k=20, epsilon_cutoff=0.01), "repeat_above"
    caps, mask = _prefix(eager, 5)
    requests = lambda: Requests(5, lambda ids: (torch.cat([caps[ids], eager.null_condition(len(ids)).to(caps.dtype)]),
                                                torch.cat([mask[ids], torch.ones_like(mask[ids])])), slots=3)
    drafter = lambda: JacobiDrafter(32, init, grid_width=4)
    assert drafter().fused_step(sampling, default_rule(sampling), 16) is not None
    precompile_decode(compiled, requests().prefix([0, 1, 2]), 16, sampling, [1, 4], drafts=True, auto=True,
                      drafter=drafter())
    graphs = set(compiled._compiler.compile_s)
    fused = []
    step = compiled._compiled_window
    with mock.patch.object(compiled, "_compiled_window",
                           side_effect=lambda tokens, pos, f, post, args: fused.append(hasattr(post, "window"))
                           or step(tokens, pos, f, post, args)):
        runs = [decode(model, requests(), 16, sampling, drafter=drafter(), window=_Windows([(4, False), (1, False)]),
                       generator=[torch.Generator().manual_seed(r) for r in range(5)])
                for model in (eager, compiled)]
    (ref, ref_stats), (out, stats) = runs
    assert torch.equal(out, ref) and torch.equal(stats.fixed_at, ref_stats.fixed_at)
    assert stats.target_forwards == ref_stats.target_forwards
    assert any(fused) and not all(fused), "the drafted steps run fused, the one-token steps do not"
    assert set(compiled._compiler.compile_s) == graphs  # the precompiled graphs ran the decode


@torch.no_grad()
def test_guards_are_checked_once_a_decode_then_skipped(compiled_pair):
    """After a prefill, a compiled bucket's first call checks torch's guards and the later calls
    skip them; a change its bucket key does not name (a weight's layout) is caught at the first call
    after the next prefill, with the error that names the bucket, instead of running silently."""
    _, compiled = compiled_pair
    prefix, tokens = _prefix(compiled), torch.zeros(3, 1, dtype=torch.long)
    compiled.precompile(prefix, 16, [1])
    assert_guards_checked_once_a_decode(lambda: compiled.prefill(prefix, 16),
                                        lambda position: compiled.forward_window(tokens, position), compiled.output)


@torch.no_grad()
def test_the_eager_step_comes_back_when_compiling_is_switched_off(compiled_pair):
    _, compiled = compiled_pair
    compiled.compile_step(False)
    try:
        prefix = _prefix(compiled)
        compiled.prefill(prefix, 16)
        graphs = set(compiled._compiler.compile_s)
        compiled.forward_window(torch.zeros(3, 2, dtype=torch.long), 0)  # window 2: never compiled
        assert set(compiled._compiler.compile_s) == graphs and not compiled.compiled_step
    finally:
        compiled.compile_step(True)


@torch.no_grad()
def test_a_second_prefill_empties_and_reuses_the_cache_buffers(compiled_pair):
    """A CUDA graph bakes the cache's addresses in: a prefill of the same shape reuses the buffers
    (emptied: the logits are a fresh model's), one of another shape makes new ones."""
    eager, _ = compiled_pair
    prefix = _prefix(eager)
    tokens = torch.randint(0, 32, (3, 6), generator=torch.Generator().manual_seed(2))
    eager.prefill(prefix, 16)
    first = eager.forward_window(tokens, 0)
    buffers = [b.data_ptr() for b in (*eager._cache[0], *eager._cache[1])]
    eager.prefill(prefix, 16)
    assert [b.data_ptr() for b in (*eager._cache[0], *eager._cache[1])] == buffers
    assert all(int((b[:, :, 5:] != 0).sum()) == 0 for b in eager._cache[0])  # only the caption's slots written
    torch.testing.assert_close(eager.forward_window(tokens, 0), first)
    eager.prefill(tuple(x[:2] for x in prefix), 16)
    assert eager._cache[0][0].shape[0] == 2 and eager._cache[0][0].data_ptr() not in buffers


def test_a_compiled_steps_costs_are_kept_apart_per_wrapper(monkeypatch):
    from visualspec.core.window_costs import cost_signature

    monkeypatch.delenv("VISUALSPEC_CPP_WRAPPER", raising=False)
    model = tiny_llamagen()
    cpp, eager = cost_signature(model, 2, 4, compiled=True), cost_signature(model, 2, 4, compiled=False)
    monkeypatch.setenv("VISUALSPEC_CPP_WRAPPER", "0")
    assert cost_signature(model, 2, 4, compiled=True) != cpp  # timed under another wrapper: not reused
    assert cost_signature(model, 2, 4, compiled=False) == eager
    assert cpp.endswith("|compiled") and f"mode={CPP_WRAPPER}" in cpp


def test_dense_gives_row_major_strides_even_where_every_dimension_but_one_is_size_1():
    """A compiled step's guards compare strides: one row's column of a (1, N) buffer (stride N along
    its one dimension, yet contiguous) must reach the graph as a fresh (1,) tensor does."""
    from visualspec.core.compiled import dense, dense_args, row_major

    buffer = torch.arange(128).view(1, 128)
    cases = [buffer[:, 0], buffer[:, 5:6], torch.arange(12).view(3, 4).T, torch.arange(15).view(3, 1, 5)[:, :, 1:2]]
    for x in cases:
        out = dense(x)
        assert out.stride() == row_major(out.shape) and torch.equal(out, x) and out is not x
    plain = torch.arange(6).view(2, 3)
    assert dense(plain).data_ptr() == plain.data_ptr()  # row-major already: a view, no copy
    first, again = dense_args([plain, plain])
    assert first is plain and again is not plain and torch.equal(again, plain)


def test_a_guard_failure_that_does_not_repeat_is_tried_again_with_every_guard():
    """torch's stance is process-wide: another thread's call can fail a compiled call's guards once.
    The call is tried again with every guard evaluated; a failure that repeats still names the bucket."""
    compiler = StepCompiler(lambda x: x * 2, "the toy step", describe=lambda key: f"bucket {key}")
    compiler("four", torch.arange(4.0))
    run, calls = compiler._run, []

    def flaky(*args):
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("Detected recompile when torch.compile stance is 'fail_on_recompile'")
        return run(*args)
    compiler._run = flaky
    torch.testing.assert_close(compiler("four", torch.arange(4.0)), torch.arange(4.0) * 2)
    assert calls == [0, 1]
    with pytest.raises(RuntimeError, match="wanted to recompile the already compiled bucket bucket four"):
        compiler("four", torch.arange(6.0))  # a real change fails both tries
