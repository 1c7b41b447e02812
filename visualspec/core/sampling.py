"""Turning logits into the distributions that drafts are sampled from and verified against.

Every distribution in visualspec, target or draft, goes through :meth:`SamplingConfig.probs`, so the
acceptance test always compares a draft token against exactly the distribution it was sampled from
(after guidance, the epsilon cut-off, temperature, top-k and top-p), never against raw logits.

Randomness is explicit: every random draw takes a ``generator`` that is ``None``, one
``torch.Generator`` for the whole batch, or a list with one generator per batch row (the diffusers
convention for per-image reproducibility).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from .checks import check_int
from .constraints import StepConstraints

Generator = Union[None, torch.Generator, Sequence[torch.Generator]]


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution.

    - ``guidance_scale`` s: classifier-free guidance ``uncond + s * (cond - uncond)``. When ``s != 1``
      the model batch is ``[cond; uncond]`` (2B rows) and :meth:`probs` returns B rows. ``s == 1``
      means no guidance and a plain batch of B rows.
    - ``temperature`` T: logits / T. ``T == 0`` means greedy decoding: :meth:`probs` returns the
      one-hot distribution of the argmax.
    - ``top_k`` k: keep the k largest logits (0 keeps all).
    - ``top_p`` p: keep the smallest set of tokens whose probability reaches p (1.0 keeps all).
    - ``epsilon_cutoff`` ε: drop every token whose probability under the *conditional* model
      (softmax of the cond logits, before guidance and temperature) is below ε; the conditional's
      most likely token always stays (0 keeps all). Without guidance this is epsilon sampling
      (Hewitt et al., 2022). With guidance it keeps ``s * (cond - uncond)`` from promoting tokens
      the conditional model itself finds implausible: guidance weights a token's conditional
      probability by its cond/uncond ratio to the power s - 1, and that ratio can be large for a
      token of tiny conditional probability. The cut-off reads the conditional, not the guided,
      distribution, so among the tokens the conditional model finds plausible guidance still
      favours those the condition makes likelier.

    Order: guidance, the allowed tokens (when :meth:`probs` is given them), epsilon cut-off,
    temperature, top-k, top-p.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    guidance_scale: float = 1.0
    epsilon_cutoff: float = 0.0

    def __post_init__(self):
        check_sampling_args(self.temperature, self.top_k, self.top_p, self.guidance_scale, self.epsilon_cutoff)

    @property
    def uses_guidance(self) -> bool:
        return self.guidance_scale != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def model_rows_per_sample(self) -> int:
        """Model rows per sample: 2 under guidance (the batch is [cond; uncond]), else 1."""
        return 2 if self.uses_guidance else 1

    def model_batch(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row values (B, ...) -> the model's rows: under guidance the batch is [cond; uncond]
        (2B rows, row b and row B + b are one sample), so the values are repeated; else unchanged.
        The one place this layout is written (:meth:`guide` reads it back)."""
        return torch.cat([x, x]) if self.uses_guidance else x

    def model_rows(self, rows: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Row indices of a batch of ``batch_size`` -> the model's row indices (both halves under
        guidance, as :meth:`model_batch` lays them out)."""
        return torch.cat([rows, rows + batch_size]) if self.uses_guidance else rows

    def draw(self, probs: torch.Tensor, generator: Generator = None) -> torch.Tensor:
        """A token from each distribution of ``probs`` (..., V): the most probable when greedy,
        else a sample (:func:`sample`)."""
        return probs.argmax(-1) if self.greedy else sample(probs, generator)

    def guide(self, logits: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """Apply classifier-free guidance: rows [cond; uncond] (2B) -> B rows. ``scale`` (B, ..., 1),
        if given, replaces ``guidance_scale`` per row and position."""
        if not self.uses_guidance:
            return logits
        cond, uncond = logits.float().chunk(2, dim=0)
        return classifier_free(cond, uncond, self.guidance_scale if scale is None else scale)

    def probs(self, logits: torch.Tensor, allowed: torch.Tensor | None = None,
              guidance: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (2B or B, ..., V) -> probabilities (B, ..., V) in float32. ``allowed`` (B, ..., V)
        bool keeps only those tokens, right after guidance (the epsilon cut-off then reads the
        conditional logits with the same tokens kept); ``guidance`` (B, ..., 1) is the guidance
        scale per row and position, in place of ``guidance_scale``; see
        :mod:`visualspec.core.constraints` for both."""
        cond = logits.chunk(2, dim=0)[0] if self.uses_guidance else logits
        return self.guided_probs(self.guide(logits, guidance), cond, allowed)

    def paired_rows(self, batch_size: int, device=None) -> torch.Tensor:
        """For each model row of a batch of ``batch_size`` (:meth:`model_batch`'s layout), the row
        guidance pairs it with: under guidance, row b's unconditional row B + b (and back); else
        itself. :func:`guide_rows` reads it."""
        rows = torch.arange(batch_size, device=device)
        return torch.cat([rows + batch_size, rows]) if self.uses_guidance else rows

    def guided_probs(self, guided: torch.Tensor, cond: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`probs` after guidance: ``guided`` logits (B, ..., V) and the conditional logits
        ``cond`` (B, ..., V) the epsilon cut-off reads -> probabilities in float32."""
        guided = guided.float()
        if allowed is not None:
            guided = guided.masked_fill(~allowed, float("-inf"))
        if self.epsilon_cutoff > 0:
            if allowed is not None:
                cond = cond.float().masked_fill(~allowed, float("-inf"))
            guided = filter_epsilon(guided, cond, self.epsilon_cutoff)
        if self.greedy:
            return torch.nn.functional.one_hot(guided.argmax(-1), guided.shape[-1]).float()
        guided = filter_top_k_top_p(guided / self.temperature, self.top_k, self.top_p)
        return torch.softmax(guided, dim=-1)


def classifier_free(cond: torch.Tensor, uncond: torch.Tensor, scale) -> torch.Tensor:
    """Classifier-free guidance: ``uncond + scale * (cond - uncond)`` (``scale`` a number or a
    tensor that broadcasts)."""
    return uncond + scale * (cond - uncond)


def guide_rows(logits: torch.Tensor, partner: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance row by row (:func:`classifier_free`), in float32: every model row j
    guided against its partner row ``partner[j]`` (:meth:`SamplingConfig.paired_rows`). A
    conditional row gets :meth:`SamplingConfig.guide`'s value; its unconditional row gets a value
    nobody reads. Unlike ``guide``, it keeps every row, so a step that pads its rows to a fixed
    count (a compiled graph) can run it on the padded rows."""
    logits = logits.float()
    return classifier_free(logits, logits[partner], scale)


def step_probs(sampling: SamplingConfig, constraints: StepConstraints | None, logits: torch.Tensor,
               partner: torch.Tensor, *constrained) -> torch.Tensor:
    """:class:`StepSampler`'s distributions (R, L, V), as a function: the traced code of a compiled
    step calls this rather than building a sampler (torch 2.11's compiler fails on a frozen
    dataclass made inside the graph)."""
    allowed, scale = None, sampling.guidance_scale
    if constraints is not None:
        n, *tables = constrained
        positions = n[:, None] + torch.arange(logits.shape[1], device=n.device)
        allowed, scales = constraints.law(positions, *tables)
        scale = scale if scales is None else scales
    guided = guide_rows(logits, partner, scale) if sampling.uses_guidance else logits
    return sampling.guided_probs(guided, logits, allowed)


@dataclass(frozen=True)
class StepSampler:
    """What a token model's step does with its window's logits inside the step itself (compiled with
    it, where the step is compiled: one graph instead of a graph and a dozen small eager calls).

    Called as ``sampler(logits (R, L, V), partner (R,))`` over model rows, padded ones included
    (:meth:`SamplingConfig.paired_rows` pairs the rows for guidance), it returns each row's
    distributions, :meth:`SamplingConfig.probs`'s (R, L, V). The rows of a conditional model row
    are the sample's; the rest are junk for the caller to drop. The lossless rule runs after it in
    the same step (:class:`visualspec.core.verify.StepVerifier`). With ``constraints``
    (:class:`~visualspec.core.constraints.StepConstraints`) it also takes each model row's first
    position ``n`` (R,) (column j of the window is position n + j) and the constraints' tables
    (:meth:`~visualspec.core.constraints.TokenConstraints.tables`), and applies their allowed
    tokens and guidance scales as :meth:`SamplingConfig.probs` does. Frozen and hashable: equal
    samplers share a compiled graph."""

    sampling: SamplingConfig
    constraints: StepConstraints | None = None
    label = "sampling"  # what a compiling step says it compiles with

    def __call__(self, logits: torch.Tensor, partner: torch.Tensor, *constrained) -> torch.Tensor:
        return step_probs(self.sampling, self.constraints, logits, partner, *constrained)

    def constraint_args(self, model_rows: int, vocab_size: int, device=None) -> tuple:
        """Example arguments for the constraints (none without them): ``n`` and the tables."""
        if self.constraints is None:
            return ()
        return (torch.zeros(model_rows, dtype=torch.long, device=device),
                *self.constraints.example_tables(model_rows, vocab_size, device))

    def example_args(self, model_rows: int, window: int, vocab_size: int, device=None) -> tuple:
        """Arguments of the shapes and dtypes a step of ``model_rows`` rows and ``window`` tokens
        hands it (to compile its graph before decoding)."""
        return (torch.zeros(model_rows, dtype=torch.long, device=device),
                *self.constraint_args(model_rows, vocab_size, device))

    def padded(self, args: tuple, length: int, run: int) -> tuple:
        """``args`` of a window of ``length`` tokens for the step of a window of ``run`` >= ``length``
        (a model that runs its windows in buckets pads the window after its tokens): none of a
        sampler's arguments has the window's length."""
        return args

    def cropped(self, out: torch.Tensor, length: int) -> torch.Tensor:
        """The output of a padded step (:meth:`padded`) as a window of ``length`` tokens gives it:
        its first ``length`` distributions (a padding column's are no position's)."""
        return out[:, :length]


def check_sampling_args(temperature: float, top_k: int, top_p: float, guidance_scale: float,
                        epsilon_cutoff: float = 0.0) -> None:
    """Raise a ValueError naming the first bad sampling argument."""
    if temperature is None or temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
    check_int("top_k (0 disables it)", top_k, 0)
    if top_p is None or not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if guidance_scale is None or guidance_scale < 0:
        raise ValueError(f"guidance_scale must be >= 0, got {guidance_scale!r}")
    if epsilon_cutoff is None or not (0.0 <= epsilon_cutoff < 1.0):
        raise ValueError(f"epsilon_cutoff must be in [0, 1) (0 disables it), got {epsilon_cutoff!r}")


def filter_top_k_top_p(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf (any leading shape).

    The nucleus is the smallest prefix of tokens, sorted by probability, whose mass reaches
    ``top_p``; the most likely token is always kept.
    """
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def filter_epsilon(logits: torch.Tensor, reference_logits: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Set ``logits`` to -inf where ``softmax(reference_logits) < epsilon``, except at the
    reference's most likely token, which always stays (same shapes)."""
    reference = torch.softmax(reference_logits.float(), dim=-1)
    drop = reference < epsilon
    drop.scatter_(-1, reference.argmax(-1, keepdim=True), False)
    return logits.masked_fill(drop, float("-inf"))


# ----------------------------------------------------------------------------------------------
# Random draws with an explicit generator (one for the batch, or one per row)
# ----------------------------------------------------------------------------------------------


def row_generators(generator: Generator, rows) -> Generator:
    """The generators of rows ``rows`` (indices: a list or a tensor) when there is one per row,
    else the one shared generator (or None)."""
    if not isinstance(generator, (list, tuple)):
        return generator
    return [generator[i] for i in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]


def uniform(shape: Sequence[int], generator: Generator = None, device=None) -> torch.Tensor:
    """U[0, 1) draws of ``shape`` (float64); row b uses ``generator[b]`` when a list is given."""
    shape = tuple(shape)
    if isinstance(generator, (list, tuple)):
        if len(generator) != shape[0]:
            raise ValueError(f"got {len(generator)} generators for a batch of {shape[0]}")
        rows = [torch.rand(shape[1:], generator=g, device=g.device, dtype=torch.float64) for g in generator]
        out = torch.stack(rows)
    else:
        gen_device = generator.device if generator is not None else "cpu"
        out = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64)
    return to_device(out, device)


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """``x`` on ``device`` (None: where it is). From a CPU to a GPU through pinned memory, without
    waiting: a copy from ordinary memory waits for every kernel queued before it, once a step."""
    if device is None or x.device == torch.device(device):
        return x
    if x.device.type == "cpu" and torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def normal(shape: Sequence[int], generator: Generator = None, device=None, dtype=torch.float32) -> torch.Tensor:
    """Standard normal draws of ``shape``; row b uses ``generator[b]`` when a list is given. The
    draws are made on each generator's device and moved to ``device``."""
    shape = tuple(shape)
    if isinstance(generator, (list, tuple)):
        if len(generator) != shape[0]:
            raise ValueError(f"got {len(generator)} generators for a batch of {shape[0]}")
        out = torch.stack([torch.randn(shape[1:], generator=g, device=g.device, dtype=dtype) for g in generator])
    else:
        gen_device = generator.device if generator is not None else (device or "cpu")
        out = torch.randn(shape, generator=generator, device=gen_device, dtype=dtype)
    return to_device(out, device)


def sample(probs: torch.Tensor, generator: Generator = None) -> torch.Tensor:
    """One draw from each categorical distribution in ``probs`` (B, ..., V) -> (B, ...) long.

    Inverse-CDF sampling in float64 with one uniform per draw: it never returns a token of zero
    probability, works with per-row generators and is reproducible for a given generator state.
    """
    return inverse_cdf(probs, uniform(probs.shape[:-1], generator, device=probs.device))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each distribution of ``probs`` (B, ..., V) at quantile ``u`` (B, ...) in [0, 1):
    the first token whose cumulative probability (float64) exceeds ``u`` times the total. Monotone in
    ``u``, so rows given the same ``u`` under nearby distributions mostly draw the same token."""
    cdf = probs.double().cumsum(-1)
    target = (u.double() * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def make_generator(seed: int | None = None, generator: Generator = None, device="cpu") -> Generator:
    """The generator to use for a call: an explicit generator wins, else one seeded with ``seed``."""
    if generator is not None:
        return generator
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(seed))
