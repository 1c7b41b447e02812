"""What every image pipeline shares: its output, its conditions, its folder defaults, its input
checks, and the surface it declares to the command line, ``batch``, ``bench`` and the app.

A pipeline family subclasses :class:`ImagePipeline` and declares

- ``display_name``: how messages name it (``"MAR"``, ``"a unified-vocabulary model"``);
- ``decoding_modes`` and :meth:`ImagePipeline.default_decoding`: the values of ``decoding=``;
- ``bench_modes`` / ``default_bench_modes`` (and :meth:`ImagePipeline.bench_settings` for spelled
  combinations): what ``visualspec bench`` can compare, as ``__call__`` arguments;
- its call options: read from the ``__call__`` signature (:meth:`ImagePipeline.call_options`);
- :meth:`ImagePipeline.acceptance_grid`: the raster grid of :meth:`ImagePipeline.acceptance_map`,
  the picture of which forward fixed each token (None: not drawn in raster order);
- :meth:`TokenImagePipeline.auto_window`: what ``window="auto"`` decodes with (token pipelines only);
- :meth:`ImagePipeline.load_draft_model`: how a ``--draft-model`` folder loads, if it takes one.

Tools read only these, so a new family needs only its own files (``tests/pipelines/test_new_family.py``
proves it with a throwaway family).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

import numpy as np
import torch
from diffusers.utils import BaseOutput

from ..core.checks import check_positive_int, is_int
from ..core.engine import decode
from ..core.judge import JudgeRule
from ..core.sampling import SamplingConfig, make_generator
from ..core.stats import DecodeStats
from ..core.verify import default_rule, gsd_verify, lantern_verify
from ..core.window import WINDOWS, prefix_rows
from ..core.window_costs import step_policy, step_tag, window_policy
from ..drafters import (INIT_SCHEMES, DenoisingJacobiDrafter, DraftModelDrafter, FeatureDrafter, HybridDrafter,
                       JacobiDrafter)
from ..models.feature_drafter import check_target, weights_hash
from ..models.judge import check_judge
from .base import VisualSpecPipeline

OUTPUT_TYPES = ("pil", "np", "pt", "latent")
# arguments every image pipeline takes in the same way; not part of a family's options
COMMON_ARGUMENTS = ("prompt", "class_labels", "num_images_per_prompt", "seed", "generator", "output_type",
                    "return_dict")


@dataclass
class VisualSpecImageOutput(BaseOutput):
    """``images``: a list of PIL images, an (N, H, W, 3) float array in [0, 1], an (N, 3, H, W)
    tensor in [0, 1], or the generated tokens for ``output_type="latent"``; ``stats``: the decode
    statistics of the call."""

    images: Any
    stats: DecodeStats


def options_text(names) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class ImagePipeline(VisualSpecPipeline):
    """Base of every image pipeline (see the module docstring for what a family declares)."""

    display_name = "an image model"
    decoding_modes: tuple[str, ...] = ("ar",)
    bench_modes: Mapping[str, dict] = {}
    default_bench_modes: tuple[str, ...] = ()
    is_text_conditional = True

    # ------------------------------------------------------------------ the declared surface

    @classmethod
    def call_options(cls) -> tuple[str, ...]:
        """The keyword arguments of ``__call__`` that set how images are drawn (its signature less
        :data:`COMMON_ARGUMENTS` and ``**kwargs``)."""
        params = inspect.signature(cls.__call__).parameters.values()
        return tuple(p.name for p in params if p.name != "self" and p.name not in COMMON_ARGUMENTS
                     and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))

    @classmethod
    def refuse_options(cls, given, spell: Callable[[str], str] = str, offered=None) -> None:
        """A ValueError naming the options in ``given`` (argument names) that ``__call__`` does not
        take, and those it does take among ``offered`` (default: all), each written by ``spell``
        (the command line's: ``--top-k``)."""
        options = cls.call_options()
        unknown = [name for name in given if name not in options]
        if unknown:
            takes = [spell(n) for n in options if offered is None or n in offered]
            raise ValueError(f"{options_text([spell(n) for n in unknown])} {'is' if len(unknown) == 1 else 'are'} "
                             f"not an option of {cls.display_name} ({cls.__name__}): it takes "
                             f"{options_text(takes) if takes else 'none of them'}")

    def default_decoding(self) -> str:
        """The decoding of a call that names none."""
        return self.decoding_modes[0]

    def available_decodings(self) -> tuple[str, ...]:
        """The decodings this folder can run as it is (a draft model's need one loaded)."""
        return self.decoding_modes

    @classmethod
    def check_decoding(cls, decoding) -> None:
        if decoding not in cls.decoding_modes:
            modes = " or ".join(map(repr, cls.decoding_modes))
            raise ValueError(f"unknown decoding mode {decoding!r}: {cls.display_name} decodes with {modes}; "
                             f"{decoding!r} is not built for {cls.display_name}")

    @classmethod
    def bench_mode(cls, mode: str) -> dict:
        """The ``__call__`` arguments of benchmark mode ``mode``, or a ValueError listing the modes.
        Where the pipeline takes ``compile``, a mode runs eagerly and ``MODE+compiled`` runs it
        with the compiled step."""
        compiles = "compile" in cls.call_options()
        if compiles and mode.endswith("+compiled"):
            return {**cls.bench_mode(mode[:-len("+compiled")]), "compile": True}
        return {**cls.bench_settings(mode), **({"compile": False} if compiles else {})}

    @classmethod
    def bench_settings(cls, mode: str) -> dict:
        """The decoding arguments of benchmark mode ``mode`` (:meth:`bench_mode` adds ``compile``)."""
        if mode in cls.bench_modes:
            return dict(cls.bench_modes[mode])
        if not cls.bench_modes:
            raise ValueError(f"bench compares decodings of one model; {cls.display_name} has one: time it with "
                             f"generate --stats")
        raise ValueError(f"unknown benchmark mode {mode!r}: it is not built for {cls.display_name}; choose from "
                         f"{', '.join(cls.bench_modes)}")

    def acceptance_grid(self) -> tuple[int, int] | None:
        """``(rows, columns)`` of the tokens an image is drawn as, in raster order, for
        :meth:`acceptance_map`; None where they are not drawn in raster order."""
        return None

    def raster_grid(self) -> tuple[int, int]:
        """:meth:`acceptance_grid`, or a ValueError where the pipeline has none."""
        grid = self.acceptance_grid()
        if grid is None:
            raise ValueError(f"{self.display_name} ({type(self).__name__}) draws no acceptance map: its tokens are "
                             f"not drawn in raster order")
        return grid

    def acceptance_map(self, stats: DecodeStats, scale: int = 8):
        """The picture of which forward fixed each token of the first image (the first
        rows x columns tokens: a unified layout's row ends are a column, what follows is left out)."""
        grid = self.raster_grid()
        n = grid[0] * grid[1]
        shown = dataclasses.replace(stats, fixed_at=stats.fixed_at[:, :n], num_tokens=n)
        return shown.acceptance_map_image(*grid, scale=scale)

    def load_draft_model(self, folder: str) -> None:
        """Load the draft model in ``folder`` into this pipeline (families that take one override)."""
        raise ValueError(f"{self.display_name} ({type(self).__name__}) takes no --draft-model")

    # ------------------------------------------------------------------ folder defaults, checks

    def folder_default(self, name: str, value):
        """``value``, or when it is None the folder's ``default_<name>`` (None if the folder has
        none): ``x=None`` means the folder's default everywhere."""
        return self.config.get(f"default_{name}") if value is None else value

    def folder_defaults(self, **values) -> dict:
        """:meth:`folder_default` of every keyword, as a dict."""
        return {name: self.folder_default(name, value) for name, value in values.items()}

    def check_common(self, output_type: str, num_images_per_prompt, batch_size=None) -> None:
        """Checks every image pipeline makes the same way."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"unknown output_type {output_type!r}; choose one of {OUTPUT_TYPES}")
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        check_positive_int("batch_size", batch_size, optional=True)

    # ------------------------------------------------------------------ outputs

    def postprocess(self, decoded: torch.Tensor, output_type: str = "pil"):
        """Decoded images (B, 3, H, W) in [-1, 1] -> a list of PIL images, an (B, H, W, 3) array or
        a (B, 3, H, W) tensor in [0, 1]."""
        images = ((decoded.float() + 1) / 2).clamp(0, 1)
        if output_type == "pt":
            return images
        array = images.permute(0, 2, 3, 1).cpu().numpy()
        return self.numpy_to_pil(array) if output_type == "pil" else array

    def output(self, tokens, stats: DecodeStats, output_type: str, return_dict: bool, decode: Callable):
        """The result of a call: ``decode(tokens)`` (images in [-1, 1]) post-processed, or the
        tokens themselves for ``output_type="latent"``."""
        images = tokens if output_type == "latent" else self.postprocess(decode(tokens), output_type)
        return VisualSpecImageOutput(images=images, stats=stats) if return_dict else (images, stats)

    def window_tables(self, prompt=None, *, batch_size: int = 1, **call_kwargs) -> dict:
        """The window policy a call with ``window="auto"`` decodes ``batch_size`` images of
        ``prompt`` with (what ``visualspec batch`` records, so that a resumed run steps as the
        first did): ``{"tables": {model_rows: {W: seconds per forward}}, "tokens": {W: tokens per
        row-step}}``, or ``{}`` for a pipeline without token windows."""
        return {}


def window_lengths(window) -> list[int]:
    """The window lengths a decode with ``window`` (an int or a WindowPolicy) can step with."""
    if hasattr(window, "tables"):
        return sorted({w for table in window.tables.values() for w in table})
    return [int(window)]


# ---------------------------------------------------------------------- token decodings

# what drafts, for the decodings whose rule takes any drafts
DRAFTS = ("jacobi", "feature", "hybrid", "draft_model", "denoising")
DENOISING_WINDOW = 32  # drafts="denoising" (SJD2): its fixed window, where a call asks for "auto"
HYBRID_FEATURE_DEPTH = 1  # drafts="hybrid": positions the feature drafter drafts, where a folder sets none
FEATURE_DRAFTS = ("feature", "hybrid")  # the drafts a feature drafter makes (all, or the first of each window)
DEFAULT_DRAFTS = {"sjd": "jacobi", "lantern": "jacobi", "gsd": "jacobi", "judge": "jacobi",
                  "speculative": "draft_model", "feature": "feature"}

TOKEN_BENCH_MODES = {
    "ar": dict(decoding="ar"),
    "sjd": dict(decoding="sjd", coupling=False),
    "sjd+coupling": dict(decoding="sjd", coupling=True),
    "sjd+pd": dict(decoding="sjd", coupling=False, siblings=3, sibling_depth=2),
    "sjd+coupling+pd": dict(decoding="sjd", coupling=True, siblings=3, sibling_depth=2),
    "lantern": dict(decoding="lantern"),
    "gsd": dict(decoding="gsd"),
    "judge": dict(decoding="judge"),
    "speculative": dict(decoding="speculative"),
    "feature": dict(decoding="feature"),
    "sjd+feature": dict(decoding="sjd", drafts="feature"),  # +feature: a relaxed rule over the feature drafter's drafts
    "sjd+hybrid": dict(decoding="sjd", drafts="hybrid"),  # +hybrid: the feature drafter's first drafts, Jacobi's after
    "sjd+denoising": dict(decoding="sjd", drafts="denoising"),  # SJD2: noised Jacobi drafts (a fine-tuned transformer)
}


class TokenImagePipeline(ImagePipeline):
    """An image pipeline of discrete tokens decoded by the engine: AR, SJD and the relaxed rules
    over Jacobi drafts, built by :meth:`token_decoding`. ``bench_mode`` also spells
    ``DECODING+coupling`` and ``DECODING+pd`` (proactive drafting: 3 candidates at the first 2
    draft positions) for the decodings the family has, and ``lantern@DELTA`` / ``judge@THRESHOLD``."""

    #: ``DECODING@VALUE`` bench modes: the setting VALUE gives (``lantern@0.2``, ``judge@0.9``)
    bench_values = {"lantern": "lantern_delta", "judge": "judge_threshold"}

    @classmethod
    def bench_settings(cls, mode: str) -> dict:
        if "@" in mode:
            name, _, value = mode.partition("@")
            if name not in cls.bench_values or name not in cls.bench_modes:
                raise ValueError(f"bench mode {mode!r}: only {', '.join(m for m in cls.bench_values if m in cls.bench_modes)}"
                                 f" take @VALUE ({cls.display_name})")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"bench mode {mode!r}: {value!r} after @ is not a number") from None
            return {**cls.bench_settings(name), cls.bench_values[name]: number}
        decoding, *extras = mode.split("+")
        if mode not in cls.bench_modes and decoding in cls.bench_modes and extras \
                and len(set(extras)) == len(extras):
            combined = {**cls.bench_modes[decoding]}
            for extra in extras:
                part = cls.bench_modes.get(f"sjd+{extra}")
                if part is None:
                    break
                combined.update({k: v for k, v in part.items() if k != "decoding" and (k != "coupling" or v)})
            else:
                return combined
        return super().bench_settings(mode)

    #: the :class:`visualspec.core.window.WindowPolicy` of this pipeline's latest call whose
    #: ``window="auto"`` speculated (its tables and first estimates), for inspection; None before
    last_window_policy = None
    #: the argument a call takes its window policy by (``visualspec batch`` passes the recorded one)
    window_argument = "window"

    def auto_window(self, model, prefix, num_tokens: int, sampling: SamplingConfig, drafter, rule,
                    constraints=None, windows=WINDOWS, fixed: bool | None = None):
        """``window="auto"`` for a call that speculates with ``drafter`` and ``rule``: the policy of
        :func:`visualspec.core.window_costs.step_policy`, whose table holds the cost of whole decode
        steps of ``prefix`` (the call's first batch, not a queue) at each fixed window, drafts, rule
        and commit included, measured once per machine, batch and kind of step and cached, beside
        plain AR's step. With Jacobi drafts (which carry over between steps) the call decodes at
        the fixed window whose timed decode committed tokens fastest (a search that mixes windows
        starts cold drafts and committed fewer: the policy's ``fixed``,
        docs/experiments/2026-11-28-fixed-window-vs-search.md); drafts made afresh each step (the
        feature drafter, a draft model) keep the search, unless ``fixed`` says otherwise. Where no
        window is expected to beat plain AR the policy's ``as_ar`` is set: the engine decodes the
        call without drafts (its stats' mode says ``as AR``). So speculation is never slower than
        AR but for the noise of the measurements. ``windows``: the candidates (each a step's
        last committed token and its W - 1 drafts). The target must be compiled (or not)
        as the call will run it, every window bucket included, before this runs."""
        def decode_at(w: int, seed: int = 0, drafts=drafter):
            return decode(model, prefix, num_tokens, sampling, drafter=drafts, rule=rule if drafts else None,
                          window=w, generator=make_generator(seed), constraints=constraints)[1]

        self.last_window_policy = step_policy(model, decode_at, num_tokens, prefix_rows(prefix),
                                              step_tag(drafter, rule, sampling), windows,
                                              ar_at=lambda: decode_at(1, drafts=None),
                                              fixed=getattr(drafter, "carries_drafts", False) if fixed is None
                                              else fixed)
        return self.last_window_policy

    def window_tables(self, prompt=None, *, batch_size: int = 1, **call_kwargs) -> dict:
        """Decodes one batch of ``batch_size`` images of ``prompt`` (repeated) with
        ``window="auto"`` and the other ``call_kwargs`` of the calls to come, and returns the
        policy it decoded with (measuring its tables first where this machine has none):
        ``{"tables", "tokens", "as_ar", "fixed"}``; ``{}`` where that call does not speculate (AR)."""
        given = prompt if prompt is not None else call_kwargs.pop("class_labels", None)
        items = given if isinstance(given, (list, tuple)) else [given]
        self.last_window_policy = None
        self([items[i % len(items)] for i in range(batch_size)], batch_size=batch_size,
             output_type="latent", **{**call_kwargs, self.window_argument: "auto"})
        policy = self.last_window_policy
        if policy is None:
            return {}
        return {"tables": policy.tables, "tokens": policy.tokens, "as_ar": policy.as_ar, "fixed": policy.fixed}

    def check_token_options(self, decoding, window, jacobi_init, coupling, lantern_k=None, lantern_delta=None,
                            lantern_lambda=None) -> None:
        """Checks of the options every token pipeline shares."""
        self.check_decoding(decoding)
        if window != "auto" and not hasattr(window, "search") and not (is_int(window) and window >= 1):
            raise ValueError(f"window must be an integer >= 1, 'auto' or a WindowPolicy, got {window!r}")
        if jacobi_init not in INIT_SCHEMES:
            raise ValueError(f"unknown jacobi_init {jacobi_init!r}; choose one of {INIT_SCHEMES}")
        if not isinstance(coupling, bool):
            raise ValueError(f"coupling must be True or False, got {coupling!r}")
        if decoding == "lantern":
            if lantern_lambda is None and not 0 <= lantern_delta <= 1:
                raise ValueError(f"lantern_delta must be in [0, 1], got {lantern_delta!r}")
            if lantern_lambda is not None and lantern_lambda < 1:
                raise ValueError(f"lantern_lambda must be >= 1, got {lantern_lambda!r}")
            check_positive_int("lantern_k", lantern_k)

    def token_decoding(self, decoding: str, sampling: SamplingConfig, *, vocab_size: int, grid_width: int,
                       jacobi_init: str, coupling: bool, lantern_k: int = 1, lantern_delta: float | None = None,
                       lantern_lambda: float | None = None, gsd_group_size: int = 0,
                       gsd_max_distance: float | None = None, draft: tuple | None = None, feature: tuple | None = None,
                       drafts: str | None = None, judge: tuple | None = None,
                       feature_depth: int = HYBRID_FEATURE_DEPTH, target=None):
        """``(drafter, rule)`` of ``decoding`` for every token pipeline: Jacobi drafts for sjd,
        lantern and gsd (or ``drafts="feature"`` / ``"hybrid"`` / ``"draft_model"``'s); a draft model's (``draft``:
        ``(model, prefix)``) for speculative; a feature drafter's (``feature``: ``(drafter network,
        target)``) for feature; for ``"hybrid"`` the feature drafter's first ``feature_depth`` drafts
        and Jacobi's past them (:class:`~visualspec.drafters.HybridDrafter`); for ``"denoising"``
        SJD2's noised Jacobi drafts for ``target``, a model fine-tuned for them
        (:class:`~visualspec.drafters.DenoisingJacobiDrafter`); the
        exact rule, or LANTERN's (``lantern_k`` nearest codes of :meth:`neighbour_table`, budget
        ``lantern_delta`` or ``lantern_lambda``) or GSD's (groups over :meth:`code_vectors`), or a
        judge's (``judge``: ``(judge head, target, threshold)``, :class:`visualspec.core.judge.JudgeRule`).
        LANTERN and GSD fall back to the exact rule under greedy sampling."""
        drafter, rule = None, default_rule(sampling)
        kind = drafts or DEFAULT_DRAFTS.get(decoding)  # None for ar
        if kind == "jacobi":
            drafter = JacobiDrafter(vocab_size, jacobi_init, grid_width=grid_width, coupling=coupling)
        elif kind == "draft_model":
            drafter = DraftModelDrafter(*draft)
        elif kind == "denoising":
            drafter = DenoisingJacobiDrafter.for_target(target)
        elif kind in FEATURE_DRAFTS:
            check_target(feature[0], feature[1], feature[1].feature_size)
            drafter = FeatureDrafter(*feature)
            if kind == "hybrid":
                jacobi = JacobiDrafter(vocab_size, jacobi_init, grid_width=grid_width, coupling=coupling)
                drafter = HybridDrafter(drafter, jacobi, feature_depth)
        if decoding == "lantern" and not sampling.greedy:
            delta = None if lantern_lambda is not None else lantern_delta
            rule = partial(lantern_verify, neighbours=self.neighbour_table(lantern_k), delta=delta, lam=lantern_lambda)
        if decoding == "gsd" and not sampling.greedy:
            rule = partial(gsd_verify, group_size=gsd_group_size, embeddings=self.code_vectors(),
                           max_distance=gsd_max_distance)
        if decoding == "judge":
            head, target, threshold = judge
            check_judge(head, target, target.feature_size)
            rule = JudgeRule(head.score, threshold, tag=weights_hash(head))
        return drafter, rule

    def neighbour_table(self, k: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no LANTERN neighbourhoods")

    def code_vectors(self) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no code vectors for GSD")


# ---------------------------------------------------------------------- conditions


def compile_heads(compile, *models) -> None:
    """Switch the diffusion-head sampler of each model (its ``diffloss``; None skipped) compiled or
    eager, as a continuous-token pipeline's ``compile`` (True or False) says."""
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    for model in models:
        if model is not None:
            model.diffloss.compile_step(compile)


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


def caption_text(prompt: str) -> str:
    """The caption a prompt stands for: without surrounding spaces and one final full stop, as a
    sentence may end ("A photo of a RED circle." reads as "a photo of a red circle"; the
    tokenizer lower-cases)."""
    text = prompt.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def _shortened(prompt: str, limit: int = 80) -> str:
    """A prompt quoted in a message: its first ``limit`` characters and how long it was."""
    return prompt if len(prompt) <= limit else f"{prompt[:limit]}... ({len(prompt)} characters)"


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
            self._check_caption(prompt)

    def _check_caption(self, prompt: str) -> None:
        """Refuse a prompt the text encoder cannot read whole: with words it does not know (anywhere
        in it), or longer than its ``cls_token_num`` caption tokens (it would be cut, silently
        changing what is drawn)."""
        if self.text_encoder is None or self.tokenizer is None:
            raise ValueError("this text-conditional pipeline has no text_encoder/tokenizer to encode prompts")
        caption = caption_text(prompt)
        ids = self.tokenizer(caption, add_special_tokens=True, verbose=False).input_ids
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is not None and unk in ids:
            words = [w for w in caption.split() if unk in self.tokenizer(w, add_special_tokens=False).input_ids]
            raise ValueError(f"prompt {_shortened(prompt)!r} has words the text encoder does not know: {words}")
        limit = self.transformer.config.cls_token_num
        if len(ids) > limit:
            raise ValueError(f"prompt {_shortened(prompt)!r} is {len(ids)} caption tokens; this model reads at most "
                             f"{limit} (its cls_token_num), so the rest would be lost: shorten it")

    def encode_prompt(self, prompts: list[str]):
        """Prompts -> (caption features (B, T, C), mask (B, T)), left-padded like LlamaGen. Each
        prompt is checked whole first (:meth:`_check_caption`), so padding never cuts one."""
        for prompt in dict.fromkeys(prompts):  # each distinct prompt once (a call repeats it per image)
            self._check_caption(prompt)
        enc = self.tokenizer([caption_text(p) for p in prompts], padding="max_length",
                             max_length=self.transformer.config.cls_token_num, return_tensors="pt")
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

    def acceptance_grid(self) -> tuple[int, int]:
        return self.transformer.grid_size, self.transformer.grid_size


__all__ = ["OUTPUT_TYPES", "VisualSpecImageOutput", "ImagePipeline", "TokenImagePipeline", "PromptConditioning",
           "window_policy", "window_lengths", "check_draft_compatible", "class_label_list", "caption_text"]
