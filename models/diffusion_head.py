"""MAR's diffusion head: a small MLP that draws a continuous token given the transformer's output.

A continuous-token AR model (MAR, Li et al. 2024) ends each position with a vector z; the head
turns z into a token x (D numbers) by reverse diffusion, a few hundred times cheaper than the
transformer. This module holds the head's network, with the official parameter names (so MAR's
``diffloss.net.*`` weights load as they are), and its DDPM sampler:

- the network (``AdaLNMLP``): x and the time t go in, z conditions every residual block through
  adaLN (shift, scale, gate); it predicts the noise eps and, per channel, where the step's log
  variance lies between the clipped posterior variance and beta_t (improved DDPM's learned range);
- the schedule (:class:`DiffusionSchedule`): cosine ``alpha_bar(s) = cos((s + 0.008) / 1.008 * pi / 2)^2``
  over 1,000 training steps, betas ``1 - alpha_bar(i + 1) / alpha_bar(i)`` capped at 0.999,
  respaced to ``num_sampling_steps`` evenly spread steps (always the first and the last);
- sampling (:meth:`DiffusionHead.sample`) from given noise: x_T and one eps per step, so that a draft
  head and a target head can share them (CSpD's trajectory alignment,
  :mod:`visualspec.core.continuous`).

What the network predicts (``prediction_type``): MAR's ``"epsilon"`` (the noise), or
``"v_prediction"``, ``v = sqrt(abar) eps - sqrt(1 - abar) x_0`` (Salimans and Ho 2022), which the
sampler turns back into ``eps = sqrt(1 - abar) x_t + sqrt(abar) v``. The cosine schedule ends at
abar = 2.4e-9, where the sampler's first step multiplies an eps error by
``sqrt(abar_prev / abar)`` (about 640 at 50 steps): a small head trained briefly predicts eps to
about 0.02 there and its samples explode, while a v head's error passes through unamplified.
Guidance is linear in either output for the same x_t, so it is applied to what the network predicts.

One difference from MAR, on purpose: MAR's last step adds no noise, so its token is the point
mu(x_1) and has no density. Here the last step keeps the variance the head predicts for it (the
clipped posterior variance is positive), so every token has the Gaussian density CSpD's exact rule
needs; :meth:`DiffusionHead.sample` returns that Gaussian with the token. ``last_step_noise=False``
gives MAR's sampler exactly.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from torch import nn

from visualspec.core.checks import check_int
from visualspec.core.continuous import Gaussian, head_noise
from visualspec.core.sampling import normal


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features (N, dim) of (possibly fractional) times t (N,): cosines, then sines."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t[:, None].float() * freqs[None]
    emb = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return torch.cat([emb, emb[:, :1] * 0], dim=-1) if dim % 2 else emb


class TimeEmbedding(nn.Module):
    def __init__(self, width: int, features: int = 256):
        super().__init__()
        self.features = features
        self.mlp = nn.Sequential(nn.Linear(features, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t):
        return self.mlp(timestep_embedding(t, self.features).to(self.mlp[0].weight.dtype))


def _modulate(x, shift, scale):
    return x * (1 + scale) + shift


class ResBlock(nn.Module):
    """x + gate * MLP(LayerNorm(x) * (1 + scale) + shift), with (shift, scale, gate) from y."""

    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(_modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(_modulate(self.norm_final(x), shift, scale))


class AdaLNMLP(nn.Module):
    """The head's network: (x (N, D), t (N,), z (N, z_dim)) -> (N, 2D): eps, then the variance
    interpolation values in [-1, 1] (not enforced)."""

    def __init__(self, channels: int, width: int, z_channels: int, depth: int):
        super().__init__()
        self.time_embed = TimeEmbedding(width)
        self.cond_embed = nn.Linear(z_channels, width)
        self.input_proj = nn.Linear(channels, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, 2 * channels)
        self.reset_parameters()

    def reset_parameters(self):
        """Xavier linears with zero biases; adaLN and output layers start at zero (the head starts
        by predicting eps = 0 with the middle of the variance range)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for linear in (self.time_embed.mlp[0], self.time_embed.mlp[2]):
            nn.init.normal_(linear.weight, std=0.02)
        for block in self.res_blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for linear in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x, t, z):
        y = self.time_embed(t) + self.cond_embed(z)
        h = self.input_proj(x)
        for block in self.res_blocks:
            h = block(h, y)
        return self.final_layer(h, y)


def space_timesteps(num_timesteps: int, count: int) -> list[int]:
    """``count`` of the steps 0..num_timesteps-1, evenly spread with rounding, first and last
    included (improved DDPM's respacing with one section)."""
    check_int("num_sampling_steps", count, 1, high=num_timesteps)
    if count == 1:
        return [0]
    stride = (num_timesteps - 1) / (count - 1)
    return sorted({round(i * stride) for i in range(count)})


class DiffusionSchedule:
    """The DDPM quantities of a respaced cosine schedule, in float64.

    With ``abar`` the kept steps' cumulative alphas (``abar_prev`` the previous kept step's, 1
    before the first): ``beta = 1 - abar / abar_prev``; the posterior of x_{t-1} given x_t and x_0
    has variance ``beta (1 - abar_prev) / (1 - abar)``, clipped at the first step to the second
    step's value (it is 0 there), and mean ``c0 x_0 + ct x_t`` with ``c0 = beta sqrt(abar_prev) /
    (1 - abar)`` and ``ct = (1 - abar_prev) sqrt(1 - beta) / (1 - abar)``; x_0 is estimated from eps
    as ``(x_t - sqrt(1 - abar) eps) / sqrt(abar)``.
    """

    def __init__(self, num_sampling_steps: int = 100, num_timesteps: int = 1000):
        alpha_bar = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
        betas = [min(1 - alpha_bar((i + 1) / num_timesteps) / alpha_bar(i / num_timesteps), 0.999)
                 for i in range(num_timesteps)]
        abar_all = torch.tensor(betas, dtype=torch.float64).neg().add(1).cumprod(0)
        self.timesteps = torch.tensor(space_timesteps(num_timesteps, num_sampling_steps))  # the network's t
        abar = abar_all[self.timesteps]
        abar_prev = torch.cat([abar.new_ones(1), abar[:-1]])
        self.beta = 1 - abar / abar_prev
        posterior = self.beta * (1 - abar_prev) / (1 - abar)
        self.log_posterior = torch.cat([posterior[1:2], posterior[1:]]).log() if len(posterior) > 1 \
            else posterior.clamp(min=1e-20).log()
        self.abar, self.abar_prev = abar, abar_prev
        self.c0 = self.beta * abar_prev.sqrt() / (1 - abar)
        self.ct = (1 - abar_prev) * (1 - self.beta).sqrt() / (1 - abar)
        # every kept step's quantities, (steps, 6) float64: t, abar, beta, log posterior variance,
        # c0, ct; row i is what posterior_step reads at step i (a tensor, so that a compiled step
        # takes every step without recompiling)
        self.table = torch.stack([self.timesteps.double(), abar, self.beta, self.log_posterior, self.c0, self.ct], 1)

    def __len__(self):
        return len(self.timesteps)

    def step(self, out: torch.Tensor, x: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log variance of x at kept step i - 1 given x at step i and the network's output
        ``out`` (N, 2D) = (eps, variance values)."""
        return posterior_step(out, x, self.table[i].to(x.device))


def posterior_step(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and log variance of x one kept step down, float64, from x at this step and the
    network's ``out`` (N, 2D) = (eps, variance values v in [-1, 1]); ``q`` is the step's
    row of ``DiffusionSchedule.table``: ``x0 = (x - sqrt(1 - abar) eps) / sqrt(abar)``, mean
    ``c0 x0 + ct x``, log variance ``f log(beta) + (1 - f) log(posterior)`` with ``f = (v + 1) / 2``."""
    abar, beta, log_posterior, c0, ct = q[1], q[2], q[3], q[4], q[5]
    D = x.shape[-1]
    eps, v = out[:, :D].double(), out[:, D:].double()
    x = x.double()
    x0 = (x - (1 - abar).sqrt() * eps) / abar.sqrt()
    frac = (v + 1) / 2
    log_var = frac * beta.log() + (1 - frac) * log_posterior
    return c0 * x0 + ct * x, log_var


PREDICTION_TYPES = ("epsilon", "v_prediction")
COMPILED_STEPS = 5  # sampling steps per compiled call (DiffusionHead.compile_step)


@functools.lru_cache(maxsize=16)
def _schedule(num_steps: int) -> DiffusionSchedule:
    return DiffusionSchedule(num_steps)


@functools.lru_cache(maxsize=4)
def _training_alpha_bar(num_timesteps: int = 1000) -> torch.Tensor:
    """alpha_bar of every training step (the cosine schedule, unspaced)."""
    return DiffusionSchedule(num_timesteps, num_timesteps).abar


class DiffusionHead(nn.Module):
    """MAR's diffusion head (its ``DiffLoss``): ``net`` and the sampling schedule.

    ``channels`` is the token dimension D (16 for MAR's KL-16 latents), ``z_channels`` the
    transformer's width, ``depth`` and ``width`` the MLP's.
    """

    def __init__(self, channels: int, z_channels: int, depth: int, width: int, num_sampling_steps: int = 100,
                 prediction_type: str = "epsilon"):
        super().__init__()
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        self.channels = channels
        self.prediction_type = prediction_type
        self.net = AdaLNMLP(channels, width, z_channels, depth)
        self.schedule = DiffusionSchedule(num_sampling_steps)

    def loss(self, x0: torch.Tensor, z: torch.Tensor, generator=None) -> torch.Tensor:
        """The training loss for tokens x0 (N, D) under conditions z (N, z_dim): the mean squared
        error of the prediction (eps, or v) at a random one of the 1,000 training steps (MAR's
        simple loss; the variance outputs are not trained here and stay at the middle of their range)."""
        abar = _training_alpha_bar().to(x0.device)
        t = torch.randint(0, len(abar), (x0.shape[0],), generator=generator, device=x0.device)
        eps = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        a = abar[t][:, None].to(x0.dtype)
        out = self.net(a.sqrt() * x0 + (1 - a).sqrt() * eps, t, z)
        target = eps if self.prediction_type == "epsilon" else a.sqrt() * eps - (1 - a).sqrt() * x0
        return (out[:, :self.channels] - target).pow(2).mean()

    @contextlib.contextmanager
    def sampling_steps(self, num_steps: int | None):
        """Sample with ``num_steps`` respaced steps inside the ``with`` block (None: the head's own);
        the same trained network, as MAR's ``--num_sampling_steps``."""
        saved = self.schedule
        if num_steps is not None and num_steps != len(saved):
            self.schedule = _schedule(num_steps)
        try:
            yield self
        finally:
            self.schedule = saved

    _compiled_step = None

    def denoise_step(self, x: torch.Tensor, z: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                     guided: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One sampling step: the mean and standard deviation (float64) of x one kept step down,
        from x (N, D) at the step whose quantities are ``q`` (a row of ``DiffusionSchedule.table``);
        ``scale`` is (guidance s, temperature). Guided, z is [cond; uncond] (2N rows) and eps is
        ``uncond + s (cond - uncond)``, the variance the conditional rows'."""
        n, D = x.shape[0], self.channels
        t = q[0].long().expand(z.shape[0])
        out = self.net(torch.cat([x, x]) if guided else x, t, z)
        if guided:
            cond, uncond = out[:n], out[n:]
            out = torch.cat([uncond[:, :D] + scale[0].to(out.dtype) * (cond[:, :D] - uncond[:, :D]), cond[:, D:]], dim=1)
        if self.prediction_type == "v_prediction":  # eps = sqrt(1 - abar) x_t + sqrt(abar) v
            a = q[1]
            eps = (1 - a).sqrt() * x.double() + a.sqrt() * out[:, :D].double()
            out = torch.cat([eps.to(out.dtype), out[:, D:]], dim=1)
        mean, log_var = posterior_step(out, x, q)
        return mean, (0.5 * log_var).exp() * scale[1]

    def denoise_steps(self, x: torch.Tensor, z: torch.Tensor, q: torch.Tensor, eps: torch.Tensor, scale: torch.Tensor,
                      guided: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``len(q)`` sampling steps in a row (:meth:`denoise_step` with each row of ``q``), each
        but the last followed by its noise ``eps[j]`` (N, D); the last step's mean and standard
        deviation. One call of a compiled chunk replaces several calls of a compiled step, whose
        fixed cost bounds a small head's step on a CPU."""
        for j in range(q.shape[0]):
            mean, std = self.denoise_step(x, z, q[j], scale, guided)
            if j < q.shape[0] - 1:
                x = (mean + std * eps[j].double()).to(z.dtype)
        return mean, std

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """Run the sampler through ``torch.compile`` in chunks of :data:`COMPILED_STEPS` steps
        (:meth:`denoise_steps`), one graph per chunk length for every row count (dynamic rows;
        torch compiles once for one row, once for more); ``enabled=False``: eager again. A head
        compiled already keeps its graphs. The steps and their noise are unchanged, so the tokens
        are the eager ones up to float rounding."""
        from visualspec.core.compiled import compile_in_mode, compile_mode

        if not enabled:
            self._compiled_step = None
        elif self._compiled_step is None:
            mode = compile_mode(mode, next(self.parameters()).device)
            self._compiled_step = compile_in_mode(self.denoise_steps, mode, dynamic=True)

    def noise(self, rows: int, generator=None, device=None) -> dict:
        """Fresh noise for one token per row: ``x_T`` (rows, D) and ``eps`` (steps, rows, D).
        A draft and a target head given the same dict follow aligned trajectories."""
        return head_noise(normal((rows, len(self.schedule) + 1, self.channels), generator, device))

    @torch.no_grad()
    def sample(self, z: torch.Tensor, noise: dict, temperature: float = 1.0, guidance: float = 1.0,
               last_step_noise: bool = True) -> tuple[torch.Tensor, Gaussian]:
        """Tokens (N, D) for conditions z (N, z_dim), and the Gaussian of the last step they were drawn
        from (given this head's own x_1). With ``guidance`` s != 1, z is [cond; uncond] (2N rows)
        and eps is guided, ``uncond + s (cond - uncond)``, as MAR does; the variance comes from the
        conditional rows. ``temperature`` scales every step's noise, MAR's temperature.
        ``last_step_noise=False`` is MAR's sampler (the token is the last mean; the Gaussian
        returned is then the one it would have drawn from)."""
        guided = guidance != 1.0
        scale = torch.tensor([guidance, temperature], dtype=torch.float64, device=z.device)
        table = self.schedule.table.to(z.device)
        x = noise["x_T"].to(z.dtype)
        chunk = COMPILED_STEPS if self._compiled_step is not None else 1
        if chunk > 1:  # dense inputs: one compiled graph whatever views the noise and z come as
            x, z = x.contiguous(), z.contiguous()
        for top in range(len(table) - 1, -1, -chunk):  # steps top, top - 1, ..., down to 0
            i = max(top - chunk + 1, 0)
            if chunk == 1:
                mean, std = self.denoise_step(x, z, table[i], scale, guided)
            else:
                mean, std = self._compiled_step(x, z, table[i:top + 1].flip(0), noise["eps"][i:top + 1].flip(0),
                                                scale, guided)
            if i == 0:
                last = Gaussian(mean.to(z.dtype), std.to(z.dtype))
                token = mean + std * noise["eps"][0].double() if last_step_noise else mean
                return token.to(z.dtype), last
            x = (mean + std * noise["eps"][i].double()).to(z.dtype)
