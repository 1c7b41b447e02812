"""The LlamaGen pipeline: class or text condition -> image tokens (AR, SJD, LANTERN or a draft model) -> VQ decode."""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.checks import check_int, check_probability
from ..core.compiled import compiled_step
from ..core.engine import Requests, decode, precompile_decode
from ..core.rows import feature_request
from ..core.sampling import SamplingConfig, make_generator
from ..core.window import WINDOWS
from ..models.llamagen import LlamaGenGPT
from ..models.llamagen_vq import LlamaGenVQModel, nearest_codes
from .base import register_pipeline
from .image import (DEFAULT_DRAFTS, DENOISING_WINDOW, DRAFTS, FEATURE_DRAFTS, HYBRID_FEATURE_DEPTH, TOKEN_BENCH_MODES,
                    PromptConditioning, TokenImagePipeline, check_draft_compatible, window_lengths, window_policy)


@register_pipeline
class LlamaGenPipeline(PromptConditioning, TokenImagePipeline):
    """Class- or text-conditional image generation with a LlamaGen GPT and VQ tokenizer.

    Components: ``transformer`` (:class:`LlamaGenGPT`), ``vq_model`` (:class:`LlamaGenVQModel`),
    and for text-conditional models a ``text_encoder`` (any transformers encoder whose
    ``last_hidden_state`` has ``caption_dim`` features) with its ``tokenizer``. An optional
    ``draft_model`` (a smaller LlamaGen GPT of the same vocabulary) enables
    ``decoding="speculative"``; an optional ``feature_drafter``
    (:class:`~visualspec.models.feature_drafter.FeatureDraftModel`, trained for this transformer by
    ``visualspec train-drafter --model``) enables ``decoding="feature"`` (EAGLE-style drafts from
    the transformer's own features; lossless); an optional ``judge``
    (:class:`~visualspec.models.judge.JudgeHead`, trained for this transformer by ``visualspec
    train-judge``) enables ``decoding="judge"`` (judge decoding; lossy).
    """

    model_cpu_offload_seq = "text_encoder->transformer->vq_model"
    _optional_components = ["text_encoder", "tokenizer", "draft_model", "feature_drafter", "judge"]
    display_name = "LlamaGen"
    decoding_modes = ("sjd", "ar", "lantern", "gsd", "judge", "speculative", "feature")
    bench_modes = TOKEN_BENCH_MODES
    default_bench_modes = ("ar", "ar+compiled", "sjd", "sjd+coupling", "lantern", "gsd")  # the fastest AR too

    def __init__(self, transformer: LlamaGenGPT, vq_model: LlamaGenVQModel, text_encoder=None, tokenizer=None,
                 draft_model: LlamaGenGPT | None = None, feature_drafter=None, judge=None,
                 default_guidance_scale: float = 4.0,
                 default_top_k: int = 0, default_lantern_k: int = 1000, default_lantern_delta: float = 0.1,
                 default_jacobi_init: str = "random", default_epsilon_cutoff: float = 0.0,
                 default_coupling: bool = False, default_gsd_group_size: int = 3,
                 default_gsd_max_distance: float | None = None, default_siblings: int = 1,
                 default_sibling_depth: int = 2, default_feature_depth: int = HYBRID_FEATURE_DEPTH):
        super().__init__()
        self.register_modules(transformer=transformer, vq_model=vq_model, text_encoder=text_encoder,
                              tokenizer=tokenizer, draft_model=draft_model, feature_drafter=feature_drafter,
                              judge=judge)
        # sampling defaults that belong to the model (saved in model_index.json)
        self.register_to_config(default_guidance_scale=default_guidance_scale, default_top_k=default_top_k,
                                default_lantern_k=default_lantern_k, default_lantern_delta=default_lantern_delta,
                                default_jacobi_init=default_jacobi_init,
                                default_epsilon_cutoff=default_epsilon_cutoff, default_coupling=default_coupling,
                                default_gsd_group_size=default_gsd_group_size,
                                default_gsd_max_distance=default_gsd_max_distance,
                                default_siblings=default_siblings, default_sibling_depth=default_sibling_depth,
                                default_feature_depth=default_feature_depth)
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
        drafts: str | None = None,
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
        feature_depth: int | None = None,
        lantern_k: int | None = None,
        lantern_delta: float | None = None,
        lantern_lambda: float | None = None,
        gsd_group_size: int | None = None,
        gsd_max_distance: float | None = None,
        judge_threshold: float | None = None,
        compile="auto",
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
          ``"speculative"`` (the ``draft_model`` drafts ``window - 1`` tokens, lossless), or
          ``"feature"`` (the ``feature_drafter`` drafts from the transformer's own features, lossless),
          or ``"judge"`` (Jacobi drafts kept where exact verification or the folder's ``judge`` accepts
          them: judge decoding, lossy, see ``judge_threshold``).
        - ``drafts``: what drafts for ``"sjd"``, ``"lantern"``, ``"gsd"`` and ``"judge"``: ``"jacobi"`` (the
          default), ``"feature"`` (the feature drafter: LANTERN or GSD over learned drafts),
          ``"hybrid"`` (the feature drafter's first ``feature_depth`` drafts of each window, Jacobi's
          past them), ``"draft_model"`` or ``"denoising"`` (SJD2: Jacobi drafts in the near half of
          each window, the far half fed as noised embeddings, unverified; for a transformer
          fine-tuned by ``visualspec train-denoising``, eager, in a fixed window: ``"auto"`` is
          32); the rule stays the decoding's.
        - ``feature_depth``: for ``drafts="hybrid"``, how many positions after the committed tokens
          the feature drafter drafts (>= 1). Default from the folder.
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
        - ``judge_threshold``: for ``decoding="judge"``, the judge score (in [0, 1]) above which a
          draft is kept; 1 keeps none beyond the exact rule's (lossless). Default: the judge's own
          (chosen when it was trained). The stats' ``judged_tokens`` count the drafts it kept.
        - ``compile``: run the target's decode step through ``torch.compile`` (True), eagerly
          (False), or ``"auto"``: compiled only where measurements stored on this machine say it
          pays in this call (see ``compiled_step``; a first compiled call measures them). Greedy
          tokens are the eager ones; each new shape compiles once, with a progress line.
        - ``seed`` or ``generator`` (a ``torch.Generator`` or one per image) make results repeatable.
        - ``output_type``: ``"pil"``, ``"np"``, ``"pt"`` or ``"latent"`` (token ids).
        """
        d = self.folder_defaults(jacobi_init=jacobi_init, coupling=coupling, siblings=siblings,
                                 sibling_depth=sibling_depth, top_k=top_k, epsilon_cutoff=epsilon_cutoff,
                                 lantern_k=lantern_k, lantern_delta=lantern_delta, gsd_group_size=gsd_group_size,
                                 gsd_max_distance=gsd_max_distance, guidance_scale=guidance_scale,
                                 feature_depth=feature_depth)
        self.check_inputs(decoding, output_type, window, num_images_per_prompt, batch_size, d["jacobi_init"],
                          d["coupling"], d["lantern_k"], d["lantern_delta"], lantern_lambda, d["gsd_group_size"],
                          d["gsd_max_distance"], d["siblings"], d["sibling_depth"], drafts, judge_threshold,
                          feature_depth, compile)
        drafts = drafts or DEFAULT_DRAFTS.get(decoding)
        features = drafts in FEATURE_DRAFTS
        judge = None
        if decoding == "judge":
            judge = (self.judge, self.transformer,
                     self.judge.config.threshold if judge_threshold is None else judge_threshold)
        sampling = SamplingConfig(temperature=temperature, top_k=d["top_k"], top_p=top_p,
                                  guidance_scale=d["guidance_scale"], epsilon_cutoff=d["epsilon_cutoff"])

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
        draft = None
        if drafts == "draft_model":
            check_draft_compatible(model, self.draft_model)
            draft = (self.draft_model, lambda ids: prefix_of(self.draft_model, ids))
        drafter, rule = self.token_decoding(
            decoding, sampling, vocab_size=vocab, grid_width=model.grid_size, jacobi_init=d["jacobi_init"],
            coupling=d["coupling"], lantern_k=min(d["lantern_k"], vocab - 1), lantern_delta=d["lantern_delta"],
            lantern_lambda=lantern_lambda, gsd_group_size=d["gsd_group_size"],
            gsd_max_distance=d["gsd_max_distance"], draft=draft,
            feature=(self.feature_drafter, model) if features else None, drafts=drafts, judge=judge,
            feature_depth=d["feature_depth"], target=model)
        if drafts == "denoising":  # its noised step runs eagerly, in a fixed window
            compile, window = False, DENOISING_WINDOW if window == "auto" else window
        siblings, sibling_depth = d["siblings"], d["sibling_depth"]
        tree = drafter is not None and siblings > 1 and sibling_depth > 0
        compiled = compiled_step(model, compile, lambda r: prefix_of(model, list(range(r))), num_tokens, rows, slots)
        if features:  # the drafter's own step compiled with the target's (before its costs are timed)
            self._compile_feature_drafter(compiled, slots * sampling.model_rows_per_sample, num_tokens,
                                          WINDOWS if window == "auto" else [window])
        window = 1 if drafter is None else window  # AR has no window to choose
        auto = window == "auto"
        if compiled:  # every step the decode (and its window search) can take, before timing them
            precompile_decode(model, prefix_of(model, list(range(slots))), num_tokens, sampling,
                              [w for w in WINDOWS if w <= num_tokens] if auto else window_lengths(window),
                              drafts=drafter is not None, rule=rule, auto=auto, features=feature_request(drafter, rule),
                              drafter=drafter)
        if auto and tree:  # sibling-tree steps: forward tables (a draft model's drafts priced with them)
            window = self.last_window_policy = window_policy(
                model, lambda r: prefix_of(model, list(range(r))), num_tokens, slots, siblings, sibling_depth,
                drafter=drafter, sampling=sampling)
        elif auto:  # whole decode steps, drafts and rule included (as_ar where none beats plain AR)
            window = self.auto_window(model, prefix_of(model, list(range(slots))), num_tokens, sampling, drafter, rule)

        with self.progress_bar(total=num_tokens * rows) as bar:
            mode = (decoding + (f"+{drafts}" if drafts != DEFAULT_DRAFTS.get(decoding) else "")
                    + ("+coupling" if d["coupling"] and drafts in ("jacobi", "hybrid") else "")
                    + ("+pd" if tree else "")
                    + ("+compiled" if compiled else ""))
            tokens, stats = decode(model, prefix, num_tokens, sampling, drafter=drafter, rule=rule, window=window,
                                   generator=gen, mode=mode, progress=bar.update, siblings=siblings if tree else 1,
                                   sibling_depth=sibling_depth)
        return self.output(tokens, stats, output_type, return_dict, self.decode_images)

    def _compile_feature_drafter(self, compiled: bool, model_rows: int, num_tokens: int, windows) -> None:
        """Switch the feature drafter's compiled step with the transformer's, in its dtype, with a
        graph for every step a decode with these window lengths makes: the catch-up of 1..W
        committed pairs (in their buckets) and the one-pair drafting steps (compiled once; other
        shapes run eagerly)."""
        drafter, dtype = self.feature_drafter, self.transformer.tok_embeddings.weight.dtype
        drafter.compile_step(compiled)
        if compiled:
            if drafter.dtype != dtype:
                drafter.to(dtype)
            drafter.precompile(model_rows, num_tokens + 1,
                               {drafter.pairs_bucket(c) for w in windows for c in range(1, w + 1)})

    def check_inputs(self, decoding, output_type, window, num_images_per_prompt, batch_size, jacobi_init, coupling,
                     lantern_k, lantern_delta, lantern_lambda, gsd_group_size, gsd_max_distance, siblings=1,
                     sibling_depth=2, drafts=None, judge_threshold=None, feature_depth=None, compile="auto") -> None:
        """Raise a ValueError naming the first bad argument of :meth:`__call__`."""
        self.check_token_options(decoding, window, jacobi_init, coupling, lantern_k, lantern_delta, lantern_lambda)
        self.check_common(output_type, num_images_per_prompt, batch_size)
        check_int("siblings", siblings, 1)
        check_int("sibling_depth", sibling_depth, 0)
        if siblings > 1 and decoding in ("lantern", "gsd", "judge"):
            raise ValueError(f"siblings (proactive drafting) are verified exactly; decoding={decoding!r} is relaxed: "
                             f"use 'sjd' or 'speculative', or siblings=1")
        if drafts is not None:
            if drafts not in DRAFTS:
                raise ValueError(f"unknown drafts {drafts!r}; choose one of {DRAFTS}")
            if decoding in ("ar", "speculative", "feature") and drafts != DEFAULT_DRAFTS.get(decoding):
                raise ValueError(f"drafts={drafts!r} is for decoding 'sjd', 'lantern', 'gsd' or 'judge'; decoding={decoding!r} "
                                 + ("makes no drafts" if decoding == "ar" else f"drafts with its {DEFAULT_DRAFTS[decoding]}"))
        drafts = drafts or DEFAULT_DRAFTS.get(decoding)
        if drafts == "draft_model" and self.draft_model is None:
            raise ValueError(f"decoding={decoding!r} with draft-model drafts needs a draft_model; load one with "
                             "from_pretrained(..., draft_model=model), or decode with Jacobi drafts ('sjd')")
        if drafts in FEATURE_DRAFTS and self.feature_drafter is None:
            raise ValueError(f"decoding={decoding!r} with {drafts} drafts needs a feature_drafter (visualspec "
                             "train-drafter --model); load one with from_pretrained(..., feature_drafter=model), or "
                             "decode with Jacobi drafts ('sjd')")
        if drafts in FEATURE_DRAFTS and siblings > 1:
            raise ValueError(f"{drafts} drafts are chains; proactive drafting (siblings > 1) needs siblings=1")
        if drafts == "denoising":
            if decoding not in ("sjd", "lantern", "gsd"):
                raise ValueError(f"drafts='denoising' is for decoding 'sjd', 'lantern' or 'gsd', not {decoding!r}")
            if not self.transformer.config.denoising_steps:
                raise ValueError("drafts='denoising' (SJD2) needs a transformer fine-tuned for noisy inputs "
                                 "(visualspec train-denoising); this one has no denoising_steps")
            if siblings > 1:
                raise ValueError("drafts='denoising' feeds a noised tail, not trees: use siblings=1")
            if compile is True:
                raise ValueError("drafts='denoising' runs its noised step eagerly: use compile=False or 'auto'")
        if feature_depth is not None:
            if drafts != "hybrid":
                raise ValueError(f"feature_depth is for drafts='hybrid', not {drafts!r}")
            check_int("feature_depth", feature_depth, 1)
        if decoding == "judge" and self.judge is None:
            raise ValueError("decoding='judge' needs a judge (visualspec train-judge); load one with "
                             "from_pretrained(..., judge=JudgeHead.from_pretrained(folder)), or decode with 'sjd'")
        if judge_threshold is not None:
            if decoding != "judge":
                raise ValueError(f"judge_threshold is for decoding='judge', not {decoding!r}")
            check_probability("judge_threshold", judge_threshold)
        if decoding == "gsd":
            check_int("gsd_group_size", gsd_group_size, 0)
            if gsd_max_distance is not None and not gsd_max_distance >= 0:
                raise ValueError(f"gsd_max_distance must be >= 0 or None, got {gsd_max_distance!r}")

    def code_vectors(self) -> torch.Tensor:
        """The VQ codebook vectors (V, D) that LANTERN and GSD measure visual similarity with
        (L2-normalised when the tokenizer normalises its codes)."""
        codebook = self.vq_model.quantize.embedding.weight.detach().float()
        if self.vq_model.config.codebook_l2_norm:
            codebook = torch.nn.functional.normalize(codebook, dim=-1)
        return codebook.to(self.device)

    def available_decodings(self) -> tuple[str, ...]:
        missing = {"speculative": self.draft_model is None, "feature": self.feature_drafter is None,
                   "judge": self.judge is None}
        return tuple(m for m in self.decoding_modes if not missing.get(m, False))

    def load_draft_model(self, folder: str) -> None:
        """A LlamaGen pipeline folder whose transformer drafts, or a LlamaGen GPT folder."""
        if (Path(folder) / "model_index.json").is_file():
            draft = LlamaGenPipeline.from_pretrained(folder).transformer
        elif (Path(folder) / "config.json").is_file():
            draft = LlamaGenGPT.from_pretrained(folder, use_safetensors=True).eval()
        else:
            raise ValueError(f"--draft-model {folder} is neither a pipeline folder nor a LlamaGen GPT folder")
        self.register_modules(draft_model=draft.to(self.device))

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (B, h*w) -> images (B, 3, H, W) in [-1, 1] through the VQ decoder."""
        B, g = tokens.shape[0], self.transformer.grid_size
        shape = (B, self.vq_model.config.codebook_embed_dim, g, g)
        return self.vq_model.decode_code(tokens.reshape(B, g * g), shape=shape)
