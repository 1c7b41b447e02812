"""SJD2's fine-tune (Speculative Jacobi-Denoising Decoding, arXiv 2510.08994): a shapes-world GPT
taught next-clean-token prediction, so that a Jacobi window's drafts past the verified ones can be
noisy embeddings that it denoises step by step (:class:`visualspec.drafters.DenoisingJacobiDrafter`).

Each row of a batch is the world's caption and image tokens, as the GPT's own training sees them.
A share ``clean`` of the rows stays clean (plain next-token prediction, so the model stays the
target it was); in the others the inputs past a random cut are noised with levels that rise along
the sequence (:func:`training_levels`), the profile a decode's window has, and every position still
predicts the clean next token. The loss is the cross-entropy over all positions.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import claim_work_dir, optimizer_step, run_stage, training_autocast, write_training_record


@dataclass
class DenoisingConfig:
    """The recipe (defaults: the study's, docs/experiments/2026-12-07-sjd2-shapes.md)."""

    steps: int = 800
    batch: int = 32
    lr: float = 1e-4
    warmup: int = 50
    denoising_steps: int = 4  # S: a drafted position's noise falls by 1/S a forward, from pure noise to clean
    clean: float = 0.3  # the share of rows without noise (plain next-token prediction)
    max_band: float = 8.0  # the most positions one noise level spans along the window
    flat: float = 0.2  # the share of noised rows whose levels are one level past the cut (a decode's first steps)
    seed: int = 0
    checkpoint_seconds: float = 300.0


def training_levels(rows: int, length: int, steps: int, clean: float, max_band: float, flat: float,
                    generator: torch.Generator) -> torch.Tensor:
    """Noise levels (rows, length) in {0, 1/S, ..., 1} (S = ``steps``) for a batch's inputs.

    A row is clean with probability ``clean``. Otherwise, past a cut c drawn uniformly from
    0..length-1, input j has level ``min(S, ceil((j - c + 1 - phi) / band)) / S`` with ``band``
    uniform in [0.5, ``max_band``] and ``phi`` uniform in [0, 1) (a window in a decode: clean drafts,
    then levels rising by one every ``band`` positions up to pure noise), or, for a share ``flat`` of
    those rows, one level ``l / S`` with l uniform in 1..S everywhere past the cut (a decode's first
    steps, every drafted position as noisy as the next)."""
    g = dict(generator=generator)
    j = torch.arange(length, dtype=torch.float64)[None]
    cut = torch.randint(0, length, (rows, 1), **g).double()
    band = 0.5 + (max_band - 0.5) * torch.rand(rows, 1, **g, dtype=torch.float64)
    phase = torch.rand(rows, 1, **g, dtype=torch.float64)
    ramp = torch.ceil((j - cut + 1 - phase) / band).clamp(0, steps) + 0.0  # (no -0.0 before the cut)
    level = torch.randint(1, steps + 1, (rows, 1), **g).double()
    flat_rows = torch.rand(rows, 1, **g) < flat
    levels = torch.where(flat_rows, torch.where(j >= cut, level, 0.0), ramp)
    levels = torch.where(torch.rand(rows, 1, **g) < clean, 0.0, levels)
    return (levels / steps).float()


def train_denoising_target(model: str | None, out: str, work_dir: str, cfg: DenoisingConfig | None = None,
                           progress: bool = True) -> Path:
    """Run (or resume) SJD2's fine-tune of a shapes-world LlamaGen pipeline ``model`` (default: the
    shipped ``assets/shapes-t2i``) and write the whole pipeline, its GPT fine-tuned (its config's
    ``denoising_steps`` set), to ``out``. The VQ and the text encoder stay as they were."""
    from ..assets import SHAPES_T2I
    from ..pipelines.llamagen import LlamaGenPipeline
    from .shapes import ShapesTrainingConfig, caption_training_batch

    cfg = cfg or DenoisingConfig()
    folder = Path(model) if model is not None else SHAPES_T2I
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k != "checkpoint_seconds"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    pipe = LlamaGenPipeline.from_pretrained(folder).to(device)
    gpt, vq = pipe.transformer, pipe.vq_model.eval().requires_grad_(False)
    pipe.text_encoder.eval().requires_grad_(False)
    gpt.train()
    world = ShapesTrainingConfig()
    autocast = training_autocast(device)
    params = list(gpt.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)

    def step_fn(step):
        tokens, captions, mask, drop = caption_training_batch(
            vq, pipe, cfg.seed + 23, step, cfg.batch, world.task_weights, world.caption_detail, world.caption_order,
            world.caption_dropout, cfg.seed * 1_000_003 + step, autocast, device)
        g = torch.Generator().manual_seed(cfg.seed * 7_000_003 + step)
        length = tokens.shape[1] - 1
        levels = training_levels(len(tokens), length, cfg.denoising_steps, cfg.clean, cfg.max_band, cfg.flat, g)
        eps = torch.randn(len(tokens), length, gpt.config.dim, generator=g)
        with torch.autocast(**autocast):
            logits = gpt(captions, tokens, cond_mask=mask, drop_condition=drop,
                         noise=(levels.to(device), eps.to(device)))
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens.reshape(-1))
        optimizer_step(opt, loss, params)
        return {"loss": loss.item()}

    run_stage("SJD2 fine-tune", work / "gpt", {"gpt": gpt}, opt, cfg.steps, step_fn, lr=cfg.lr, warmup=cfg.warmup,
              checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    gpt.eval()
    gpt.register_to_config(denoising_steps=cfg.denoising_steps)
    out = Path(out)
    pipe.save_pretrained(out)
    write_training_record(out, "visualspec train-denoising", asdict(cfg), t0, device, model=str(folder))
    return out
