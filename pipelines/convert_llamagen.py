"""Convert official LlamaGen checkpoint files into a local visualspec pipeline folder.

    visualspec convert-llamagen --gpt c2i_L_256.pt --gpt-model GPT-L --vq vq_ds16_c2i.pt --out llamagen-L-256
    visualspec convert-llamagen --gpt t2i_XL_stage1_256.pt --gpt-model GPT-XL --vq vq_ds16_t2i.pt \\
        --text-encoder path/to/flan-t5-xl --out llamagen-t2i-XL-256

Everything is read from local files (``torch.load(weights_only=True)``) and written as safetensors.
"""

from __future__ import annotations

from ..models.llamagen import LlamaGenGPT
from ..models.llamagen_vq import LlamaGenVQModel
from .llamagen import LlamaGenPipeline

# the guidance scales of LlamaGen's demos
DEFAULT_GUIDANCE = {"c2i": 4.0, "t2i": 7.5}


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
                            default_guidance_scale=DEFAULT_GUIDANCE[gpt.config.model_type])
    if output_dir is not None:
        pipe.save_pretrained(output_dir)
    return pipe
