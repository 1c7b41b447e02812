"""Quality of a next-frame world model against the arena simulator.

- :func:`one_step_psnr`: teacher-forced next-frame prediction on held-out episodes (the true past
  frames are the context), PSNR of each predicted frame against the simulator's, in dB over
  [0, 255]; the autoencoder's own reconstruction PSNR is reported beside it as the ceiling.
- :func:`rollout_player_error`: open loop. The model plays a whole action sequence on its own
  samples; the analytic detector finds the player in every generated frame and the error is its
  distance to the simulator's player for the same actions. The ball is looked for in every frame
  too: in the simulator it is always in sight, so a frame where the detector finds no ball is a
  frame where the model lost it.

Held-out episodes use seeds from :data:`HELD_OUT_SEED` on, far from the training seeds.
"""

from __future__ import annotations

import numpy as np
import torch

from ..video import denoise_frames
from ..worlds import arena

HELD_OUT_SEED = 10_000_000


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


@torch.no_grad()
def one_step_psnr(pipe, episodes: int = 8, frames: int = 30, steps: int | None = None, use_teacher: bool = False,
                  seed: int = HELD_OUT_SEED) -> dict:
    """Mean PSNR of teacher-forced next-frame predictions over ``episodes`` x ``frames`` frames."""
    model, sampler = pipe._model(use_teacher)
    steps = steps or (pipe.config.default_teacher_steps if use_teacher else pipe.config.default_steps)
    predicted, reconstructed = [], []
    for e in range(episodes):
        ep = arena.episode(seed + e, frames)
        latents = pipe.encode_frames(ep.frames)
        cache = model.new_cache()
        generator = torch.Generator().manual_seed(seed + e)
        previous_action = model.no_action
        for t in range(frames):
            commit = (latents[None, t:t + 1], torch.tensor([[previous_action]]))
            action = torch.tensor([[int(ep.actions[t])]])
            z, _ = denoise_frames(model, cache, action, steps, sampler, commit=commit, generator=generator,
                                  context_noise=pipe.config.context_noise)
            predicted.append(psnr(pipe.decode_latents(z[0])[0], ep.frames[t + 1]))
            previous_action = int(ep.actions[t])
        reconstructed += [psnr(f, g) for f, g in zip(pipe.decode_latents(latents), ep.frames)]
    return {"psnr_db": float(np.mean(predicted)), "autoencoder_psnr_db": float(np.mean(reconstructed)),
            "frames": len(predicted), "steps": steps, "model": "teacher" if use_teacher else "distilled"}


def simulator_rollout(seed: int, actions, opening_frames: int = 2) -> list[arena.ArenaState]:
    """The simulator's states for the frames the pipeline generates from ``seed`` under ``actions``."""
    state = arena.reset(np.random.default_rng(seed))
    for _ in range(opening_frames - 1):
        state = arena.step(state, "none")
    states = []
    for a in actions:
        state = arena.step(state, a)
        states.append(state)
    return states


def _finite(x) -> float | None:
    """JSON-safe: None where the player was not found (an infinite error)."""
    return float(x) if np.isfinite(x) else None


@torch.no_grad()
def rollout_player_error(pipe, episodes: int = 8, frames: int = 60, tolerance: float = 2.0, steps: int | None = None,
                         use_teacher: bool = False, speculate: int = 1, seed: int = HELD_OUT_SEED,
                         guard: bool = True) -> dict:
    """Open-loop rollouts: how far the detected player is from the simulator's, frame by frame, and
    in how many frames the ball is missing (``ball_not_found``, its share, and the longest run of
    consecutive frames without it in one episode). ``guard``: the pipeline's (frames generated ahead
    that lost the ball refused; the default), with the share of such frames it refused."""
    errors, missing, no_ball, longest, refused, ahead = [], 0, 0, 0, 0, 0
    for e in range(episodes):
        actions = arena.random_actions(np.random.default_rng([seed + e, 2]), frames)
        out = pipe(actions=list(actions), seed=seed + e, steps=steps, use_teacher=use_teacher, speculate=speculate,
                   guard=guard)
        refused += out.stats.refused
        ahead += out.stats.refused + out.stats.speculated
        truth = simulator_rollout(seed + e, actions, pipe.config.opening_frames)
        row, run = [], 0
        for frame, state in zip(out.frames, truth):
            run = run + 1 if arena.detect_ball(frame) is None else 0
            no_ball += run > 0
            longest = max(longest, run)
            found = arena.detect_player(frame)
            if found is None:
                missing += 1
                row.append(float("inf"))
            else:
                row.append(float(np.hypot(*(np.subtract(found, arena.player_center(state))))))
        errors.append(row)
    err = np.array(errors)
    return {
        "model": "teacher" if use_teacher else "distilled", "speculate": speculate, "guard": guard,
        "refused_share": refused / ahead if ahead else None,
        "steps": steps or (pipe.config.default_teacher_steps if use_teacher else pipe.config.default_steps),
        "episodes": episodes, "frames": frames, "tolerance_px": tolerance,
        "frames_within_tolerance": float(np.mean(err <= tolerance)),
        "episodes_all_within_tolerance": float(np.mean(np.all(err <= tolerance, axis=1))),
        "median_error_px": _finite(np.median(err)), "player_not_found": missing,
        "ball_not_found": no_ball, "ball_not_found_share": no_ball / (episodes * frames),
        "longest_run_without_ball": longest,
        "median_error_at_frame": {i + 1: _finite(np.median(err[:, i])) for i in range(9, frames, 10)},
    }
