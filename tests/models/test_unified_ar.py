"""Unified-vocabulary image generation on transformers' Chameleon (tiny, built offline): the
Lumina-mGPT layout, structural tokens forced inside Jacobi windows, greedy SJD against greedy AR,
and the exact law by chi-square with guidance and with a per-position guidance schedule, each with
a control that makes the decode ignore what it tests, both where the constraints apply inside the
model's step (its ``post``) and where the engine applies them; Lumina-mGPT 2.0's schedule."""

import pytest
import torch

from visualspec.core import rows as engine
from visualspec.core.constraints import StepConstraints, scales_at
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import JacobiDrafter
from visualspec.models.unified_ar import ImageLayout, UnifiedImageLM, chameleon_layout, lumina2_guidance

BOS, PAD, SEP = 1, 3, 24
START, ROW_END, END = 21, 26, 22


def code_name(c):
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(c)) + "Z"


def tiny_vocabulary():
    vocab = {"<unk>": 0, "<s>": BOS, "</s>": 2, "<pad>": PAD}
    vocab.update({code_name(c): 4 + c for c in range(16)})  # codes 0..15 are tokens 4..19
    vocab.update({"<image>": 20, "<racm3:break>": START, "<eoss>": END, "<reserved08800>": 23,
                  "<reserved08706>": SEP, "<reserved08801>": 25, "<reserved08799>": ROW_END,
                  "<reserved08802>": 27})
    vocab.update({f"w{i}": i for i in range(28, 64)})
    return vocab


def tiny_chameleon(seed=0):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    config = ChameleonConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                             vocabulary_map=tiny_vocabulary(), pad_token_id=PAD, bos_token_id=BOS,
                             vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                                            channel_multiplier=[1, 2], num_res_blocks=1, resolution=32,
                                            attn_resolutions=[]))
    model = ChameleonForConditionalGeneration(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.double().eval()


def prefix(layout, rows, guided, prompt=(BOS, 30, 31, SEP)):
    """The prompt then the image opening; under guidance the unconditional rows hold the opening
    alone (Lumina's image-only context), left-padded."""
    cond = torch.tensor([list(prompt) + list(layout.opening)] * rows)
    if not guided:
        return cond, torch.ones_like(cond)
    uncond = torch.full_like(cond, PAD)
    uncond[:, -len(layout.opening):] = torch.tensor(layout.opening)
    mask = torch.cat([torch.ones_like(cond), (uncond != PAD).long()])
    return torch.cat([cond, uncond]), mask


def test_the_layout_places_row_ends_and_the_end():
    layout = ImageLayout(tuple(range(4, 20)), height=2, width=3, row_end=ROW_END, ending=(END,))
    assert layout.num_tokens == 9 and layout.row_length == 4
    assert layout.forced().tolist() == [-1, -1, -1, ROW_END, -1, -1, -1, ROW_END, END]
    tokens = torch.tensor([[4, 5, 6, ROW_END, 19, 18, 17, ROW_END, END]])
    assert layout.codes(tokens).tolist() == [[[0, 1, 2], [15, 14, 13]]]
    with pytest.raises(ValueError, match="not an image code"):
        layout.codes(torch.tensor([[4, 5, 30, ROW_END, 19, 18, 17, ROW_END, END]]))
    with pytest.raises(ValueError, match="height in codes"):
        ImageLayout((4,), height=0, width=3)
    with pytest.raises(ValueError, match="also an image code"):
        ImageLayout((4, ROW_END), height=1, width=1, row_end=ROW_END)
    janus = ImageLayout((4, 5), height=2, width=2)  # no row ends, no end token
    assert janus.num_tokens == 4 and janus.forced().tolist() == [-1] * 4


def test_the_chameleon_layout_comes_from_the_vocabulary():
    layout = chameleon_layout(tiny_vocabulary(), height=2, width=2)
    assert layout.code_tokens == tuple(range(4, 20))
    assert layout.opening == (START, 25, 25) and layout.row_end == ROW_END and layout.ending == (END,)
    vocab = tiny_vocabulary()
    del vocab["<reserved08799>"]
    with pytest.raises(ValueError, match="no <reserved08799> token"):
        chameleon_layout(vocab, 2, 2)
    with pytest.raises(ValueError, match="32-pixel cells"):
        chameleon_layout(tiny_vocabulary(), 3, 2)


def test_the_adapter_reads_the_image_logits_transformers_masks():
    model = tiny_chameleon()
    ids = torch.tensor([[BOS, 30, START]])
    own = model(input_ids=ids).logits[0, -1, 4:20]
    assert bool((own < -1e30).all())  # transformers' Chameleon never emits an image token
    raw = UnifiedImageLM(model).prefill(ids, 4)[0, 4:20]
    assert bool(torch.isfinite(raw).all()) and raw.std() > 0


@pytest.mark.parametrize("guided", [False, True], ids=["plain", "guided"])
def test_greedy_sjd_equals_greedy_ar_across_row_ends(guided):
    model = UnifiedImageLM(tiny_chameleon(seed=1))
    layout = chameleon_layout(tiny_vocabulary(), height=4, width=4)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0 if guided else 1.0)
    constraints = layout.constraints(model.vocab_size)
    ar, ar_stats = decode(model, prefix(layout, 2, guided), layout.num_tokens, sampling, constraints=constraints)
    sjd, stats = decode(model, prefix(layout, 2, guided), layout.num_tokens, sampling, constraints=constraints,
                        drafter=JacobiDrafter(64, "repeat_above", grid_width=layout.row_length), window=8)
    assert torch.equal(ar, sjd)
    assert layout.codes(sjd).shape == (2, 4, 4)  # every code position holds a code, every row end its token
    assert stats.structural_tokens == ar_stats.structural_tokens == 2 * (4 + 1)
    assert stats.target_forwards < ar_stats.target_forwards


N_CODES = 4  # codes 0..3 only, so the 4 code positions of a 2x2 image have 256 sequences
GUIDED = SamplingConfig(guidance_scale=2.0, temperature=0.9)


def small_layout():
    return ImageLayout(tuple(range(4, 4 + N_CODES)), height=2, width=2, row_end=ROW_END, ending=(END,),
                       opening=(START,))


def constrained_fit(model, layout, samples=20000):
    constraints = layout.constraints(model.vocab_size)
    make = lambda rows: prefix(layout, rows, True)  # noqa: E731
    drafter = lambda rows: JacobiDrafter(64, "repeat_above", grid_width=layout.row_length)  # noqa: E731
    _, stats = decode(model, make(64), layout.num_tokens, GUIDED, drafter=drafter(64), window=4,
                      constraints=constraints, generator=torch.Generator().manual_seed(0))
    assert stats.row_forwards.unique().numel() > 1, "every row accepted alike: not a ragged batch"
    seqs, probs = exact_sequence_distribution(model, make, layout.num_tokens, GUIDED, constraints)
    assert len(seqs) == N_CODES ** 4
    drawn = sample_sequences(model, make, layout.num_tokens, GUIDED, samples, window=4, constraints=constraints,
                             drafter_factory=drafter)
    return chi_square_fit(drawn, seqs, probs)


@pytest.fixture(params=["in the step", "in the engine"])
def where(request, monkeypatch):
    """Where a window's distributions, constraints and rule run: inside the model's step (the
    adapter takes the engine's ``post``) or in the engine around a model that takes none."""
    if request.param == "in the engine":
        monkeypatch.setattr(UnifiedImageLM, "posts_inside", False)
    return request.param


def test_sjd_with_structural_tokens_and_guidance_is_lossless(where):
    """Windows of 4 run across the row ends and the end token (3 of 7 positions are structural)."""
    fit = constrained_fit(UnifiedImageLM(tiny_chameleon(seed=2)), small_layout())
    assert fit.passed, fit


def test_the_harness_catches_windows_that_forget_the_constraints(where, monkeypatch):
    """Control: verification inside windows without the constraints (the first token keeps them)
    draws tokens the layout does not allow, and the fit fails."""
    if where == "in the step":
        monkeypatch.setattr(StepConstraints, "law", lambda self, positions, forced, free, guidance: (
            None, None if guidance is None else scales_at(guidance, positions)))
    else:
        keep = engine._Run.probs
        monkeypatch.setattr(engine._Run, "probs", lambda self, logits, positions: (
            self.sampling.probs(logits) if positions.ndim > 1 else keep(self, logits, positions)))
    fit = constrained_fit(UnifiedImageLM(tiny_chameleon(seed=2)), small_layout(), samples=4000)
    assert not fit.passed, fit


def test_the_step_and_the_engine_draw_the_same_tokens(monkeypatch):
    """The constraints, the guidance schedule, the sampling and the rule inside the model's step
    give the engine's own tokens, for one generator, on a ragged batch (rows accept apart)."""
    layout, model = small_layout(), UnifiedImageLM(tiny_chameleon(seed=2))
    constraints = layout.constraints(model.vocab_size, SCHEDULE)

    def run():
        return decode(model, prefix(layout, 16, True), layout.num_tokens, GUIDED, window=4, constraints=constraints,
                      drafter=JacobiDrafter(64, "repeat_above", grid_width=layout.row_length),
                      generator=torch.Generator().manual_seed(5))
    inside, stats = run()
    monkeypatch.setattr(UnifiedImageLM, "posts_inside", False)
    outside, _ = run()
    assert stats.row_forwards.unique().numel() > 1, "every row accepted alike: not a ragged batch"
    assert torch.equal(inside, outside)


def lumina2_by_its_recursion(scale, num_tokens, size_cells):
    """The schedule as Lumina-mGPT 2.0's script runs it: one update before each token."""
    out, s = [], scale
    for i in range(num_tokens):
        s = max(4.0, s * (1 - (i + 2) / (4 * size_cells)))
        out.append(s)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("scale, num_tokens, size_cells", [(7.0, 60, 9), (30.0, 200, 16), (3.0, 20, 4),
                                                           (4.0, 20, 4), (7.0, 9312, 576)])
def test_lumina2_guidance_is_its_script_recursion(scale, num_tokens, size_cells):
    got = lumina2_guidance(scale, num_tokens, size_cells)
    assert torch.allclose(got.double(), lumina2_by_its_recursion(scale, num_tokens, size_cells), rtol=1e-6)
    assert bool((got >= 4).all()) and bool((got[1:] <= got[:-1]).all())
    if scale > 4:
        assert got[0] > 4 and got[-1] == 4  # starts above the floor and reaches it
    if size_cells == 576:  # 768 x 768 in 2.0: 24 x 24 cells; the scale is 4 after a few dozen tokens
        assert 20 < int((got > 4).sum()) < 60


# a per-position schedule that differs from GUIDED's constant 2.0 (the row ends and the end are forced)
SCHEDULE = torch.tensor([0.0, 4.0, 1.0, 1.0, 3.0, 0.5, 1.0])


def scheduled_fit(layout, samples=20000):
    model = UnifiedImageLM(tiny_chameleon(seed=2))
    constraints = layout.constraints(model.vocab_size, SCHEDULE)
    make = lambda rows: prefix(layout, rows, True)  # noqa: E731
    drafter = lambda rows: JacobiDrafter(64, "repeat_above", grid_width=layout.row_length)  # noqa: E731
    seqs, probs = exact_sequence_distribution(model, make, layout.num_tokens, GUIDED, constraints)
    drawn = sample_sequences(model, make, layout.num_tokens, GUIDED, samples, window=4, constraints=constraints,
                             drafter_factory=drafter)
    return chi_square_fit(drawn, seqs, probs)


def test_sjd_with_a_guidance_schedule_is_lossless(where):
    """Per-position guidance scales (Lumina-mGPT 2.0's kind) with windows of 4: SJD draws the law
    the schedule defines."""
    fit = scheduled_fit(small_layout())
    assert fit.passed, fit


def test_the_harness_catches_a_schedule_the_engine_ignores(where, monkeypatch):
    """Control: guiding at the constant scale while the schedule defines the law."""
    if where == "in the step":
        keep = StepConstraints.law
        monkeypatch.setattr(StepConstraints, "law", lambda self, positions, forced, free, guidance: (
            keep(self, positions, forced, free, guidance)[0], None))
    else:
        monkeypatch.setattr(engine._Run, "probs", lambda self, logits, positions: self.sampling.probs(
            logits, self.constraints.allowed_mask(positions, self.target.vocab_size)))
    fit = scheduled_fit(small_layout(), samples=4000)
    assert not fit.passed, fit


def test_a_schedule_needs_guidance_and_one_scale_per_position():
    layout = small_layout()
    with pytest.raises(ValueError, match="one per position"):
        layout.constraints(64, torch.ones(3))
    model = UnifiedImageLM(tiny_chameleon(seed=2))
    with pytest.raises(ValueError, match="uses no guidance"):
        decode(model, prefix(layout, 1, False), layout.num_tokens, SamplingConfig(),
               constraints=layout.constraints(64, SCHEDULE))


def test_a_model_whose_step_failed_to_compile_with_its_rule_keeps_the_rule_after_it_in_every_adapter():
    """A pipeline makes a token model a call: the fallback of a step torch could not compile with
    its rule inside (:func:`visualspec.core.engine.precompile_decode`) holds for the model, not the
    adapter, so that no later call compiles (and fails) again."""
    model, other = tiny_chameleon(), tiny_chameleon(seed=1)
    first = UnifiedImageLM(model)
    assert first.takes_post and UnifiedImageLM(other).takes_post
    first.takes_post = False
    assert not UnifiedImageLM(model).takes_post and not first.takes_post
    assert UnifiedImageLM(other).takes_post  # the control: another model still takes its rule inside
    first.takes_post = True
    assert UnifiedImageLM(model).takes_post
