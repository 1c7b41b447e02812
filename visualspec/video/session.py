"""Next-frame video generation: flow-matching and consistency sampling of latent frames, and NFD's
action-persistence speculation.

A next-frame model (``visualspec.models.nfd.NextFrameDiT``) predicts the flow-matching velocity
``v = noise - clean`` of new latent frames given a cache of past frames, per-frame times ``tau``
and the actions that led to each frame. Two samplers share one loop, :func:`denoise_frames`:

- ``"flow"`` (the undistilled model): Euler steps ``x <- x + (tau' - tau) v`` from tau = 1 to 0;
- ``"consistency"`` (a consistency-distilled model): at each time the model's clean estimate
  ``x0 = x - tau v`` is taken and, except at the last step, re-noised to the next time
  ``x <- (1 - tau') x0 + tau' eps`` (multistep consistency sampling).

Speculation (NFD): people hold keys, so the next action usually equals the current one. While it
does, :class:`WorldSession` denoises the next ``speculate`` frames *together* (one block, as if the
action persists) and shows them one by one; when the action changes the unseen ones are discarded
and the world regenerates from the last frame shown. A speculative frame is what the model would
produce for that action sequence from its own earlier samples, denoised jointly with the block
rather than one by one (every frame of a training sequence has its own noise level, so the model
is trained for it), and that costs what the model loses further from its context: the arena's
ball, most. The block's first frame sees only itself and the past (block-causal attention), so it
is the frame a world without speculation draws. A session may therefore check each later frame
against it (``keep``; NFD checks nothing) and cut the block before the first it refuses: the
world regenerates from the last frame shown, as after a changed action.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..core.checks import check_positive_int
from ..core.sampling import Generator, normal
from ..models.nfd import FrameCache

SAMPLERS = ("flow", "consistency")


def time_grid(steps: int, sampler: str) -> list[float]:
    """The times visited: ``steps + 1`` points from 1 to 0 (flow) or ``steps`` points (consistency)."""
    check_positive_int("steps", steps)
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")
    grid = [1.0 - i / steps for i in range(steps + 1)]
    return grid if sampler == "flow" else grid[:-1]


@torch.no_grad()
def denoise_frames(model, cache, actions: torch.Tensor, steps: int, sampler: str = "flow",
                   commit: tuple[torch.Tensor, torch.Tensor] | None = None, generator: Generator = None,
                   context_noise: float = 0.0) -> tuple[torch.Tensor, int]:
    """Generate ``actions.shape[1]`` new latent frames jointly after the cached ones.

    ``actions`` (B, N): the action leading to each new frame. ``commit`` = (latents (B, P, C, h, w),
    actions (B, P)): clean frames shown since the last call; the first forward appends them to the
    cache (at time ``context_noise``, NFD's small context noise against drift). Returns the new
    latents (B, N, C, h, w) and the number of model forwards used.
    """
    B, N = actions.shape
    cfg, device = model.config, model.device  # diffusers' device looks through the parameters: once
    shape = (B, N, cfg.latent_channels, cfg.latent_size, cfg.latent_size)
    x = normal(shape, generator, device)
    grid = time_grid(steps, sampler)
    forwards = 0
    for i, tau in enumerate(grid[:steps]):
        inputs, taus, acts, write = x, torch.full((B, N), tau), actions, 0
        if i == 0 and commit is not None and commit[0].shape[1] > 0:
            clean, clean_actions = commit
            if context_noise > 0:
                clean = (1 - context_noise) * clean + context_noise * normal(clean.shape, generator, device)
            write = clean.shape[1]
            inputs = torch.cat([clean.to(x.dtype), x], dim=1)
            taus = torch.cat([torch.full((B, write), float(context_noise)), taus], dim=1)
            acts = torch.cat([clean_actions, actions], dim=1)
        v = model(inputs, taus.to(device), acts.to(device), cache=cache, write=write)[:, write:]
        forwards += 1
        if sampler == "flow":
            x = x + (grid[i + 1] - tau) * v
        else:
            x0 = x - tau * v
            x = x0 if i == steps - 1 else (1 - grid[i + 1]) * x0 + grid[i + 1] * normal(shape, generator, x.device)
    return x, forwards


@dataclass
class VideoStats:
    """What a video generation or an interactive session cost, and how speculation paid off.

    - ``frames``: frames shown; ``model_forwards``: transformer forward passes;
    - ``speculated``: frames generated ahead under the assumption that the action persists (the
      first frame of each block is not counted: it was asked for); ``hits``: of those, frames
      shown; ``discarded``: frames thrown away because the action changed; ``refused``: frames
      generated ahead that the session's check refused (not counted in ``speculated``).
    """

    frames: int = 0
    model_forwards: int = 0
    generation_calls: int = 0
    speculated: int = 0
    hits: int = 0
    discarded: int = 0
    refused: int = 0
    seconds: float = 0.0
    frame_seconds: list[float] = field(default_factory=list, repr=False)

    @property
    def hit_rate(self) -> float:
        """Fraction of speculative frames that were shown, of those shown, discarded or refused (NaN
        before any speculation)."""
        decided = self.hits + self.discarded + self.refused
        return self.hits / decided if decided else float("nan")

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("frame_seconds")
        d.update(hit_rate=self.hit_rate, fps=self.fps)
        return d


class WorldSession:
    """An interactive world: ``step(action)`` returns the next frame, speculating while the action
    persists.

    ``decode`` maps latents (N, C, h, w) to displayable frames (a list of N). ``first`` is the
    initial context: latents (1, P, C, h, w) and the actions that led to them (1, P). ``keep``
    (optional) is ``keep(first_frame, frame) -> bool``: whether a frame generated ahead may be shown,
    given its block's first frame (e.g. :func:`visualspec.worlds.arena.keeps_ball`); a block is cut
    before the first frame it refuses.
    """

    def __init__(self, model, decode: Callable, first: tuple[torch.Tensor, torch.Tensor], steps: int = 1,
                 sampler: str = "consistency", speculate: int = 1, context_noise: float = 0.0,
                 generator: Generator = None, action_index: Callable[[object], int] = int,
                 keep: Callable[[object, object], bool] | None = None):
        check_positive_int("speculate (1 = off)", speculate)
        if speculate > model.config.context_frames:
            raise ValueError(f"speculate must be at most the model's context_frames "
                             f"({model.config.context_frames}), got {speculate}")
        time_grid(steps, sampler)  # validates steps and sampler
        self.model, self.decode = model, decode
        self.steps, self.sampler, self.speculate = steps, sampler, speculate
        self.context_noise, self.generator, self.action_index = context_noise, generator, action_index
        self.keep = keep
        self.cache = model.new_cache()
        self.pending_latents, self.pending_actions = first  # shown, not yet in the cache
        self.buffer: list[tuple[torch.Tensor, object]] = []  # (latent (1, C, h, w), frame) ahead
        self.buffer_action: int | None = None
        self.stats = VideoStats()

    def step(self, action):
        """Advance one frame under ``action`` and return the frame."""
        start = time.perf_counter()
        a = self.action_index(action)
        if not self._buffered(a):
            self._generate([self], [a])
        return self._show(a, start)

    def _buffered(self, a: int) -> bool:
        """Whether the next frame under action ``a`` was speculated already; counts the hit, or the
        frames discarded because the action changed."""
        if self.buffer and self.buffer_action == a:
            self.stats.hits += 1
            return True
        self.stats.discarded += len(self.buffer)
        return False

    def _show(self, a: int, start: float):
        latent, frame = self.buffer.pop(0)
        self.pending_latents = torch.cat([self.pending_latents, latent[:, None]], dim=1)
        self.pending_actions = torch.cat([self.pending_actions, torch.tensor([[a]])], dim=1)
        elapsed = time.perf_counter() - start
        self.stats.frames += 1
        self.stats.seconds += elapsed
        self.stats.frame_seconds.append(elapsed)
        return frame

    def _batch_key(self) -> tuple:
        """Worlds with equal keys can generate in one batched forward (:func:`step_together`)."""
        return (id(self.model), self.decode, self.cache.frames, self.pending_latents.shape[1], self.speculate,
                self.steps, self.sampler, self.context_noise)

    def _shown_ahead(self, frames: list) -> int:
        """How many of a block's ``frames`` may be shown: all, or those before the first frame after
        the block's first that :attr:`keep` refuses."""
        if self.keep is not None:
            for i in range(1, len(frames)):
                if not self.keep(frames[0], frames[i]):
                    return i
        return len(frames)

    @staticmethod
    def _generate(sessions: list["WorldSession"], actions: list[int]) -> None:
        """Fill the buffers of ``sessions`` (equal :meth:`_batch_key`) with their next ``speculate``
        frames under ``actions``, in one batched call of :func:`denoise_frames`."""
        first, n = sessions[0], sessions[0].speculate
        cache = first.cache if len(sessions) == 1 else FrameCache.stack([s.cache for s in sessions])
        commit = (torch.cat([s.pending_latents for s in sessions]), torch.cat([s.pending_actions for s in sessions]))
        generators = [s.generator for s in sessions]
        generator = generators[0] if len(sessions) == 1 else (None if None in generators else generators)
        latents, forwards = denoise_frames(
            first.model, cache, torch.tensor(actions)[:, None].expand(-1, n), first.steps, first.sampler,
            commit=commit, generator=generator, context_noise=first.context_noise)
        frames = first.decode(latents.flatten(0, 1))
        caches = [cache] if len(sessions) == 1 else cache.split()
        for b, (s, a) in enumerate(zip(sessions, actions)):
            s.cache = caches[b]
            s.pending_latents = s.pending_latents[:, :0]
            s.pending_actions = s.pending_actions[:, :0]
            shown = s._shown_ahead(frames[b * n:(b + 1) * n])
            s.buffer = [(latents[b:b + 1, i], frames[b * n + i]) for i in range(shown)]
            s.buffer_action = a
            s.stats.model_forwards += forwards
            s.stats.generation_calls += 1
            s.stats.speculated += shown - 1
            s.stats.refused += n - shown


def step_together(sessions: list[WorldSession], actions: list) -> list:
    """One frame for each of several worlds (one per player), as ``[s.step(a) for s, a in ...]``
    would give, but with the generations they need made in batched forwards: worlds of one model
    whose caches hold as many frames and who commit as many shown frames go together (after their
    first frames that is all of them). The step's fixed costs are paid once per batch (vLLM's
    continuous batching, for worlds): three worlds each get 1.3x to 1.4x the frames per second they
    get one after another on a 2-core CPU without speculation (``visualspec bench-video --players
    3``), and about the same with it. Each world keeps its own generator, so its frames do not
    depend on who else plays (up to floating-point summation order; a batch in which some world has
    no generator draws from torch's global one); every world is charged the batch's time.
    """
    start = time.perf_counter()
    indices = [s.action_index(a) for s, a in zip(sessions, actions)]
    groups: dict[tuple, list[int]] = {}
    for i, (s, a) in enumerate(zip(sessions, indices)):
        if not s._buffered(a):
            groups.setdefault(s._batch_key(), []).append(i)
    for members in groups.values():
        WorldSession._generate([sessions[i] for i in members], [indices[i] for i in members])
    return [s._show(a, start) for s, a in zip(sessions, indices)]


def rollout(model, decode: Callable, first, actions, steps: int = 1, sampler: str = "consistency",
            speculate: int = 1, context_noise: float = 0.0, generator: Generator = None, keep=None):
    """Frames for a whole action sequence (open loop), through the same session logic."""
    session = WorldSession(model, decode, first, steps, sampler, speculate, context_noise, generator, keep=keep)
    frames = [session.step(a) for a in actions]
    return frames, session.stats
