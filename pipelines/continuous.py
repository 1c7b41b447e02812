"""The continuous-token pipeline: prompt or class -> continuous latent tokens (AR or CSpD) -> KL decode.

The transformer is a causal continuous-token model
(:class:`visualspec.models.continuous_ar.ContinuousARTransformer`) that draws each token with MAR's
diffusion head; ``decoding="cspd"`` drafts ``gamma`` tokens a step with ``draft_model`` and keeps
them by CSpD's density-ratio rule (:func:`visualspec.core.continuous.decode_continuous`).
"""

from __future__ import annotations

import contextlib

import torch

from ..core.checks import check_int
from ..core.continuous import decode_continuous
from ..core.sampling import SamplingConfig, make_generator
from ..core.stats import merge_decode_stats
from ..drafters import ContinuousDraftModelDrafter
from ..models.continuous_ar import ContinuousARTransformer
from ..models.kl_vae import KLAutoencoder
from .base import register_pipeline
from .image import ImagePipeline, PromptConditioning, check_draft_compatible, compile_heads


@register_pipeline
class ContinuousARPipeline(PromptConditioning, ImagePipeline):
    """Components: ``transformer`` (the target), ``vae`` (:class:`KLAutoencoder`), for text models
    ``text_encoder`` and ``tokenizer``, and optionally ``draft_model`` (a smaller continuous-token
    model of the same token dimension) for ``decoding="cspd"``."""

    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _optional_components = ["text_encoder", "tokenizer", "draft_model"]
    display_name = "a continuous-token model"
    decoding_modes = ("ar", "cspd")
    bench_modes = {"ar": dict(decoding="ar"), "cspd": dict(decoding="cspd"),
                   "cspd+flat": dict(decoding="cspd", flatten=42.0)}  # the released CSpD code's ratio (lossy)
    default_bench_modes = ("ar", "cspd", "cspd+flat")

    def default_decoding(self) -> str:
        return "cspd" if self.draft_model is not None else "ar"

    def available_decodings(self) -> tuple[str, ...]:
        return ("ar", "cspd") if self.draft_model is not None else ("ar",)

    @classmethod
    def bench_settings(cls, mode: str) -> dict:
        """A mode, optionally ``@N`` for N diffusion-head steps per token (``ar@25``: the
        fewer-steps baseline)."""
        name, _, steps = mode.partition("@")
        if name in cls.bench_modes and steps.isdigit():
            return {**cls.bench_modes[name], "num_steps": int(steps)}
        if steps:
            raise ValueError(f"unknown benchmark mode {mode!r}: it is not built for {cls.display_name}; choose "
                             f"from {', '.join(cls.bench_modes)}, each optionally @STEPS")
        return super().bench_settings(mode)

    def __init__(self, transformer: ContinuousARTransformer, vae: KLAutoencoder, text_encoder=None, tokenizer=None,
                 draft_model: ContinuousARTransformer | None = None, default_guidance_scale: float = 3.0,
                 default_gamma: int = 4, default_prefill: float = 0.05):
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              draft_model=draft_model)
        self.register_to_config(default_guidance_scale=default_guidance_scale, default_gamma=default_gamma,
                                default_prefill=default_prefill)

    def check_inputs(self, decoding, gamma, prefill, guidance_scale, temperature, flatten, output_type,
                     num_images_per_prompt, num_steps=None, batch_size=None) -> None:
        self.check_decoding(decoding)
        if decoding == "cspd":
            if self.draft_model is None:
                raise ValueError("decoding='cspd' needs a draft_model (a smaller continuous-token model)")
            check_draft_compatible(self.transformer, self.draft_model, token_field="token_dim")
        check_int("gamma (drafts per step)", gamma)
        if not 0.0 <= prefill < 1.0:
            raise ValueError(f"the pre-fill fraction must lie in [0, 1), got {prefill!r}")
        check_int("num_steps (the diffusion head's sampling steps)", num_steps, 1, high=1000, optional=True)
        if not guidance_scale >= 1.0:
            raise ValueError(f"guidance_scale must be >= 1 (1 = no guidance), got {guidance_scale}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for a diffusion head, got {temperature}")
        if not flatten >= 1.0:
            raise ValueError(f"flatten must be >= 1 (1 = the exact rule), got {flatten}")
        self.check_common(output_type, num_images_per_prompt, batch_size)

    @torch.no_grad()
    def __call__(self, prompt=None, class_labels=None, *, decoding: str | None = None, gamma: int | None = None,
                 prefill: float | None = None, num_steps: int | None = None, guidance_scale: float | None = None,
                 temperature: float = 1.0, flatten: float = 1.0, num_images_per_prompt: int = 1,
                 batch_size: int | None = None, seed: int | None = None, generator=None, output_type: str = "pil",
                 return_dict: bool = True, compile: bool = False):
        """Generate images. ``decoding``: ``"ar"`` or ``"cspd"`` (default: cspd when the folder has
        a draft model); ``gamma`` drafts per step, ``prefill`` the share of tokens the target draws
        alone first, ``guidance_scale`` and the three default to the folder's; ``num_steps`` the
        diffusion heads' sampling steps per token (default: the models' own); ``temperature``
        scales the head's noise; ``flatten`` > 1 is the released CSpD code's flattened ratio
        (lossy, for measuring); ``seed`` / ``generator`` (one, or one per image); ``output_type``
        ``"pil"``, ``"np"``, ``"pt"`` or ``"latent"`` (tokens (B, N, D)). ``batch_size``: at most
        this many images decode at once, the rest in later groups (a row's tokens depend only on
        its condition and generator, so the grouping changes no image). ``compile=True`` runs the
        diffusion heads' sampler compiled (:meth:`DiffusionHead.compile_step`: 2-3x faster heads,
        where nine tenths of a token's time goes; the transformer stays eager), after compiling
        for 20-50 s on a CPU the first time in a process."""
        decoding = decoding or self.default_decoding()
        gamma, prefill, guidance_scale = (self.folder_default(name, value) for name, value in
                                          (("gamma", gamma), ("prefill", prefill), ("guidance_scale", guidance_scale)))
        self.check_inputs(decoding, gamma, prefill, guidance_scale, temperature, flatten, output_type,
                          num_images_per_prompt, num_steps, batch_size)
        compile_heads(compile, self.transformer, self.draft_model if decoding == "cspd" else None)
        sampling = SamplingConfig(guidance_scale=guidance_scale)
        cond = self._conditions(prompt, class_labels, num_images_per_prompt)
        gen = make_generator(seed, generator)
        rows = (cond[0] if isinstance(cond, tuple) else cond).shape[0]
        if isinstance(gen, (list, tuple)) and len(gen) != rows:
            raise ValueError(f"got {len(gen)} generators for a batch of {rows}")
        size = rows if batch_size is None else batch_size
        outputs = []
        heads = contextlib.ExitStack()
        for model in (self.transformer, self.draft_model if decoding == "cspd" else None):
            if model is not None:  # draft and target share each position's noise, so they take the same steps
                heads.enter_context(model.diffloss.sampling_steps(num_steps))
        with heads:
            for start in range(0, rows, size):
                ids = torch.arange(start, min(start + size, rows), device=self.device)
                part = tuple(c[ids] for c in cond) if isinstance(cond, tuple) else cond[ids]
                part_gen = gen[start:start + size] if isinstance(gen, (list, tuple)) else gen
                outputs.append(self._decode(part, sampling, decoding, gamma, prefill, guidance_scale, temperature,
                                            flatten, part_gen, compile))
        tokens = torch.cat([t for t, _ in outputs])
        stats = merge_decode_stats([s for _, s in outputs])
        return self.output(tokens, stats, output_type, return_dict, self.decode_images)

    def _decode(self, cond, sampling, decoding, gamma, prefill, guidance_scale, temperature, flatten, generator,
                compile=False):
        target, drafter = self.transformer, None
        if decoding == "cspd":
            drafter = ContinuousDraftModelDrafter(self.draft_model, self._prefix(self.draft_model, cond, sampling))
        return decode_continuous(target, self._prefix(target, cond, sampling), target.config.block_size,
                                 drafter=drafter, gamma=gamma, guidance_scale=guidance_scale, temperature=temperature,
                                 generator=generator, prefill=prefill if drafter is not None else 0.0,
                                 flatten=flatten, mode=decoding + ("+compiled" if compile else ""))

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Raster-order tokens (B, N, D) -> images (B, 3, H, W) in [-1, 1] through the autoencoder."""
        g = self.transformer.grid_size
        latents = tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], g, g)
        return self.vae.decode(latents.to(self.vae.dtype))
