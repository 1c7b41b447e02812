"""Train the shipped arena-world video model, reproducibly and resumably.

    visualspec train-arena --out assets/arena-nfd

Four stages on seeded episodes of the arena world (:mod:`visualspec.worlds.arena`):

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
   tau_{n-1} (the estimate at tau = 0 is the input itself, the boundary condition);
4. self forcing (:func:`self_forcing`): the distilled model fine-tuned on its own open-loop
   rollouts, made as it plays (speculative blocks included), towards frames the game would draw
   from what it drew. ``visualspec train-arena --from FOLDER`` runs only this stage, on the models
   of a folder stages 1 to 3 wrote.

The pipeline folder stores all three models in float16 (about 8 MB). Checkpoints (safetensors +
JSON) go to ``--work-dir`` every few minutes; rerunning resumes. A GPU
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
from ..video import denoise_frames
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
    # self forcing: the distilled model fine-tuned on its own open-loop rollouts (0 steps = skip)
    self_forcing_steps: int = 1400
    self_forcing_lr: float = 5e-5
    self_forcing_frames: int = 40  # the longest own rollout before the block it learns
    self_forcing_targets: str = "simulator"  # or "recorded" (see ``self_forcing``)
    # simulator targets put back a ball the model lost (``simulated_targets``); measured, not shipped:
    # docs/experiments/2026-11-27-arena-lost-ball-targets.md
    self_forcing_recover: bool = False
    opening_frames: int = 2  # the simulator's frames a rollout starts from, as in the pipeline
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
    """Latents (E, T+1, C, 8, 8) (unscaled), actions (E, T), the ball's latent cells
    (E, T+1, 8, 8) and the states (E, T+1, 6) (:func:`arena.state_row`) of the training (or
    held-out) episodes."""
    count = count or cfg.episodes
    frames, actions, states = arena.batch_episodes(cfg.seed + 1000 + seed_offset, count, cfg.episode_frames,
                                                   with_states=True)
    latents = []
    for chunk in np.array_split(np.arange(count), max(1, count // 50)):
        x = _frames_to_tensor(frames[chunk]).to(device)
        z = ae.encoder(x.flatten(0, 1))
        latents.append(z.view(len(chunk), x.shape[1], *z.shape[1:]).cpu())
    return (torch.cat(latents), torch.from_numpy(actions), ball_cells(frames, arena.CANVAS // latents[0].shape[-1]),
            states)


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


@torch.no_grad()
def own_rollout(model, x0: torch.Tensor, acts: torch.Tensor, opening: int, cfg: ArenaTrainingConfig,
                rng: np.random.Generator, generator: torch.Generator) -> torch.Tensor:
    """The model's own open-loop continuation of true latent frames x0 (B, T, C, h, w) under their
    actions (B, T): the first ``opening`` frames are kept and every later one is replaced by the
    model's one-step sample, generated as the app does (blocks of 1 to ``max_speculate`` frames
    denoised together, each block's frames committed to the cache at ``context_noise``)."""
    cache, frames, t = model.new_cache(), [x0[:, :opening]], opening
    while t < x0.shape[1]:
        n = min(int(rng.integers(1, cfg.max_speculate + 1)), x0.shape[1] - t)
        shown = frames[-1].shape[1]  # committed with the first forward of the next block
        z, _ = denoise_frames(model, cache, acts[:, t:t + n], 1, "consistency",
                              commit=(frames[-1], acts[:, t - shown:t]), generator=generator,
                              context_noise=cfg.context_noise)
        frames.append(z)
        t += n
    return torch.cat(frames, 1)


# a faint ball the model drew still counts as its ball, to be drawn sharp where it is: RGB distance
# to the ball's colour (the game's detector takes 120; the player and the background are over 270 away)
DRAWN_BALL_TOLERANCE = 180.0


def _velocity(before, after, recorded: int) -> int:
    """One component of the ball's velocity from its drawn centres in two frames: the displacement
    rounded and clipped to the game's speeds (+-1, +-2); a displacement under half a pixel (a bounce
    off a wall moves the ball less) takes the recorded velocity's direction at speed 1."""
    v = int(np.clip(round(after - before), -2, 2))
    return v if v else (1 if recorded > 0 else -1)


def _last_drawn_ball(seen: list, recover: bool) -> int | None:
    """The frame whose drawn ball the target continues: the last one, if the ball was seen there
    and in the frame before; with ``recover``, the last frame that shows a ball, if the frame
    before shows it too (a ball seen alone, in one frame, gives no velocity: None)."""
    i = len(seen) - 1
    while recover and i > 0 and seen[i] is None:
        i -= 1
    return i if i > 0 and seen[i] is not None and seen[i - 1] is not None else None


@torch.no_grad()
def simulated_targets(ae, context: torch.Tensor, states: np.ndarray, keys: np.ndarray, recover: bool = False):
    """The next frames as the game draws them from what the model drew: scaled latents
    (B, n, C, h, w), the ball's cells (B, n, h, w), and which rows have a target (B,) bool.

    ``context`` (B, K, C, h, w), K >= 2: the model's frames (scaled latents); ``states`` (B, K, 6):
    the recorded state of each (:func:`arena.state_row`); ``keys`` (B, K + n): the key leading to
    each frame, context and target (the first is unused). The player is the recorded one: it
    follows the keys, so the model must learn to put it back where they take it. The ball continues
    from the last frame j where the model drew it in both j - 1 and j, from where it drew it, at
    the velocity it drew it moving with (:func:`_velocity`), drawn sharp even where the model drew
    it faint: a ball a few pixels or a bounce off the recorded one cannot be put back from what the
    model sees, and a target it cannot predict averages into a blur that is no ball at all.

    Without ``recover`` j must be the last frame: rows where the model lost the ball in either of
    the last two frames (or drew it inside the recorded player) have no target, since taught the
    recorded ball there it learns that the ball is unpredictable and fades it everywhere. With
    ``recover`` j may be any context frame: a ball the model drew and then lost is put back where
    the game would have carried it, which the model can tell from the frames it still sees.
    """
    dtype = next(ae.parameters()).dtype
    B, K = context.shape[:2]
    read = context if recover else context[:, -2:]
    drawn = ((ae.decode(read.flatten(0, 1).to(dtype)).float().clamp(-1, 1) + 1) * 127.5).round()
    drawn = drawn.to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy().reshape(B, -1, arena.CANVAS, arena.CANVAS, 3)
    first = K - drawn.shape[1]  # the context index of drawn[:, 0]
    frames, kept = [], []
    for shown, rows, row_keys in zip(drawn, states, keys):
        seen = [arena.detect_ball(f, DRAWN_BALL_TOLERANCE) for f in shown]
        j, state = _last_drawn_ball(seen, recover), arena.state_from_row(rows[-1])
        if j is not None:
            recorded = arena.state_from_row(rows[first + j])
            corner = tuple(min(max(round(c - (arena.BALL_SIZE - 1) / 2), 0), arena.BALL_MAX) for c in seen[j])
            if arena.overlaps(corner, recorded.player):
                j = None
            else:
                velocity = tuple(_velocity(b, a, r) for b, a, r in zip(seen[j - 1], seen[j], recorded.velocity))
                state = arena.ArenaState(player=recorded.player, ball=corner, velocity=velocity)
                j += first
        kept.append(j is not None)
        for key in row_keys[(j if j is not None else K - 1) + 1:K]:  # carry the drawn ball to the last frame
            state = arena.step(state, int(key))
        block = []
        for key in row_keys[K:]:
            state = arena.step(state, int(key))
            block.append(arena.render(state))
        frames.append(block)
    frames = np.stack(frames)
    x = _frames_to_tensor(frames).to(context.device)
    z = ae.encode(x.flatten(0, 1).to(dtype)).float()
    cells = ball_cells(frames, arena.CANVAS // z.shape[-1]).to(context.device)
    return z.view(*frames.shape[:2], *z.shape[1:]), cells, torch.tensor(kept, device=context.device)


def self_forcing(cfg: ArenaTrainingConfig, student, ae, latents, actions, states, balls, work: Path, device,
                 progress=True):
    """Stage 4: fine-tune the distilled model on contexts it generated itself (Self Forcing's idea;
    DAgger's, in imitation-learning terms), so that its own small errors stop adding up.

    Each step rolls the model out open loop (no gradient) for 0 to ``self_forcing_frames`` frames
    from ``opening_frames`` recorded ones, exactly as it plays (:func:`own_rollout`), then teaches it
    the next block of 1 to ``max_speculate`` frames from the last ``window`` - n frames of that
    rollout, denoised together as speculation uses them: from pure noise (tau = 1, the one-step
    sample) half of the time, else from a level of the distillation grid. The loss is the weighted
    squared error (:func:`loss_weights`) between the clean estimate ``x - tau v`` and the targets:

    - ``self_forcing_targets="simulator"``: :func:`simulated_targets`, the recorded player and the
      ball continued from where the model drew it (with ``self_forcing_recover``, from where it
      last drew it, if it lost it since);
    - ``"recorded"``: the recorded frames. The player comes back, but the ball the model drew a few
      pixels off cannot, and the model learns to blur it away (docs/experiments/2026-11-27-arena-self-forcing.md).

    ``states`` (E, T+1, 6) are the episodes' states (:func:`episode_latents`), ``balls`` their
    ball cells (:func:`ball_cells`).
    """
    if cfg.self_forcing_targets not in ("simulator", "recorded"):
        raise ValueError(f"self_forcing_targets must be 'simulator' or 'recorded', got {cfg.self_forcing_targets!r}")
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.self_forcing_lr, weight_decay=0.0)
    autocast = training_autocast(device)
    E, T1 = latents.shape[:2]

    def step_fn(step):
        rng = np.random.default_rng([cfg.seed, 41, step])
        generator = torch.Generator(device).manual_seed(int(rng.integers(2 ** 62)))
        n = int(rng.integers(1, cfg.max_speculate + 1))
        own = int(rng.integers(0, min(cfg.self_forcing_frames, T1 - cfg.opening_frames - n) + 1))
        length = cfg.opening_frames + own + n
        eps = torch.from_numpy(rng.integers(0, E, cfg.batch))[:, None]
        idx = torch.from_numpy(rng.integers(0, T1 - length + 1, cfg.batch)[:, None] + np.arange(length)[None])
        acts = actions[eps, (idx - 1).clamp(min=0)]
        acts[idx == 0] = student.no_action
        x0, acts = latents[eps, idx].to(device), acts.to(device)
        student.eval()
        with torch.autocast(**autocast):
            context = own_rollout(student, x0[:, :-n], acts[:, :-n], cfg.opening_frames, cfg, rng, generator)
        student.train()
        keep = min(context.shape[1], cfg.window - n)
        context, acts = context[:, -keep:].float(), acts[:, -(keep + n):]
        if cfg.self_forcing_targets == "simulator":
            shown = idx[:, -(keep + n):-n].numpy()
            target, ball, kept = simulated_targets(ae, context, states[eps.numpy(), shown], acts.cpu().numpy(),
                                                   recover=cfg.self_forcing_recover)
        else:
            target, ball = x0[:, -n:], balls[eps, idx[:, -n:]].to(device)
            kept = torch.ones(cfg.batch, dtype=torch.bool, device=device)
        taus = torch.full((cfg.batch, keep + n), cfg.context_noise, device=device)
        taus[:, keep:] = 1.0 if rng.random() < 0.5 else int(rng.integers(1, cfg.distill_grid + 1)) / cfg.distill_grid
        frames = torch.cat([context, target], 1)
        noise = torch.randn(frames.shape, generator=generator, device=device)
        inputs = _noised(frames, taus, noise)
        with torch.autocast(**autocast):
            v = student(inputs, taus, acts)
        estimate = (inputs - taus[:, :, None, None, None] * v.float())[:, keep:]
        weights = loss_weights(frames, taus, cfg, torch.cat([torch.zeros_like(ball[:, :1]).expand(-1, keep, -1, -1),
                                                             ball], 1))[:, keep:]
        weights = weights * kept[:, None, None, None, None]
        loss = ((estimate - target) ** 2 * weights).sum() / (weights.expand_as(target).sum() + 1e-8)
        optimizer_step(opt, loss, student.parameters())
        return {"loss": loss.item(), "own": own, "kept": kept.float().mean().item()}

    run_stage("self forcing", work / "self_forcing", {"student": student}, opt, cfg.self_forcing_steps, step_fn,
              lr=cfg.self_forcing_lr, warmup=20, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return student.eval()


def train_arena(out: str, work_dir: str, cfg: ArenaTrainingConfig | None = None, progress: bool = True,
                start_from: str | None = None):
    """Run (or resume) all stages and save the video pipeline folder to ``out``.

    ``start_from``: a pipeline folder this recipe wrote; its autoencoder, distilled transformer and
    teacher stand in for stages 1 to 3 (their fields of ``cfg`` are then unused) and only self
    forcing runs, on the episodes encoded by that autoencoder.
    """
    from ..pipelines.nfd import NextFramePipeline

    cfg = cfg or ArenaTrainingConfig()
    config = json.loads(json.dumps(asdict(cfg)))
    if start_from:
        config["start_from"] = str(start_from)
    work = claim_work_dir(work_dir, config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    if start_from:
        base = NextFramePipeline.from_pretrained(start_from)
        if base.teacher is None:
            raise ValueError(f"{start_from} has no teacher; self forcing starts from a folder with all three models")
        ae, teacher, student = (m.float().to(device) for m in (base.autoencoder, base.teacher, base.transformer))
    else:
        ae = train_autoencoder(cfg, work, device, progress)
    for p in ae.parameters():
        p.requires_grad_(False)
    latents, actions, balls, states = episode_latents(cfg, ae, device)
    if not start_from:
        ae.register_to_config(scaling_factor=float(1.0 / latents.std()))
    latents = latents * ae.config.scaling_factor
    if not start_from:
        teacher = train_transformer(cfg, latents, actions, balls, work, device, progress)
        student = distill(cfg, teacher, latents, actions, balls, work, device, progress)
    if cfg.self_forcing_steps:
        student = self_forcing(cfg, student, ae, latents, actions, states, balls, work, device, progress)
    # stored in float16 to keep the asset small; from_pretrained loads them back in float32
    pipe = NextFramePipeline(transformer=student.cpu().half(), teacher=teacher.cpu().half(),
                             autoencoder=ae.cpu().half(), context_noise=cfg.context_noise)
    pipe.save_pretrained(out)
    write_training_record(out, "visualspec train-arena" + (f" --from {start_from}" if start_from else ""), config,
                          t0, device)
    return NextFramePipeline.from_pretrained(out)
