"""Lumina-mGPT's published layout, end to end on tiny stand-ins built offline: a transformers
Chameleon folder with its tokenizer, and Meta's VQGAN files (version 1) or a MoVQGAN file (2.0),
through the converter into a working pipeline; the trained sizes and clear errors."""

import warnings

import pytest
import torch
import yaml

from visualspec.models.chameleon_vqgan import ChameleonVQGAN
from visualspec.models.movqgan import MoVQGAN
from visualspec.pipelines.convert import LUMINA_TEMPLATE, lumina_crop_sizes, lumina_pipeline
from visualspec.pipelines.tiny import _WORDS, word_tokenizer

PROMPT = "a photo of a red circle"
VQGAN = dict(codebook_size=16, codebook_embed_dim=4, ch=32, ch_mult=(1, 1, 1, 1, 1), num_res_blocks=1,
             z_channels=4, resolution=32)  # 16 pixels per code, like Chameleon's
MOVQ = dict(codebook_size=16, codebook_embed_dim=4, ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=1, z_channels=4,
            resolution=32, attn_resolutions=())  # 8 pixels per code, like MoVQGAN 270M


def lumina_folder(path, version):
    """A tiny Lumina-mGPT folder: Chameleon config, weights and a tokenizer knowing the template."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    words = list(_WORDS) + "generate image according to following prompt x : 0 1 2 3 4 5 6 7 8 9".split()
    tokenizer = word_tokenizer(words, model_max_length=64, split_symbols=True)
    vocab = dict(tokenizer.get_vocab())
    names = ["<image>", "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>", "<reserved08801>",
             "<reserved08802>"]
    if version == 1:
        names += [f"IMGIMG{''.join(chr(ord('A') + int(d)) for d in str(c))}Z" for c in range(16)]
    vocab.update({name: len(tokenizer) + i for i, name in enumerate(names)})
    size = len(vocab) + (16 if version == 2 else 0)  # 2.0: codes are the 16 tokens after the named ones
    torch.manual_seed(0)
    config = ChameleonConfig(vocab_size=size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                             vocabulary_map=vocab, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                             vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                                            channel_multiplier=[1, 2], num_res_blocks=1, resolution=32,
                                            attn_resolutions=[]))
    model = ChameleonForConditionalGeneration(config)
    torch.nn.init.normal_(model.lm_head.weight, std=0.5)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return len(vocab)


def vqgan_files(path):
    torch.manual_seed(1)
    state = ChameleonVQGAN(**VQGAN).state_dict()
    torch.save({"state_dict": {**state, "loss.logvar": torch.zeros(())}, "global_step": 3}, path / "vqgan.ckpt")
    dd = dict(double_z=False, z_channels=4, resolution=32, in_channels=3, out_ch=3, ch=32, ch_mult=[1] * 5,
              num_res_blocks=1, attn_resolutions=[], dropout=0.0)
    (path / "vqgan.yaml").write_text(yaml.safe_dump({"model": {"params": {"embed_dim": 4, "n_embed": 16,
                                                                          "ddconfig": dd}}}))
    return str(path / "vqgan.ckpt"), str(path / "vqgan.yaml")


@pytest.fixture(scope="module")
def lumina1(tmp_path_factory):
    path = tmp_path_factory.mktemp("lumina1")
    lumina_folder(path / "model", version=1)
    ckpt, config = vqgan_files(path)
    pipe = lumina_pipeline(str(path / "model"), vqgan=ckpt, vqgan_config=config, size=32)
    pipe.set_progress_bar_config(disable=True)
    return path, pipe


def test_lumina1_generates_in_its_layout_with_its_template(lumina1):
    _, pipe = lumina1
    assert isinstance(pipe.vq_model, ChameleonVQGAN) and pipe.config.prompt_template == LUMINA_TEMPLATE
    layout = pipe.layout
    vocab = pipe.transformer.config.vocabulary_map
    assert (layout.height, layout.width) == (2, 2)  # 32 pixels at 16 per code
    assert layout.opening == (vocab["<racm3:break>"], vocab["<reserved08801>"], vocab["<reserved08801>"])
    ids, _ = pipe.encode_prompts([PROMPT], guided=False)
    text = pipe.tokenizer.decode(ids[0, :-4])
    assert text.startswith("generate an image of 3 2 x 3 2") and text.endswith("a photo of a red circle")
    out = pipe(PROMPT, decoding="sjd", seed=0, window=4)
    assert out.images[0].size == (32, 32) and out.stats.structural_tokens == 2 + 1
    ar = pipe(PROMPT, decoding="ar", temperature=0, output_type="latent").images
    assert torch.equal(ar, pipe(PROMPT, decoding="sjd", temperature=0, window=4, output_type="latent").images)


def test_lumina2_reads_codes_at_an_offset_with_4x4_cells(tmp_path):
    named = lumina_folder(tmp_path / "model", version=2)
    torch.manual_seed(2)
    torch.save(MoVQGAN(**MOVQ).state_dict(), tmp_path / "movqgan_270M.ckpt")
    pipe = lumina_pipeline(str(tmp_path / "model"), movqgan=str(tmp_path / "movqgan_270M.ckpt"), size=32,
                           code_token_offset=named, image_tokenizer_config=MOVQ)
    pipe.set_progress_bar_config(disable=True)
    layout = pipe.layout
    assert (layout.height, layout.width) == (4, 4) and layout.code_tokens == tuple(range(named, named + 16))
    assert layout.opening[1:] == (pipe.transformer.config.vocabulary_map["<reserved08801>"],) * 2  # one 4x4 cell
    tokens = pipe(PROMPT, decoding="sjd", seed=0, window=6, output_type="latent").images
    assert layout.codes(tokens).shape == (1, 4, 4)
    assert pipe(PROMPT, seed=0, output_type="pt").images.shape == (1, 3, 32, 32)
    # its guidance schedule: on this one-cell image 7 is lowered to the floor of 4 at once
    assert pipe.config.default_guidance_schedule == "lumina2"
    latent = dict(decoding="sjd", seed=0, window=6, output_type="latent")
    scheduled = pipe(PROMPT, guidance_scale=7.0, **latent).images
    assert torch.equal(scheduled, pipe(PROMPT, guidance_scale=4.0, guidance_schedule="constant", **latent).images)
    assert not torch.equal(scheduled, pipe(PROMPT, guidance_scale=7.0, guidance_schedule="constant", **latent).images)
    with pytest.warns(UserWarning, match="never goes below 4"):
        pipe(PROMPT, guidance_scale=2.0, **latent)


def test_lumina_trains_at_its_published_crop_sizes():
    sizes = lumina_crop_sizes(768)
    assert len(sizes) == 73 and [768, 768] in sizes and [1536, 384] in sizes and [384, 1536] in sizes
    assert len(lumina_crop_sizes(512)) == 49 and len(lumina_crop_sizes(1024)) == 97


def test_an_untrained_size_is_forced_and_said(lumina1):
    """Lumina-mGPT 2.0's issue #11: other sizes made the model sample wrong size tokens. Here the
    size tokens are part of the opening, so they are the asked size's, and a warning says the
    checkpoint was not trained at it."""
    _, pipe = lumina1
    with pytest.warns(UserWarning, match="64x32 is not a size this checkpoint was trained at"):
        tokens = pipe(PROMPT, width=64, height=32, seed=0, window=4, output_type="latent").images
    assert pipe.layout_for(2, 4).opening[1:] == tuple(pipe.transformer.config.vocabulary_map[f"<reserved0880{n}>"]
                                                      for n in (1, 2))
    assert tokens.shape == (1, pipe.layout_for(2, 4).num_tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe(PROMPT, width=32, height=32, seed=0, window=4)  # a trained size: no warning
    with pytest.raises(ValueError, match="width must be a positive multiple of 16 pixels"):
        pipe(PROMPT, width=40)


def test_bad_lumina_inputs_are_named(lumina1, tmp_path):
    path, _ = lumina1
    model = str(path / "model")
    ckpt, config = str(path / "vqgan.ckpt"), str(path / "vqgan.yaml")
    with pytest.raises(ValueError, match="vqgan .* or movqgan .*not both"):
        lumina_pipeline(model)
    with pytest.raises(FileNotFoundError, match="nothere.ckpt"):
        lumina_pipeline(model, vqgan=str(tmp_path / "nothere.ckpt"), vqgan_config=config, size=32)
    with pytest.raises(ValueError, match="no config.json"):
        lumina_pipeline(str(tmp_path), vqgan=ckpt, vqgan_config=config)
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="holds a 'llama' model; Lumina-mGPT checkpoints are Chameleon"):
        lumina_pipeline(str(tmp_path / "llama"), vqgan=ckpt, vqgan_config=config)
    with pytest.raises(ValueError, match="no tokenizer"):
        lumina_pipeline(model, vqgan=ckpt, vqgan_config=config, tokenizer_dir=str(tmp_path))


def test_the_command_line_converts_a_lumina_folder(lumina1, tmp_path, capsys):
    from visualspec import VisualSpecPipeline
    from visualspec.tools.cli import main

    path, pipe = lumina1
    out = tmp_path / "lumina"
    assert main(["convert-lumina", str(path / "model"), "--vqgan", str(path / "vqgan.ckpt"), "--vqgan-config",
                 str(path / "vqgan.yaml"), "--size", "32", "--out", str(out)]) == 0
    loaded = VisualSpecPipeline.from_pretrained(out)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.config.trained_sizes == [[32, 32]] and loaded.config.default_top_k == 2000
    a = loaded(PROMPT, seed=0, window=4, output_type="latent").images
    assert torch.equal(a, pipe(PROMPT, seed=0, window=4, output_type="latent").images)
