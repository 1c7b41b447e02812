"""Unified-vocabulary image generation: Lumina-mGPT's layout on transformers' Chameleon.

One decoder-only model reads the prompt and writes the image in the same token sequence: the
prompt (through ``prompt_template``), a separator, the image opening (image start and the two size
tokens), then rows of image codes, each closed by a row-end token, then the end-of-image token
(:class:`visualspec.models.unified_ar.ImageLayout`). The engine forces the row ends and the end at
their positions, inside Jacobi windows too, and keeps every other position to image codes.
Classifier-free guidance runs the unconditional branch on the image opening alone (Lumina-mGPT's
image-only context), left-padded into the same batch.
"""

from __future__ import annotations

import torch

from functools import partial

from visualspec.core.engine import decode
from visualspec.core.sampling import SamplingConfig, make_generator
from visualspec.core.verify import lantern_verify
from visualspec.drafters import INIT_SCHEMES, JacobiDrafter

from ..models.llamagen_vq import nearest_codes
from ..models.unified_ar import UnifiedImageLM, chameleon_layout
from .base import VisualSpecPipeline, register_pipeline
from .llamagen import OUTPUT_TYPES, VisualSpecImageOutput, vq_images

UNIFIED_DECODING_MODES = ("ar", "sjd", "lantern")


@register_pipeline
class UnifiedARPipeline(VisualSpecPipeline):
    """Text-to-image with a unified-vocabulary model (Lumina-mGPT's layout).

    Components: ``transformer`` (transformers' ``ChameleonForConditionalGeneration``; its
    ``vocabulary_map`` names the image codes and the layout's tokens), ``tokenizer`` (the text
    tokenizer, whose ids are the model's), ``vq_model`` (the image tokenizer; anything with
    LlamaGen's ``decode_code(codes, shape)``). Config: the code grid ``image_height`` x
    ``image_width``, ``prompt_template`` (``{prompt}``, ``{width}`` and ``{height}`` in pixels are
    filled in), ``separator`` (the vocabulary's token after the prompt; Lumina-mGPT's turn end
    ``<reserved08706>``), ``grid_tokens`` (whether the opening names the size) and sampling defaults.
    """

    model_cpu_offload_seq = "transformer->vq_model"

    def __init__(self, transformer, tokenizer, vq_model, image_height: int = 16, image_width: int = 16,
                 prompt_template: str = "{prompt}", separator: str | None = "<reserved08706>",
                 grid_tokens: bool = True, default_guidance_scale: float = 3.0, default_top_k: int = 0,
                 default_jacobi_init: str = "repeat_above", default_lantern_k: int = 16,
                 default_lantern_delta: float = 0.05):
        super().__init__()
        self.register_modules(transformer=transformer, tokenizer=tokenizer, vq_model=vq_model)
        self.register_to_config(image_height=image_height, image_width=image_width, prompt_template=prompt_template,
                                separator=separator, grid_tokens=grid_tokens,
                                default_guidance_scale=default_guidance_scale, default_top_k=default_top_k,
                                default_jacobi_init=default_jacobi_init, default_lantern_k=default_lantern_k,
                                default_lantern_delta=default_lantern_delta)

    @property
    def layout(self):
        """The image's token layout in this model's vocabulary."""
        return chameleon_layout(self.transformer.config.vocabulary_map, self.config.image_height,
                                self.config.image_width, self.config.grid_tokens)

    def neighbour_table(self, k: int) -> torch.Tensor:
        """LANTERN's neighbourhoods in token ids (V, k): each image code's k nearest codes in the
        image tokenizer's codebook; every other token is its own (and so absorbs nothing)."""
        layout, V = self.layout, self.transformer.config.vocab_size
        codebook = self.vq_model.quantize.embedding.weight.detach().float()
        if codebook.shape[0] != len(layout.code_tokens):
            raise ValueError(f"the image tokenizer has {codebook.shape[0]} codes, the vocabulary "
                             f"{len(layout.code_tokens)} image code tokens")
        near = nearest_codes(codebook, k, l2_normalize=bool(self.vq_model.config.codebook_l2_norm))
        tokens = torch.tensor(layout.code_tokens)
        table = torch.arange(V)[:, None].repeat(1, k)
        table[tokens] = tokens[near.long()]
        return table.to(self.device)

    def check_inputs(self, prompts, decoding, output_type, window, jacobi_init, num_images_per_prompt,
                     lantern_k=16, lantern_delta=0.05) -> None:
        """Raise a ValueError naming the first bad argument of :meth:`__call__`."""
        if decoding not in UNIFIED_DECODING_MODES:
            raise ValueError(f"unknown decoding mode {decoding!r} for a unified-vocabulary model; choose one of "
                             f"{UNIFIED_DECODING_MODES}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"unknown output_type {output_type!r}; choose one of {OUTPUT_TYPES}")
        if window != "auto" and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"window must be an integer >= 1 or 'auto', got {window!r}")
        if jacobi_init not in INIT_SCHEMES:
            raise ValueError(f"unknown jacobi_init {jacobi_init!r}; choose one of {INIT_SCHEMES}")
        if decoding == "lantern":
            if not 0 <= lantern_delta <= 1:
                raise ValueError(f"lantern_delta must be in [0, 1], got {lantern_delta!r}")
            if not isinstance(lantern_k, int) or isinstance(lantern_k, bool) or lantern_k < 1:
                raise ValueError(f"lantern_k must be an integer >= 1, got {lantern_k!r}")
        if not isinstance(num_images_per_prompt, int) or isinstance(num_images_per_prompt, bool) or \
                num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be an integer >= 1, got {num_images_per_prompt!r}")
        if not prompts:
            raise ValueError("the prompt list is empty")
        for i, p in enumerate(prompts):
            if not isinstance(p, str) or not p.strip():
                raise ValueError(f"prompts[{i}] must be a non-empty string, got {p!r}")

    def encode_prompts(self, prompts: list[str], guided: bool):
        """The model prefix ``(input_ids, attention_mask)``: each prompt's tokens, the separator and
        the image opening, left-padded; under guidance the unconditional rows follow, holding the
        opening alone."""
        layout, vocab = self.layout, self.transformer.config.vocabulary_map
        patch = 2 ** (len(self.vq_model.config.ch_mult) - 1)  # pixels per code (LlamaGen's VQ)
        texts = [self.config.prompt_template.format(prompt=p, width=self.config.image_width * patch,
                                                    height=self.config.image_height * patch) for p in prompts]
        separator = [int(vocab[self.config.separator])] if self.config.separator else []
        rows = [self.tokenizer(t).input_ids + separator + list(layout.opening) for t in texts]
        unk = getattr(self.tokenizer, "unk_token_id", None)
        for prompt, ids in zip(prompts, rows):
            if unk is not None and unk in ids:
                raise ValueError(f"prompt {prompt!r} has words this model's tokenizer does not know")
        if guided:
            rows += [list(layout.opening)] * len(prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        return ids, mask

    @torch.no_grad()
    def __call__(self, prompt, *, decoding: str = "sjd", num_images_per_prompt: int = 1,
                 guidance_scale: float | None = None, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float = 1.0, window="auto", jacobi_init: str | None = None, coupling: bool = False,
                 lantern_k: int | None = None, lantern_delta: float | None = None, seed: int | None = None,
                 generator=None, output_type: str = "pil", return_dict: bool = True):
        """Generate images: ``decoding`` ``"ar"``, ``"sjd"`` (lossless) or ``"lantern"`` (lossy: a
        draft may take the mass of its ``lantern_k`` nearest codes up to ``lantern_delta``), and the LlamaGen
        pipeline's conventions for the rest (``window="auto"`` measures window costs once per
        batch size on this machine; ``seed`` or one generator per image; ``output_type`` ``"pil"``,
        ``"np"``, ``"pt"`` or ``"latent"``: the generated tokens, row ends included)."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        jacobi_init = self.config.default_jacobi_init if jacobi_init is None else jacobi_init
        lantern_k = self.config.default_lantern_k if lantern_k is None else lantern_k
        lantern_delta = self.config.default_lantern_delta if lantern_delta is None else lantern_delta
        self.check_inputs(prompts, decoding, output_type, window, jacobi_init, num_images_per_prompt, lantern_k,
                          lantern_delta)
        guidance_scale = self.config.default_guidance_scale if guidance_scale is None else guidance_scale
        top_k = self.config.default_top_k if top_k is None else top_k
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance_scale)
        prompts = [p for p in prompts for _ in range(num_images_per_prompt)]
        prefix = self.encode_prompts(prompts, sampling.uses_guidance)
        layout, target = self.layout, UnifiedImageLM(self.transformer)
        constraints = layout.constraints(target.vocab_size)
        drafter, rule = None, None
        if decoding == "ar":
            window = 1
        if decoding in ("sjd", "lantern"):
            drafter = JacobiDrafter(target.vocab_size, jacobi_init, grid_width=layout.row_length, coupling=coupling)
            if window == "auto":
                window = self.window_policy(target, prefix, layout.num_tokens)
        if decoding == "lantern" and not sampling.greedy:
            k = min(lantern_k, len(layout.code_tokens) - 1)  # a code has that many others
            rule = partial(lantern_verify, neighbours=self.neighbour_table(k), delta=lantern_delta)
        with self.progress_bar(total=layout.num_tokens * len(prompts)) as bar:
            tokens, stats = decode(target, prefix, layout.num_tokens, sampling, drafter=drafter, rule=rule,
                                   window=window, generator=make_generator(seed, generator), constraints=constraints,
                                   mode=decoding + ("+coupling" if coupling and drafter else ""),
                                   progress=bar.update)
        images = tokens if output_type == "latent" else vq_images(self, layout.codes(tokens), output_type)
        if not return_dict:
            return images, stats
        return VisualSpecImageOutput(images=images, stats=stats)

    def window_policy(self, target, prefix, num_tokens: int):
        """``window="auto"``'s policy at this batch: its cost table, measured once per model, batch
        and machine and cached on disk."""
        from visualspec.core.window import WindowPolicy, cached_window_costs, prefix_rows

        return WindowPolicy({prefix_rows(prefix): cached_window_costs(target, prefix, num_tokens)})
