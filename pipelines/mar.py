"""The MAR pipeline: class labels -> continuous latent tokens (MAR's masked sampler) -> KL-16 decode.

Official weights convert with :func:`visualspec.pipelines.convert.convert_mar` (``visualspec convert-mar``). CSpD for MAR's
masked order is not built yet: ``decoding="ar"`` (MAR's own sampler) is the only mode.
"""

from __future__ import annotations

import time

import torch

from ..core.checks import check_int
from ..core.sampling import make_generator
from ..core.stats import DecodeStats
from ..models.kl_vae import KLAutoencoder
from ..models.mar import MAR
from .base import register_pipeline
from .image import ImagePipeline, class_label_list, compile_heads


@register_pipeline
class MARPipeline(ImagePipeline):
    """Class-conditional generation with MAR (``transformer``) and its KL-16 autoencoder (``vae``)."""

    model_cpu_offload_seq = "transformer->vae"
    display_name = "MAR"
    decoding_modes = ("ar",)  # its own masked sampler; no bench modes: nothing to compare it with
    is_text_conditional = False

    def __init__(self, transformer: MAR, vae: KLAutoencoder, default_guidance_scale: float = 3.0,
                 default_num_iter: int = 64, default_cfg_schedule: str = "linear"):
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae)
        self.register_to_config(default_guidance_scale=default_guidance_scale, default_num_iter=default_num_iter,
                                default_cfg_schedule=default_cfg_schedule)

    def check_inputs(self, class_labels, decoding, num_iter, guidance_scale, cfg_schedule, temperature, output_type,
                     num_images_per_prompt) -> list[int]:
        self.check_decoding(decoding)
        labels = class_label_list(class_labels, self.transformer.config.class_num, model="MAR")
        seq_len = self.transformer.seq_len
        check_int("num_iter", num_iter, 1, high=seq_len)
        if not guidance_scale >= 1.0:
            raise ValueError(f"guidance_scale must be >= 1 (1 = no guidance), got {guidance_scale}")
        if cfg_schedule not in ("linear", "constant"):
            raise ValueError(f"cfg_schedule must be 'linear' or 'constant', got {cfg_schedule!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for MAR's diffusion head, got {temperature}")
        self.check_common(output_type, num_images_per_prompt)
        return labels

    @torch.no_grad()
    def __call__(self, class_labels=None, *, decoding: str = "ar", num_iter: int | None = None,
                 guidance_scale: float | None = None, cfg_schedule: str | None = None, temperature: float = 1.0,
                 num_images_per_prompt: int = 1, seed: int | None = None, generator=None, output_type: str = "pil",
                 return_dict: bool = True, compile: bool = False, **others):
        """Generate images of ``class_labels`` (an int or a list). ``num_iter`` (MAR's AR steps),
        ``guidance_scale`` and ``cfg_schedule`` (``"linear"`` or ``"constant"``) default to the
        folder's; ``temperature`` scales the head's noise; ``seed`` or ``generator`` (one, or one
        per image) make results repeatable; ``output_type`` is ``"pil"``, ``"np"``, ``"pt"`` or
        ``"latent"`` (tokens (B, 256, 16)); ``compile=True`` runs the diffusion head's sampler
        compiled (:meth:`~visualspec.models.diffusion_head.DiffusionHead.compile_step`)."""
        self.refuse_options(others)  # a token pipeline's option, named as such
        compile_heads(compile, self.transformer)
        num_iter, guidance_scale, cfg_schedule = (self.folder_default(name, value) for name, value in (
            ("num_iter", num_iter), ("guidance_scale", guidance_scale), ("cfg_schedule", cfg_schedule)))
        labels = self.check_inputs(class_labels, decoding, num_iter, guidance_scale, cfg_schedule, temperature,
                                   output_type, num_images_per_prompt)
        labels = torch.tensor([x for x in labels for _ in range(num_images_per_prompt)], device=self.device)
        gen = make_generator(seed, generator)
        stats = DecodeStats(mode="mar+compiled" if compile else "mar", batch_size=len(labels),
                            num_tokens=self.transformer.seq_len, target_forwards=num_iter, slots=len(labels))
        start = time.perf_counter()
        tokens = self.transformer.generate(labels, num_iter=num_iter, cfg=guidance_scale, cfg_schedule=cfg_schedule,
                                           temperature=temperature, generator=gen)
        stats.wall_time_s = time.perf_counter() - start  # the decode, as the engine times it (the VAE apart)
        stats.row_forwards = torch.full((len(labels),), num_iter)
        return self.output(tokens, stats, output_type, return_dict,
                           lambda t: self.vae.decode(self.transformer.unpatchify(t)))

