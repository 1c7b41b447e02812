"""The causal continuous-token model and CSpD through the engine: a draft identical to the target
gives AR's tokens with every draft accepted, rows are independent in a ragged batch, the model
saves and loads, and bad input is refused."""

import pytest
import torch

from drafters.harness import generators as _gens
from visualspec.core.continuous import decode_continuous
from visualspec.drafters import ContinuousDraftModelDrafter
from visualspec.models.continuous_ar import ContinuousARTransformer

N = 16  # a 4 x 4 grid


def tiny(seed: int, dim: int = 32) -> ContinuousARTransformer:
    """A tiny class-conditional model in float64 (so that a draft equal to the target gives equal
    densities, not merely close ones)."""
    torch.manual_seed(seed)
    m = ContinuousARTransformer(token_dim=4, dim=dim, n_layer=2, n_head=2, model_type="c2i", num_classes=10,
                                cls_token_num=1, block_size=N, prefix_rope="zeros", caption_positions=False,
                                head_depth=2, head_width=32, num_sampling_steps=10)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return m.eval().double()


LABELS = torch.tensor([1, 2, 3])


def _prefix(model, guidance):
    return LABELS if guidance == 1.0 else torch.cat([LABELS, model.null_condition(len(LABELS))])


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_a_draft_equal_to_the_target_gives_ar_tokens_with_every_draft_kept(guidance):
    target, same = tiny(0), tiny(0)
    ar, ar_stats = decode_continuous(target, _prefix(target, guidance), N, generator=_gens(), guidance_scale=guidance)
    sp, stats = decode_continuous(target, _prefix(target, guidance), N, drafter=ContinuousDraftModelDrafter(
        same, _prefix(same, guidance)), gamma=3, generator=_gens(), guidance_scale=guidance)
    assert ar_stats.target_forwards == N and ar.shape == (3, N, 4)
    assert torch.allclose(ar, sp, rtol=1e-9, atol=1e-9)
    assert set(stats.accepted_lengths[:-3]) == {4}  # gamma + 1 a step until the rows end
    assert stats.target_forwards == 1 + 4 and stats.residual_proposals == 0


def test_rows_decode_alike_alone_and_in_a_ragged_batch():
    # the draft is the target except for the embedding of class 3: rows of classes 1 and 2 keep every
    # draft, the row of class 3 has some rejected, so the rows commit different counts. (A random
    # head's token barely depends on z; its condition weights are scaled up so that it does.)
    target, draft = _ragged_pair()
    batch, stats = decode_continuous(target, LABELS, N, drafter=ContinuousDraftModelDrafter(draft, LABELS), gamma=3,
                                     generator=_gens())
    histograms = []
    for b in range(3):
        alone, s = decode_continuous(target, LABELS[b:b + 1], N, drafter=ContinuousDraftModelDrafter(draft, LABELS[b:b + 1]),
                                     gamma=3, generator=_gens((b,)))
        assert torch.allclose(alone[0], batch[b], rtol=1e-7, atol=1e-7)
        histograms.append(tuple(s.accepted_lengths))
    assert len(set(histograms)) > 1  # the rows accepted different counts, so the batch was ragged
    assert 1 < stats.mean_accepted < 4 and stats.residual_proposals > 0 and stats.residual_fallbacks == 0


def test_prefill_leaves_the_first_tokens_to_the_target():
    target, same = tiny(0), tiny(0)
    ar, _ = decode_continuous(target, LABELS, N, generator=_gens())
    sp, stats = decode_continuous(target, LABELS, N, drafter=ContinuousDraftModelDrafter(same, LABELS), gamma=3,
                                  prefill=0.5, generator=_gens())
    assert torch.allclose(ar, sp, rtol=1e-9, atol=1e-9)
    # 7 steps of one token reach position 8 = 0.5 N, then two steps of 4: 1 + 7 + 2 forwards
    assert stats.target_forwards == 10 and stats.accepted_lengths[:3 * 7] == [1] * 21


def _ragged_pair():
    """A draft that is the target except for the embedding of class 3 (see below)."""
    target, draft = tiny(0), tiny(0)
    for model in (target, draft):
        model.diffloss.net.cond_embed.weight.data *= 1000
    table = draft.backbone.cls_embedding.embedding_table.weight
    table.data[3] += torch.randn(table.shape[1], generator=torch.Generator().manual_seed(9), dtype=table.dtype)
    return target, draft


def test_flattening_the_ratio_keeps_more_drafts():
    target, draft = _ragged_pair()
    kept = []
    for flatten in (1.0, 42.0):
        _, stats = decode_continuous(target, LABELS, N, drafter=ContinuousDraftModelDrafter(draft, LABELS), gamma=3,
                                     flatten=flatten, generator=_gens())
        kept.append(stats.mean_accepted)
    assert kept[1] > kept[0]


def test_the_model_saves_and_loads(tmp_path):
    model = tiny(0).float()
    model.save_pretrained(tmp_path / "m")
    loaded = ContinuousARTransformer.from_pretrained(tmp_path / "m").eval()
    a, _ = decode_continuous(model, LABELS, N, generator=_gens())
    b, _ = decode_continuous(loaded, LABELS, N, generator=_gens())
    assert torch.equal(a, b)


def test_bad_input_gets_a_clear_error():
    target = tiny(0)
    with pytest.raises(ValueError, match="gamma"):
        decode_continuous(target, LABELS, N, drafter=ContinuousDraftModelDrafter(tiny(1), LABELS), gamma=0)
    with pytest.raises(ValueError, match=r"pre-fill fraction must lie in \[0, 1\)"):
        decode_continuous(target, LABELS, N, prefill=1.0)
    with pytest.raises(ValueError, match="2 generators for a batch of 3"):
        decode_continuous(target, LABELS, N, generator=_gens((0, 1)))
    target.prefill(LABELS, N)
    with pytest.raises(ValueError, match=r"\(B, L, 4\)"):
        target.forward_window(torch.zeros(3, 2, 8, dtype=torch.float64), 0)
