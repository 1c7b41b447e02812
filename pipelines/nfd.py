"""The arena-world video pipeline: a frame autoencoder and a next-frame diffusion transformer.

    pipe = VisualSpecPipeline.from_pretrained("assets/arena-nfd")
    out = pipe(actions=["right"] * 30 + ["up"] * 30, seed=0)      # out.frames, out.stats
    session = pipe.interactive(seed=0)
    frame = session.step("left")                                   # (64, 64, 3) uint8
    worlds = [pipe.interactive(seed=s) for s in (1, 2)]           # several players' worlds,
    frames = ArenaSession.step_together(worlds, ["left", "up"])    # stepped in one batch
    export_video(out.frames, "play.mp4")

The world opens with ``opening_frames`` frames of the simulator (seeded; action "none"), which the
model takes as its first context, then generates every further frame itself (open loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers.utils import BaseOutput

from ..core.checks import check_positive_int
from ..core.sampling import make_generator
from ..video import VideoStats, WorldSession, step_together
from ..worlds import arena
from ..models.frame_autoencoder import FrameAutoencoder
from ..models.nfd import NextFrameDiT
from .base import VisualSpecPipeline, register_pipeline

OUTPUT_TYPES = ("np", "pil", "pt")


@dataclass
class VisualSpecVideoOutput(BaseOutput):
    """``frames``: list of (64, 64, 3) uint8 arrays (``np``), PIL images, or a (F, 3, H, W) tensor
    in [0, 1] (``pt``); ``stats``: the :class:`visualspec.video.VideoStats` of the call."""

    frames: list | torch.Tensor
    stats: VideoStats


class ArenaSession:
    """One player's world: ``step(action)`` -> the next frame ((64, 64, 3) uint8)."""

    def __init__(self, session: WorldSession, opening: list[np.ndarray]):
        self._session = session
        self.opening = opening
        self.last_frame = opening[-1]

    @property
    def stats(self) -> VideoStats:
        return self._session.stats

    def step(self, action="none") -> np.ndarray:
        self.last_frame = self._session.step(action)
        return self.last_frame

    @staticmethod
    def step_together(sessions: list["ArenaSession"], actions: list) -> list[np.ndarray]:
        """The next frame of each player's world, the generations they need made in batched
        forwards (:func:`visualspec.video.step_together`): the same frames as stepping each alone."""
        frames = step_together([s._session for s in sessions], actions)
        for session, frame in zip(sessions, frames):
            session.last_frame = frame
        return frames


@register_pipeline
class NextFramePipeline(VisualSpecPipeline):
    """Action-conditioned next-frame generation with NFD's speculation.

    ``transformer`` is the consistency-distilled model (1 to 4 steps); ``teacher``, when present,
    the undistilled flow-matching model it was distilled from (many Euler steps).
    """

    model_cpu_offload_seq = "transformer->autoencoder"
    _optional_components = ["teacher"]

    def __init__(self, transformer: NextFrameDiT, autoencoder: FrameAutoencoder, teacher: NextFrameDiT | None = None,
                 context_noise: float = 0.02, default_steps: int = 1, default_teacher_steps: int = 8,
                 opening_frames: int = 2):
        super().__init__()
        self.register_modules(transformer=transformer, autoencoder=autoencoder, teacher=teacher)
        self.register_to_config(context_noise=context_noise, default_steps=default_steps,
                                default_teacher_steps=default_teacher_steps, opening_frames=opening_frames)

    # ------------------------------------------------------------------ pieces

    @torch.no_grad()
    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        """uint8 (N, 64, 64, 3) -> latents (N, C, 8, 8)."""
        x = torch.from_numpy(np.ascontiguousarray(frames)).float().permute(0, 3, 1, 2) / 127.5 - 1
        return self.autoencoder.encode(x.to(self.device, self.autoencoder.dtype))

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> list[np.ndarray]:
        """Latents (N, C, 8, 8) -> list of N uint8 (64, 64, 3) frames."""
        x = self.autoencoder.decode(latents)
        x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return list(x)

    def _model(self, use_teacher: bool) -> tuple[NextFrameDiT, str]:
        if not use_teacher:
            return self.transformer, "consistency"
        if self.teacher is None:
            raise ValueError("this pipeline has no teacher (undistilled) model")
        return self.teacher, "flow"

    def _session(self, seed, generator, steps, speculate, use_teacher, guard=True) -> ArenaSession:
        model, sampler = self._model(use_teacher)
        if steps is None:
            steps = self.config.default_teacher_steps if use_teacher else self.config.default_steps
        check_positive_int("steps", steps)
        check_positive_int("speculate (1 = off)", speculate)
        rng = np.random.default_rng(seed)
        state = arena.reset(rng)
        opening = [arena.render(state)]
        for _ in range(self.config.opening_frames - 1):
            state = arena.step(state, "none")
            opening.append(arena.render(state))
        latents = self.encode_frames(np.stack(opening))[None]
        acts = torch.tensor([[model.no_action] + [0] * (len(opening) - 1)])
        generator = make_generator(seed, generator, device="cpu")
        session = WorldSession(model, self.decode_latents, (latents, acts), steps=steps, sampler=sampler,
                               speculate=speculate, context_noise=self.config.context_noise,
                               generator=generator, action_index=arena.action_index,
                               keep=arena.keeps_ball if guard else None)
        return ArenaSession(session, opening)

    # ------------------------------------------------------------------ API

    def compile_worlds(self, speculate: int = 4, batch_sizes=(1,), enabled: bool = True) -> None:
        """Compile the world model's step and the frame decoder for live worlds that speculate
        ``speculate`` frames, at each of ``batch_sizes`` worlds stepped together: one graph per number
        of frames shown since the last generation (1 to ``speculate``) and one decoder graph per batch
        size, each announced once (torch keeps the code on disk,
        so a later process compiles faster). Worlds then step compiled once their context is full;
        other shapes stay eager, so nothing compiles while they play. ``enabled=False``: both
        eager again (the compiled graphs are kept)."""
        check_positive_int("speculate (1 = off)", speculate)
        self.transformer.compile_step(enabled)
        self.autoencoder.compile_step(enabled)
        if enabled:
            self.transformer.precompile(batch_sizes, [(shown, speculate) for shown in range(1, speculate + 1)])
            self.autoencoder.precompile([b * speculate for b in batch_sizes], self.transformer.config.latent_size)

    def interactive(self, seed: int | None = None, generator=None, steps: int | None = None, speculate: int = 4,
                    use_teacher: bool = False, guard: bool = True) -> ArenaSession:
        """A live world for one player; ``session.step(action)`` returns each next frame (``guard``:
        as :meth:`__call__`)."""
        return self._session(seed, generator, steps, speculate, use_teacher, guard)

    @torch.no_grad()
    def __call__(self, actions=None, num_frames: int | None = None, seed: int | None = None, generator=None,
                 steps: int | None = None, speculate: int = 1, use_teacher: bool = False, guard: bool = True,
                 output_type: str = "np", return_dict: bool = True):
        """Generate ``num_frames`` frames open loop under ``actions`` (names or indices of
        ``arena.ACTIONS``; random persistent key presses from ``seed`` when not given).

        ``steps``: sampling steps (default 1 for the distilled model, 8 for ``use_teacher=True``);
        ``speculate``: frames generated together while the action persists (1 = off); ``guard`` (the
        default): a frame generated ahead that lost the ball its block's first frame shows is not
        shown, and the world regenerates from the last frame shown
        (:func:`visualspec.worlds.arena.keeps_ball`; the stats count such frames as ``refused``);
        ``guard=False`` speculates as NFD does, unchecked.
        """
        self.check_inputs(actions, num_frames, output_type)
        if actions is None:
            actions = arena.random_actions(np.random.default_rng([seed or 0, 1]), num_frames)
        actions = [arena.action_index(a) for a in actions]
        if num_frames is None:
            num_frames = len(actions)
        if len(actions) != num_frames:
            raise ValueError(f"got {len(actions)} actions for num_frames={num_frames}")
        if num_frames < 1:
            raise ValueError("num_frames must be >= 1 (the action list is empty)")
        session = self._session(seed, generator, steps, speculate, use_teacher, guard)
        frames = [session.step(a) for a in self.progress_bar(actions)]
        if output_type == "pil":
            from PIL import Image

            frames = [Image.fromarray(f) for f in frames]
        elif output_type == "pt":
            frames = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float() / 255
        if not return_dict:
            return frames, session.stats
        return VisualSpecVideoOutput(frames=frames, stats=session.stats)


    def check_inputs(self, actions, num_frames, output_type) -> None:
        """Raise a ValueError naming the first bad argument of :meth:`__call__` (``steps`` and
        ``speculate`` are checked where every session starts)."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"unknown output_type {output_type!r}; choose one of {OUTPUT_TYPES}")
        if num_frames is None and actions is None:
            raise ValueError("pass actions, num_frames, or both")
        check_positive_int("num_frames", num_frames, optional=True)

def export_video(frames, path, fps: int = arena.FPS, scale: int = 4) -> Path:
    """Write frames (uint8 arrays or PIL images) to ``.mp4`` or ``.gif`` with imageio, upscaled
    ``scale`` times with nearest-neighbour pixels."""
    import imageio.v2 as imageio

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".mp4", ".gif"):
        raise ValueError(f"export to .mp4 or .gif, not {path.name!r}")
    arrays = [np.asarray(f) for f in frames]
    if not arrays:
        raise ValueError("no frames to export")
    arrays = [a.repeat(scale, 0).repeat(scale, 1) for a in arrays]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".partial" + suffix)
    if suffix == ".gif":
        imageio.mimsave(tmp, arrays, duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(tmp, arrays, fps=fps, codec="libx264", quality=8, macro_block_size=1)
    tmp.replace(path)
    return path
