"""The LlamaGen pipeline: class or text condition -> image tokens (AR, SJD, LANTERN or a draft model) -> VQ decode."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from diffusers.utils import BaseOutput

from visualspec.drafters import DraftModelDrafter, JacobiDrafter, INIT_SCHEMES
from visualspec.core.engine import Requests, decode
from visualspec.core.sampling import SamplingConfig, make_generator
from visualspec.core.stats import DecodeStats
from visualspec.core.verify import default_rule, gsd_verify, lantern_verify

from ..models.llamagen import LlamaGenGPT
from ..models.llamagen_vq import LlamaGenVQModel, nearest_codes
from .base import VisualSpecPipeline, register_pipeline

DECODING_MODES = ("ar", "sjd", "lantern", "gsd", "speculative")
OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@dataclass
class VisualSpecImageOutput(BaseOutput):
    """``images``: a list of PIL images, an (N, H, W, 3) float array in [0, 1], an (N, 3, H, W)
    tensor in [0, 1], or (N, h*w) token ids for ``output_type="latent"``; ``stats``: the decode
    statistics of the call."""

    images: Any
    stats: DecodeStats


def vq_images(pipe, codes: torch.Tensor, output_type: str = "pil"):
    """Code grids (B, h, w) -> images through ``pipe.vq_model`` (LlamaGen's VQ decoder): a list of
    PIL images, an (B, H, W, 3) array or a (B, 3, H, W) tensor in [0, 1]."""
    B, h, w = codes.shape
    shape = (B, pipe.vq_model.config.codebook_embed_dim, h, w)
    return image_output(pipe, pipe.vq_model.decode_code(codes.reshape(B, h * w), shape=shape), output_type)


def image_output(pipe, decoded: torch.Tensor, output_type: str = "pil"):
    """Decoded images (B, 3, H, W) in [-1, 1] -> a list of PIL images, an (B, H, W, 3) array or a
    (B, 3, H, W) tensor in [0, 1]."""
    images = ((decoded.float() + 1) / 2).clamp(0, 1)
    if output_type == "pt":
        return images
    array = images.permute(0, 2, 3, 1).cpu().numpy()
    return pipe.numpy_to_pil(array) if output_type == "pil" else array


def check_draft_compatible(target, draft, token_field: str = "vocab_size") -> None:
    """A draft model must make the target's tokens (its ``token_field``: the vocabulary, or a
    continuous token's dimension) over the same grid, and take the same condition."""
    fields = [token_field, "model_type", "block_size"]
    fields += ["cls_token_num", "caption_dim"] if target.config.model_type == "t2i" else ["num_classes"]
    for name in fields:
        if getattr(draft.config, name) != getattr(target.config, name):
            raise ValueError(f"the draft model's {name} ({getattr(draft.config, name)}) differs from the "
                             f"target's ({getattr(target.config, name)})")


def class_label_list(given, num_classes: int, model: str = "this model") -> list[int]:
    """The class labels of a call (an int, a list or a tensor) as a list of ints, or a ValueError
    naming the problem: a prompt given to a class model, an empty list, a label that is not an
    integer in [0, num_classes)."""
    if isinstance(given, torch.Tensor):
        given = given.tolist()
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    if any(isinstance(x, str) for x in items):
        raise ValueError(f"{model} is class-conditional: pass class labels (ints), not a prompt")
    if not items:
        raise ValueError("the class label list is empty")
    bad = [x for x in items if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < num_classes]
    if bad:
        raise ValueError(f"class labels must be integers in [0, {num_classes}), got {bad}")
    return [int(x) for x in items]


class PromptConditioning:
    """The conditions of an image pipeline whose ``transformer`` is LlamaGen-shaped (its config has
    ``model_type``, ``num_classes``, ``cls_token_num``, ``caption_dim``; it has ``null_condition``):
    prompts through ``text_encoder`` and ``tokenizer`` (text models) or class labels, checked, and
    the model prefix doubled as [cond; null] under guidance. Shared by the token and the
    continuous-token pipelines."""

    @property
    def is_text_conditional(self) -> bool:
        return self.transformer.config.model_type == "t2i"

    def _conditions(self, prompt, class_labels, num_images_per_prompt):
        """The model's condition for every image (B rows): class labels or (captions, mask)."""
        if prompt is not None and class_labels is not None:
            raise ValueError("pass either prompt or class_labels, not both")
        given = prompt if prompt is not None else class_labels
        if given is None:
            raise ValueError("nothing to generate: pass a prompt (text model) or class labels (class model)")
        items = [x for x in self._conditions_items(given) for _ in range(num_images_per_prompt)]
        if not self.is_text_conditional:
            return torch.tensor(items, dtype=torch.long, device=self.device)
        return self.encode_prompt(items)

    def _conditions_items(self, given) -> list:
        """The prompts or class labels of a call as a list, checked for the model's kind."""
        if isinstance(given, torch.Tensor):
            given = given.tolist()
        items = given if isinstance(given, (list, tuple)) else [given]
        if len(items) == 0:
            raise ValueError("the prompt list is empty")
        is_text = all(isinstance(x, str) for x in items)
        empty = [i for i, x in enumerate(items) if isinstance(x, str) and not x.strip()]
        if empty:
            raise ValueError(f"prompts[{empty[0]}] is empty; give each image a prompt")
        if self.is_text_conditional and not is_text:
            raise ValueError("this model is text-conditional: pass a prompt string or a list of strings")
        if not self.is_text_conditional:
            return class_label_list(items, self.transformer.config.num_classes)
        return list(items)

    def check_prompt(self, prompt) -> None:
        """Raise a ValueError naming what this pipeline cannot draw from ``prompt`` (a string for a
        text model, a class label for a class model): an empty prompt, a word the text encoder does
        not know, a label out of range. Cheap: nothing is encoded."""
        if isinstance(prompt, str) and not prompt.strip():
            raise ValueError("the prompt is empty")
        self._conditions_items([prompt])
        if self.is_text_conditional:
            self._check_words(prompt, self._tokenize([prompt]).input_ids[0])

    def _check_words(self, prompt: str, ids) -> None:
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is not None and bool((ids == unk).any()):
            words = [w for w in prompt.split() if unk in self.tokenizer(w, add_special_tokens=False).input_ids]
            raise ValueError(f"prompt {prompt!r} has words the text encoder does not know: {words}")

    def _tokenize(self, prompts: list[str]):
        """The caption tokens the text encoder reads: ``cls_token_num`` per prompt, cut or padded."""
        if self.text_encoder is None or self.tokenizer is None:
            raise ValueError("this text-conditional pipeline has no text_encoder/tokenizer to encode prompts")
        T = self.transformer.config.cls_token_num
        return self.tokenizer(prompts, padding="max_length", max_length=T, truncation=True, return_tensors="pt")

    def encode_prompt(self, prompts: list[str]):
        """Prompts -> (caption features (B, T, C), mask (B, T)), left-padded like LlamaGen."""
        enc = self._tokenize(prompts)
        for prompt, ids in zip(prompts, enc.input_ids):
            self._check_words(prompt, ids)
        ids, mask = enc.input_ids.to(self.device), enc.attention_mask.to(self.device)
        feats = self.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        if feats.shape[-1] != self.transformer.config.caption_dim:
            raise ValueError(f"text encoder gives {feats.shape[-1]} features, the transformer expects "
                             f"{self.transformer.config.caption_dim}")
        # left-pad: move each row's valid tokens to the end (the model saw captions this way)
        order = torch.argsort(mask, dim=1, stable=True)
        feats = feats.gather(1, order[..., None].expand_as(feats)) * mask.gather(1, order)[..., None]
        return feats.to(self.transformer.dtype), mask.gather(1, order)

    def _prefix(self, model, cond, sampling: SamplingConfig, rows=None):
        """The model input for B conditions (or for those of ``rows``), doubled as [cond; null]
        under guidance."""
        if rows is not None:
            cond = tuple(c[rows] for c in cond) if isinstance(cond, tuple) else cond[rows]
        feats, mask = cond if isinstance(cond, tuple) else (cond, None)
        if sampling.uses_guidance:
            B = feats.shape[0]
            feats = torch.cat([feats, model.null_condition(B).to(feats.dtype)])
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask)])
        return feats if mask is None else (feats, mask)


@register_pipeline
class LlamaGenPipeline(PromptConditioning, VisualSpecPipeline):
    """Class- or text-conditional image generation with a LlamaGen GPT and VQ tokenizer.

    Components: ``transformer`` (:class:`LlamaGenGPT`), ``vq_model`` (:class:`LlamaGenVQModel`),
    and for text-conditional models a ``text_encoder`` (any transformers encoder whose
    ``last_hidden_state`` has ``caption_dim`` features) with its ``tokenizer``. An optional
    ``draft_model`` (a smaller LlamaGen GPT of the same vocabulary) enables
    ``decoding="speculative"``.
    """

    model_cpu_offload_seq = "text_encoder->transformer->vq_model"
    _optional_components = ["text_encoder", "tokenizer", "draft_model"]

    def __init__(self, transformer: LlamaGenGPT, vq_model: LlamaGenVQModel, text_encoder=None, tokenizer=None,
                 draft_model: LlamaGenGPT | None = None, default_guidance_scale: float = 4.0,
                 default_top_k: int = 0, default_lantern_k: int = 1000, default_lantern_delta: float = 0.1,
                 default_jacobi_init: str = "random", default_epsilon_cutoff: float = 0.0,
                 default_coupling: bool = False, default_gsd_group_size: int = 3,
                 default_gsd_max_distance: float | None = None, default_siblings: int = 1,
                 default_sibling_depth: int = 2):
        super().__init__()
        self.register_modules(transformer=transformer, vq_model=vq_model, text_encoder=text_encoder,
                              tokenizer=tokenizer, draft_model=draft_model)
        # sampling defaults that belong to the model (saved in model_index.json)
        self.register_to_config(default_guidance_scale=default_guidance_scale, default_top_k=default_top_k,
                                default_lantern_k=default_lantern_k, default_lantern_delta=default_lantern_delta,
                                default_jacobi_init=default_jacobi_init,
                                default_epsilon_cutoff=default_epsilon_cutoff, default_coupling=default_coupling,
                                default_gsd_group_size=default_gsd_group_size,
                                default_gsd_max_distance=default_gsd_max_distance,
                                default_siblings=default_siblings, default_sibling_depth=default_sibling_depth)
        self._neighbour_tables: dict[tuple[int, bool], torch.Tensor] = {}

    # ------------------------------------------------------------------ LANTERN neighbourhoods

    def neighbour_table(self, k: int, l2_normalize: bool | None = None) -> torch.Tensor:
        """The k nearest codebook entries of every code (V, k), computed once per k."""
        if l2_normalize is None:
            l2_normalize = bool(self.vq_model.config.codebook_l2_norm)
        key = (k, l2_normalize)
        if key not in self._neighbour_tables:
            codebook = self.vq_model.quantize.embedding.weight.detach().float()
            self._neighbour_tables[key] = nearest_codes(codebook, k, l2_normalize=l2_normalize).to(torch.int32)
        return self._neighbour_tables[key].to(self.device)

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def __call__(
        self,
        prompt=None,
        class_labels=None,
        *,
        decoding: str = "sjd",
        num_images_per_prompt: int = 1,
        guidance_scale: float | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        epsilon_cutoff: float | None = None,
        window="auto",
        batch_size: int | None = None,
        jacobi_init: str | None = None,
        coupling: bool | None = None,
        siblings: int | None = None,
        sibling_depth: int | None = None,
        lantern_k: int | None = None,
        lantern_delta: float | None = None,
        lantern_lambda: float | None = None,
        gsd_group_size: int | None = None,
        gsd_max_distance: float | None = None,
        seed: int | None = None,
        generator=None,
        output_type: str = "pil",
        return_dict: bool = True,
    ):
        """Generate images.

        - ``prompt``: a string or list of strings (text model), or class labels (class model);
          ``class_labels=`` is the explicit spelling for class models.
        - ``decoding``: ``"ar"`` (one token per forward), ``"sjd"`` (Speculative Jacobi Decoding,
          lossless), ``"lantern"`` (Jacobi drafts with LANTERN relaxed acceptance, lossy, budget
          ``lantern_delta`` over ``lantern_k`` codebook neighbours, or ``lantern_lambda``), or
          ``"gsd"`` (Jacobi drafts with grouped acceptance, lossy, see ``gsd_group_size``), or
          ``"speculative"`` (the ``draft_model`` drafts ``window - 1`` tokens, lossless).
        - ``guidance_scale``, ``top_k``, ``epsilon_cutoff``, ``lantern_k``, ``lantern_delta`` and
          ``jacobi_init`` default to the model's own settings (``pipe.config.default_*``; LlamaGen's
          are 4.0, 0 = no top-k, 0 = no cut-off, 1000, 0.1 and ``"random"``).
        - ``epsilon_cutoff``: leave out tokens whose conditional probability (before guidance) is
          below it, so guidance cannot promote them (see ``SamplingConfig``).
        - ``jacobi_init``: how SJD and LANTERN fill window positions nobody has predicted yet:
          ``"random"`` tokens (SJD's paper), or the token to the left (``"repeat_left"``) or one row
          above (``"repeat_above"``). The rule stays exact for any of them; only speed changes.
        - ``temperature=0`` decodes greedily in every mode (drafts verified by argmax match).
        - ``window``: tokens per target forward in the speculative modes, or ``"auto"``: the engine
          picks it each step from the measured cost of a window at this batch size on this machine
          (measured once per model and batch size, cached) and the acceptance seen so far.
        - ``batch_size``: at most this many images decode at once; the rest wait and take the
          place of finished ones (continuous batching). Default: all at once.
        - ``coupling``: Jacobi drafts re-drawn by maximal coupling with their previous draft
          (speculative coupled decoding; lossless). Default from the folder.
        - ``siblings``, ``sibling_depth``: proactive drafting (SJD-PAC's sibling tree; lossless, for
          ``"sjd"`` and ``"speculative"``): the first ``sibling_depth`` draft positions get
          ``siblings`` candidates each, scored as a tree in the same forward. 1 = off. Defaults from
          the folder.
        - ``gsd_group_size``, ``gsd_max_distance``: for ``decoding="gsd"`` (grouped speculative
          decoding, lossy): a draft is accepted with the target mass of its group, the tokens within
          ``gsd_group_size`` ranks of it in the target's ranking whose codebook vectors lie within
          ``gsd_max_distance`` (squared) of its own. Defaults from the folder.
        - ``seed`` or ``generator`` (a ``torch.Generator`` or one per image) make results repeatable.
        - ``output_type``: ``"pil"``, ``"np"``, ``"pt"`` or ``"latent"`` (token ids).
        """
        jacobi_init = self.config.default_jacobi_init if jacobi_init is None else jacobi_init
        coupling = self.config.get("default_coupling", False) if coupling is None else coupling
        siblings = self.config.get("default_siblings", 1) if siblings is None else siblings
        sibling_depth = self.config.get("default_sibling_depth", 2) if sibling_depth is None else sibling_depth
        top_k = self.config.default_top_k if top_k is None else top_k
        epsilon_cutoff = self.config.default_epsilon_cutoff if epsilon_cutoff is None else epsilon_cutoff
        lantern_k = self.config.default_lantern_k if lantern_k is None else lantern_k
        lantern_delta = self.config.default_lantern_delta if lantern_delta is None else lantern_delta
        gsd_group_size = self.config.get("default_gsd_group_size", 3) if gsd_group_size is None else gsd_group_size
        if gsd_max_distance is None:
            gsd_max_distance = self.config.get("default_gsd_max_distance")
        guidance_scale = self.config.default_guidance_scale if guidance_scale is None else guidance_scale
        self.check_inputs(decoding, output_type, window, num_images_per_prompt, batch_size, jacobi_init, coupling,
                          lantern_k, lantern_delta, lantern_lambda, gsd_group_size, gsd_max_distance, siblings,
                          sibling_depth)
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance_scale,
                                  epsilon_cutoff=epsilon_cutoff)

        cond = self._conditions(prompt, class_labels, num_images_per_prompt)
        gen = make_generator(seed, generator)
        model = self.transformer
        num_tokens, vocab = model.config.block_size, model.config.vocab_size
        rows = (cond[0] if isinstance(cond, tuple) else cond).shape[0]
        slots = rows if batch_size is None else min(batch_size, rows)

        def prefix_of(target, ids=None):
            return self._prefix(target, cond, sampling, ids)

        queued = slots < rows
        prefix = Requests(rows, lambda ids: prefix_of(model, ids), slots) if queued else prefix_of(model)
        drafter, rule = None, default_rule(sampling)
        if decoding in ("sjd", "lantern", "gsd"):
            drafter = JacobiDrafter(vocab, jacobi_init, grid_width=model.grid_size, coupling=coupling)
        if decoding == "speculative":
            check_draft_compatible(model, self.draft_model)
            draft = self.draft_model
            drafter = DraftModelDrafter(draft, (lambda ids: prefix_of(draft, ids)) if queued else prefix_of(draft))
        if decoding == "lantern" and not sampling.greedy:
            table = self.neighbour_table(min(lantern_k, vocab - 1))
            delta = None if lantern_lambda is not None else lantern_delta
            rule = partial(lantern_verify, neighbours=table, delta=delta, lam=lantern_lambda)
        if decoding == "gsd" and not sampling.greedy:
            rule = partial(gsd_verify, group_size=gsd_group_size, embeddings=self.code_vectors(),
                           max_distance=gsd_max_distance)
        tree = drafter is not None and siblings > 1 and sibling_depth > 0
        if window == "auto":
            window = (self.window_policy(prefix_of, slots, siblings if tree else 1, sibling_depth)
                      if drafter is not None else 1)

        with self.progress_bar(total=num_tokens * rows) as bar:
            mode = decoding + ("+coupling" if coupling and drafter else "") + ("+pd" if tree else "")
            tokens, stats = decode(model, prefix, num_tokens, sampling, drafter=drafter, rule=rule, window=window,
                                   generator=gen, mode=mode, progress=bar.update, siblings=siblings if tree else 1,
                                   sibling_depth=sibling_depth)
        images = tokens if output_type == "latent" else self.decode_tokens(tokens, output_type)
        if not return_dict:
            return images, stats
        return VisualSpecImageOutput(images=images, stats=stats)

    def check_inputs(self, decoding, output_type, window, num_images_per_prompt, batch_size, jacobi_init, coupling,
                     lantern_k, lantern_delta, lantern_lambda, gsd_group_size, gsd_max_distance, siblings=1,
                     sibling_depth=2) -> None:
        """Raise a ValueError naming the first bad argument of :meth:`__call__`."""
        if decoding not in DECODING_MODES:
            raise ValueError(f"unknown decoding mode {decoding!r}; choose one of {DECODING_MODES}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"unknown output_type {output_type!r}; choose one of {OUTPUT_TYPES}")
        if window != "auto" and not hasattr(window, "search") and (
                not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"window must be an integer >= 1, 'auto' or a WindowPolicy, got {window!r}")
        for name, value in (("num_images_per_prompt", num_images_per_prompt), ("batch_size", batch_size)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if jacobi_init not in INIT_SCHEMES:
            raise ValueError(f"unknown jacobi_init {jacobi_init!r}; choose one of {INIT_SCHEMES}")
        if not isinstance(coupling, bool):
            raise ValueError(f"coupling must be True or False, got {coupling!r}")
        for name, value, low in (("siblings", siblings, 1), ("sibling_depth", sibling_depth, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if siblings > 1 and decoding in ("lantern", "gsd"):
            raise ValueError(f"siblings (proactive drafting) are verified exactly; decoding={decoding!r} is relaxed: "
                             f"use 'sjd' or 'speculative', or siblings=1")
        if decoding == "speculative" and self.draft_model is None:
            raise ValueError("decoding='speculative' needs a draft_model; load one with "
                             "from_pretrained(..., draft_model=model) or use 'sjd'")
        if decoding == "lantern":
            if lantern_lambda is None and not 0 <= lantern_delta <= 1:
                raise ValueError(f"lantern_delta must be in [0, 1], got {lantern_delta!r}")
            if lantern_lambda is not None and lantern_lambda < 1:
                raise ValueError(f"lantern_lambda must be >= 1, got {lantern_lambda!r}")
            if not isinstance(lantern_k, int) or lantern_k < 1:
                raise ValueError(f"lantern_k must be an integer >= 1, got {lantern_k!r}")
        if decoding == "gsd":
            if not isinstance(gsd_group_size, int) or isinstance(gsd_group_size, bool) or gsd_group_size < 0:
                raise ValueError(f"gsd_group_size must be an integer >= 0, got {gsd_group_size!r}")
            if gsd_max_distance is not None and not gsd_max_distance >= 0:
                raise ValueError(f"gsd_max_distance must be >= 0 or None, got {gsd_max_distance!r}")

    def code_vectors(self) -> torch.Tensor:
        """The VQ codebook vectors (V, D) that LANTERN and GSD measure visual similarity with
        (L2-normalised when the tokenizer normalises its codes)."""
        codebook = self.vq_model.quantize.embedding.weight.detach().float()
        if self.vq_model.config.codebook_l2_norm:
            codebook = torch.nn.functional.normalize(codebook, dim=-1)
        return codebook.to(self.device)

    def window_policy(self, prefix_of, slots: int, siblings: int = 1, sibling_depth: int = 2):
        """The :class:`visualspec.core.window.WindowPolicy` of ``window="auto"`` at ``slots`` images: cost
        tables at slots, slots/2, ..., 1 images (the batch shrinks as images finish), measured
        once per model and batch size on this machine and cached on disk; with ``siblings`` > 1
        also the cost of whole sibling-tree steps
        (:func:`visualspec.core.proactive.tree_step_timer`)."""
        from visualspec.core.proactive import tree_step_timer
        from visualspec.core.window import WindowPolicy, prefix_rows
        from visualspec.core.window_costs import cached_window_costs

        tables, trees, rows = {}, {}, slots
        model, N = self.transformer, self.transformer.config.block_size
        while True:
            prefix = prefix_of(model, list(range(rows)))
            model_rows = prefix_rows(prefix)
            tables[model_rows] = cached_window_costs(model, prefix, N)
            if siblings > 1 and sibling_depth > 0:
                step = tree_step_timer(model, model_rows // rows, siblings, sibling_depth)
                trees[model_rows] = cached_window_costs(model, prefix, N, forward=step,
                                                        tag=f"tree={siblings}x{sibling_depth}")
            if rows == 1:
                return WindowPolicy(tables, trees)
            rows = max(1, rows // 2)

    def window_tables(self, prompt=None, class_labels=None, *, batch_size: int = 1,
                      guidance_scale: float | None = None) -> dict[int, dict[int, float]]:
        """The cost tables ``window="auto"`` decodes ``batch_size`` images of this condition with,
        ``{model_rows: {W: seconds per forward}}`` (see :meth:`window_policy`)."""
        scale = self.config.default_guidance_scale if guidance_scale is None else guidance_scale
        cond = self._conditions(prompt, class_labels, batch_size)
        sampling = SamplingConfig(guidance_scale=scale)

        return self.window_policy(lambda target, ids: self._prefix(target, cond, sampling, ids), batch_size).tables

    def decode_tokens(self, tokens: torch.Tensor, output_type: str = "pil"):
        """Token ids (B, h*w) -> images through the VQ decoder."""
        g = self.transformer.grid_size
        return vq_images(self, tokens.view(-1, g, g), output_type)
