"""The any-order pipeline (#52): a caption -> image tokens in a random order per image (AR, ASSD
or RandAR-style parallel decoding), or the missing cells of a given image (infilling) -> VQ decode."""

from __future__ import annotations


import numpy as np
import torch

from ..core.checks import check_int, is_int
from ..core.compiled import compiled_step
from ..core.engine import Requests, decode, precompile_decode
from ..core.parallel import decode_parallel
from ..core.sampling import SamplingConfig, make_generator
from ..core.stats import merge_decode_stats
from ..core.verify import default_rule
from ..core.window import WindowPolicy
from ..drafters.any_order import AnySubsetDrafter
from ..models.any_order import AnyOrderGPT, check_orders
from ..models.llamagen_vq import LlamaGenVQModel
from .base import register_pipeline
from .image import PromptConditioning, TokenImagePipeline

#: RandAR's parallel schedule: 88 steps for 256 tokens (its ``num_inference_steps``)
RANDAR_STEPS_PER_TOKEN = 88 / 256

#: the windows (k + 1) ``k="auto"`` chooses among: k = 2, 4, 8 and 16, the candidates the folder's
#: fixed k was tuned over (docs/experiments/2026-11-28-any-order-assd.md), and plain AR
ASSD_WINDOWS = (1, 3, 5, 9, 17)


@register_pipeline
class AnyOrderPipeline(PromptConditioning, TokenImagePipeline):
    """Text-to-image generation in any order with an :class:`AnyOrderGPT` and a LlamaGen VQ tokenizer.

    Every image is drawn along its own order of the grid's cells, drawn from its generator (or
    given as ``order``), so an image's law depends only on its prompt and generator. ``decoding``:

    - ``"ar"``: one cell per forward along the order (the model's law);
    - ``"assd"``: Any-Subset Speculative Decoding (lossless: the same law as ``"ar"``): the model
      drafts the next ``k`` cells in one forward, each from the committed cells alone, and the next
      forward verifies them along the order with the exact rule; at least two cells per two
      forwards (:class:`~visualspec.drafters.AnySubsetDrafter`);
    - ``"parallel"``: RandAR's parallel decoding (lossy): ``parallel_steps`` forwards, each drawing
      the next cells of a cosine schedule at once without verification
      (:func:`~visualspec.core.parallel.decode_parallel`).

    Infilling: ``image`` with ``mask`` (True = keep that cell) generates only the other cells,
    conditioned on the kept ones (under ``"assd"`` with exactly the model's law).
    """

    model_cpu_offload_seq = "text_encoder->transformer->vq_model"
    _optional_components = ["text_encoder", "tokenizer"]
    display_name = "the any-order model"
    decoding_modes = ("assd", "ar", "parallel")
    bench_modes = {"ar": dict(decoding="ar"), "assd": dict(decoding="assd"), "parallel": dict(decoding="parallel")}
    default_bench_modes = ("ar", "assd", "parallel")
    bench_values = {"assd": "k", "parallel": "parallel_steps"}
    window_argument = "k"  # ASSD's window is k + 1

    def __init__(self, transformer: AnyOrderGPT, vq_model: LlamaGenVQModel, text_encoder=None, tokenizer=None,
                 default_guidance_scale: float = 3.0, default_top_k: int = 0, default_epsilon_cutoff: float = 0.0,
                 default_k: int | str = 4, default_k_batched: int | str | None = None):
        super().__init__()
        self.register_modules(transformer=transformer, vq_model=vq_model, text_encoder=text_encoder,
                              tokenizer=tokenizer)
        self.register_to_config(default_guidance_scale=default_guidance_scale, default_top_k=default_top_k,
                                default_epsilon_cutoff=default_epsilon_cutoff, default_k=default_k,
                                default_k_batched=default_k_batched)

    @classmethod
    def bench_settings(cls, mode: str) -> dict:
        if mode.partition("+")[0] == "assd@auto":  # k chosen from timed decodes
            return {**cls.bench_settings("assd" + mode[len("assd@auto"):]), "k": "auto"}
        settings = super().bench_settings(mode)
        return {k: int(v) if k in ("k", "parallel_steps") else v for k, v in settings.items()}

    @torch.no_grad()
    def __call__(
        self,
        prompt=None,
        *,
        decoding: str = "assd",
        k: int | str | WindowPolicy | None = None,
        parallel_steps: int | None = None,
        order=None,
        image=None,
        mask=None,
        num_images_per_prompt: int = 1,
        guidance_scale: float | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        epsilon_cutoff: float | None = None,
        batch_size: int | None = None,
        compile="auto",
        seed: int | None = None,
        generator=None,
        output_type: str = "pil",
        return_dict: bool = True,
    ):
        """Generate images (or fill the unkept cells of ``image``).

        - ``decoding``: ``"assd"`` (lossless speculative), ``"ar"`` or ``"parallel"`` (lossy), above.
        - ``k``: the cells ASSD drafts per round (default: the folder's, :meth:`default_k_for`), or
          ``"auto"``: among 2, 4, 8 and 16, the k whose whole ASSD decode, timed at this batch
          size on this machine beside plain AR's (once, kept on disk, as the raster pipeline's
          ``window="auto"``), was fastest, held for every round of the call (a search that mixes
          k lost to the best fixed k on the tuning prompts), or AR where none beat AR's decode
          (the stats' mode then says so); or the policy :meth:`window_tables` returned.
        - ``parallel_steps``: forwards after the prefill for ``"parallel"`` (default: RandAR's
          88 per 256 cells).
        - ``order``: the order of the cells, (cells,) or (B, cells) permutations of 0..cells-1;
          default: a uniformly random order per image from its generator. With ``mask``, the kept
          cells must come first.
        - ``image``, ``mask``: infilling. ``image`` is the picture (a PIL image, a list of them, or
          a (B, 3, H, W) tensor in [0, 1]) or its tokens ((B, cells) long); ``mask`` (grid, grid)
          or (B, grid, grid) bool, True = keep that cell (every image keeps as many cells).
        - ``guidance_scale``, ``top_k``, ``epsilon_cutoff`` default to the folder's settings;
          ``temperature=0`` is greedy; ``batch_size``: at most this many images decode at once
          (continuous batching for ``"ar"`` and ``"assd"``); ``compile``: as LlamaGen's
          (``"auto"``: compiled where measured to pay); ``seed`` or ``generator`` (one or one per
          image) make results repeatable; ``output_type``: ``"pil"``, ``"np"``, ``"pt"``, ``"latent"``.

        The stats' ``fixed_at`` is per cell in raster order (the forward that fixed it; 0 for kept
        cells); ASSD's draft forwards count as target forwards.
        """
        d = self.folder_defaults(guidance_scale=guidance_scale, top_k=top_k, epsilon_cutoff=epsilon_cutoff)
        self.check_inputs(decoding, self.default_k_for(k, 1), k, parallel_steps, output_type, num_images_per_prompt,
                          batch_size)
        sampling = SamplingConfig(temperature=temperature, top_k=d["top_k"], top_p=top_p,
                                  guidance_scale=d["guidance_scale"], epsilon_cutoff=d["epsilon_cutoff"])
        cond = self._conditions(prompt, None, num_images_per_prompt)
        rows = cond[0].shape[0]
        model, cells = self.transformer, self.transformer.cells
        kept_cells, kept_tokens = self._kept(image, mask, rows)
        gen = make_generator(seed, generator)
        orders = self._orders(order, kept_cells, rows, gen)
        m = 0 if kept_cells is None else int(kept_cells[0].sum())
        kept = orders.new_zeros(rows, 0) if kept_tokens is None else kept_tokens.gather(1, orders[:, :m])
        num_tokens = cells - m
        slots = rows if batch_size is None else min(batch_size, rows)
        d["k"] = self.default_k_for(k, slots)

        def prefix_of(ids):
            feats, caption_mask = self._prefix(model, cond, sampling, ids)
            return feats, caption_mask, sampling.model_batch(orders[ids]), sampling.model_batch(kept[ids])

        compiled = compiled_step(model, compile, lambda r: prefix_of(list(range(r))), num_tokens, rows, slots)
        if decoding == "parallel":
            steps = parallel_steps or max(1, round(num_tokens * RANDAR_STEPS_PER_TOKEN))
            if compiled:
                model.precompile(prefix_of(list(range(slots))), num_tokens, [1])
            parts, tokens = [], []
            with self.progress_bar(total=num_tokens * rows) as bar:
                for s in range(0, rows, slots):
                    ids = list(range(s, min(s + slots, rows)))
                    gens = [gen[i] for i in ids] if isinstance(gen, (list, tuple)) else gen
                    t, stats = decode_parallel(model, prefix_of(ids), num_tokens, sampling, min(steps, num_tokens - 1),
                                               gens, mode="parallel" + ("+compiled" if compiled else ""),
                                               progress=bar.update)
                    tokens.append(t)
                    parts.append(stats)
            tokens, stats = torch.cat(tokens), merge_decode_stats(parts)
        else:
            drafter = AnySubsetDrafter(model) if decoding == "assd" else None
            auto = drafter is not None and (d["k"] == "auto" or isinstance(d["k"], WindowPolicy))
            window = 1 if drafter is None else d["k"] if auto else d["k"] + 1
            if compiled:  # every step the decode (and its choice of k) can take, before timing them
                precompile_decode(model, prefix_of(list(range(slots))), num_tokens, sampling,
                                  ASSD_WINDOWS if auto else sorted({1, window}), drafts=drafter is not None, auto=auto)
            if window == "auto":  # whole ASSD decodes timed beside plain AR's (as_ar where no k pays)
                window = self.auto_window(model, prefix_of(list(range(slots))), num_tokens, sampling, drafter,
                                          default_rule(sampling), windows=ASSD_WINDOWS, fixed=True)
            prefix = Requests(rows, prefix_of, slots) if slots < rows else prefix_of(list(range(rows)))
            mode = decoding + (f"@{'auto' if auto else d['k']}" if drafter else "") + ("+compiled" if compiled else "")
            with self.progress_bar(total=num_tokens * rows) as bar:
                tokens, stats = decode(model, prefix, num_tokens, sampling, drafter=drafter, window=window,
                                       generator=gen, progress=bar.update, mode=mode)
        image_tokens = torch.empty(rows, cells, dtype=torch.long, device=tokens.device)
        image_tokens.scatter_(1, orders[:, m:].to(tokens.device), tokens)
        if m:
            image_tokens.scatter_(1, orders[:, :m].to(tokens.device), kept.to(tokens.device))
        stats.fixed_at = _raster_fixed_at(stats.fixed_at, orders.cpu(), m)
        return self.output(image_tokens, stats, output_type, return_dict, self.decode_images)

    def window_tables(self, prompt=None, *, batch_size: int = 1, **call_kwargs) -> dict:
        """The policy ``k="auto"`` decodes a batch of ``batch_size`` images of ``prompt`` with
        (``{"tables", "tokens", "as_ar", "fixed"}``, its windows k + 1; measured first where this
        machine has no tables), for ``visualspec batch`` to record and pass back as ``k``; ``{}``
        where the call does not choose k: another decoding, or a fixed k."""
        decoding = call_kwargs.get("decoding", "assd")
        if decoding != "assd" or self.default_k_for(call_kwargs.get("k"), batch_size) != "auto":
            return {}
        return super().window_tables(prompt, batch_size=batch_size, **call_kwargs)

    def default_k_for(self, k, images: int):
        """``k``, or where it is None the folder's k for a decode of ``images`` images at once:
        ``default_k_batched`` for more than one where the folder sets it (the shipped folder:
        ``"auto"``, docs/experiments/2026-11-30-assd-batch-default.md), else ``default_k``."""
        if k is not None:
            return k
        batched = self.config.get("default_k_batched")
        return batched if images > 1 and batched is not None else self.config.get("default_k")

    # ------------------------------------------------------------------ inputs

    def check_inputs(self, decoding, k, k_given, parallel_steps, output_type, num_images_per_prompt, batch_size):
        """Raise a ValueError naming the first bad argument of :meth:`__call__`."""
        self.check_decoding(decoding)
        self.check_common(output_type, num_images_per_prompt, batch_size)
        for k in (k, self.default_k_for(k_given, 2)):  # the call's k, or the folder's of one image and of a batch
            if not (k == "auto" or isinstance(k, WindowPolicy)) and not (is_int(k) and k >= 1):
                raise ValueError(f"k must be an integer >= 1 (the cells ASSD drafts per round) or 'auto', got {k!r}")
        if k_given is not None and decoding != "assd":
            raise ValueError(f"k is the number of cells ASSD drafts per round: it is for decoding='assd', "
                             f"not {decoding!r}")
        if parallel_steps is not None:
            if decoding != "parallel":
                raise ValueError(f"parallel_steps is for decoding='parallel', not {decoding!r}")
            check_int("parallel_steps", parallel_steps, 1)

    def _kept(self, image, mask, rows: int):
        """(keep (B, cells) bool, tokens (B, cells) long) of an infilling call, or (None, None)."""
        if image is None and mask is None:
            return None, None
        if image is None or mask is None:
            raise ValueError("infilling takes both image= (the picture or its tokens) and mask= (the cells to keep)")
        g, cells = self.transformer.grid_size, self.transformer.cells
        mask = torch.as_tensor(np.asarray(mask) if not isinstance(mask, torch.Tensor) else mask)
        if mask.dim() == 2:
            mask = mask[None]
        if mask.dim() != 3 or tuple(mask.shape[1:]) != (g, g) or mask.shape[0] not in (1, rows):
            raise ValueError(f"mask marks the cells to keep: shape ({g}, {g}) or ({rows}, {g}, {g}) for this "
                             f"{g}x{g}-token model and {rows} images, got {tuple(mask.shape)}")
        keep = mask.bool().reshape(-1, cells).expand(rows, cells)
        counts = keep.sum(1)
        if bool((counts != counts[0]).any()):
            raise ValueError(f"every image of a call keeps as many cells; the masks keep {sorted(set(counts.tolist()))}")
        if int(counts[0]) == cells:
            raise ValueError("the mask keeps every cell: nothing is left to generate")
        return keep, self._image_tokens(image, rows)

    def _image_tokens(self, image, rows: int) -> torch.Tensor:
        """The tokens (rows, cells) of ``image``: tokens, PIL image(s) or a [0, 1] tensor."""
        cells = self.transformer.cells
        if isinstance(image, torch.Tensor) and image.dtype in (torch.int32, torch.int64):
            tokens = image.reshape(-1, cells) if image.numel() % cells == 0 else None
            if tokens is None or tokens.shape[0] not in (1, rows):
                raise ValueError(f"image tokens are (B, {cells}) for B = 1 or {rows}, got {tuple(image.shape)}")
            if int(tokens.min()) < 0 or int(tokens.max()) >= self.transformer.vocab_size:
                raise ValueError(f"image tokens must lie in [0, {self.transformer.vocab_size})")
            return tokens.expand(rows, cells).to(self.device)
        if not isinstance(image, torch.Tensor):
            pictures = image if isinstance(image, (list, tuple)) else [image]
            image = torch.stack([torch.from_numpy(np.asarray(p.convert("RGB"), dtype=np.float32) / 255).permute(2, 0, 1)
                                 for p in pictures])
        if image.dim() == 3:
            image = image[None]
        side = self.transformer.grid_size * self._patch()
        if image.dim() != 4 or tuple(image.shape[1:]) != (3, side, side) or image.shape[0] not in (1, rows):
            raise ValueError(f"image must be {side}x{side} RGB (a PIL image, or a (B, 3, {side}, {side}) tensor "
                             f"in [0, 1]) for B = 1 or {rows}, got {tuple(image.shape)}")
        _, tokens = self.vq_model.encode(image.to(self.device, self.vq_model.dtype) * 2 - 1)
        return tokens.reshape(-1, cells).expand(rows, cells)

    def _patch(self) -> int:
        return 2 ** (len(self.vq_model.config.ch_mult) - 1)

    def _orders(self, order, keep, rows: int, gen) -> torch.Tensor:
        """Each image's order (rows, cells): given, or drawn from its generator (kept cells first)."""
        cells = self.transformer.cells
        if order is not None:
            order = torch.as_tensor(order)
            order = check_orders(order[None] if order.dim() == 1 else order, cells)
            if order.shape[0] not in (1, rows):
                raise ValueError(f"order is (cells,) or ({rows}, {cells}) for {rows} images, got {tuple(order.shape)}")
            order = order.expand(rows, cells).to(self.device)
            if keep is not None:
                m = int(keep[0].sum())
                if not bool(keep.to(order.device).gather(1, order[:, :m]).all()):
                    raise ValueError(f"with a mask the order must list the {m} kept cells first")
            return order
        if isinstance(gen, (list, tuple)):
            if len(gen) != rows:
                raise ValueError(f"got {len(gen)} generators for a batch of {rows}")
            keys = torch.stack([torch.rand(cells, generator=g, device=g.device).cpu() for g in gen])
        else:
            keys = torch.rand(rows, cells, generator=gen, device=gen.device if gen is not None else "cpu").cpu()
        if keep is not None:
            keys = keys - keep.cpu().float()  # kept cells (keys in [-1, 0)) sort first
        return keys.argsort(dim=1).to(self.device)

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (B, cells) in raster order -> images (B, 3, H, W) in [-1, 1]."""
        B, g = tokens.shape[0], self.transformer.grid_size
        return self.vq_model.decode_code(tokens, shape=(B, self.vq_model.config.codebook_embed_dim, g, g))

    def acceptance_grid(self) -> tuple[int, int]:
        return self.transformer.grid_size, self.transformer.grid_size


def _raster_fixed_at(fixed_at: torch.Tensor, orders: torch.Tensor, kept: int) -> torch.Tensor:
    """``fixed_at`` (B, N - kept) of the generated positions -> per cell in raster order (B, N),
    0 at the kept cells."""
    raster = torch.zeros(orders.shape, dtype=fixed_at.dtype)
    return raster.scatter_(1, orders[:, kept:], fixed_at)


__all__ = ["AnyOrderPipeline", "RANDAR_STEPS_PER_TOKEN"]
