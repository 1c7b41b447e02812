"""A statistical harness that proves a decoding mode lossless, or catches it when it is not.

On a tiny model with a small vocabulary V and a few tokens N, the target's exact distribution over
all V**N sequences is computed by enumeration. A decoding mode then generates many sequences, and
Pearson's chi-square statistic between the observed and the expected counts is compared with the
chi-square quantile for a false-alarm probability ``alpha``. Cells with small expected counts are
pooled so that every tested cell expects at least ``min_expected`` samples (the usual validity
condition for the chi-square approximation). A rule that changes the sequence distribution by a
few percent fails with overwhelming probability at the sample sizes used in the tests.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .constraints import TokenConstraints
from .engine import TokenModel, decode
from .sampling import SamplingConfig


@torch.no_grad()
def exact_sequence_distribution(model: TokenModel, make_prefix: Callable[[int], Any], num_tokens: int,
                                sampling: SamplingConfig, constraints: TokenConstraints | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """All V**N sequences (M, N) and their probabilities (M,) under ``sampling``.

    ``make_prefix(rows)`` returns the model prefix for ``rows`` copies of one condition (already
    doubled as [cond; uncond] when ``sampling`` uses guidance). With ``constraints`` only the
    sequences they allow are listed (forced positions hold their token, the others run over the
    allowed tokens), with the constrained law and the constraints' guidance scales, if any.
    """
    V = model.vocab_size
    if constraints is None:
        choices = [range(V)] * num_tokens
    else:
        free = (constraints.allowed.nonzero()[:, 0].tolist() if constraints.allowed is not None else range(V))
        choices = [[t] if t >= 0 else free for t in constraints.forced.tolist()]
    seqs = torch.tensor(list(itertools.product(*choices)), dtype=torch.long)
    M = seqs.shape[0]
    positions = torch.arange(num_tokens).expand(M, num_tokens)
    allowed = scales = None
    if constraints is not None:
        allowed, scales = constraints.allowed_mask(positions, V), constraints.guidance_at(positions)

    def at(x, i):  # the positions i of a per-position tensor that may be None
        return None if x is None else x[:, i]

    first = sampling.probs(model.prefill(make_prefix(M), num_tokens), at(allowed, 0), at(scales, 0))
    logp = first.gather(1, seqs[:, :1]).log().squeeze(1)
    if num_tokens > 1:
        rest = sampling.probs(model.forward_window(sampling.model_batch(seqs[:, :-1]), 0),
                              at(allowed, slice(1, None)), at(scales, slice(1, None)))  # (M, N-1, V)
        logp = logp + rest.gather(2, seqs[:, 1:, None]).log().squeeze(2).sum(1)
    return seqs, logp.exp()


@dataclass
class FitResult:
    chi2: float
    threshold: float
    dof: int
    samples: int
    impossible: int = 0  # samples of sequences the exact law gives probability 0

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.chi2 <= self.threshold


def chi_square_fit(samples: torch.Tensor, seqs: torch.Tensor, probs: torch.Tensor, alpha: float = 1e-6,
                   min_expected: float = 5.0) -> FitResult:
    """Pearson's chi-square test of sampled sequences (n, N) against exact probabilities.

    A sample of a sequence of probability 0 (cut by top-k, top-p or the epsilon cut-off), or of one
    ``seqs`` does not list (outside what constraints allow), fails the fit outright, however few
    there are: pooling it with the small cells could hide it."""
    from scipy.stats import chi2 as chi2_dist

    V = max(int(seqs.max()), int(samples.max())) + 1
    weights = V ** torch.arange(seqs.shape[1] - 1, -1, -1)
    index = {int(code): i for i, code in enumerate((seqs * weights).sum(1))}
    observed = torch.zeros(len(probs), dtype=torch.float64)
    unlisted = 0
    for code in (samples * weights).sum(1).tolist():
        if code in index:
            observed[index[code]] += 1
        else:
            unlisted += 1
    n = samples.shape[0]
    expected = probs.double() * n
    big = expected >= min_expected
    obs = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    if exp[-1] < min_expected:  # pooled remainder too small to test on its own: fold it in
        obs, exp = obs[:-1], exp[:-1]
        obs[exp.argmin()] += observed[~big].sum()
        exp[exp.argmin()] += expected[~big].sum()
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(exp) - 1
    impossible = int(observed[probs == 0].sum()) + unlisted
    return FitResult(stat, float(chi2_dist.isf(alpha, dof)), dof, n, impossible)


def sample_sequences(model: TokenModel, make_prefix, num_tokens: int, sampling: SamplingConfig, n: int,
                     seed: int = 0, batch: int = 4096, **decode_kwargs) -> torch.Tensor:
    """n sequences (n, N) from :func:`visualspec.core.engine.decode` (or ``decode_fn``, e.g. a
    :func:`functools.partial` of :func:`visualspec.core.tree.decode_tree`), in batches of ``batch`` rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, n, batch):
        rows = min(batch, n - start)
        drafter = decode_kwargs.get("drafter_factory", lambda r: None)(rows)
        kwargs = {k: v for k, v in decode_kwargs.items() if k not in ("drafter_factory", "decode_fn")}
        tokens, _ = decode_kwargs.get("decode_fn", decode)(model, make_prefix(rows), num_tokens, sampling, drafter=drafter, generator=g, **kwargs)
        out.append(tokens.cpu())
    return torch.cat(out)
