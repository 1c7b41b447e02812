"""The decode engine on real model code: greedy equivalences, cached windows, cache crop, stats."""

import pytest
import torch

from conftest import tiny_hf, tiny_llamagen
from visualspec.drafters import DraftModelDrafter, JacobiDrafter
from visualspec.drafters.jacobi import FUSED_WIDTH
from visualspec.core.constraints import TokenConstraints
from visualspec.core.engine import decode
from visualspec.models.hf import HFCausalLM
from visualspec.core.sampling import SamplingConfig
from visualspec.core.verify import default_rule, greedy_verify, speculative_verify

GREEDY = SamplingConfig(temperature=0)


def _t2i_prefix(model, rows=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    caps = torch.randn(rows, model.config.cls_token_num, model.config.caption_dim, generator=g, dtype=model.dtype)
    mask = torch.ones(rows, model.config.cls_token_num, dtype=torch.long)
    mask[1, :3] = 0  # a left-padded caption
    return caps, mask


@pytest.mark.parametrize("static_step", [False, True], ids=["keys-so-far", "static-step"])
@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_cached_windows_equal_the_full_forward(model_type, static_step):
    kw = dict(caption_dim=8, cls_token_num=5) if model_type == "t2i" else {}
    model = tiny_llamagen(vocab_size=32, block_size=64, model_type=model_type, **kw)
    model.static_step = static_step  # every cache slot, masked: the same logits
    prefix = _t2i_prefix(model) if model_type == "t2i" else torch.tensor([0, 1, 2])
    tokens = torch.randint(0, 32, (3, 64))
    cond, mask = prefix if model_type == "t2i" else (prefix, None)
    full = model(cond, tokens, cond_mask=mask)
    torch.testing.assert_close(model.prefill(prefix, 64), full[:, 0])
    start = 0
    for length in (1, 7, 16, 3):  # uneven windows, like Jacobi steps
        out = model.forward_window(tokens[:, start:start + length], start)
        torch.testing.assert_close(out, full[:, start + 1:start + 1 + length])
        start += length
    # overwrite after a "crop": a later window at an earlier position sees fresh keys only
    other = torch.randint(0, 32, (3, 4))
    out = model.forward_window(other, 10)
    ref = model(cond, torch.cat([tokens[:, :10], other, tokens[:, 14:]], 1), cond_mask=mask)
    torch.testing.assert_close(out, ref[:, 11:15])


def test_head_dim_100_like_llamagen_3b_works():
    model = tiny_llamagen(vocab_size=16, block_size=16, dim=200, n_head=2)  # head_dim 100, as in GPT-3B
    tokens = torch.randint(0, 16, (2, 16))
    full = model(torch.tensor([0, 1]), tokens)
    model.prefill(torch.tensor([0, 1]), 16)
    torch.testing.assert_close(model.forward_window(tokens[:, :15], 0), full[:, 1:])


def test_condition_prefix_has_zero_rotary_table():
    model = tiny_llamagen(vocab_size=16, block_size=16, model_type="t2i", caption_dim=8, cls_token_num=5)
    assert model.rope.shape[0] == 5 + 16 and model.rope[:5].abs().sum() == 0 and model.rope[5:, :, 0].abs().sum() > 0


@pytest.mark.parametrize("init", ["repeat_left", "repeat_above"])
def test_jacobi_fill_follows_sources_inside_the_window(init):
    """Fresh drafts copy their source (left, or one image row up), which may be another fresh
    position of the same window; carried positions keep their carried token. Checked against the
    token-by-token definition, with windows longer than an image row so chains cross rows."""
    g, V, N = 4, 50, 24
    drafter = JacobiDrafter(V, init, grid_width=g)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (3, N), generator=gen)
    n = torch.tensor([1, 5, 9])
    for k, count in [(11, [0, 0, 0]), (11, [3, 0, 6]), (7, [7, 2, 1])]:
        drafter.start(3, N, GREEDY)
        carried = torch.randint(0, V, (3, k), generator=gen)
        if any(count):
            drafter.carry = (carried, torch.full((3, k, V), 1.0 / V), torch.tensor(count))
        drafts, _ = drafter.propose(tokens, n, k)
        for b in range(3):
            seq = tokens[b].tolist() + [None] * k
            for j in range(k):
                pos = int(n[b]) + j
                if j < count[b]:
                    seq[pos] = int(carried[b, j])
                else:
                    seq[pos] = seq[pos - g if init == "repeat_above" and pos >= g else pos - 1]
            assert drafts[b].tolist() == seq[int(n[b]):int(n[b]) + k], (k, count, b)


def test_a_fused_step_widens_the_jacobi_carry_without_changing_the_drafts():
    """A fused step reads the Jacobi carry at one width (:data:`FUSED_WIDTH` columns); a carry an
    unfused step left narrower is widened, and proposes the drafts and laws it proposed before."""
    V, gen = 8, torch.Generator().manual_seed(0)
    drafter = JacobiDrafter(V)
    drafter.start(2, 16, SamplingConfig())
    probs = torch.softmax(torch.randn(2, 3, V, generator=gen), -1)
    drafter.observe(torch.tensor([1, 1]), torch.tensor([1, 0]), probs, gen)
    assert drafter.carry[0].shape[1] == 3
    tokens = torch.randint(0, V, (2, 16), generator=gen)
    n = torch.tensor([2, 1])
    narrow = drafter.propose(tokens, n, 5, torch.Generator().manual_seed(1))
    carried, laws, count = drafter.step_state(2)
    assert carried.shape == (2, FUSED_WIDTH) and laws.shape == (2, FUSED_WIDTH, V) and count.tolist() == [2, 3]
    wide = drafter.propose(tokens, n, 5, torch.Generator().manual_seed(1))
    assert torch.equal(wide[0], narrow[0]) and torch.equal(wide[1], narrow[1])


def test_a_fused_step_forces_the_constraints_drafts_as_the_engine_does():
    """Under constraints a fused Jacobi step makes the window the unfused step makes: the drafter's
    proposal (random fresh drafts, a carry on one row) with the forced positions' tokens put in at
    a point-mass law (``TokenConstraints.force_drafts``), from the constraints' tables."""
    V, N, k, gen = 8, 12, 6, torch.Generator().manual_seed(0)
    constraints = TokenConstraints(torch.tensor([-1, -1, 7, -1, -1, 7, -1, -1, 7, -1, -1, 6]))
    drafter = JacobiDrafter(V)
    drafter.start(2, N, SamplingConfig())
    drafter.observe(torch.tensor([1, 1]), torch.tensor([1, 0]), torch.softmax(torch.randn(2, 3, V, generator=gen), -1),
                    gen)
    tokens, n = torch.randint(0, V, (2, N), generator=gen), torch.tensor([2, 4])
    state = drafter.step_state(2)
    drafts, q = drafter.propose(tokens, n, k, torch.Generator().manual_seed(1))
    drafts, q = constraints.force_drafts(drafts, q, n[:, None] + torch.arange(k), V)
    step = drafter.fused_step(SamplingConfig(), default_rule(SamplingConfig()), N, constraints=constraints.step)
    uniforms = step.uniforms(2, k, torch.Generator().manual_seed(1))
    window, args = step.window(torch.zeros(2, k + 1, dtype=torch.long), torch.arange(2), tokens, n,
                               torch.zeros(2, N, dtype=torch.long), torch.ones(2, dtype=torch.long), *state, *uniforms,
                               *constraints.tables(2, V))
    assert (drafts == 7).sum() >= 3  # the forced positions in the windows hold their token
    assert torch.equal(window[:, 1:], drafts) and torch.equal(args[6], drafts) and torch.equal(args[7], q)


@pytest.mark.parametrize("init", ["random", "repeat_left", "repeat_above"])
@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_greedy_sjd_equals_greedy_ar_for_llamagen(init, model_type):
    kw = dict(caption_dim=8, cls_token_num=5) if model_type == "t2i" else {}
    model = tiny_llamagen(vocab_size=32, block_size=64, model_type=model_type, std=0.3, **kw)
    prefix = _t2i_prefix(model) if model_type == "t2i" else torch.tensor([0, 1, 2])
    ar, ar_stats = decode(model, prefix, 64, GREEDY, rule=greedy_verify)
    sjd, stats = decode(model, prefix, 64, GREEDY, drafter=JacobiDrafter(32, init, grid_width=8), rule=greedy_verify,
                        window=8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ar, sjd)
    assert ar_stats.target_forwards == 64 and stats.forwards_per_sequence < 64


def test_greedy_draft_model_decoding_equals_greedy_ar():
    target = tiny_llamagen(seed=0, vocab_size=32, block_size=64, std=0.3)
    draft = tiny_llamagen(seed=0, vocab_size=32, block_size=64, std=0.3)  # a perfect draft: all accepted
    labels = torch.tensor([0, 2])
    ar, _ = decode(target, labels, 64, GREEDY, rule=greedy_verify)
    spec, stats = decode(target, labels, 64, GREEDY, drafter=DraftModelDrafter(draft, labels), rule=greedy_verify,
                         window=5)
    assert torch.equal(ar, spec)
    assert stats.steps == 2 * 13  # both rows accept every draft: 12 full windows of 5 tokens, then the last 3
    weak = tiny_llamagen(seed=3, vocab_size=32, block_size=64, dim=16, n_layer=1, std=0.3)
    spec, stats = decode(target, labels, 64, GREEDY, drafter=DraftModelDrafter(weak, labels), rule=greedy_verify,
                         window=4)
    assert torch.equal(ar, spec) and stats.draft_forwards > 0


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_greedy_sjd_equals_transformers_generate(family, static):
    model = tiny_hf(family)
    ids = torch.randint(2, 64, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    ids[1, :2] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                         eos_token_id=None)[:, 6:]
    lm = HFCausalLM(model, static=static)
    ar, _ = decode(lm, (ids, mask), 24, GREEDY, rule=greedy_verify)
    sjd, _ = decode(lm, (ids, mask), 24, GREEDY, drafter=JacobiDrafter(64, "repeat_left"), rule=greedy_verify,
                    window=6)
    assert torch.equal(ar, ref) and torch.equal(sjd, ref)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_transformers_cache_crop_matches_a_fresh_prefix(static):
    lm = HFCausalLM(tiny_hf("llama"), static=static)
    ids = torch.randint(2, 64, (2, 5))
    window = torch.randint(2, 64, (2, 6))
    lm.prefill(ids, 16)
    lm.forward_window(window, 0)
    lm.crop(2)  # keep the first two generated positions only
    after_crop = lm.forward_window(window[:, 2:4], 2)
    lm.prefill(ids, 16)
    fresh = lm.forward_window(window[:, :4], 0)[:, 2:]
    torch.testing.assert_close(after_crop, fresh)
    assert lm.cache.get_seq_length() == 5 + 4


def test_batch_rows_decode_like_single_rows_in_greedy_mode():
    model = tiny_llamagen(vocab_size=32, block_size=64, std=0.3)
    labels = torch.tensor([0, 1, 2])
    batch, _ = decode(model, labels, 64, GREEDY, drafter=JacobiDrafter(32, "random"), rule=greedy_verify, window=6)
    for row in range(3):
        single, _ = decode(model, labels[row:row + 1], 64, GREEDY, rule=greedy_verify)
        assert torch.equal(batch[row], single[0])


def test_stats_account_for_every_token():
    model = tiny_llamagen(vocab_size=32, block_size=64, std=0.3)
    tokens, stats = decode(model, torch.tensor([0, 1]), 64, SamplingConfig(), drafter=JacobiDrafter(32, "random"),
                           rule=speculative_verify, window=8, generator=torch.Generator().manual_seed(0))
    assert stats.batch_size + sum(stats.accepted_lengths) == 2 * 64  # each row: its first token, then its steps
    assert int(stats.row_forwards.sum()) == stats.batch_size + stats.steps
    assert stats.target_forwards == int(stats.row_forwards.max())  # the rows ran side by side
    assert max(stats.accepted_lengths) <= 8 and sum(stats.accepted_histogram.values()) == stats.steps
    fixed = stats.acceptance_map(8, 8)
    assert fixed[0, 0] == 1 and fixed.max() == stats.row_forwards[0] and (fixed.flatten()[1:] >= fixed.flatten()[:-1]).all()
    image = stats.acceptance_map_image(8, 8, scale=4)
    assert image.size == (32, 32)
    with pytest.raises(ValueError, match="acceptance map"):
        stats.acceptance_map(4, 4)


def test_merged_stats_add_counts_and_join_records_of_every_field():
    from dataclasses import fields

    from visualspec.core.stats import DecodeStats, merge_decode_stats

    def part(n, base):  # every count differs, so a field left out or taken from one part shows
        return DecodeStats(mode="cspd", batch_size=n, num_tokens=4, target_forwards=base, draft_forwards=base + 1,
                           wall_time_s=base + 0.5, accepted_lengths=[base] * n, fixed_at=torch.full((n, 4), base),
                           row_forwards=torch.full((n,), base), slots=n, residual_proposals=base + 2,
                           residual_fallbacks=base + 3, drafts_proposed=base + 4, drafts_accepted=base + 5,
                           judged_tokens=base + 6, judged_at=torch.full((n, 4), base % 2 == 0))

    a, b = part(2, 10), part(3, 20)
    m = merge_decode_stats([a, b])
    assert (m.mode, m.num_tokens, m.batch_size, m.slots) == ("cspd", 4, 5, 3)
    for f in fields(DecodeStats):
        if f.name in ("mode", "num_tokens", "batch_size", "slots"):
            continue
        va, vb, vm = getattr(a, f.name), getattr(b, f.name), getattr(m, f.name)
        if isinstance(va, torch.Tensor):
            assert torch.equal(vm, torch.cat([va, vb])), f.name
        else:
            assert vm == va + vb, f.name
    assert merge_decode_stats([a]) is a


def test_engine_rejects_bad_arguments():
    model = tiny_llamagen(vocab_size=8, block_size=16)
    with pytest.raises(ValueError, match="window"):
        decode(model, torch.tensor([0]), 16, SamplingConfig(), drafter=JacobiDrafter(8), window=0)
    with pytest.raises(ValueError, match="num_tokens"):
        decode(model, torch.tensor([0]), 0, SamplingConfig())
    with pytest.raises(ValueError, match="init"):
        JacobiDrafter(8, "diagonal")
