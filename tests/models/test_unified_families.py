"""Emu3 and Janus through the unified adapter (tiny transformers models built offline): their
layouts, greedy SJD against greedy AR across row ends and two-token endings (Emu3) and through
Janus's own embeddings and head, with guidance as each family defines it, and the exact law by
chi-square on Janus's path, with a control (a cache that keeps rejected drafts) that fails."""

import pytest
import torch

from visualspec.core.constraints import TokenConstraints
from visualspec.core.engine import decode
from visualspec.core.lossless import chi_square_fit, exact_sequence_distribution, sample_sequences
from visualspec.core.sampling import SamplingConfig
from visualspec.drafters import JacobiDrafter
from visualspec.models.unified_ar import (ImageLayout, JanusImageLM, UnifiedImageLM, emu3_layout,
                                          unified_family)

BOS, PAD = 1, 0
EOL, EOF, IMAGE_START, IMAGE_END, IMAGE_TOKEN, STAR = 40, 41, 42, 43, 44, 46
BOI = 12


def emu3_vocabulary():
    vocab = {f"<|visual token{c:06d}|>": 20 + c for c in range(16)}
    vocab.update({"<|extra_200|>": EOL, "<|extra_201|>": EOF, "<|image start|>": IMAGE_START,
                  "<|image end|>": IMAGE_END, "<|image token|>": IMAGE_TOKEN, "<image>": 45, "*": STAR})
    vocab.update({str(d): 50 + d for d in range(10)})
    return vocab


def tiny_emu3(seed=0):
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    config = Emu3Config(
        vq_config=dict(codebook_size=16, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
                       num_res_blocks=1, attn_resolutions=[], temporal_downsample_factor=4, hidden_size=64,
                       num_attention_heads=1),
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=PAD, bos_token_id=BOS, eos_token_id=2),
        vocabulary_map=emu3_vocabulary())
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config)
    torch.nn.init.normal_(model.lm_head.weight, std=0.3)
    return model.double().eval()


def tiny_janus(seed=0, grid=2):
    from transformers import JanusConfig, JanusForConditionalGeneration

    config = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=PAD, bos_token_id=BOS, eos_token_id=2),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                           image_size=16 * grid, patch_size=16, num_image_tokens=grid * grid, projection_dim=32),
        vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
                       num_res_blocks=1, projection_dim=32, image_token_embed_dim=32, num_hidden_layers=1,
                       num_patches=grid),
        image_token_id=10)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config)
    for p in model.model.language_model.parameters():  # strong dependence on the context
        torch.nn.init.normal_(p, std=0.3)
    for p in [*model.model.generation_embeddings.parameters(), *model.model.generation_head.parameters()]:
        torch.nn.init.normal_(p, std=0.5)
    return model.double().eval()


class DigitTokenizer:
    """The few tokenizer calls the layouts make: digits and '*' as Emu3's tiny vocabulary has them,
    and Janus's <begin_of_image>."""

    unk_token_id = 3

    def __call__(self, text, add_special_tokens=True):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[STAR if ch == "*" else 50 + int(ch) for ch in text])

    def convert_tokens_to_ids(self, token):
        return BOI if token == "<begin_of_image>" else self.unk_token_id


def test_the_emu3_layout_comes_from_the_vocabulary():
    layout = emu3_layout(emu3_vocabulary(), height=2, width=3, size_tokens=[52, STAR, 53])
    assert layout.code_tokens == tuple(range(20, 36))
    assert layout.opening == (IMAGE_START, 52, STAR, 53, IMAGE_TOKEN)
    assert layout.num_tokens == 2 * 4 + 2
    assert layout.forced().tolist() == [-1, -1, -1, EOL, -1, -1, -1, EOL, EOF, IMAGE_END]
    assert unified_family(tiny_emu3()).layout(2, 3, DigitTokenizer()) == layout  # the size as text, in codes
    vocab = emu3_vocabulary()
    del vocab["<|extra_201|>"]
    with pytest.raises(ValueError, match=r"no <\|extra_201\|> token"):
        emu3_layout(vocab, 2, 2, [])


def test_the_family_comes_from_the_config_and_others_are_refused():
    assert type(unified_family(tiny_janus())).__name__ == "JanusFamily"
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(ValueError, match="model_type 'llama'.*not a unified-vocabulary image generator"):
        unified_family(llama)


def test_the_janus_layout_is_its_code_grid_and_refuses_another():
    family = unified_family(tiny_janus(grid=2))
    layout = family.layout(2, 2, DigitTokenizer())
    assert layout == ImageLayout(tuple(range(16)), 2, 2, opening=(BOI,))
    with pytest.raises(ValueError, match="makes 2x2 code grids, not 3x3"):
        family.layout(3, 3, DigitTokenizer())
    ids = [PAD, BOS, 30, 31, BOI]
    assert family.unconditional(ids, layout) == [PAD, BOS, PAD, PAD, BOI]  # as Janus's generate pads it
    image = family.decode(torch.randint(0, 16, (2, 2, 2)))
    assert family.pixels_per_code() == 2 and image.shape == (2, 3, 4, 4)  # channel_multiplier [1, 2]: 2x


def guided_prefix(family, layout, prompt, rows):
    cond = list(prompt) + list(layout.opening)
    uncond = family.unconditional(cond, layout)
    width = max(len(cond), len(uncond))
    pad = lambda r: [PAD] * (width - len(r)) + r  # noqa: E731
    ids = torch.tensor([pad(cond)] * rows + [pad(uncond)] * rows)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in [cond] * rows + [uncond] * rows])
    return ids, mask


@pytest.mark.parametrize("kind", ["emu3", "janus"])
def test_greedy_sjd_equals_greedy_ar_with_guidance(kind):
    model = tiny_emu3(seed=1) if kind == "emu3" else tiny_janus(seed=1, grid=4)
    family = unified_family(model)
    layout = family.layout(4, 4, DigitTokenizer())
    target = family.token_model()
    assert isinstance(target, JanusImageLM if kind == "janus" else UnifiedImageLM)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    constraints = layout.constraints(target.vocab_size)
    prefix = guided_prefix(family, layout, (BOS, 30, 31), rows=2)
    ar, ar_stats = decode(target, prefix, layout.num_tokens, sampling, constraints=constraints)
    sjd, stats = decode(target, prefix, layout.num_tokens, sampling, constraints=constraints,
                        drafter=JacobiDrafter(target.vocab_size, "repeat_above", grid_width=layout.row_length),
                        window=8)
    assert torch.equal(ar, sjd)
    assert layout.codes(sjd).shape == (2, 4, 4)
    assert stats.structural_tokens == ar_stats.structural_tokens == 2 * (4 + 2 if kind == "emu3" else 0)
    assert stats.target_forwards < ar_stats.target_forwards
    assert family.decode(layout.codes(sjd)).shape[-2:] == (4 * family.pixels_per_code(),) * 2


GUIDED = SamplingConfig(guidance_scale=2.0, temperature=0.9)


def janus_fit(target, samples):
    """Janus's path (text-embedded prompt, code embeddings and head, padded guidance) on a 2x2 grid,
    kept to codes 0..3 by the allowed mask so that its 256 sequences can be enumerated."""
    family = unified_family(target.model)
    layout = family.layout(2, 2, DigitTokenizer())
    allowed = torch.arange(16) < 4
    constraints = TokenConstraints(layout.forced(), allowed)
    make = lambda rows: guided_prefix(family, layout, (BOS, 30, 31), rows)  # noqa: E731
    drafter = lambda rows: JacobiDrafter(16, "random")  # noqa: E731
    _, stats = decode(target, make(64), layout.num_tokens, GUIDED, drafter=drafter(64), window=3,
                      constraints=constraints, generator=torch.Generator().manual_seed(0))
    assert stats.row_forwards.unique().numel() > 1, "every row accepted alike: not a ragged batch"
    seqs, probs = exact_sequence_distribution(target, make, layout.num_tokens, GUIDED, constraints)
    assert len(seqs) == 4 ** 4 and probs.max() < 0.2, "a peaked law would leave the test nothing to check"
    drawn = sample_sequences(target, make, layout.num_tokens, GUIDED, samples, window=3, constraints=constraints,
                             drafter_factory=drafter)
    return chi_square_fit(drawn, seqs, probs)


def test_sjd_on_janus_is_lossless():
    fit = janus_fit(JanusImageLM(tiny_janus(seed=2, grid=2)), samples=20000)
    assert fit.passed, fit


class StaleCacheJanus(JanusImageLM):
    """Control: a Janus adapter whose cache keeps rejected drafts (its crop drops nothing), so later
    tokens attend to codes that were never accepted. The exact law, computed in one forward per
    sequence, never crops and so is unchanged; only speculation sees the bug."""

    def crop(self, lengths):
        pass


def test_the_harness_catches_a_janus_cache_that_keeps_rejected_drafts():
    fit = janus_fit(StaleCacheJanus(tiny_janus(seed=2, grid=2)), samples=4000)
    assert not fit.passed, fit
