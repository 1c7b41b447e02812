"""MAR: the official key layout of every size, strict loading of a training checkpoint, the
generation schedule, and generation that fills every position, row by row independently."""

import argparse
import json

import pytest
import torch

from conftest import FIXTURES
from visualspec.models.mar import MAR, unknown_after

LAYOUT = json.loads((FIXTURES / "mar_keys.json").read_text())


@pytest.mark.parametrize("name", sorted(LAYOUT["keys"]))
def test_every_official_size_has_the_official_keys_and_shapes(name):
    with torch.device("meta"):
        model = MAR.from_name(name)
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == LAYOUT["keys"][name]


def tiny(**kw) -> MAR:
    torch.manual_seed(0)
    model = MAR(img_size=64, vae_stride=16, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2,
                decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2, buffer_size=4, diffloss_d=1,
                diffloss_w=32, class_num=10, num_sampling_steps=10, **kw)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return model.eval()


def test_a_training_checkpoint_loads_strictly(tmp_path):
    model, ema = tiny(), tiny()
    for p in ema.parameters():
        p.data += 1.0
    path = tmp_path / "checkpoint-last.pth"
    torch.save({"model": model.state_dict(), "model_ema": ema.state_dict(), "epoch": 3,
                "args": argparse.Namespace(model="mar_tiny")}, path)
    overrides = dict(img_size=64, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2, decoder_embed_dim=32,
                     decoder_depth=1, decoder_num_heads=2, buffer_size=4, diffloss_d=1, diffloss_w=32, class_num=10,
                     num_sampling_steps=10)
    loaded = MAR.from_mar_checkpoint(str(path), "mar_base", **overrides)
    assert torch.equal(loaded.mask_token, ema.mask_token)  # the EMA weights by default, as MAR's demos
    assert torch.equal(MAR.from_mar_checkpoint(str(path), "mar_base", key="model", **overrides).mask_token,
                       model.mask_token)
    state = ema.state_dict()
    state.pop("z_proj.bias")
    state["extra.weight"] = torch.zeros(1)
    torch.save({"model_ema": state}, path)
    with pytest.raises(ValueError, match=r"1 missing \(z_proj.bias\); 1 unexpected \(extra.weight\)"):
        MAR.from_mar_checkpoint(str(path), "mar_base", **overrides)


@pytest.mark.parametrize("num_iter", [1, 4, 64, 256])
def test_the_schedule_draws_every_token_once(num_iter):
    unknown, drawn = 256, []
    for step in range(num_iter):
        left = unknown_after(step, num_iter, 256, unknown)
        drawn.append(unknown - left)
        unknown = left
    assert sum(drawn) == 256 and min(drawn) >= 1
    assert drawn[0] <= drawn[-1]  # few tokens early, many late
    if num_iter == 256:
        assert set(drawn) == {1}


@pytest.mark.parametrize("cfg, schedule", [(1.0, "linear"), (3.0, "linear"), (3.0, "constant")])
def test_generation_fills_every_position_and_rows_are_independent(cfg, schedule):
    model = tiny()
    labels = torch.tensor([1, 2, 3])
    gens = lambda: [torch.Generator().manual_seed(s) for s in range(3)]  # noqa: E731
    tokens = model.generate(labels, num_iter=4, cfg=cfg, cfg_schedule=schedule, generator=gens())
    assert tokens.shape == (3, 16, 16) and bool(torch.isfinite(tokens).all())
    assert bool((tokens != 0).any(-1).all())  # every position was drawn
    alone = model.generate(labels[1:2], num_iter=4, cfg=cfg, cfg_schedule=schedule,
                           generator=[torch.Generator().manual_seed(1)])
    # the same draws; float32 sums of a one-row and a three-row batch round apart, and the head's
    # sampling steps carry it (up to 1.5e-4 of a value on an AVX2 machine); another row's draws
    # would differ in every digit
    torch.testing.assert_close(alone[0], tokens[1], rtol=1e-3, atol=1e-5)
    assert model.unpatchify(tokens).shape == (3, 16, 4, 4)


def test_bad_input_gets_a_clear_error():
    model = tiny()
    with pytest.raises(ValueError, match="cfg_schedule"):
        model.generate(torch.tensor([1]), cfg=2.0, cfg_schedule="cosine")
    with pytest.raises(ValueError, match="num_iter"):
        model.generate(torch.tensor([1]), num_iter=0)
    with pytest.raises(ValueError, match="unknown MAR size"):
        MAR.from_name("mar_tiny")
