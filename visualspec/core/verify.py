"""Verification rules: which draft tokens a target accepts, and what it emits where it stops.

Every rule is a small pure function over batched tensors with the same signature::

    rule(draft_tokens, draft_probs, target_probs, generator) -> Verdict

- ``draft_tokens`` (B, K) long: the K drafted tokens of each row.
- ``draft_probs`` (B, K, V) or ``None``: the distribution q each draft token was sampled from.
  ``None`` means every draft is deterministic (a point mass on the drafted token); a point mass can
  also be given per position as a one-hot row (see :func:`point_mass`).
- ``target_probs`` (B, K + 1, V): the target distribution p at each draft position given the
  prefix and the earlier drafts, plus one more row for the bonus position after the last draft.
- ``generator``: the randomness (see :mod:`visualspec.core.sampling`).

The :class:`Verdict` gives, per row, how many drafts were accepted (``a``, 0..K) and the token to
emit at position ``a`` (the residual sample after a rejection, or the bonus token from
``target_probs[:, K]`` when all K were accepted). A decode step therefore commits ``a + 1`` tokens.

Lossless rules (:func:`speculative_verify`, :func:`greedy_verify`) emit sequences with exactly the
target's distribution; :func:`lantern_verify` is lossy with a per-step total-variation budget, and
:func:`typical_verify` (Medusa's typical acceptance) and :func:`judge_verify` (a learned judge) are
lossy without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .checks import check_int, check_probability
from .constraints import StepConstraints
from .sampling import Generator, SamplingConfig, StepSampler, inverse_cdf, step_probs, uniform


@dataclass
class Verdict:
    num_accepted: torch.Tensor  # (B,) long, in 0..K
    next_tokens: torch.Tensor  # (B,) long, the token at position num_accepted
    judged: torch.Tensor | None = None  # (B, K) bool: accepted drafts only a judge accepted (judge_verify)


Rule = Callable[..., Verdict]  # rule(draft_tokens, draft_probs, target_probs, generator) -> Verdict


def point_mass(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One-hot distributions (…, V) for deterministic draft tokens (…)."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def _draft_prob_of_token(draft_tokens, draft_probs):
    if draft_probs is None:
        return torch.ones(draft_tokens.shape, dtype=torch.float32, device=draft_tokens.device)
    return draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)


def leading_true(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading True values per row of a (B, K) bool tensor."""
    return accept.long().cumprod(dim=-1).sum(dim=-1)


def _row_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[b, index[b]] for x of shape (B, K, ...)."""
    return x[torch.arange(x.shape[0], device=x.device), index]


def _emit(num_accepted, stop_dist, target_probs, u_emit) -> Verdict:
    """The token at position ``num_accepted``, at quantile ``u_emit`` (B,): from ``stop_dist``
    (B, V) after a rejection, from the bonus row ``target_probs[:, K]`` when every draft was
    accepted."""
    K = target_probs.shape[1] - 1
    all_accepted = (num_accepted == K).unsqueeze(-1)
    dist = torch.where(all_accepted, target_probs[:, K], stop_dist)
    return Verdict(num_accepted, inverse_cdf(dist, u_emit))


def rule_uniforms(rows: int, k: int, generator: Generator = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The uniforms a step of the speculative rule draws for ``k`` drafts in each of ``rows`` rows,
    in its order: one per draft (the acceptance tests, (rows, k); None when k = 0), then one per
    row for the emitted token (rows,). Drawn up front, the rule can run where no generator reaches
    (inside a compiled step, :class:`StepVerifier`) and still give the tokens it gives drawing them
    itself."""
    u = uniform((rows, k), generator, device=device) if k else None
    return u, uniform((rows,), generator, device=device)


def _uniforms_for(draft_tokens: torch.Tensor, generator: Generator = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rule_uniforms` for ``draft_tokens`` (B, K), on their device."""
    return rule_uniforms(*draft_tokens.shape[:2], generator, draft_tokens.device)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); falls back to p where the residual has no mass (then p == q, and a
    rejection had probability zero)."""
    r = (p - q).clamp_(min=0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp(min=1e-30), p)



def speculative_verify(draft_tokens, draft_probs, target_probs, generator: Generator = None) -> Verdict:
    """Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023). Lossless.

    For each draft x_i ~ q_i in order, accept with probability ``min(1, p_i(x_i) / q_i(x_i))``.
    At the first rejection emit a sample from ``norm(max(p_i - q_i, 0))`` and stop; when all K are
    accepted emit a bonus token from ``p_K``. The emitted token at every position then has law p_i.

    Deterministic drafts (argmax, n-gram, fresh Jacobi initialisations) are point masses q = δ_x:
    accept with probability ``p(x)``, else sample from p with x removed.

    SJD's probabilistic Jacobi criterion is exactly this rule with q_i the previous Jacobi
    iteration's distribution at that position (see :class:`visualspec.drafters.JacobiDrafter`).
    """
    return speculative_verdict(draft_tokens, draft_probs, target_probs, *_uniforms_for(draft_tokens, generator))


def speculative_verdict(draft_tokens, draft_probs, target_probs, u, u_emit) -> Verdict:
    """:func:`speculative_verify` at the uniforms it would draw (:func:`rule_uniforms`): ``u``
    (B, K) for the acceptance tests (None when K = 0), ``u_emit`` (B,) for the emitted token. A
    pure function of its tensors (what a compiled step runs)."""
    if draft_tokens.shape[1] == 0:
        none = torch.zeros(target_probs.shape[0], dtype=torch.long, device=target_probs.device)
        return _emit(none, target_probs[:, 0], target_probs, u_emit)
    p_x = target_probs[:, :-1].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    return _verify_against(draft_tokens, draft_probs, target_probs, u, u_emit, p_x,
                           lambda stop, x_stop: _row_at(target_probs, stop))


def _autoregressive_step(target_probs, generator) -> Verdict:
    """No drafts: emit one token from p_0."""
    no_drafts = target_probs.new_empty(target_probs.shape[0], 0, dtype=torch.long)
    return speculative_verdict(no_drafts, None, target_probs, *_uniforms_for(no_drafts, generator))


def _verify_against(draft_tokens, draft_probs, target_probs, u, u_emit, target_mass, stop_target,
                    also=None) -> Verdict:
    """Speculative sampling against a target given by its mass at each draft token (B, K) and
    ``stop_target(stop, x_stop)``, its distribution (B, V) at the stop row, at the uniforms ``u``
    (B, K) and ``u_emit`` (B,) (:func:`rule_uniforms`): accept x_i with ``min(1, target_mass_i /
    q_i(x_i))`` (or where ``also`` (B, K) bool is set); at the first rejection sample from
    ``norm(max(target - q, 0))``; after K acceptances a bonus token from ``target_probs[:, K]``."""
    K = draft_tokens.shape[1]
    q_x = _draft_prob_of_token(draft_tokens, draft_probs)
    accept = (q_x > 0) & (u * q_x.double() < target_mass.double())
    exact = accept
    if also is not None:
        accept = accept | also
    a = leading_true(accept)
    stop = a.clamp(max=K - 1)
    x_stop = _row_at(draft_tokens, stop)
    q_stop = point_mass(x_stop, target_probs.shape[-1]) if draft_probs is None else _row_at(draft_probs, stop)
    verdict = _emit(a, residual(stop_target(stop, x_stop), q_stop), target_probs, u_emit)
    if also is not None:
        verdict.judged = (torch.arange(K, device=a.device) < a.unsqueeze(-1)) & ~exact
    return verdict


def greedy_verify(draft_tokens, draft_probs, target_probs, generator: Generator = None) -> Verdict:
    """Greedy (argmax) verification. Lossless for greedy decoding.

    Accept draft x_i while ``x_i == argmax p_i``; emit ``argmax p_a`` at the first mismatch (or the
    bonus ``argmax p_K``). ``draft_probs`` and ``generator`` are ignored: nothing is random.
    """
    K = draft_tokens.shape[1]
    best = target_probs.argmax(-1)  # (B, K+1)
    a = leading_true(draft_tokens == best[:, :K])
    return Verdict(a, _row_at(best, a))


def default_rule(sampling: SamplingConfig) -> Rule:
    """The lossless rule for ``sampling``: argmax matching when greedy, else speculative sampling."""
    return greedy_verify if sampling.greedy else speculative_verify


def step_verdict(sampling: SamplingConfig, constraints: StepConstraints | None, logits, partner, drafts=None,
                 draft_probs=None, u=None, u_emit=None, *constrained):
    """:class:`StepVerifier`'s ``(probs, num_accepted, next_tokens)``, as a function: the traced code
    of a compiled step (a drafter's fused step) calls this rather than building a verifier."""
    probs = step_probs(sampling, constraints, logits, partner, *constrained)
    if drafts is None:
        drafts = probs.new_empty(probs.shape[0], 0, dtype=torch.long)
    rule = greedy_verify(drafts, None, probs) if sampling.greedy else \
        speculative_verdict(drafts, draft_probs, probs, u, u_emit)
    return probs, rule.num_accepted, rule.next_tokens


@dataclass(frozen=True)
class StepVerifier:
    """The lossless rule (:func:`default_rule`) run inside a token model's step, after its sampling
    (:class:`~visualspec.core.sampling.StepSampler`): one compiled graph gives the target's
    distributions and the verdict, instead of a graph and a few dozen small eager calls.

    Called as ``verifier(logits (R, K+1, V), partner (R,), drafts (R, K), draft_probs (R, K, V),
    u (R, K), u_emit (R,))`` over model rows, padded ones included; ``drafts`` and ``draft_probs``
    are None when K = 0 (an AR step), and the uniforms (:func:`rule_uniforms`) and ``draft_probs``
    None when greedy (the argmax rule reads neither). A point-mass draft is given as its one-hot
    row (:func:`point_mass`). Returns ``(probs (R, K+1, V), num_accepted (R,), next_tokens (R,))``:
    the verdict :func:`speculative_verdict` (greedy: :func:`greedy_verify`) gives. Frozen and
    hashable: equal verifiers share a compiled graph."""

    sampling: SamplingConfig
    constraints: StepConstraints | None = None  # as the StepSampler's: its n and tables come last
    label = "sampling and rule"  # what a compiling step says it compiles with

    def __call__(self, logits, partner, drafts=None, draft_probs=None, u=None, u_emit=None, *constrained):
        return step_verdict(self.sampling, self.constraints, logits, partner, drafts, draft_probs, u, u_emit,
                            *constrained)

    def example_args(self, model_rows: int, window: int, vocab_size: int, device=None) -> tuple:
        """Arguments of the shapes and dtypes a step of ``model_rows`` rows and ``window`` tokens
        hands it (to compile its graph before decoding)."""
        k, greedy = window - 1, self.sampling.greedy
        partner = torch.zeros(model_rows, dtype=torch.long, device=device)

        def zeros(*shape, dtype=torch.float64):
            return torch.zeros(*shape, dtype=dtype, device=device)
        drafts = zeros(model_rows, k, dtype=torch.long) if k else None
        draft_probs = zeros(model_rows, k, vocab_size, dtype=torch.float32) if k and not greedy else None
        u = zeros(model_rows, k) if k and not greedy else None
        return (partner, drafts, draft_probs, u, None if greedy else zeros(model_rows),
                *StepSampler(self.sampling, self.constraints).constraint_args(model_rows, vocab_size, device))

    def padded(self, args: tuple, length: int, run: int) -> tuple:
        """``args`` of a window of ``length`` tokens for the step of a window of ``run`` >= ``length``
        (a model that runs its windows in buckets pads the window after its tokens), with drafts no
        rule accepts in the extra draft columns (:func:`padded_drafts`), so that the verdict is the
        window's own."""
        if run == length:
            return args
        partner, drafts, draft_probs, u, *rest = args
        return (partner, *padded_drafts(drafts, draft_probs, u, run - 1), *rest)

    def cropped(self, out: tuple, length: int) -> tuple:
        """The output of a padded step (:meth:`padded`) as a window of ``length`` tokens gives it:
        the first ``length`` distributions, the verdict as it is."""
        probs, accepted, tokens = out
        return probs[:, :length], accepted, tokens


def padded_drafts(drafts, draft_probs, u, k: int):
    """``(drafts, draft_probs, u)`` of a step's rule (:class:`StepVerifier`'s; ``draft_probs`` and
    ``u`` None when greedy) with drafts that no rule accepts after the real ones, up to ``k``:

    - greedy: the draft -1, which no argmax equals;
    - sampled: a draft law of zero mass, q = 0 (never accepted: a draft is accepted only where
      ``q(x) > 0``), at uniform 0. A row that accepted every real draft stops at the first such
      column and emits from ``norm(max(p - 0, 0)) = p`` there: the bonus token of the unpadded
      window, whose last column that is, at the same uniform.

    So the verdict is the unpadded window's."""
    extra = k - drafts.shape[1]
    if draft_probs is None:
        return torch.nn.functional.pad(drafts, (0, extra), value=-1), None, u
    return (torch.nn.functional.pad(drafts, (0, extra)), torch.nn.functional.pad(draft_probs, (0, 0, 0, extra)),
            torch.nn.functional.pad(u, (0, extra)))


def typical_verify(draft_tokens, draft_probs, target_probs, generator: Generator = None, *,
                   epsilon: float = 0.09, delta: float = 0.3) -> Verdict:
    """Typical acceptance (Medusa, Cai et al. 2024). Lossy.

    Accept draft x_i while ``p_i(x_i) > min(epsilon, delta * exp(-H(p_i)))``, with H the entropy
    of p_i in nats: a draft is kept when the target finds it typical enough, whatever q was. At the
    first rejection emit a sample from p_a itself (or the bonus from p_K). With temperature 0 (a
    point-mass p) this accepts exactly the argmax prefix; otherwise the output law differs from the
    target's, and by how much is measured, not bounded.
    """
    K = draft_tokens.shape[1]
    if K == 0:
        return _autoregressive_step(target_probs, generator)
    p = target_probs[:, :-1]
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    p_x = p.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    a = leading_true(p_x > threshold)
    return _emit(a, _row_at(target_probs, a.clamp(max=K - 1)), target_probs,
                 uniform(a.shape, generator, device=a.device))


def judge_verify(draft_tokens, draft_probs, target_probs, generator: Generator = None, *,
                 scores: torch.Tensor, threshold: float) -> Verdict:
    """Judge decoding (Bachmann et al., ICLR 2025). Lossy.

    ``scores`` (B, K) in [0, 1] is a learned judge's belief that draft x_i is harmless (see
    :class:`visualspec.core.judge.JudgeRule`). Accept x_i while

        speculative sampling accepts it (``u_i q_i(x_i) < p_i(x_i)``; argmax matching when p is
        one-hot, i.e. greedy)   or   ``scores_i > threshold``;

    at the first position a that both reject, emit the exact rule's residual sample
    ``norm(max(p_a - q_a, 0))`` and stop; after K acceptances a bonus token from p_K.

    What it guarantees: every token the exact rule accepts is accepted, so a step commits at least
    as many tokens as :func:`speculative_verify` with the same uniforms; ``threshold = 1`` (no score
    exceeds it) is exactly that rule, lossless. What it does not: with a lower threshold the output
    law differs from the target's by whatever the judge lets through (no total-variation bound, unlike
    LANTERN); its cost is measured on the outcome the judge was trained for, not bounded.
    """
    threshold = check_probability("the judge's threshold", threshold)
    if draft_tokens.shape[1] == 0:
        return _autoregressive_step(target_probs, generator)
    if scores.shape != draft_tokens.shape:
        raise ValueError(f"scores must have the drafts' shape {tuple(draft_tokens.shape)}, got {tuple(scores.shape)}")
    p_x = target_probs[:, :-1].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    return _verify_against(draft_tokens, draft_probs, target_probs, *_uniforms_for(draft_tokens, generator), p_x,
                           lambda stop, x_stop: _row_at(target_probs, stop), also=scores > threshold)


# ----------------------------------------------------------------------------------------------
# LANTERN relaxed acceptance
# ----------------------------------------------------------------------------------------------


def lantern_relaxation(p, tokens, neighbours, delta: float | None = None, lam: float | None = None):
    """LANTERN's latent-neighbourhood relaxation of p around each draft token.

    ``p`` (..., V), ``tokens`` (...), ``neighbours`` (V, k): the k nearest codebook entries of every
    token, nearest first. With c_m the target mass of the m nearest neighbours of x, choose the
    largest m with

    - ``c_m <= delta`` (LANTERN, total-variation budget δ), or
    - ``c_m <= (lam - 1) * p(x)`` (LANTERN++'s λ variant: p̃(x) <= λ p(x)),

    and return ``(p_tilde_x, absorbed)``: the relaxed probability ``p̃(x) = p(x) + c_m`` and a bool
    mask (..., k) of the absorbed neighbours. The relaxed distribution p̃ moves the absorbed mass
    onto x, so ``TV(p, p̃) = c_m <= delta``.
    """
    if (delta is None) == (lam is None):
        raise ValueError("give exactly one of delta (TV budget) or lam (ratio budget)")
    nb = neighbours[tokens].long()  # (..., k)
    p_nb = p.gather(-1, nb)
    cum = p_nb.cumsum(-1)
    p_x = p.gather(-1, tokens.unsqueeze(-1))
    budget = torch.full_like(p_x, float(delta)) if delta is not None else (float(lam) - 1.0) * p_x
    # the neighbour is x itself only in degenerate tables; never absorb x
    absorbed = (cum <= budget) & (nb != tokens.unsqueeze(-1))
    absorbed = absorbed.long().cumprod(-1).bool()  # a prefix of the neighbour list
    c_m = (p_nb * absorbed).sum(-1)
    return p_x.squeeze(-1) + c_m, absorbed


def relaxed_distribution(p, tokens, neighbours, absorbed):
    """The LANTERN distribution p̃ (…, V): p with the absorbed neighbours' mass moved onto x."""
    nb = neighbours[tokens].long()
    moved = (p.gather(-1, nb) * absorbed).sum(-1, keepdim=True)
    out = p.scatter(-1, nb, p.gather(-1, nb).masked_fill(absorbed, 0.0))
    return out.scatter_add(-1, tokens.unsqueeze(-1), moved)


def lantern_verify(draft_tokens, draft_probs, target_probs, generator: Generator = None, *,
                   neighbours: torch.Tensor, delta: float | None = 0.1, lam: float | None = None) -> Verdict:
    """LANTERN relaxed speculative sampling (Jang et al. 2025). Lossy.

    Exact speculative sampling against the relaxed target p̃ of :func:`lantern_relaxation`:
    accept x with probability ``min(1, p̃(x) / q(x))``; at the first rejection sample from
    ``norm(max(p̃ - q, 0))`` (x and its absorbed neighbours carry no residual mass); bonus from p_K.

    Bound: ``TV(p, p̃) <= delta`` for every draft token. For a deterministic draft (point mass) the
    emitted token has law exactly p̃, so one step is within δ of the target in total variation.
    For stochastic drafts there is no such bound on the step (drafts accepted through their
    neighbours' mass can pile up); δ then bounds only each token's relaxation.
    Pass ``lam`` (and ``delta=None``) for the λ variant.
    """
    if draft_tokens.shape[1] == 0:
        return _autoregressive_step(target_probs, generator)
    p = target_probs[:, :-1]
    p_tilde, absorbed = lantern_relaxation(p, draft_tokens, neighbours, delta=delta, lam=lam)
    return _verify_against(
        draft_tokens, draft_probs, target_probs, *_uniforms_for(draft_tokens, generator), p_tilde,
        lambda stop, x_stop: relaxed_distribution(_row_at(p, stop), x_stop, neighbours, _row_at(absorbed, stop)))


# ----------------------------------------------------------------------------------------------
# Grouped speculative decoding (GSD)
# ----------------------------------------------------------------------------------------------


def _check_gsd_args(group_size, embeddings, max_distance, vocab_size: int) -> None:
    """Raise a ValueError naming the first bad GSD argument."""
    check_int("group_size (0 is exact speculative sampling)", group_size, 0)
    if max_distance is not None and not max_distance >= 0:  # also rejects NaN
        raise ValueError(f"max_distance must be >= 0 or None (no distance filter), got {max_distance!r}")
    if max_distance is not None and embeddings is None:
        raise ValueError("max_distance needs embeddings (V, D) to measure distances in")
    if embeddings is not None and (embeddings.dim() != 2 or embeddings.shape[0] != vocab_size):
        raise ValueError(f"embeddings must have shape (V, D) with V = {vocab_size}, got {tuple(embeddings.shape)}")


def gsd_group(p, tokens, group_size: int, embeddings=None, max_distance: float | None = None):
    """GSD's group G of each draft token: a bool mask (..., V).

    ``p`` (..., V), ``tokens`` (...). Rank the vocabulary by descending p (a stable sort: equal
    probabilities keep token order). G holds the tokens ranked ``rank(x) - group_size ..
    rank(x) + group_size`` (clamped to 0..V-1), and when ``max_distance`` is given only those with
    ``|e_y - e_x|² <= max_distance`` (``e = embeddings``, e.g. the VQ codebook); x is always in G.
    ``group_size = 0`` gives G = {x}.
    """
    V = p.shape[-1]
    _check_gsd_args(group_size, embeddings, max_distance, V)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices  # rank -> token
    rank_x = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=p.device).expand_as(order))
    rank_x = rank_x.gather(-1, tokens.unsqueeze(-1))  # (..., 1)
    window = rank_x + torch.arange(-group_size, group_size + 1, device=p.device)  # (..., 2r+1)
    keep = (window >= 0) & (window < V)
    members = order.gather(-1, window.clamp(0, V - 1))
    if max_distance is not None:
        diff = embeddings[members] - embeddings[tokens].unsqueeze(-2)
        keep &= (diff * diff).sum(-1) <= max_distance
    # clamped ranks repeat an end token with keep=False: count votes instead of overwriting
    votes = torch.zeros(p.shape, dtype=torch.long, device=p.device).scatter_add_(-1, members, keep.long())
    return (votes > 0).scatter(-1, tokens.unsqueeze(-1), True)


def gsd_verify(draft_tokens, draft_probs, target_probs, generator: Generator = None, *,
               group_size: int, embeddings=None, max_distance: float | None = None) -> Verdict:
    """Grouped speculative decoding (So et al., ICCV 2025). Lossy.

    With G_i = :func:`gsd_group` of draft x_i under p_i, accept x_i with probability
    ``min(1, p_i(G_i) / q_i(G_i))`` (q_i(G_i) = 1 for a point-mass draft, so then ``p_i(G_i)``);
    at the first rejection sample from the ordinary residual ``norm(max(p_i - q_i, 0))`` and stop;
    after K acceptances a bonus token from p_K. ``group_size = 0`` is :func:`speculative_verify`.
    The published rule's window is 7 ranks on one side and 6 on the other; here it is symmetric.

    Bound, point-mass draft x (one step): P(emit x) = p(G), and a rejection samples from
    ``norm(max(p - δ_x, 0))``, which is p without x renormalised. So the emitted law is

        p̃(x) = p(G),    p̃(y) = p(y) (1 - p(G)) / (1 - p(x))  for y != x

    (p̃ = p when p(x) = 1): x gains ``p(G \\ {x})`` and every other token, inside G or not, loses
    in proportion to p(y). Hence ``TV(p, p̃) = p(G \\ {x})`` exactly, at most 1 - p(x). Unlike
    LANTERN's p̃ the mass is not taken from G's tokens only, and the bound depends on p (no budget:
    G is set by ranks and distances, not by mass).

    Stochastic drafts (q not a point mass): only the per-token relaxation above is described; the
    step's law is measured, not bounded. Nor is the rule sure to accept more than exact speculative
    sampling there: ``p(G) / q(G)`` can be below ``p(x) / q(x)`` when G's other tokens are likelier
    under q than under p.
    """
    _check_gsd_args(group_size, embeddings, max_distance, target_probs.shape[-1])
    if draft_tokens.shape[1] == 0:
        return _autoregressive_step(target_probs, generator)
    p = target_probs[:, :-1]
    group = gsd_group(p, draft_tokens, group_size, embeddings, max_distance)
    p_group = (p * group).sum(-1)
    q_x = _draft_prob_of_token(draft_tokens, draft_probs)
    q_group = q_x if draft_probs is None else (draft_probs * group).sum(-1)
    # _verify_against accepts with min(1, mass / q(x)): scale p(G) by q(x) / q(G) (1 when G = {x})
    scale = torch.where(q_group > 0, q_x.double() / q_group.double().clamp(min=1e-300), 0.0)
    return _verify_against(draft_tokens, draft_probs, target_probs, *_uniforms_for(draft_tokens, generator),
                           p_group.double() * scale,
                           lambda stop, x_stop: _row_at(target_probs, stop))
