"""Continuous speculative decoding (CSpD): verifying continuous tokens drawn from Gaussian heads.

Continuous-token AR models (MAR and its successors) draw each token's value x (D numbers) with a
small diffusion head instead of a softmax. CSpD (Wang et al. 2024) speculates with a draft model's
head and verifies with the target's, by the same rule as discrete speculative sampling with
densities in place of probabilities.

**The ratio the heads allow.** A DDPM head draws x_T ~ N(0, I), then x_{t-1} = mu(x_t, t) +
sigma_t eps_t. Draft and target run their heads with the *same* noise (x_T and every eps_t,
"trajectory alignment"), which makes their x_1 close. The exact ratio of the two whole
trajectories is useless (the paper measures about 5e-23), so the rule compares the last step only,
each model conditioned on its own x_1:

    q(x) = N(x; mu_q(x_1^q, 1), sigma_q^2),  p(x) = N(x; mu_p(x_1^p, 1), sigma_p^2),

accepts the draft x ~ q with probability ``min(1, p(x) / q(x))`` and otherwise draws from the
residual ``max(0, p - q) / Z``. Given the shared noise this emits exactly p(. | x_1^p); the target's
x_1^p is a sample of the target's own chain whatever the draft did, so the token has exactly the
target head's law. Three consequences, each resolving a point of the released code:

- no trajectory factor: multiplying the ratio by a constant Sigma != 1 (the paper's
  prod sqrt|Sigma_t^q| / sqrt|Sigma_t^p|, inverted in the released code) breaks the identity
  ``q min(1, p/q) + (1 - beta) r = p`` that makes the rule lossless;
- the last step must be random: MAR drops the noise of its final step, so its token is the point
  mu(x_1) and has no density. A head used here keeps the variance it predicts for t = 1 (the
  clipped posterior variance of improved DDPM, positive); this changes MAR's law by that one small
  step of noise, and the models say so;
- no flattening: the released code divides both Gaussians' exponents by an undocumented 42,
  which raises acceptance and makes the rule lossy. It is offered only as ``flatten=`` (1 = exact).

**The residual**, ``max(0, p - q) / Z``, has no closed form; it is drawn by acceptance-rejection:
propose y ~ p and keep it with probability ``max(0, 1 - q(y) / p(y))`` (the envelope M = 1/Z cancels
Z), with no network pass. Each proposal is kept with probability Z = TV(p, q), so a rejected token
needs 1/Z proposals on average, and one drawn at all only with probability Z: one proposal per
token in expectation. The number is bounded (``max_proposals``, M). When all M fail the rule emits
the last proposal, a draw from p, and counts it (``Verdict.fallbacks``); the emitted law is then off
by at most ``Z (1 - Z)^M <= 1 / (e M)`` in total variation (3.7e-4 for M = 1,000). The released code
left a zero token there, silently.

**What to expect.** The last step's standard deviation is small: 0.0063 per dimension for MAR's
100-step schedule (:class:`visualspec.models.diffusion_head.DiffusionSchedule`, temperature 1).
Two heads' last means must therefore agree to about that much in every dimension for a draft to
be kept: at the aligned draft-target distance CSpD reports for MAR (about 0.8 per 16-dimensional
token), ``log p/q`` is of order -8,000 and the exact rule keeps nothing. The released code's
flattening (42) scales that by 1/42^2. How much a trained pair keeps is a measurement, not an
assumption.

Distributions are diagonal Gaussians, :class:`Gaussian` (mean and standard deviation, (..., D)).

**The loop.** :func:`decode_continuous` generates continuous tokens, AR or CSpD with a draft
model, on the same rows and run as the discrete engine (:mod:`visualspec.core.rows`); every
position's head noise is drawn once (:class:`PositionNoise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .checks import check_positive_int
from .rows import _Run
from .sampling import Generator, SamplingConfig, normal, row_generators, uniform
from .stats import DecodeStats
from .verify import leading_true


@dataclass
class Gaussian:
    """A diagonal Gaussian over D-dimensional tokens: ``mean`` and ``std`` (..., D), std > 0."""

    mean: torch.Tensor
    std: torch.Tensor

    def __post_init__(self):
        self.std = torch.as_tensor(self.std, dtype=self.mean.dtype, device=self.mean.device).expand_as(self.mean)
        if not bool((self.std > 0).all()):
            raise ValueError("a Gaussian head's standard deviation must be positive (a head that drops its "
                             "last step's noise has no density: keep the variance it predicts for that step)")

    def log_prob(self, x: torch.Tensor, flatten: float = 1.0) -> torch.Tensor:
        """log N(x; mean, std^2) summed over the last dimension (…). ``flatten`` T divides the
        exponent's argument by T, keeping the normaliser (the released CSpD code's T = 42; lossy)."""
        z = (x.double() - self.mean.double()) / (self.std.double() * flatten)
        return (-0.5 * z.pow(2) - self.std.double().log()).sum(-1) - 0.5 * x.shape[-1] * math.log(2 * math.pi)

    def __getitem__(self, index) -> "Gaussian":
        return Gaussian(self.mean[index], self.std[index])

    def sample(self, generator: Generator = None) -> torch.Tensor:
        """One draw per distribution: mean + std * eps."""
        return self.mean + self.std * normal(self.mean.shape, generator, self.mean.device, self.mean.dtype)


def head_noise(draws: torch.Tensor) -> dict:
    """Standard normal draws (N, steps + 1, D), one row per token -> the noise a diffusion head's
    sampler reads: ``{"x_T": (N, D), "eps": (steps, N, D)}`` (the start, then one eps per step)."""
    return {"x_T": draws[:, 0], "eps": draws[:, 1:].transpose(0, 1)}


@dataclass
class ContinuousVerdict:
    num_accepted: torch.Tensor  # (B,) long, in 0..K
    next_tokens: torch.Tensor  # (B, D): the token at position num_accepted
    proposals: torch.Tensor  # (B,) long: residual proposals drawn (0 where nothing was rejected)
    fallbacks: torch.Tensor  # (B,) bool: the residual ran out of proposals and a draw from p was emitted


def _check(drafts: torch.Tensor, draft: Gaussian, target: Gaussian, max_proposals: int, flatten: float) -> None:
    if drafts.ndim != 3:
        raise ValueError(f"drafts must be (batch, K, D), got shape {tuple(drafts.shape)}")
    B, K, D = drafts.shape
    if tuple(draft.mean.shape) != (B, K, D):
        raise ValueError(f"the draft distributions must match the drafts {(B, K, D)}, got {tuple(draft.mean.shape)}")
    if tuple(target.mean.shape) != (B, K + 1, D):
        raise ValueError(f"the target distributions must be (batch, K + 1, D) = {(B, K + 1, D)} (one more for the "
                         f"bonus token), got {tuple(target.mean.shape)}; a draft of another token dimension "
                         f"cannot be verified")
    check_positive_int("max_proposals", max_proposals)
    if not flatten >= 1.0:
        raise ValueError(f"flatten must be >= 1 (1 = the exact rule), got {flatten!r}")


def residual_sample(p: Gaussian, q: Gaussian, generator: Generator = None, max_proposals: int = 1024,
                    chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draws from ``max(0, p - q) / Z`` for each row of p and q ((R, D)) by acceptance-rejection:
    y ~ p kept with probability ``max(0, 1 - q(y) / p(y))``, at most ``max_proposals`` per row
    (drawn ``chunk`` at a time, only for rows still searching, so a row's draws depend on its own
    outcomes). Returns ``(tokens (R, D), proposals (R,), fallbacks (R,))``: a row whose proposals
    all failed gets its last one, a draw from p, and is flagged."""
    R, D = p.mean.shape
    device = p.mean.device
    out = torch.empty(R, D, dtype=p.mean.dtype, device=device)
    used = torch.zeros(R, dtype=torch.long, device=device)
    kept = torch.zeros(R, dtype=torch.bool, device=device)
    searching = torch.arange(R, device=device)
    while len(searching):
        n = min(chunk, max_proposals - int(used[searching[0]]))  # rows still searching have used the same
        gens = row_generators(generator, searching)
        pr, qr = p[searching], q[searching]
        y = pr.mean[:, None] + pr.std[:, None] * normal((len(searching), n, D), gens, device, p.mean.dtype)
        q_over_p = (qr[:, None].log_prob(y) - pr[:, None].log_prob(y)).exp()
        keep = uniform((len(searching), n), gens, device=device) < (1.0 - q_over_p).clamp(min=0.0)
        found = keep.any(1)
        first = torch.where(found, keep.long().argmax(1), torch.full_like(found, n - 1, dtype=torch.long))
        used[searching] += torch.where(found, first + 1, torch.full_like(first, n))
        out[searching] = y[torch.arange(len(searching), device=device), first]
        kept[searching] = found
        searching = searching[~found & (used[searching] < max_proposals)]
    return out, used, ~kept


def continuous_verify(drafts: torch.Tensor, draft: Gaussian, target: Gaussian, generator: Generator = None, *,
                      bonus: torch.Tensor | None = None, max_proposals: int = 1024,
                      flatten: float = 1.0) -> ContinuousVerdict:
    """CSpD's rule for K continuous drafts per row, lossless with ``flatten=1``.

    ``drafts`` (B, K, D) were drawn from ``draft`` (B, K, D); ``target`` (B, K + 1, D) holds the
    target's distribution at each draft position given the earlier drafts, plus the bonus position.
    Draft i is accepted when ``u_i < min(1, p_i(x_i) / q_i(x_i))`` and every earlier one was; at the
    first rejection the token is drawn from the residual of p and q there
    (:func:`residual_sample`), and after K acceptances from the bonus distribution (``bonus`` (B, D):
    a token already drawn from it, such as the target head's own sample there). ``flatten`` T > 1
    is the released code's flattened ratio ``exp(-|x - mu_p|^2 / 2 T^2 sigma_p^2) sigma_q / (...)``:
    lossy, for measuring only.
    """
    _check(drafts, draft, target, max_proposals, flatten)
    B, K, D = drafts.shape
    device = drafts.device
    log_ratio = target[:, :K].log_prob(drafts, flatten) - draft.log_prob(drafts, flatten)
    accept = uniform((B, K), generator, device=device).log() < log_ratio.clamp(max=0.0)
    a = leading_true(accept)
    if bonus is None:  # every row draws it, so a row's draws depend on its own outcomes only
        bonus = target[:, K].sample(generator)
    elif tuple(bonus.shape) != (B, D):
        raise ValueError(f"bonus must be (batch, D) = {(B, D)}, got {tuple(bonus.shape)}")
    tokens = bonus.clone()
    proposals = torch.zeros(B, dtype=torch.long, device=device)
    fallbacks = torch.zeros(B, dtype=torch.bool, device=device)
    stopped = (a < K).nonzero()[:, 0]
    if len(stopped):
        at = a[stopped]
        p = Gaussian(target.mean[stopped, at], target.std[stopped, at])
        q = Gaussian(draft.mean[stopped, at], draft.std[stopped, at])
        y, used, fell = residual_sample(p, q, row_generators(generator, stopped), max_proposals)
        tokens[stopped], proposals[stopped], fallbacks[stopped] = y, used, fell
    return ContinuousVerdict(a, tokens, proposals, fallbacks)


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------


class PositionNoise:
    """The diffusion-head noise of every position of every row, drawn once when decoding starts:
    ``x_T`` and one eps per denoising step, (rows, N, steps + 1, D), from each row's generator.

    The draft and the target head read the same noise at a position (CSpD's trajectory
    alignment), however many times the position is drafted or verified; AR reads it too, so AR and
    speculation with a draft identical to the target give the same tokens."""

    def __init__(self, rows: int, num_tokens: int, steps: int, dim: int, generator: Generator, device=None):
        self.draws = normal((rows, num_tokens, steps + 1, dim), generator, device)

    def at(self, positions: torch.Tensor) -> dict:
        """Noise for the positions (B, L) of rows 0..B-1, flattened to B*L tokens in row order."""
        b = torch.arange(positions.shape[0], device=positions.device)[:, None]
        d = self.draws[b, positions.clamp(max=self.draws.shape[1] - 1)].flatten(0, 1)  # (B L, steps + 1, D)
        return head_noise(d)


def head_rows(z: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Model output (model rows, L, dim) -> one row per token, [cond tokens; uncond tokens] under
    guidance, as a guided head takes them."""
    if not sampling.uses_guidance:
        return z.flatten(0, 1)
    cond, uncond = z.chunk(2)
    return torch.cat([cond.flatten(0, 1), uncond.flatten(0, 1)])


class _ContinuousRun(_Run):
    """A decode run of continuous tokens: the target returns the head's condition z, which its
    head turns into tokens with each position's noise (:meth:`draw`). The noise is drawn when the
    rows are prefilled; rows that finish stay in the batch, idle (row b reads the noise of row b)."""

    drops_rows = False

    def __init__(self, target, prefix: Any, num_tokens: int, sampling: SamplingConfig, *, drafter,
                 generator: Generator, mode: str, temperature: float):
        self.temperature = temperature
        super().__init__(target, prefix, num_tokens, sampling, drafter=drafter, rule=None, generator=generator,
                         mode=mode)

    def first_tokens(self, z: torch.Tensor, generator: Generator) -> torch.Tensor:
        """Draws every row's noise (:class:`PositionNoise`), then token 0 from the prefill's z."""
        rows = z.shape[0] // self.sampling.model_rows_per_sample
        self.noise = PositionNoise(rows, self.N, len(self.target.diffloss.schedule), self.target.token_dim, generator,
                                   z.device)
        return self.draw(z[:, None], torch.zeros(rows, 1, dtype=torch.long, device=z.device))[0][:, 0]

    def draw(self, z: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Gaussian]:
        """The target head's tokens (b, L, D) at ``positions`` (b, L) from z (model rows, L, dim),
        and the Gaussians of their last step."""
        b, L = positions.shape
        tokens, p = self.target.draw(head_rows(z, self.sampling), self.noise.at(positions), self.temperature,
                                     self.sampling.guidance_scale)
        return tokens.view(b, L, -1), Gaussian(p.mean.view(b, L, -1), p.std.view(b, L, -1))


@torch.no_grad()
def decode_continuous(
    target,
    prefix: Any,
    num_tokens: int,
    *,
    drafter=None,
    gamma: int = 4,
    guidance_scale: float = 1.0,
    temperature: float = 1.0,
    generator: Generator = None,
    max_proposals: int = 1024,
    prefill: float = 0.0,
    flatten: float = 1.0,
    mode: str = "",
) -> tuple[torch.Tensor, DecodeStats]:
    """Continuous-token generation: AR, or CSpD with a draft model. Returns ``(tokens (R, N, D), stats)``.

    ``target`` is a continuous token model (:class:`visualspec.models.continuous_ar.ContinuousARTransformer`:
    the token-model protocol returning the head's condition z, and ``draw(z, noise, temperature,
    guidance)``). With ``drafter`` (:class:`visualspec.drafters.ContinuousDraftModelDrafter`) each
    step drafts ``gamma`` tokens, the target scores them in one forward, and
    :func:`continuous_verify` keeps a prefix and emits one more token;
    each row commits its own count. Every position's head noise is drawn once
    (:class:`PositionNoise`) and shared by draft and target. Rows that finish stay in the batch
    idle. ``guidance_scale`` is MAR's (on the head's eps); ``temperature`` scales the head's noise.
    ``prefill`` is CSpD's token pre-filling: the first ``floor(prefill * N)`` tokens come from the
    target alone (every row is there at the same step, since rows start together). ``flatten`` > 1
    is the released code's flattened ratio (lossy; see :func:`continuous_verify`).
    """
    check_positive_int("gamma (drafts per step)", gamma)
    if not 0.0 <= prefill < 1.0:
        raise ValueError(f"the pre-fill fraction must lie in [0, 1), got {prefill!r}")
    run = _ContinuousRun(target, prefix, num_tokens, SamplingConfig(guidance_scale=guidance_scale), drafter=drafter,
                         generator=generator, mode=mode or ("ar" if drafter is None else "cspd"),
                         temperature=temperature)
    rows, stats = run.rows, run.stats
    while run.live():
        n, live = rows.n, rows.n < num_tokens
        prefilling = bool((n < int(prefill * num_tokens)).any())  # rows move together until then
        k = gamma if drafter is not None and not prefilling else 0
        if k:
            drafts, q = drafter.propose(rows.seq, n, k, run.noise, temperature)
        else:
            drafts = rows.seq.new_empty(len(rows), 0, target.token_dim)
            q = Gaussian(drafts, torch.ones_like(drafts))
        tokens, p = run.draw(run.forward_window(drafts)[0], rows.positions(k + 1))
        run.step_done()
        verdict = continuous_verify(drafts, q, p, rows.generator, bonus=tokens[:, k], max_proposals=max_proposals,
                                    flatten=flatten)
        stats.residual_proposals += int(verdict.proposals[live].sum())
        stats.residual_fallbacks += int(verdict.fallbacks[live].sum())
        stats.drafts_proposed += k * int(live.sum())
        stats.drafts_accepted += int(verdict.num_accepted[live].sum())
        counts = run.commit(drafts, verdict.num_accepted, verdict.next_tokens)
        if k:
            drafter.observe(n, counts)
        run.finish_rows()
    return run.result()
