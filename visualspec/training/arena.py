"""Train the shipped arena-world video model, reproducibly and resumably.

    visualspec train-arena --out assets/arena-nfd

Three stages on seeded episodes of the arena world (:mod:`visualspec.worlds.arena`):

1. a per-frame autoencoder (64x64 frames -> 8 x 8 x 8 latents; L1 + L2 reconstruction), after
   which the latents of a fixed episode set are computed once (with ``scaling_factor`` = 1 / std);
2. the next-frame diffusion transformer, by flow matching with diffusion forcing: every frame of
   a training window has its own time tau. Half of the windows look like generation (a clean
   prefix of context frames, then a block of 1 to ``max_speculate`` frames sharing one tau), half
   have an independent logit-normal tau per frame. ``motion_weight`` and ``context_weight``
   (:func:`loss_weights`) weight the cells that move (by 1 + 4) and drop the near-clean context
   frames: with the plain mean squared error the model moved the player and the ball only about
   40 % as far per frame as the game does;
3. consistency distillation of a copy of it (the student) for 1 to 4 step sampling: for a block at
   time tau_n of an ``distill_grid``-point grid, the teacher takes one Euler step to tau_{n-1} and
   the student's clean estimate ``x - tau v`` at tau_n is pulled to an EMA copy's estimate at
   tau_{n-1} (the estimate at tau = 0 is the input itself, the boundary condition).

The pipeline folder stores all three models in float16 (about 8 MB). Checkpoints (safetensors + JSON) go to ``--work-dir`` every few minutes; rerunning resumes. A GPU
is used when present; the transformer trains in bfloat16 autocast where the hardware runs it fast
(``visualspec.training.shapes.training_autocast``), else in float32.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .common import (claim_work_dir, ema_update, optimizer_step, run_stage, training_autocast,
                     write_training_record)
from ..worlds import arena


@dataclass
class ArenaTrainingConfig:
    seed: int = 0
    # autoencoder
    ae_channels: tuple = (32, 64, 64)
    latent_channels: int = 8
    ae_steps: int = 1200
    ae_batch: int = 16
    ae_lr: float = 1e-3
    # episodes whose latents the transformer trains on
    episodes: int = 2000
    episode_frames: int = 48
    # next-frame transformer
    dim: int = 128
    depth: int = 6
    heads: int = 2
    context_frames: int = 4
    window: int = 8  # frames per training sequence
    max_speculate: int = 4
    steps: int = 5500
    batch: int = 16
    lr: float = 5e-4
    warmup_steps: int = 100
    # consistency distillation
    distill_steps: int = 600
    distill_lr: float = 1e-4
    distill_grid: int = 16
    ema_decay: float = 0.95
    context_noise: float = 0.02
    # flow-matching loss weights (see ``loss_weights``); 1 and 0 give the plain mean squared error
    context_weight: float = 0.0
    motion_weight: float = 4.0
    ball_weight: float = 0.0  # added to the weight of the latent cells that hold the ball
    checkpoint_seconds: float = 300.0


def _frames_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 (..., 64, 64, 3) -> float (..., 3, 64, 64) in [-1, 1]."""
    x = torch.from_numpy(frames).float() / 127.5 - 1
    return x.movedim(-1, -3)


def autoencoder_batch(seed: int, step: int, batch: int) -> torch.Tensor:
    """Random frames of fresh episodes (the world is cheap to simulate)."""
    rng = np.random.default_rng([seed, 11, step])
    frames = []
    for _ in range(batch):
        ep = arena.episode(rng, int(rng.integers(1, 40)))
        frames.append(ep.frames[-1])
    return _frames_to_tensor(np.stack(frames))


def build_autoencoder(cfg: ArenaTrainingConfig):
    from ..models.frame_autoencoder import FrameAutoencoder

    torch.manual_seed(cfg.seed)
    return FrameAutoencoder(channels=tuple(cfg.ae_channels), latent_channels=cfg.latent_channels)


def build_transformer(cfg: ArenaTrainingConfig):
    from ..models.nfd import NextFrameDiT

    torch.manual_seed(cfg.seed + 1)
    return NextFrameDiT(latent_channels=cfg.latent_channels, latent_size=arena.CANVAS // 8, dim=cfg.dim,
                        depth=cfg.depth, num_heads=cfg.heads, num_actions=len(arena.ACTIONS),
                        context_frames=cfg.context_frames)


def train_autoencoder(cfg: ArenaTrainingConfig, work: Path, device, progress=True):
    ae = build_autoencoder(cfg).to(device)
    opt = torch.optim.Adam(ae.parameters(), lr=cfg.ae_lr)

    def step_fn(step):
        x = autoencoder_batch(cfg.seed, step, cfg.ae_batch).to(device)
        z = ae.encoder(x)
        recon = ae.decoder(z)
        loss = F.l1_loss(recon, x) + F.mse_loss(recon, x) + 1e-4 * z.pow(2).mean()
        optimizer_step(opt, loss)
        return {"loss": loss.item()}

    run_stage("frame autoencoder", work / "autoencoder", {"ae": ae}, opt, cfg.ae_steps, step_fn, lr=cfg.ae_lr,
              warmup=50, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return ae.eval()


def ball_cells(frames: np.ndarray, cell: int = 8) -> torch.Tensor:
    """Which ``cell`` x ``cell`` pixel cells of frames (..., 64, 64, 3) uint8 hold a ball pixel:
    bool (..., 64 / cell, 64 / cell). The simulator draws the ball in its own exact colour."""
    ball = np.all(frames == np.array(arena.BALL_COLOR, dtype=frames.dtype), axis=-1)
    n = frames.shape[-2] // cell
    return torch.from_numpy(ball.reshape(*ball.shape[:-2], n, cell, n, cell).any(axis=(-3, -1)))


@torch.no_grad()
def episode_latents(cfg: ArenaTrainingConfig, ae, device, seed_offset: int = 0, count: int | None = None):
    """Latents (E, T+1, C, 8, 8) (unscaled), actions (E, T) and the ball's latent cells
    (E, T+1, 8, 8) of the training (or held-out) episodes."""
    count = count or cfg.episodes
    frames, actions = arena.batch_episodes(cfg.seed + 1000 + seed_offset, count, cfg.episode_frames)
    latents = []
    for chunk in np.array_split(np.arange(count), max(1, count // 50)):
        x = _frames_to_tensor(frames[chunk]).to(device)
        z = ae.encoder(x.flatten(0, 1))
        latents.append(z.view(len(chunk), x.shape[1], *z.shape[1:]).cpu())
    return torch.cat(latents), torch.from_numpy(actions), ball_cells(frames, arena.CANVAS // latents[0].shape[-1])


def sample_windows(latents, actions, balls, cfg: ArenaTrainingConfig, rng: np.random.Generator, batch: int,
                   no_action: int):
    """Random windows: latents (B, W, C, h, w), the action leading to each frame (B, W) and the
    ball's cells (B, W, h, w)."""
    E, T1 = latents.shape[:2]
    eps = torch.from_numpy(rng.integers(0, E, batch))[:, None]
    starts = rng.integers(0, T1 - cfg.window + 1, batch)
    idx = torch.from_numpy(starts[:, None] + np.arange(cfg.window)[None])
    prev = idx - 1
    acts = actions[eps, prev.clamp(min=0)]
    acts[prev < 0] = no_action
    return latents[eps, idx], acts, balls[eps, idx]


def sample_taus(cfg: ArenaTrainingConfig, rng: np.random.Generator, batch: int) -> torch.Tensor:
    """Per-frame times (B, W): half generation-like (clean prefix + one shared tau), half independent."""
    taus = 1 / (1 + np.exp(-rng.normal(size=(batch, cfg.window))))  # logit-normal
    for b in range(batch // 2):
        n = int(rng.integers(1, cfg.max_speculate + 1))
        taus[b, : cfg.window - n] = rng.uniform(0, cfg.context_noise * 2, cfg.window - n)
        taus[b, cfg.window - n:] = 1 / (1 + np.exp(-rng.normal()))
    return torch.from_numpy(taus).float()


def _noised(x, taus, noise):
    t = taus[:, :, None, None, None]
    return (1 - t) * x + t * noise


def loss_weights(x0: torch.Tensor, taus: torch.Tensor, cfg: ArenaTrainingConfig,
                 ball: torch.Tensor | None = None) -> torch.Tensor:
    """Per-cell weights (B, W, 1, h, w) of the flow-matching loss for clean latents x0 (B, W, C, h, w)
    at times ``taus`` (B, W), given the cells that hold the ball (B, W, h, w; optional).

    ``w = 1 + motion_weight * moved + ball_weight * ball``. A cell moved if its latent changed since
    the previous frame (mean absolute change over the channels above 0.05; about a fifth of the
    cells): the game's dynamics live in a few cells. The ball covers a quarter of a cell, so its
    cells can change less than the threshold and it is easily averaged away; ``ball_weight`` adds
    to its cells. Near-clean context frames (tau <= 2 * ``context_noise``) are
    scaled by ``context_weight``: at tau near 0 the velocity target ``noise - x0`` is almost pure
    noise, so their loss is mostly irreducible and only adds gradient noise.
    """
    change = (x0[:, 1:] - x0[:, :-1]).abs().mean(2)
    moving = torch.cat([torch.zeros_like(change[:, :1]), change], 1) > 0.05
    weights = 1 + cfg.motion_weight * moving.float()
    if ball is not None:
        weights = weights + cfg.ball_weight * ball.float()
    context = (taus <= 2 * cfg.context_noise)[:, :, None, None]
    return torch.where(context, cfg.context_weight * weights, weights)[:, :, None]


def train_transformer(cfg: ArenaTrainingConfig, latents, actions, balls, work: Path, device, progress=True):
    model = build_transformer(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    autocast = training_autocast(device)
    model.train()

    def step_fn(step):
        rng = np.random.default_rng([cfg.seed, 21, step])
        x0, acts, ball = sample_windows(latents, actions, balls, cfg, rng, cfg.batch, model.no_action)
        taus = sample_taus(cfg, rng, cfg.batch)
        noise = torch.from_numpy(rng.standard_normal(x0.shape, dtype=np.float32))
        x0, acts, taus, noise, ball = (t.to(device) for t in (x0, acts, taus, noise, ball))
        with torch.autocast(**autocast):
            v = model(_noised(x0, taus, noise), taus, acts)
        weights = loss_weights(x0, taus, cfg, ball)
        loss = ((v.float() - (noise - x0)) ** 2 * weights).sum() / (weights.expand_as(x0).sum() + 1e-8)
        optimizer_step(opt, loss, model.parameters())
        return {"loss": loss.item()}

    run_stage("next-frame transformer", work / "transformer", {"model": model}, opt, cfg.steps, step_fn, lr=cfg.lr,
              warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return model.eval()


def distill(cfg: ArenaTrainingConfig, teacher, latents, actions, balls, work: Path, device, progress=True):
    """Consistency distillation of ``teacher`` (frozen) into a student initialised from it."""
    student = copy.deepcopy(teacher).train()
    ema = copy.deepcopy(teacher).eval()
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.distill_lr, weight_decay=0.0)
    for p in list(teacher.parameters()) + list(ema.parameters()):
        p.requires_grad_(False)
    autocast = training_autocast(device)

    def step_fn(step):
        rng = np.random.default_rng([cfg.seed, 31, step])
        x0, acts, _ = sample_windows(latents, actions, balls, cfg, rng, cfg.batch, student.no_action)
        B, W = acts.shape
        n_block = rng.integers(1, cfg.max_speculate + 1, B)
        level = rng.integers(1, cfg.distill_grid + 1, B)
        in_block = torch.from_numpy(np.arange(W)[None] >= (W - n_block)[:, None])
        tau_hi = torch.from_numpy(level / cfg.distill_grid).float()[:, None].expand(B, W)
        tau_lo = torch.from_numpy((level - 1) / cfg.distill_grid).float()[:, None].expand(B, W)
        ctx = torch.from_numpy(rng.uniform(0, cfg.context_noise * 2, (B, W))).float()
        tau_hi, tau_lo = torch.where(in_block, tau_hi, ctx), torch.where(in_block, tau_lo, ctx)
        noise = torch.from_numpy(rng.standard_normal(x0.shape, dtype=np.float32))
        x0, acts, noise = x0.to(device), acts.to(device), noise.to(device)
        tau_hi, tau_lo, mask = tau_hi.to(device), tau_lo.to(device), in_block.to(device)[:, :, None, None, None]
        x_hi = _noised(x0, tau_hi, noise)
        with torch.no_grad(), torch.autocast(**autocast):
            x_lo = x_hi + (tau_lo - tau_hi)[:, :, None, None, None] * teacher(x_hi, tau_hi, acts).float()
            x_lo = torch.where(mask, x_lo, x_hi)  # context frames stay as they are
            target = x_lo - tau_lo[:, :, None, None, None] * ema(x_lo, tau_lo, acts).float()
        with torch.autocast(**autocast):
            estimate = x_hi - tau_hi[:, :, None, None, None] * student(x_hi, tau_hi, acts).float()
        loss = ((estimate - target) ** 2 * mask).sum() / (mask.sum() * x0[0, 0].numel())
        optimizer_step(opt, loss, student.parameters())
        ema_update(ema.parameters(), student.parameters(), cfg.ema_decay)
        return {"loss": loss.item()}

    run_stage("consistency distillation", work / "distill", {"student": student, "ema": ema}, opt,
              cfg.distill_steps, step_fn, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return student.eval()


def train_arena(out: str, work_dir: str, cfg: ArenaTrainingConfig | None = None, progress: bool = True):
    """Run (or resume) all stages and save the video pipeline folder to ``out``."""
    from ..pipelines.nfd import NextFramePipeline

    cfg = cfg or ArenaTrainingConfig()
    config = json.loads(json.dumps(asdict(cfg)))
    work = claim_work_dir(work_dir, config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    ae = train_autoencoder(cfg, work, device, progress)
    for p in ae.parameters():
        p.requires_grad_(False)
    latents, actions, balls = episode_latents(cfg, ae, device)
    scale = float(1.0 / latents.std())
    ae.register_to_config(scaling_factor=scale)
    latents = latents * scale
    teacher = train_transformer(cfg, latents, actions, balls, work, device, progress)
    student = distill(cfg, teacher, latents, actions, balls, work, device, progress)
    # stored in float16 to keep the asset small; from_pretrained loads them back in float32
    pipe = NextFramePipeline(transformer=student.cpu().half(), teacher=teacher.cpu().half(),
                             autoencoder=ae.cpu().half(), context_noise=cfg.context_noise)
    pipe.save_pretrained(out)
    write_training_record(out, "visualspec train-arena", config, t0, device)
    return NextFramePipeline.from_pretrained(out)
