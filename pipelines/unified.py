"""Unified-vocabulary image generation: Lumina-mGPT (on transformers' Chameleon), Emu3 and Janus.

One decoder-only model reads the prompt and writes the image in the same token sequence: the
prompt (through ``prompt_template``), a separator, the image opening (image start and the size
tokens), then rows of image codes, each closed by a row-end token, then the tokens ending the
image (:class:`visualspec.models.unified_ar.ImageLayout`). The engine forces the row ends and the
ending at their positions, inside Jacobi windows too, and keeps every other position to image
codes. Classifier-free guidance runs the family's unconditional context (Lumina's and Emu3's: the
image opening alone; Janus's: the prompt padded out but for BOS and the opening), left-padded into
the same batch. What differs between the families is in
:class:`visualspec.models.unified_ar.UnifiedFamily`.
"""

from __future__ import annotations

import warnings

import torch

from ..core.compiled import compiled_step
from ..core.engine import Requests, decode, precompile_decode
from ..core.sampling import SamplingConfig, make_generator
from ..core.window import WINDOWS
from ..models.llamagen_vq import nearest_codes
from ..models.unified_ar import GUIDANCE_SCHEDULES, lumina2_guidance, unified_family
from .base import register_pipeline
from .image import TOKEN_BENCH_MODES, TokenImagePipeline, caption_text, window_lengths


@register_pipeline
class UnifiedARPipeline(TokenImagePipeline):
    """Text-to-image with a unified-vocabulary model.

    Components: ``transformer`` (transformers' ``ChameleonForConditionalGeneration`` for
    Lumina-mGPT, ``Emu3ForConditionalGeneration`` or ``JanusForConditionalGeneration``; its config
    names the family), ``tokenizer`` (the text tokenizer, whose ids are the model's), ``vq_model``
    (the image tokenizer, for Chameleon only, which has none inside: anything with LlamaGen's
    ``decode_code(codes, shape)``, ``codebook_vectors()`` and ``downsample_factor``). Config: the
    default code grid ``image_height`` x ``image_width``, ``prompt_template`` (``{prompt}``,
    ``{width}`` and ``{height}`` in pixels are filled in), ``separator`` (the vocabulary's token
    after the prompt, or None; Lumina-mGPT's turn end is ``<reserved08706>``), Lumina's
    ``grid_tokens`` (whether the opening names the size), ``grid_cell_codes`` (codes per side of
    the 32-pixel cell its size tokens count: 2 for Lumina-mGPT 1, 4 for 2.0) and
    ``code_token_offset`` (2.0: code c is token ``155000 + c``; None: the vocabulary names them),
    ``trained_sizes`` (the ``[width, height]`` pixel sizes the checkpoint was trained at; None:
    not recorded) and sampling defaults (``default_epsilon_cutoff``, see
    :class:`visualspec.core.sampling.SamplingConfig`; ``default_guidance_schedule``: ``"constant"``, or
    ``"lumina2"``, Lumina-mGPT 2.0's, see :func:`visualspec.models.unified_ar.lumina2_guidance`).
    """

    model_cpu_offload_seq = "transformer->vq_model"
    _optional_components = ["vq_model"]
    display_name = "a unified-vocabulary model"
    decoding_modes = ("sjd", "ar", "lantern")
    bench_modes = {name: TOKEN_BENCH_MODES[name] for name in ("ar", "sjd", "sjd+coupling", "lantern")}
    default_bench_modes = ("ar", "ar+compiled", "sjd", "sjd+coupling", "lantern")  # the fastest AR too

    def __init__(self, transformer, tokenizer, vq_model=None, image_height: int = 16, image_width: int = 16,
                 prompt_template: str = "{prompt}", separator: str | None = "<reserved08706>",
                 grid_tokens: bool = True, grid_cell_codes: int = 2, code_token_offset: int | None = None,
                 trained_sizes: list | None = None, default_guidance_scale: float = 3.0,
                 default_guidance_schedule: str = "constant", default_top_k: int = 0,
                 default_epsilon_cutoff: float = 0.0, default_jacobi_init: str = "repeat_above",
                 default_lantern_k: int = 16, default_lantern_delta: float = 0.05):
        super().__init__()
        unified_family(transformer, vq_model).check_components()
        self.register_modules(transformer=transformer, tokenizer=tokenizer, vq_model=vq_model)
        self.register_to_config(image_height=image_height, image_width=image_width, prompt_template=prompt_template,
                                separator=separator, grid_tokens=grid_tokens, grid_cell_codes=grid_cell_codes,
                                code_token_offset=code_token_offset, trained_sizes=trained_sizes,
                                default_guidance_scale=default_guidance_scale,
                                default_guidance_schedule=default_guidance_schedule, default_top_k=default_top_k,
                                default_epsilon_cutoff=default_epsilon_cutoff, default_jacobi_init=default_jacobi_init,
                                default_lantern_k=default_lantern_k, default_lantern_delta=default_lantern_delta)

    @property
    def family(self):
        """What this model's family does its own way (layout, guidance, image tokenizer)."""
        return unified_family(self.transformer, self.vq_model)

    @property
    def layout(self):
        """The token layout of an image of the default size in this model's vocabulary."""
        return self.layout_for(self.config.image_height, self.config.image_width)

    def layout_for(self, height: int, width: int):
        """The token layout of a ``height`` x ``width`` code grid."""
        return self.family.layout(height, width, self.tokenizer, self.config.grid_tokens,
                                  self.config.grid_cell_codes, self.config.code_token_offset)

    def code_grid(self, height, width) -> tuple[int, int]:
        """The code grid of an image of ``height`` x ``width`` pixels (None: the default size), or a
        ValueError naming a size the image tokenizer cannot make. A size the checkpoint was not
        trained at gets a warning: its size tokens are forced to it all the same (unlike
        Lumina-mGPT 2.0's own script, which samples them and goes wrong; its issue #11)."""
        patch = self.family.pixels_per_code()
        h = self.config.image_height if height is None else height // patch
        w = self.config.image_width if width is None else width // patch
        for name, value in (("height", height), ("width", width)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < patch
                                      or value % patch):
                raise ValueError(f"{name} must be a positive multiple of {patch} pixels (one image code), "
                                 f"got {value!r}")
        sizes = self.config.trained_sizes
        if sizes and [w * patch, h * patch] not in [list(size) for size in sizes]:
            warnings.warn(f"{w * patch}x{h * patch} is not a size this checkpoint was trained at; its size tokens are "
                          f"forced to it, but the images may be poor (trained sizes include "
                          f"{', '.join(f'{a}x{b}' for a, b in list(sizes)[:4])}, ...)", stacklevel=4)
        return h, w

    def neighbour_table(self, k: int) -> torch.Tensor:
        """LANTERN's neighbourhoods in token ids (V, k): each image code's k nearest codes in the
        image tokenizer's codebook; every other token is its own (and so absorbs nothing)."""
        family = self.family
        layout, V = self.layout, family.token_model().vocab_size
        codebook = family.codebook()
        if codebook.shape[0] != len(layout.code_tokens):
            raise ValueError(f"the image tokenizer has {codebook.shape[0]} codes, the vocabulary "
                             f"{len(layout.code_tokens)} image code tokens")
        l2 = bool(getattr(family.image_tokenizer.config, "codebook_l2_norm", False))
        near = nearest_codes(codebook, k, l2_normalize=l2).cpu()  # the table is built on the CPU, then moved
        tokens = torch.tensor(layout.code_tokens)
        table = torch.arange(V)[:, None].repeat(1, k)
        table[tokens] = tokens[near.long()]
        return table.to(self.device)

    def check_inputs(self, prompts, decoding, output_type, window, jacobi_init, num_images_per_prompt,
                     lantern_k=16, lantern_delta=0.05, negative_prompts=None, guidance_schedule="constant",
                     coupling=False, batch_size=None) -> None:
        """Raise a ValueError naming the first bad argument of :meth:`__call__`."""
        if guidance_schedule not in GUIDANCE_SCHEDULES:
            raise ValueError(f"unknown guidance_schedule {guidance_schedule!r}; choose one of {GUIDANCE_SCHEDULES}")
        if negative_prompts is not None:
            if len(negative_prompts) != len(prompts):
                raise ValueError(f"negative_prompt must be one string or one per prompt: {len(negative_prompts)} "
                                 f"for {len(prompts)} prompts")
            for i, p in enumerate(negative_prompts):
                if not isinstance(p, str):
                    raise ValueError(f"negative_prompt[{i}] must be a string, got {p!r}")
        self.check_token_options(decoding, window, jacobi_init, coupling, lantern_k, lantern_delta)
        self.check_common(output_type, num_images_per_prompt, batch_size)
        if not prompts:
            raise ValueError("the prompt list is empty")
        for i, p in enumerate(prompts):
            if not isinstance(p, str) or not p.strip():
                raise ValueError(f"prompts[{i}] must be a non-empty string, got {p!r}")

    def check_prompt(self, prompt: str) -> None:
        """Raise a ValueError naming ``prompt`` if this model cannot read it."""
        self.check_inputs([prompt], "ar", "pil", 1, self.config.default_jacobi_init, 1)
        self.encode_prompts([prompt], guided=False)

    def encode_prompts(self, prompts: list[str], guided: bool, layout=None, negative_prompts: list[str] | None = None):
        """The model prefix ``(input_ids, attention_mask)``: each prompt's tokens, the separator and
        the image opening (of ``layout``, by default the default size's), left-padded; under
        guidance the unconditional rows follow: the family's, or ``negative_prompts`` written as the
        prompts are."""
        family, layout = self.family, layout or self.layout
        rows = self._prompt_rows(prompts, layout, "prompt")
        if guided:
            rows += (self._prompt_rows(negative_prompts, layout, "negative prompt") if negative_prompts is not None
                     else [family.unconditional(ids, layout) for ids in rows])
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        return ids, mask

    def _prompt_rows(self, prompts: list[str], layout, what: str) -> list[list[int]]:
        """Each prompt through the template, then the separator and the image opening, as token ids.
        A final full stop the tokenizer cannot read (a word-level vocabulary, as the shapes world's)
        is dropped, as a caption may end with one (:func:`caption_text`); a tokenizer that reads it
        keeps it."""
        vocab = getattr(self.transformer.config, "vocabulary_map", None) or self.tokenizer.get_vocab()
        patch = self.family.pixels_per_code()
        separator = []
        if self.config.separator:
            if self.config.separator not in vocab:
                raise ValueError(f"the separator {self.config.separator!r} is not in this model's vocabulary")
            separator = [int(vocab[self.config.separator])]
        unk = getattr(self.tokenizer, "unk_token_id", None)

        def ids(prompt: str) -> list[int]:
            text = self.config.prompt_template.format(prompt=prompt, width=layout.width * patch,
                                                      height=layout.height * patch)
            return self.tokenizer(text).input_ids

        rows = []
        for prompt in prompts:
            row = ids(prompt)
            if unk is not None and unk in row and caption_text(prompt) != prompt:
                row = ids(caption_text(prompt))
            if unk is not None and unk in row:
                raise ValueError(f"{what} {prompt!r} has words this model's tokenizer does not know")
            rows.append(row + separator + list(layout.opening))
        return rows

    @torch.no_grad()
    def __call__(self, prompt, *, negative_prompt=None, decoding: str = "sjd", num_images_per_prompt: int = 1,
                 guidance_scale: float | None = None, guidance_schedule: str | None = None,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                 epsilon_cutoff: float | None = None, window="auto", jacobi_init: str | None = None,
                 coupling: bool = False, lantern_k: int | None = None, lantern_delta: float | None = None,
                 height: int | None = None, width: int | None = None, batch_size: int | None = None,
                 seed: int | None = None, generator=None, output_type: str = "pil", return_dict: bool = True,
                 compile="auto"):
        """Generate images: ``decoding`` ``"ar"``, ``"sjd"`` (lossless) or ``"lantern"`` (lossy: a
        draft may take the mass of its ``lantern_k`` nearest codes up to ``lantern_delta``),
        ``height`` and ``width`` in pixels (None: the folder's size), ``batch_size``: at most
        this many images decode at once, a finished image's place going to the next (continuous
        batching, as in every token pipeline; None: all at once), and the LlamaGen pipeline's conventions
        for the rest (``epsilon_cutoff``, None: the folder's, drops the image codes to which the
        conditional model gives less than that probability; ``window="auto"`` measures window
        costs once per batch size on this machine; ``seed`` or one generator per image;
        ``output_type`` ``"pil"``, ``"np"``, ``"pt"`` or ``"latent"``: the generated tokens, row
        ends included; ``compile``: True, False or ``"auto"``, the model's window forward on a
        static cache through ``torch.compile``, as in the LlamaGen pipeline).

        Guidance: ``negative_prompt`` (one string, or one per prompt) makes the unconditional rows
        that text, written as a prompt is (as Emu3's model card guides), in place of the family's
        own unconditional context; ``guidance_schedule`` (None: the folder's) is ``"constant"`` or
        ``"lumina2"``, Lumina-mGPT 2.0's, which starts at ``guidance_scale`` and falls to 4 over the
        first tokens, and never goes below 4 (:func:`visualspec.models.unified_ar.lumina2_guidance`).
        Both are ignored at ``guidance_scale=1`` (no guidance)."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        negatives = None if negative_prompt is None else (
            [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else list(negative_prompt))
        d = self.folder_defaults(guidance_schedule=guidance_schedule, jacobi_init=jacobi_init, lantern_k=lantern_k,
                                 lantern_delta=lantern_delta, guidance_scale=guidance_scale, top_k=top_k,
                                 epsilon_cutoff=epsilon_cutoff)
        self.check_inputs(prompts, decoding, output_type, window, d["jacobi_init"], num_images_per_prompt,
                          d["lantern_k"], d["lantern_delta"], negatives, d["guidance_schedule"], coupling, batch_size)
        sampling = SamplingConfig(temperature=temperature, top_k=d["top_k"], top_p=top_p,
                                  guidance_scale=d["guidance_scale"], epsilon_cutoff=d["epsilon_cutoff"])
        prompts = [p for p in prompts for _ in range(num_images_per_prompt)]
        if negatives is not None:
            negatives = [p for p in negatives for _ in range(num_images_per_prompt)]
        family = self.family
        layout, target = self.layout_for(*self.code_grid(height, width)), family.token_model()
        constraints = layout.constraints(target.vocab_size,
                                         self.guidance_at_positions(layout, sampling, d["guidance_schedule"]))
        drafter, rule = self.token_decoding(
            decoding, sampling, vocab_size=target.vocab_size, grid_width=layout.row_length,
            jacobi_init=d["jacobi_init"], coupling=coupling, lantern_delta=d["lantern_delta"],
            lantern_k=min(d["lantern_k"], len(layout.code_tokens) - 1))  # a code has that many others
        gen = make_generator(seed, generator)
        slots = min(batch_size or len(prompts), len(prompts))
        prefix_of = self._prefix_of(prompts, sampling, layout, negatives)
        prefix = (Requests(len(prompts), prefix_of, slots) if slots < len(prompts)
                  else prefix_of(range(len(prompts))))
        compiled = compiled_step(target, compile, lambda r: prefix_of(range(r)), layout.num_tokens, len(prompts),
                                 slots)
        window = 1 if drafter is None else window  # AR has no window to choose
        auto = window == "auto"
        if compiled:  # every step the decode (and its window search) can take, before timing them
            precompile_decode(target, prefix_of(range(slots)), layout.num_tokens, sampling,
                              [w for w in WINDOWS if w <= layout.num_tokens] if auto else window_lengths(window),
                              drafts=drafter is not None, rule=rule, auto=auto, drafter=drafter,
                              constraints=constraints)
        if auto:  # whole decode steps, drafts and rule included (as_ar where none beats plain AR)
            window = self.auto_window(target, prefix_of(range(slots)), layout.num_tokens, sampling, drafter, rule,
                                      constraints)
        mode = decoding + ("+coupling" if coupling and drafter else "") + ("+compiled" if compiled else "")
        with self.progress_bar(total=layout.num_tokens * len(prompts)) as bar:
            tokens, stats = decode(target, prefix, layout.num_tokens, sampling, drafter=drafter, rule=rule,
                                   window=window, generator=gen, constraints=constraints,
                                   progress=bar.update, mode=mode)
        return self.output(tokens, stats, output_type, return_dict, lambda t: family.decode(layout.codes(t)))

    def guidance_at_positions(self, layout, sampling: SamplingConfig, schedule: str):
        """The guidance scale at each generated position under ``schedule``, or None where it is
        constant (or there is no guidance)."""
        if schedule == "constant" or not sampling.uses_guidance:
            return None
        scale = sampling.guidance_scale
        if scale < 4:
            warnings.warn(f"Lumina-mGPT 2.0's guidance schedule never goes below 4: guidance_scale={scale} acts as 4 "
                          f"(guidance_schedule='constant' keeps {scale})", stacklevel=4)
        cell = self.config.grid_cell_codes
        return lumina2_guidance(scale, layout.num_tokens, (layout.height // cell) * (layout.width // cell))

    def _prefix_of(self, prompts: list[str], sampling: SamplingConfig, layout, negatives: list[str] | None = None):
        """The model prefix of the prompts (and negative prompts) of given indices, as
        :class:`visualspec.core.engine.Requests` asks for it."""
        def prefix_of(rows):
            return self.encode_prompts([prompts[i] for i in rows], sampling.uses_guidance, layout,
                                       None if negatives is None else [negatives[i] for i in rows])

        return prefix_of

    def acceptance_grid(self) -> tuple[int, int]:
        """The image's rows of codes, each with its row-end column."""
        return self.layout.height, self.layout.row_length
