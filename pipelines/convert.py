"""Official checkpoints -> local visualspec pipeline folders, all from local files
(``torch.load(weights_only=True)``), written as safetensors.

    visualspec convert-llamagen --gpt c2i_L_256.pt --gpt-model GPT-L --vq vq_ds16_c2i.pt --out llamagen-L-256
    visualspec convert-llamagen --gpt t2i_XL_stage1_256.pt --gpt-model GPT-XL --vq vq_ds16_t2i.pt \\
        --text-encoder path/to/flan-t5-xl --out llamagen-t2i-XL-256
    visualspec convert-lumina Lumina-mGPT-7B-768 --vqgan vqgan.ckpt --vqgan-config vqgan.yaml --out lumina-768
    visualspec convert-lumina Lumina-mGPT-2.0 --movqgan movqgan_270M.ckpt --out lumina2
    visualspec convert-mar --checkpoint checkpoint-last.pth --vae kl16.ckpt --name mar_base --out mar-base

**LlamaGen** (:func:`convert_llamagen`): the GPT and VQ checkpoints of any official size, and for
text models a local flan-t5-xl folder.

**Lumina-mGPT** (:func:`convert_lumina`):

- **Lumina-mGPT 1** (7B / 34B at 512, 768 or 1024): a transformers Chameleon folder, and Meta's
  Chameleon VQGAN (``vqgan.ckpt`` and ``vqgan.yaml``, 16 pixels per code). Codes are the
  vocabulary's ``IMGIMG...Z`` tokens; the size tokens count 32-pixel cells of 2 x 2 codes.
- **Lumina-mGPT 2.0** (7B at 768): a transformers Chameleon folder, and SBER-MoVQGAN 270M
  (``movqgan_270M.ckpt``, 8 pixels per code). Code c is token ``155000 + c``; the size tokens count
  cells of 4 x 4 codes.

Both use the prompt template of Lumina's scripts and its turn separator ``<reserved08706>``, with
guidance 4.0 and top-k 2000 (1) or 4096 (2.0), as their README commands; 2.0 folders take its
guidance schedule (``default_guidance_schedule="lumina2"``, which at the recommended 4.0 is
constant). The model is loaded with transformers' own Chameleon classes (no remote code); the
pipeline reads the LM head's raw logits, so the image tokens that transformers masks out are
generated.

**MAR** (:func:`convert_mar`): ``checkpoint-last.pth`` (its EMA weights by default) and ``kl16.ckpt``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..models.kl_vae import KLAutoencoder
from ..models.llamagen import LlamaGenGPT
from ..models.llamagen_vq import LlamaGenVQModel
from ..models.mar import MAR
from .llamagen import LlamaGenPipeline
from .mar import MARPipeline
from .unified import UnifiedARPipeline

# the guidance scales of LlamaGen's demos
LLAMAGEN_GUIDANCE = {"c2i": 4.0, "t2i": 7.5}


def convert_llamagen(gpt_checkpoint: str, vq_checkpoint: str, output_dir: str | None = None, *,
                     gpt_model: str = "GPT-XL", vq_model: str = "VQ-16", image_size: int = 256,
                     text_encoder: str | None = None, key: str | None = None) -> LlamaGenPipeline:
    """Build a :class:`LlamaGenPipeline` from official files and save it to ``output_dir`` if given.

    ``text_encoder`` is a local transformers folder (flan-t5-xl for the official t2i models); its
    encoder and tokenizer become the pipeline's ``text_encoder`` and ``tokenizer``.
    """
    vq = LlamaGenVQModel.from_llamagen_checkpoint(vq_checkpoint, vq_model)
    if image_size % vq.downsample_factor:
        raise ValueError(f"image_size {image_size} is not a multiple of the tokenizer's downsampling "
                         f"{vq.downsample_factor}")
    grid = image_size // vq.downsample_factor
    gpt = LlamaGenGPT.from_llamagen_checkpoint(gpt_checkpoint, gpt_model, block_size=grid * grid, key=key)
    if gpt.config.vocab_size != vq.config.codebook_size:
        raise ValueError(f"GPT vocabulary {gpt.config.vocab_size} differs from the VQ codebook {vq.config.codebook_size}")
    encoder = tokenizer = None
    if gpt.config.model_type == "t2i" and text_encoder is not None:
        from transformers import AutoTokenizer, T5EncoderModel

        encoder = T5EncoderModel.from_pretrained(text_encoder, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(text_encoder, local_files_only=True)
    pipe = LlamaGenPipeline(transformer=gpt, vq_model=vq, text_encoder=encoder, tokenizer=tokenizer,
                            default_guidance_scale=LLAMAGEN_GUIDANCE[gpt.config.model_type])
    if output_dir is not None:
        pipe.save_pretrained(output_dir)
    return pipe


LUMINA_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}"
LUMINA2_CODE_OFFSET = 155000  # Lumina-mGPT 2.0's token of MoVQGAN code 0


def lumina_crop_sizes(size: int, cell: int = 32, max_ratio: float = 4.0) -> list[list[int]]:
    """The ``[width, height]`` sizes Lumina-mGPT trains a ``size`` checkpoint at.

    With a budget of n = (size / cell)^2 cells, walk the staircase under w * h = n from (n, 1):
    each step grows h if (h + 1) * w still fits the budget, else shrinks w; every point visited
    whose aspect ratio is at most ``max_ratio`` is a size (73 of them for 768)."""
    budget = (size // cell) ** 2
    sizes, w, h = [], budget, 1
    while w > 0:
        if max(w, h) / min(w, h) <= max_ratio:
            sizes.append([w * cell, h * cell])
        if (h + 1) * w <= budget:
            h += 1
        else:
            w -= 1
    return sizes


def lumina_pipeline(model_dir: str, *, vqgan: str | None = None, vqgan_config: str | None = None,
                    movqgan: str | None = None, size: int = 768, tokenizer_dir: str | None = None,
                    torch_dtype=None, code_token_offset: int = LUMINA2_CODE_OFFSET,
                    image_tokenizer_config: dict | None = None) -> UnifiedARPipeline:
    """A :class:`UnifiedARPipeline` for the Lumina-mGPT checkpoint in ``model_dir`` at ``size``
    pixels: version 1 with ``vqgan`` (and ``vqgan_config``), 2.0 with ``movqgan``. The text
    tokenizer comes from ``tokenizer_dir`` (default ``model_dir``; of the version 1 checkpoints
    only 7B-768 ships one). ``code_token_offset`` (2.0's token of code 0) and
    ``image_tokenizer_config`` (overriding the tokenizer's released configuration) are for tests
    and variants."""
    from transformers import AutoTokenizer, ChameleonForConditionalGeneration

    if isinstance(size, bool) or not isinstance(size, int) or size < 32 or size % 32:
        raise ValueError(f"size must be a positive multiple of 32 pixels, got {size!r}")
    if (vqgan is None) == (movqgan is None):
        raise ValueError("give the image tokenizer: vqgan (Lumina-mGPT 1) or movqgan (Lumina-mGPT 2.0), not both")
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{model_dir} has no config.json: not a transformers model folder")
    kind = json.loads(config_file.read_text()).get("model_type")
    if kind != "chameleon":
        raise ValueError(f"{model_dir} holds a {kind!r} model; Lumina-mGPT checkpoints are Chameleon models")
    tokenizer_dir = tokenizer_dir or model_dir
    if not any((Path(tokenizer_dir) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"{tokenizer_dir} has no tokenizer (tokenizer.json); pass tokenizer_dir, e.g. the "
                         "Lumina-mGPT-7B-768 folder, which ships one")
    if vqgan is not None:
        from ..models.chameleon_vqgan import ChameleonVQGAN

        vq = ChameleonVQGAN.from_original(vqgan, vqgan_config, **(image_tokenizer_config or {}))
        options = dict(grid_cell_codes=2, default_top_k=2000, trained_sizes=lumina_crop_sizes(size))
    else:
        from ..models.movqgan import MoVQGAN

        vq = MoVQGAN.from_original(movqgan, **(image_tokenizer_config or {}))
        options = dict(grid_cell_codes=4, code_token_offset=code_token_offset, default_top_k=4096,
                       default_guidance_schedule="lumina2", trained_sizes=[[size, size]])  # the released 2.0 checkpoint is 768-only (its issue #11)
    model = ChameleonForConditionalGeneration.from_pretrained(model_dir, local_files_only=True,
                                                              torch_dtype=torch_dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    grid = size // vq.downsample_factor
    return UnifiedARPipeline(transformer=model, tokenizer=tokenizer, vq_model=vq.eval(), image_height=grid,
                             image_width=grid, prompt_template=LUMINA_TEMPLATE, separator="<reserved08706>",
                             default_guidance_scale=4.0, **options)


def convert_lumina(model_dir: str, output_dir: str, **kwargs) -> UnifiedARPipeline:
    """:func:`lumina_pipeline`, saved as a pipeline folder (safetensors) in ``output_dir``."""
    pipe = lumina_pipeline(model_dir, **kwargs)
    pipe.save_pretrained(output_dir)
    return pipe


# MAR's README evaluation guidance per size; its demos use 64 steps
MAR_GUIDANCE = {"mar_base": 2.9, "mar_large": 3.0, "mar_huge": 3.2}


def convert_mar(checkpoint: str, vae_checkpoint: str, output_dir: str | None = None, *, name: str = "mar_base",
                key: str = "model_ema", mar_config: dict | None = None, vae_config: dict | None = None) -> MARPipeline:
    """Build a :class:`MARPipeline` from MAR's official ``checkpoint-last.pth`` (its EMA weights by
    default) and ``kl16.ckpt``, and save it to ``output_dir`` if given. ``mar_config`` and
    ``vae_config`` override the official sizes (for small test models)."""
    transformer = MAR.from_mar_checkpoint(checkpoint, name, key=key, **(mar_config or {}))
    vae = KLAutoencoder.from_kl16_checkpoint(vae_checkpoint, **(vae_config or {}))
    pipe = MARPipeline(transformer=transformer, vae=vae, default_guidance_scale=MAR_GUIDANCE[name])
    if output_dir is not None:
        pipe.save_pretrained(output_dir)
    return pipe
