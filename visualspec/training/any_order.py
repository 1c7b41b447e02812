"""Train the any-order shapes model (#52): the raster GPT of a shapes pipeline taught every order.

    visualspec train-any-order --out assets/shapes-any-order

The GPT starts from the raster model's weights (:meth:`AnyOrderGPT.from_raster`: the same network
plus a zero query embedding per cell) and keeps training on the shapes world's images and captions,
drawn as the raster stage draws them (:func:`visualspec.training.shapes.caption_batch`, the same
task weights and caption detail), each image read in a uniformly random order of its 256 cells
drawn from the step's seed. The VQ tokenizer and the text encoder are the raster pipeline's,
frozen. Cross-entropy of every slot's token along its order; 10% of captions are replaced by the
null caption for guidance, as before. Checkpoints every few minutes in ``--work-dir``; rerunning
resumes, and step s always sees the same batch and orders.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import claim_work_dir, optimizer_step, run_stage, training_autocast, write_training_record
from .shapes import ShapesTrainingConfig, caption_training_batch


@dataclass
class AnyOrderConfig:
    """The recipe of ``visualspec train-any-order``; why each value, and what it scored, is in the
    model card (assets/shapes-any-order/README.md)."""

    seed: int = 0
    steps: int = 1000
    batch: int = 32
    lr: float = 3e-4  # half the raster stage's peak: the network starts trained
    warmup_steps: int = 50
    caption_dropout: float = 0.1
    task_weights: dict = field(default_factory=lambda: dict(ShapesTrainingConfig().task_weights))
    caption_detail: float = ShapesTrainingConfig.caption_detail
    caption_order: str = ShapesTrainingConfig.caption_order  # the captions the raster model learned from
    checkpoint_seconds: float = 300.0
    compile: bool = True


def random_orders(seed: int, step: int, batch: int, cells: int) -> torch.Tensor:
    """The orders (batch, cells) of training step ``step``: uniform permutations from (seed, step)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.argsort(torch.rand(batch, cells, generator=gen), dim=1)


def train_any_order(init: str, out: str, work_dir: str, cfg: AnyOrderConfig | None = None, progress: bool = True):
    """Fine-tune the raster GPT of the pipeline folder ``init`` on random orders; write an
    :class:`~visualspec.pipelines.any_order.AnyOrderPipeline` folder to ``out``."""
    from ..models.any_order import AnyOrderGPT
    from ..pipelines.any_order import AnyOrderPipeline
    from ..pipelines.llamagen import LlamaGenPipeline

    cfg = cfg or AnyOrderConfig()
    work = claim_work_dir(work_dir, {**{k: v for k, v in asdict(cfg).items() if k not in ("checkpoint_seconds",
                                                                                         "compile")},
                                     "init": str(Path(init).resolve())})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    raster = LlamaGenPipeline.from_pretrained(init)
    vq, encoder = raster.vq_model.to(device).eval(), raster.text_encoder.to(device).eval()
    for module in (vq, encoder):
        module.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    gpt = AnyOrderGPT.from_raster(raster.transformer.float()).to(device).train()
    helper = LlamaGenPipeline(transformer=gpt, vq_model=vq, text_encoder=encoder, tokenizer=raster.tokenizer)
    params = list(gpt.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)
    autocast = training_autocast(device)
    forward = torch.compile(gpt) if cfg.compile else gpt

    def step_fn(step):
        tokens, captions, mask, drop = caption_training_batch(
            vq, helper, cfg.seed + 11, step, cfg.batch, cfg.task_weights, cfg.caption_detail, cfg.caption_order,
            cfg.caption_dropout, cfg.seed * 1_000_003 + step, autocast, device)
        orders = random_orders(cfg.seed, step, cfg.batch, tokens.shape[1]).to(device)
        with torch.autocast(**autocast):
            logits = forward(captions, tokens, cond_mask=mask, drop_condition=drop, orders=orders)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens.gather(1, orders).reshape(-1))
        optimizer_step(opt, loss, params)
        return {"loss": loss.item()}

    run_stage("any-order GPT", work / "gpt", {"gpt": gpt}, opt, cfg.steps, step_fn, lr=cfg.lr,
              warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    config = raster.config
    pipe = AnyOrderPipeline(transformer=gpt.eval().cpu().half(), vq_model=vq.cpu(), text_encoder=encoder.cpu(),
                            tokenizer=raster.tokenizer, default_guidance_scale=config.default_guidance_scale,
                            default_top_k=config.default_top_k, default_epsilon_cutoff=config.default_epsilon_cutoff)
    pipe.save_pretrained(out)
    write_training_record(out, "visualspec train-any-order", {**asdict(cfg), "init": init}, t0, device)
    return AnyOrderPipeline.from_pretrained(out)
