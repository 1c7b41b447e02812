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


def word_tokenizer(words, model_max_length: int = 16):
    """A whitespace word-level tokenizer over ``words`` (lower-cased), as a transformers tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate(special + sorted(set(w.lower() for w in words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
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


def tiny_unified_pipeline(seed: int = 0, image_codes: int = 4):
    """A random Lumina-layout pipeline: a 2-layer transformers Chameleon whose vocabulary holds the
    tiny word list, 16 image codes and the layout's tokens, and a 16-code VQ; ``image_codes`` x
    ``image_codes`` codes (even, for the size tokens) make 16x16-pixel images per 4x4 codes."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from .unified import UnifiedARPipeline

    torch.manual_seed(seed)
    tokenizer = word_tokenizer(_WORDS)
    vocab = dict(tokenizer.get_vocab())
    names = [f"IMGIMG{''.join(chr(ord('A') + int(d)) for d in str(c))}Z" for c in range(16)]
    names += ["<image>", "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"]
    names += [f"<reserved{8800 + n:05d}>" for n in range(1, image_codes // 2 + 1)]
    vocab.update({name: len(tokenizer) + i for i, name in enumerate(names)})
    config = ChameleonConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                             vocabulary_map=vocab, pad_token_id=tokenizer.pad_token_id,
                             vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                                            channel_multiplier=[1, 2], num_res_blocks=1, resolution=32,
                                            attn_resolutions=[]))
    model = ChameleonForConditionalGeneration(config).eval()
    torch.nn.init.normal_(model.lm_head.weight, std=0.5)
    vq = LlamaGenVQModel(codebook_size=16, codebook_embed_dim=8, ch=32, ch_mult=(1, 2, 2), z_channels=32,
                         num_res_blocks=1, norm_groups=8).eval()
    return UnifiedARPipeline(transformer=model, tokenizer=tokenizer, vq_model=vq, image_height=image_codes,
                             image_width=image_codes)
