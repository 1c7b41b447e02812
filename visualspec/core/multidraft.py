"""Multi-draft verification at one position: k candidate tokens, one emitted token.

These are the rules a tree decoder applies at a node whose k children were drafted from one draft
distribution q. Every rule is a small pure function over batched tensors::

    rule(candidates, q, p, generator) -> MultiDraftVerdict

- ``candidates`` (B, k) long: the k drafted tokens of each row, in the order they were drawn.
- ``q`` (B, V): the draft distribution the candidates were drawn from.
- ``p`` (B, V): the target distribution at this position.
- ``generator``: the randomness (see :mod:`visualspec.core.sampling`).

The :class:`MultiDraftVerdict` gives per row the ``index`` of the accepted candidate (-1 when every
candidate was rejected) and the emitted ``token`` (the accepted candidate, else a residual sample).
Each rule is lossless for one way of drafting the candidates (and biased, in general, for the other):

- :func:`spectr_verify`: k i.i.d. draws from q (:func:`iid_drafts`);
- :func:`recursive_iid_verify`: k i.i.d. draws from q (:func:`iid_drafts`);
- :func:`rsd_verify`: k distinct draws without replacement, in draw order (:func:`gumbel_top_k`).

Internally a rule reduces to "stages": for each candidate i the probability ``a_i`` of accepting it
once the earlier candidates were rejected, plus the residual distribution emitted after k rejections.
:func:`acceptance_rate` and :func:`output_distribution` evaluate the same stages exactly over every
draft tuple of a small vocabulary, and :func:`optimal_acceptance` solves the linear program for the
best acceptance any lossless verifier can reach, so rules can be compared with the bound exactly.

Sources of the rules: SpecTr (Sun et al. 2023), recursive speculative decoding (RSD, Jeon et al.
2024), and Hu et al. 2025 for the optimal-acceptance program. The residual formulas are derived in
the docstrings below.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Union

import torch

from .checks import check_positive_int
from .sampling import Generator, sample, uniform
from .verify import leading_true, residual

PROB_ATOL = 1e-4  # how far a row of probabilities may sum from 1
MAX_DRAFT_TUPLES = 4096  # enumeration limit of the exact acceptance computations and the linear program
SCHEMES = ("iid", "without_replacement")


@dataclass
class DraftTree:
    """k draft chains of length L that share their root (the last committed token).

    ``tokens`` (B, k, L): chain j is ``tokens[:, j]``. The first tokens ``tokens[:, :, 0]`` were
    drawn from ``first_q`` (B, V) by ``scheme`` ("iid", "without_replacement", or "greedy" for
    deterministic candidates); token d >= 1 of chain j from ``chain_q[:, j, d - 1]`` (B, k, L - 1, V),
    or deterministically when ``chain_q`` is None.
    """

    tokens: torch.Tensor
    first_q: torch.Tensor | None
    chain_q: torch.Tensor | None
    scheme: str

    def layout(self):
        """The flattened tree ``[root, chain 0, chain 1, ...]``: depths (N,) and the ancestor mask
        (N, N) bool, where node i may attend to node j iff j is i or an ancestor of i."""
        _, k, L = self.tokens.shape
        device = self.tokens.device
        depths = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, L + 1).repeat(k)]).to(device)
        chain = torch.cat([torch.full((1,), -1), torch.arange(k).repeat_interleave(L)]).to(device)
        ancestors = (chain[None, :] == chain[:, None]) & (depths[None, :] <= depths[:, None])
        ancestors[:, 0] = True
        return depths, ancestors


@dataclass
class MultiDraftVerdict:
    index: torch.Tensor  # (B,) long in -1..k-1: the accepted candidate, -1 when all were rejected
    token: torch.Tensor  # (B,) long: the emitted token


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def _check_k(k) -> int:
    return int(check_positive_int("k (candidates per row)", k))


def _check_probs(name: str, x: torch.Tensor, ndim: int = 2) -> torch.Tensor:
    """Validate a batch of distributions and return it in float64, renormalised exactly."""
    x = torch.as_tensor(x)
    if x.ndim != ndim:
        want = "(B, V)" if ndim == 2 else "(V,)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary")
    x = x.double()
    if not torch.isfinite(x).all() or (x < 0).any():
        raise ValueError(f"{name} must be finite and non-negative")
    sums = x.sum(-1)
    bad = (sums - 1).abs() > PROB_ATOL
    if bad.any():
        raise ValueError(f"{name} rows must sum to 1 (within {PROB_ATOL}); got a row summing to "
                         f"{sums[bad].flatten()[0].item():.6g}")
    return x / sums.unsqueeze(-1)


def _check_pair(q, p, ndim: int = 2):
    q, p = _check_probs("q", q, ndim), _check_probs("p", p, ndim)
    if q.shape != p.shape:
        raise ValueError(f"q and p must have the same shape, got {tuple(q.shape)} and {tuple(p.shape)}")
    return q, p


def _check_candidates(candidates: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    if candidates.ndim != 2:
        raise ValueError(f"candidates must have shape (B, k), got {tuple(candidates.shape)}")
    if candidates.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"candidates must be integer token ids, got {candidates.dtype}")
    if candidates.shape[0] != q.shape[0]:
        raise ValueError(f"candidates have {candidates.shape[0]} rows but q and p have {q.shape[0]}")
    _check_k(candidates.shape[1])
    if candidates.numel() and (candidates.min() < 0 or candidates.max() >= q.shape[1]):
        raise ValueError(f"candidate tokens must lie in 0..{q.shape[1] - 1}")
    return candidates.long()


def _check_distinct(candidates: torch.Tensor, counts: torch.Tensor | None = None) -> None:
    same = candidates.unsqueeze(2) == candidates.unsqueeze(1)
    if counts is not None:  # only the first counts[b] of row b were drawn
        real = torch.arange(candidates.shape[1], device=candidates.device) < counts[:, None]
        same &= real[:, :, None] & real[:, None, :]
        same |= torch.eye(candidates.shape[1], dtype=torch.bool, device=candidates.device)
    if (same.sum((1, 2)) > candidates.shape[1]).any():
        raise ValueError("rsd_verify needs distinct candidates per row (drafts without replacement, e.g. "
                         "gumbel_top_k); use spectr_verify or recursive_iid_verify for i.i.d. drafts")


# ----------------------------------------------------------------------------------------------
# Drafting k candidates from q
# ----------------------------------------------------------------------------------------------


def gumbel_top_k(logq: torch.Tensor, k: int, generator: Generator = None) -> torch.Tensor:
    """k distinct tokens per row, drawn from q = softmax(logq) without replacement. (B, V) -> (B, k),
    or (B, ..., V) -> (B, ..., k): several laws per row b, all drawn with row b's generator.

    Gumbel-top-k: perturb every log-probability with independent Gumbel noise
    ``g = -log(-log u)``, ``u ~ U(0, 1)``, and keep the k largest keys ``logq + g`` in decreasing
    order. The ordered result has the law of sequential sampling without replacement: the first
    token ~ q, the second ~ q with the first removed and renormalised, and so on (the Gumbel-max
    trick applied to each remaining set). ``logq`` need not be normalised; -inf marks impossible
    tokens. When q has fewer than k possible tokens the trailing candidates are impossible tokens
    (in no particular order); every rule here rejects them.
    """
    k = _check_k(k)
    if logq.ndim < 2:
        raise ValueError(f"logq must have shape (B, V) or (B, ..., V), got {tuple(logq.shape)}")
    if k > logq.shape[-1]:
        raise ValueError(f"cannot draw k={k} distinct tokens from a vocabulary of {logq.shape[-1]}")
    logq = logq.double()
    if torch.isnan(logq).any() or (logq == float("inf")).any():
        raise ValueError("logq must not contain NaN or +inf")
    if (logq == float("-inf")).all(-1).any():
        raise ValueError("every row of logq needs at least one possible token")
    keys = logq + gumbel_noise(logq.shape, generator, logq.device)
    return keys.topk(k, dim=-1).indices


def gumbel_noise(shape, generator: Generator = None, device=None) -> torch.Tensor:
    """Standard Gumbel draws ``-log(-log u)``, u ~ U(0, 1), in float64 (row b from generator b)."""
    u = uniform(shape, generator, device=device).clamp_(min=torch.finfo(torch.float64).tiny)
    return -torch.log(-torch.log(u))


def iid_drafts(q: torch.Tensor, k: int, generator: Generator = None) -> torch.Tensor:
    """k independent draws from q per row, with replacement. (B, V) -> (B, k)."""
    k = _check_k(k)
    q = _check_probs("q", q)
    return sample(q.unsqueeze(1).expand(q.shape[0], k, q.shape[1]), generator)


# ----------------------------------------------------------------------------------------------
# The rules as stages: acceptance probability of each candidate, residual after k rejections
# ----------------------------------------------------------------------------------------------


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """min(1, num / den), and 0 where den == 0 (a token the proposal could not have drawn)."""
    safe = den.clamp(min=torch.finfo(den.dtype).tiny)
    return torch.where(den > 0, (num / safe).clamp(max=1.0), torch.zeros_like(num))


def spectr_rho(q: torch.Tensor, p: torch.Tensor, k: int, iters: int = 52) -> torch.Tensor:
    """SpecTr's ρ* per row (B,): the smallest ρ in [1, k] with ``1 - (1 - β(ρ))^k <= ρ β(ρ)``.

    ``β(ρ) = Σ_x min(q(x), p(x)/ρ)``. With ``f(ρ) = Σ_x min(ρ q(x), p(x)) - 1 + (1 - β(ρ))^k``,
    f is non-decreasing in ρ (both terms are), ``f(1) = α - 1 + (1 - α)^k <= 0`` with
    ``α = Σ min(p, q)``, and ``f(k) >= 0`` by Bernoulli's inequality ``(1 - β)^k >= 1 - kβ``; so
    bisection on [1, k] finds the root. The notes (§5 SpecTr) give this equation for ρ*; we solve it
    numerically. The returned value is the upper end of the final bracket, which is always feasible
    (f >= 0), at most ``(k - 1) 2^-iters`` above ρ*. ρ = 1 exactly when f(1) >= 0 (k = 1, or p = q).
    """
    k = _check_k(k)
    q, p = _check_pair(q, p)

    def f(rho):  # uses Σ min(ρq, p) = ρ β(ρ)
        beta = torch.minimum(q, p / rho.unsqueeze(-1)).sum(-1)
        return rho * beta - 1 + (1 - beta).clamp(min=0) ** k

    one = torch.ones(q.shape[0], dtype=torch.float64, device=q.device)
    lo, hi = one.clone(), torch.full_like(one, float(k))
    hi = torch.where(f(one) >= 0, one, hi)
    for _ in range(iters if k > 1 else 0):
        mid = (lo + hi) / 2
        ok = f(mid) >= 0
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    return hi


def _spectr_stages(candidates, q, p):
    k = candidates.shape[1]
    rho = spectr_rho(q, p, k).unsqueeze(-1)  # (B, 1)
    accept = _ratio(p.gather(1, candidates), rho * q.gather(1, candidates))
    m = torch.minimum(q, p / rho)  # m(x) = P(draw x and accept it) at one step
    beta = m.sum(-1, keepdim=True)
    c = sum((1 - beta) ** i for i in range(k))  # (1 - (1 - β)^k) / β, stable at β -> 0
    return accept, residual(p, c * m)


def _recursive_stages(candidates, q, p, without_replacement: bool, counts=None):
    B, k = candidates.shape
    accept = torch.empty(B, k, dtype=torch.float64, device=q.device)
    p_i, q_i, remaining = p, q, q
    for i in range(k):
        x = candidates[:, i:i + 1]
        accept[:, i] = _ratio(p_i.gather(1, x), q_i.gather(1, x))[:, 0]
        if counts is None:
            p_i = residual(p_i, q_i)
        else:  # a row's candidates past its count were never drawn: rejected, and p passes on unchanged
            real = (i < counts)[:, None]
            accept[:, i] = torch.where(real[:, 0], accept[:, i], torch.zeros_like(accept[:, i]))
            p_i = torch.where(real, residual(p_i, q_i), p_i)
        if without_replacement:
            remaining = remaining.scatter(1, x, 0.0)
            mass = remaining.sum(-1, keepdim=True)
            q_i = torch.where(mass > 0, remaining / mass.clamp(min=1e-300), torch.zeros_like(remaining))
    return accept, p_i


def _rsd_stages(candidates, q, p, counts=None):
    return _recursive_stages(candidates, q, p, without_replacement=True, counts=counts)


def _recursive_iid_stages(candidates, q, p):
    return _recursive_stages(candidates, q, p, without_replacement=False)


def _decide(candidates, accept, residual, generator) -> MultiDraftVerdict:
    """Accept candidate i with probability accept[:, i] once 0..i-1 were rejected; the first
    acceptance wins; after k rejections emit a sample of ``residual``."""
    k = candidates.shape[1]
    u = uniform(candidates.shape, generator, device=candidates.device)
    first = leading_true(u >= accept)  # leading rejections = index of the first acceptance
    fallback = sample(residual, generator)
    hit = first < k
    index = torch.where(hit, first, torch.full_like(first, -1))
    picked = candidates.gather(1, first.clamp(max=k - 1).unsqueeze(1)).squeeze(1)
    return MultiDraftVerdict(index, torch.where(hit, picked, fallback))


# ----------------------------------------------------------------------------------------------
# Public rules
# ----------------------------------------------------------------------------------------------


def spectr_verify(candidates, q, p, generator: Generator = None) -> MultiDraftVerdict:
    """SpecTr's k-sequential selection (K-SEQ; Sun et al. 2023) for k i.i.d. drafts from q. Lossless.

    For i = 1..k accept X_i with probability ``min(1, p(X_i) / (ρ q(X_i)))``, ρ = :func:`spectr_rho`;
    the first acceptance is emitted; if all k are rejected emit a sample of
    ``r = norm((p - c m_ρ)_+)``, which at ρ = ρ* equals ``norm((p - ρ* q)_+)``. (Rule and ρ*
    equation: reference notes §5 SpecTr; the residual is derived here.)

    Derivation. One step draws x and accepts it with probability ``m_ρ(x) = q(x) min(1, p/(ρq))
    = min(q(x), p(x)/ρ)``; let ``β = Σ m_ρ``. The steps are independent, so
    P(first acceptance at step i, token x) = ``(1 - β)^(i-1) m_ρ(x)``; summed over i, the accepted
    token is x with probability ``c m_ρ(x)``, ``c = Σ_{i<k} (1 - β)^i = (1 - (1 - β)^k) / β``, and all
    are rejected with probability ``(1 - β)^k``. The output is p iff
    ``c m_ρ(x) + (1 - β)^k r(x) = p(x)``, i.e. ``r = (p - c m_ρ) / (1 - β)^k``. It sums to 1 by
    construction (Σ c m_ρ = 1 - (1 - β)^k) and is non-negative when ``c <= ρ`` (as m_ρ <= p/ρ), i.e.
    ``1 - (1 - β)^k <= ρ β = Σ min(ρq, p)``. Acceptance ``1 - (1 - β)^k`` falls as ρ grows, so the
    best ρ is the smallest feasible one, ρ*, where the two sides are equal; then ``c = ρ*`` and
    ``c m_ρ* = min(ρ* q, p)``, giving ``r ∝ (p - ρ* q)_+``. We use the general form of r at the ρ
    returned by the bisection (feasible by construction), so the output is exactly p whatever the
    bisection tolerance. k = 1 gives ρ = 1: standard speculative sampling.
    """
    q, p = _check_pair(q, p)
    candidates = _check_candidates(candidates, q)
    return _decide(candidates, *_spectr_stages(candidates, q, p), generator)


def rsd_verify(candidates, q, p, generator: Generator = None, counts=None) -> MultiDraftVerdict:
    """Recursive rejection sampling for drafts without replacement (RSD; Jeon et al. 2024). Lossless.

    With ``p_1 = p``, ``q_1 = q``: accept x_i with probability ``min(1, p_i(x_i) / q_i(x_i))``; on
    rejection set ``p_{i+1} = norm((p_i - q_i)_+)`` and ``q_{i+1}`` = q with x_1..x_i zeroed and
    renormalised (the law of the next draft without replacement); after k rejections emit a sample
    of ``p_{k+1}``. (Rule: reference notes §5 RSD, marked unverified there; exactness is proved here.)

    Proof (induction on the stages left). Given the history x_1..x_{i-1}, x_i ~ q_i. Claim: the
    stages from i on emit p_i. After k rejections we emit p_{k+1}. At stage i, P(emit x at this
    stage) = ``q_i(x) min(1, p_i/q_i) = min(p_i, q_i)(x)`` and P(reject) = ``1 - Σ min(p_i, q_i)``.
    After a rejection the later stages emit p_{i+1} by induction, whatever x_i was, because p_{i+1}
    depends on q_i (history up to i-1) but not on x_i. Total: ``min(p_i, q_i) + (p_i - q_i)_+ = p_i``.
    The candidates must be distinct and in draft order (e.g. :func:`gumbel_top_k`); a candidate with
    q_i = 0 (possible only when q has fewer than k possible tokens) is rejected and passes p_i on.
    ``counts`` (B,) long, optional: row b drew only its first ``counts[b]`` candidates (the rest
    are padding); those are verified as above and p_{counts[b]+1} is emitted after them (a row with
    none emits a sample of p). The count must be fixed before the candidates are drawn, by nothing
    they depend on, or the first ones' law is no longer q.
    """
    q, p = _check_pair(q, p)
    candidates = _check_candidates(candidates, q)
    _check_distinct(candidates, counts)
    return _decide(candidates, *_rsd_stages(candidates, q, p, counts), generator)


def recursive_iid_verify(candidates, q, p, generator: Generator = None) -> MultiDraftVerdict:
    """Recursive rejection sampling for k i.i.d. drafts from q. Lossless.

    As :func:`rsd_verify` but every draft has law q, so ``q_i = q`` is never updated: accept x_i
    with ``min(1, p_i(x_i) / q(x_i))``, on rejection ``p_{i+1} = norm((p_i - q)_+)``, after k
    rejections emit p_{k+1}. This is the point-mass sibling recursion of the notes (§5) with a
    stochastic q, and the "RRS with replacement" that Hu et al. compare with the bound. The proof of
    :func:`rsd_verify` applies unchanged (each x_i ~ q independently of the history). It is NOT
    lossless for drafts without replacement, nor is :func:`rsd_verify` for i.i.d. drafts.
    """
    q, p = _check_pair(q, p)
    candidates = _check_candidates(candidates, q)
    return _decide(candidates, *_recursive_iid_stages(candidates, q, p), generator)


def greedy_multidraft_verify(candidates, q, p, generator: Generator = None, counts=None) -> MultiDraftVerdict:
    """Greedy verification of k candidates. Lossless for greedy decoding.

    The emitted token is ``argmax p``; the accepted candidate is the first one equal to it (-1 when
    none is). ``q`` and ``generator`` are ignored: nothing is random. ``counts`` (B,): only the
    first ``counts[b]`` candidates of row b are real.
    """
    best = p.argmax(-1)
    match = candidates == best[:, None]
    if counts is not None:
        match &= torch.arange(candidates.shape[1], device=candidates.device) < counts[:, None]
    index = torch.where(match.any(-1), match.long().argmax(-1), torch.full_like(best, -1))
    return MultiDraftVerdict(index, best)


# ----------------------------------------------------------------------------------------------
# Exact evaluation on a small vocabulary
# ----------------------------------------------------------------------------------------------

Rule = Union[str, Callable]
_RULES = {"spectr": (_spectr_stages, "iid"), "rsd": (_rsd_stages, "without_replacement"),
          "recursive_iid": (_recursive_iid_stages, "iid")}
_BY_FUNCTION = {spectr_verify: "spectr", rsd_verify: "rsd", recursive_iid_verify: "recursive_iid"}


def _resolve_rule(rule: Rule, scheme):
    name = _BY_FUNCTION.get(rule, rule)
    if name not in _RULES:
        raise ValueError(f"unknown rule {rule!r}; use one of {sorted(_RULES)} or the matching *_verify function")
    stages, natural = _RULES[name]
    scheme = natural if scheme is None else scheme
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    return stages, scheme


def enumerate_drafts(q, k: int, scheme: str = "iid"):
    """Every ordered draft tuple of positive probability: ``(tuples (M, k) long, probs (M,) float64)``.

    ``"iid"``: ``P(x_1..x_k) = Π q(x_i)``. ``"without_replacement"`` (sequential draws, the law of
    :func:`gumbel_top_k`): ``P = Π_i q(x_i) / (1 - Σ_{j<i} q(x_j))``; needs k <= #{x : q(x) > 0}.
    Raises ValueError beyond :data:`MAX_DRAFT_TUPLES` tuples.
    """
    k = _check_k(k)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    q = _check_probs("q", q, ndim=1)
    support = [int(x) for x in torch.nonzero(q > 0).flatten()]
    n = len(support)
    if scheme == "iid":
        count = n ** k
    else:
        if k > n:
            raise ValueError(f"k={k} distinct drafts need at least k tokens with q > 0; q has {n}")
        count = math.perm(n, k)
    if count > MAX_DRAFT_TUPLES:
        raise ValueError(f"too large to enumerate exactly: {count} draft tuples (support {n}, k={k}); "
                         f"the limit is {MAX_DRAFT_TUPLES} (e.g. V <= 8 with k <= 4)")
    tuples = list(itertools.product(support, repeat=k) if scheme == "iid" else itertools.permutations(support, k))
    t = torch.tensor(tuples, dtype=torch.long).reshape(-1, k)
    qt = q[t]  # (M, k)
    if scheme == "iid":
        probs = qt.prod(-1)
    else:
        before = torch.cat([torch.zeros_like(qt[:, :1]), qt.cumsum(-1)[:, :-1]], -1)
        probs = (qt / (1 - before)).prod(-1)
    return t, probs


def _exact(rule: Rule, p, q, k: int, scheme):
    """Per draft tuple: its probability (M,), the law of the emitted token (M, V) and P(accept) (M,)."""
    stages, scheme = _resolve_rule(rule, scheme)
    q, p = _check_pair(q, p, ndim=1)
    tuples, probs = enumerate_drafts(q, k, scheme)
    M, V = tuples.shape[0], q.shape[0]
    accept, residual = stages(tuples, q.expand(M, V), p.expand(M, V))
    reach = torch.cumprod(torch.cat([torch.ones_like(accept[:, :1]), 1 - accept], -1), -1)  # (M, k+1)
    law = (reach[:, -1:] * residual).scatter_add(1, tuples, reach[:, :-1] * accept)
    return probs, law, 1 - reach[:, -1]


def acceptance_rate(rule: Rule, p, q, k: int, scheme: str | None = None) -> float:
    """Exact probability that ``rule`` emits one of the k drafts, by enumerating every draft tuple.

    ``rule`` is ``"spectr"``, ``"rsd"``, ``"recursive_iid"`` or the matching ``*_verify`` function;
    ``scheme`` defaults to the drafting the rule is lossless for (``"iid"`` for spectr and
    recursive_iid, ``"without_replacement"`` for rsd). ``p``, ``q`` are (V,) distributions. Given the
    drafts, P(accept) = ``1 - Π_i (1 - a_i)`` with a_i the rule's acceptance probability at stage i;
    no sampling.
    """
    probs, _, accepted = _exact(rule, p, q, k, scheme)
    return float((probs * accepted).sum())


def output_distribution(rule: Rule, p, q, k: int, scheme: str | None = None) -> torch.Tensor:
    """Exact law (V,) float64 of the token ``rule`` emits when the k drafts follow ``scheme``.

    Equals p for a lossless rule/scheme pair (up to rounding); see :func:`acceptance_rate` for the
    arguments.
    """
    probs, law, _ = _exact(rule, p, q, k, scheme)
    return (probs.unsqueeze(-1) * law).sum(0)


def optimal_acceptance(p, q, k: int, scheme: str = "iid") -> float:
    """The largest P(emitted token is one of the drafts) over all verifiers whose output has law p.

    A verifier is a coupling π(S, y) of the drafts and the output y with marginals Q (the law of the
    drafts) and p. Only the set S of distinct drafted tokens matters for "y is a draft", so the
    program is over sets: maximise ``Σ_{S, y ∈ S} π(S, y)`` subject to ``Σ_{y ∈ S} π(S, y) <= Q(S)``,
    ``Σ_{S ∋ y} π(S, y) <= p(y)``, π >= 0. (Any such partial coupling completes to a full one by
    pairing the leftover masses, which are equal on both sides, arbitrarily.) This is the optimal
    transport program of SpecTr / Hu et al. (notes §5); its dual is
    ``min_A [p(A) + 1 - Q(all drafts in A)]``. Solved with ``scipy.optimize.linprog`` (HiGHS).
    Small problems only: at most :data:`MAX_DRAFT_TUPLES` ordered draft tuples, else ValueError.
    """
    from scipy.optimize import linprog
    from scipy.sparse import lil_matrix

    q, p = _check_pair(q, p, ndim=1)
    tuples, probs = enumerate_drafts(q, k, scheme)
    mass: dict[tuple[int, ...], float] = {}
    for t, w in zip(tuples.tolist(), probs.tolist()):
        key = tuple(sorted(set(t)))
        mass[key] = mass.get(key, 0.0) + w
    sets = list(mass)
    cells = [(s, y) for s, members in enumerate(sets) for y in members]
    V = p.shape[0]
    A = lil_matrix((len(sets) + V, len(cells)))
    for j, (s, y) in enumerate(cells):
        A[s, j] = 1.0
        A[len(sets) + y, j] = 1.0
    b = [mass[s] for s in sets] + p.tolist()
    res = linprog(c=[-1.0] * len(cells), A_ub=A.tocsr(), b_ub=b, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"linear program failed: {res.message}")
    return float(-res.fun)
