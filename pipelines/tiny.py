"""A tiny, randomly initialised text-to-image LlamaGen pipeline, built offline from a seed.

It exists so that everything runs right after set-up on a machine with no network: its images are
noise, and it says so. Trained models replace it as the default as soon as they are shipped.
"""

from __future__ import annotations

import torch

from ..models.llamagen import LlamaGenGPT
from ..models.llamagen_vq import LlamaGenVQModel
from .llamagen import LlamaGenPipeline

TINY_RANDOM_NAME = "tiny-random-llamagen (untrained: outputs are noise)"

_WORDS = ("a photo of an the and with on in left right above below of one two three four "
          "red orange yellow green blue purple black white circle circles square squares triangle triangles "
          "cat dog").split()


def word_tokenizer(words, model_max_length: int = 16, split_symbols: bool = False):
    """A whitespace word-level tokenizer over ``words`` (lower-cased), as a transformers tokenizer;
    with ``split_symbols`` digits and punctuation are words of their own (``"4*4"`` is three)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate(special + sorted(set(w.lower() for w in words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if split_symbols:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=model_max_length)


def tiny_random_pipeline(seed: int = 0) -> LlamaGenPipeline:
    """64x64 images from a 16x16 token grid, a 256-code VQ, and a 2-layer GPT (all random)."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = word_tokenizer(_WORDS)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                      num_heads=2, pad_token_id=tokenizer.pad_token_id)).eval()
    vq = LlamaGenVQModel(codebook_size=256, codebook_embed_dim=8, ch=32, ch_mult=(1, 2, 2), z_channels=32,
                         num_res_blocks=1, norm_groups=8).eval()
    gpt = LlamaGenGPT(vocab_size=256, dim=64, n_layer=2, n_head=4, multiple_of=32, model_type="t2i",
                      caption_dim=32, cls_token_num=16, block_size=256)
    torch.nn.init.normal_(gpt.output.weight, std=0.02)  # an all-zero head would make every token equally likely
    return LlamaGenPipeline(transformer=gpt.eval(), vq_model=vq, text_encoder=encoder, tokenizer=tokenizer,
                            default_guidance_scale=4.0)


def tiny_unified_pipeline(seed: int = 0, image_codes: int = 4, family: str = "chameleon"):
    """A random unified-vocabulary pipeline of ``family`` with ``image_codes`` x ``image_codes``
    codes (16 codes in all) and a 2-layer transformers model whose vocabulary holds the tiny word
    list:

    - ``"chameleon"`` (Lumina-mGPT's layout): Chameleon, the image codes and the layout's tokens in
      its vocabulary, and a separate LlamaGen VQ (4 pixels per code; ``image_codes`` even, for the
      size tokens);
    - ``"emu3"``: Emu3 with its own VQ (2 pixels per code), the size written as text;
    - ``"janus"``: Janus with its own generation head and VQ (2 pixels per code).
    """
    from .unified import UnifiedARPipeline

    builders = {"chameleon": _tiny_chameleon, "emu3": _tiny_emu3, "janus": _tiny_janus}
    if family not in builders:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(builders)}")
    torch.manual_seed(seed)
    model, tokenizer, vq, config = builders[family](image_codes)
    return UnifiedARPipeline(transformer=model.eval(), tokenizer=tokenizer, vq_model=vq, image_height=image_codes,
                             image_width=image_codes, **config)


def _text_config(vocab_size: int, tokenizer) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)  # the words have no BOS


def _tiny_chameleon(image_codes: int):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    tokenizer = word_tokenizer(_WORDS)
    vocab = dict(tokenizer.get_vocab())
    names = [f"IMGIMG{''.join(chr(ord('A') + int(d)) for d in str(c))}Z" for c in range(16)]
    names += ["<image>", "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"]
    names += [f"<reserved{8800 + n:05d}>" for n in range(1, image_codes // 2 + 1)]
    vocab.update({name: len(tokenizer) + i for i, name in enumerate(names)})
    config = ChameleonConfig(**_text_config(len(vocab), tokenizer), vocabulary_map=vocab,
                             vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                                            channel_multiplier=[1, 2], num_res_blocks=1, resolution=32,
                                            attn_resolutions=[]))
    model = ChameleonForConditionalGeneration(config)
    torch.nn.init.normal_(model.lm_head.weight, std=0.5)
    vq = LlamaGenVQModel(codebook_size=16, codebook_embed_dim=8, ch=32, ch_mult=(1, 2, 2), z_channels=32,
                         num_res_blocks=1, norm_groups=8).eval()
    return model, tokenizer, vq, {}


def _tiny_emu3(image_codes: int):
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    tokenizer = word_tokenizer(_WORDS + list("0123456789*"), split_symbols=True)
    vocab = dict(tokenizer.get_vocab())
    names = [f"<|visual token{c:06d}|>" for c in range(16)]
    names += ["<|extra_200|>", "<|extra_201|>", "<|image start|>", "<|image end|>", "<|image token|>", "<image>"]
    vocab.update({name: len(tokenizer) + i for i, name in enumerate(names)})
    config = Emu3Config(text_config=_text_config(len(vocab), tokenizer), vocabulary_map=vocab,
                        vq_config=dict(codebook_size=16, embed_dim=4, latent_channels=4, base_channels=32,
                                       channel_multiplier=[1, 2], num_res_blocks=1, attn_resolutions=[],
                                       temporal_downsample_factor=4, hidden_size=64, num_attention_heads=1))
    model = Emu3ForConditionalGeneration(config)
    torch.nn.init.normal_(model.lm_head.weight, std=0.5)
    return model, tokenizer, None, dict(separator=None, grid_tokens=False)


def _tiny_janus(image_codes: int):
    from transformers import JanusConfig, JanusForConditionalGeneration

    tokenizer = word_tokenizer(_WORDS + ["<begin_of_image>"])
    text = _text_config(len(tokenizer), tokenizer)
    config = JanusConfig(text_config=dict(model_type="llama", **text),
                         vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=64, image_size=16 * image_codes, patch_size=16,
                                            num_image_tokens=image_codes ** 2, projection_dim=32),
                         vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                                        channel_multiplier=[1, 2], num_res_blocks=1, projection_dim=32,
                                        image_token_embed_dim=32, num_hidden_layers=1, num_patches=image_codes),
                         image_token_id=tokenizer.unk_token_id)
    model = JanusForConditionalGeneration(config)
    torch.nn.init.normal_(model.model.generation_head.vision_head.weight, std=0.5)
    return model, tokenizer, None, dict(separator=None, grid_tokens=False)
