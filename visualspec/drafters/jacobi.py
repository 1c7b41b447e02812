"""Jacobi self-drafting (Speculative Jacobi Decoding) and coupled Jacobi drafts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.compiled import COMPILED_WINDOWS
from ..core.constraints import StepConstraints, forced_at, pin_drafts
from ..core.engine import Drafter
from ..core.rows import commit_window, per_row
from ..core.sampling import Generator, SamplingConfig, inverse_cdf, sample, uniform
from ..core.verify import default_rule, point_mass, residual, rule_uniforms, step_verdict

INIT_SCHEMES = ("random", "repeat_left", "repeat_above")
FUSED_WIDTH = COMPILED_WINDOWS  # carry columns under a fused step: the longest window a compiled step takes


def random_tokens(u: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Uniform token ids in ``[lo, hi)`` at the uniforms ``u`` (any shape): ``lo + floor(u (hi - lo))``."""
    return lo + (u * (hi - lo)).long().clamp(max=hi - lo - 1)


def repeated_tokens(tokens: torch.Tensor, pos: torch.Tensor, carried: torch.Tensor, from_carry: torch.Tensor,
                    init: str, grid_width: int | None = None) -> torch.Tensor:
    """Drafts at positions ``pos`` (B, k) by ``repeat_left`` / ``repeat_above``, given the
    committed ``tokens`` (B, N): a ``carried`` position keeps its carried token ``from_carry``, a
    fresh one copies its source position (one to the left, or one image row of ``grid_width`` up),
    which may itself be a fresh position of this window. Sources are followed to their end by
    pointer jumping (log2 k gathers, no loop over the window)."""
    B, k = pos.shape
    src = torch.where(pos >= grid_width, pos - grid_width, pos - 1) if init == "repeat_above" else pos - 1
    length = tokens.shape[1] + k  # room for window positions past the end (fillers)
    values = torch.cat([tokens, tokens.new_zeros(B, k)], dim=1).scatter(1, pos, from_carry)
    pointer = torch.arange(length, device=pos.device).expand(B, length).clone()
    pointer.scatter_(1, pos, torch.where(carried, pos, src.clamp(min=0)))
    for _ in range(k.bit_length()):  # 2 ** rounds > k, the longest chain
        pointer = pointer.gather(1, pointer)
    return values.gather(1, pointer.gather(1, pos))


def fresh_drafts(init: str, init_vocab: tuple[int, int], grid_width: int | None, u: torch.Tensor | None,
                 tokens: torch.Tensor, n: torch.Tensor, k: int, at: tuple | None = None) -> torch.Tensor:
    """The initialisation's drafts (B, k) at each row's positions n..n+k-1: ``random`` token ids in
    ``init_vocab`` at the uniforms ``u`` (:func:`random_tokens`), or ``repeat_left`` /
    ``repeat_above`` copies of the committed ``tokens`` (B, N) (:func:`repeated_tokens`), where the
    positions the carry holds (``at``, :func:`carried_at`; None: it holds none) keep their token."""
    if init == "random":
        return random_tokens(u, *init_vocab).to(tokens.dtype)
    pos = n[:, None] + torch.arange(k, device=n.device)
    has, from_carry = at[:2] if at is not None else (torch.zeros_like(pos, dtype=torch.bool), tokens.new_zeros(pos.shape))
    return repeated_tokens(tokens, pos, has, from_carry, init, grid_width)


def carried_at(carry: tuple, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a Jacobi carry (:func:`carry_after`: tokens (B, C), laws (B, C, V), counts (B,)) holds
    at the next ``k`` positions of each row: ``(has (B, k) bool: j < count, tokens (B, k), laws
    (B, k, V))``; columns past C repeat its last one (never ``has``)."""
    tokens, probs, count = carry
    B, C, V = probs.shape
    offsets = torch.arange(k, device=tokens.device)
    index = offsets.clamp(max=C - 1)[None].expand(B, k)
    return (offsets[None] < count[:, None], tokens.gather(1, index),
            probs.gather(1, index[..., None].expand(B, k, V)))


def jacobi_drafts(carried: tuple, fresh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Jacobi step's drafts (B, k) and their laws q (B, k, V), from what the carry holds there
    (:func:`carried_at`): at position j of row b the carried token, with the law it was drawn from,
    where it ``has`` one; else ``fresh[b, j]`` (an initialisation), a point mass."""
    has, tokens, probs = carried
    drafts = torch.where(has, tokens, fresh)
    return drafts, torch.where(has[..., None], probs, point_mass(drafts, probs.shape[-1]).to(probs.dtype))


def carry_after(new: torch.Tensor, probs: torch.Tensor, committed: torch.Tensor, width: int) -> tuple:
    """The Jacobi update: the target's fresh draws ``new`` (B, K1) at a row's positions n..n+K1-1,
    from ``probs`` (B, K1, V); row b committed ``committed[b]`` tokens, so it carries
    ``new[b, committed[b]:]`` and their laws, ``count = max(K1 - committed, 0)`` of them, in
    ``width`` >= K1 columns (those past the count are junk nobody reads)."""
    B, K1, V = probs.shape
    index = (committed[:, None] + torch.arange(width, device=new.device)).clamp(max=K1 - 1)
    return new.gather(1, index), probs.gather(1, index[..., None].expand(B, width, V)), (K1 - committed).clamp(min=0)


@dataclass(frozen=True)
class JacobiStep:
    """A whole SJD step run inside the target's compiled step, in one graph: the Jacobi proposal
    (:func:`jacobi_drafts` of the carry and the initialisations), the window, the forward,
    the sampling and the lossless rule (:class:`~visualspec.core.verify.StepVerifier`), the commit
    (:func:`~visualspec.core.rows.commit_window`) and the Jacobi update (:func:`carry_after`),
    instead of a few dozen small eager calls around the graph. Its randomness is drawn before the
    step, in the order the unfused step draws it (:meth:`uniforms`), so it gives the same tokens.

    The target calls :meth:`window` before its forward (to make its window from the arguments)
    and the step itself on the logits; every argument has one row per model row (padded rows too).
    Frozen and hashable: equal steps share a compiled graph."""

    sampling: SamplingConfig
    num_tokens: int  # positions a row generates (its token buffer's length)
    init: str  # the drafter's initialisation scheme (INIT_SCHEMES)
    init_vocab: tuple[int, int]
    grid_width: int | None = None
    constraints: StepConstraints | None = None  # structural tokens: their tables come last in the arguments
    label = "Jacobi drafts, sampling, rule and commit"  # what a compiling step says it compiles with

    def uniforms(self, rows: int, k: int, generator: Generator = None, device=None) -> tuple:
        """The step's uniforms, drawn in the unfused step's order: the ``random`` initialisations
        (rows, k), the rule's (:func:`~visualspec.core.verify.rule_uniforms`), the update's draws
        (rows, k + 1); None for what it does not draw (greedy draws only the initialisations)."""
        init = uniform((rows, k), generator, device=device) if self.init == "random" else None
        if self.sampling.greedy:
            return init, None, None, None
        return init, *rule_uniforms(rows, k, generator, device), uniform((rows, k + 1), generator, device=device)

    def window(self, tokens, partner, seq, n, fixed, forwards, carried, carried_probs, count, u_init, u, u_emit,
               u_draw, *tables):
        """The window ``[x_{n-1}, drafts]`` of each row, of ``tokens``' shape (R, k + 1), and the
        arguments of the step; a forced position's draft is its token, with a point mass as its law
        (:func:`~visualspec.core.constraints.pin_drafts`, as the unfused step's proposal does)."""
        k = tokens.shape[1] - 1
        at = carried_at((carried, carried_probs, count), k)
        drafts, q = jacobi_drafts(at, fresh_drafts(self.init, self.init_vocab, self.grid_width, u_init, seq, n, k, at))
        if self.constraints is not None:
            drafts, q = pin_drafts(drafts, q, forced_at(tables[0], n[:, None] + torch.arange(k, device=n.device)),
                                   q.shape[-1])
        last = seq.gather(1, (n - 1).clamp(min=0)[:, None])  # padded rows have n = 0
        width = max(carried.shape[1], k + 1)  # a longer window (run eagerly) widens the carry
        return torch.cat([last, drafts], 1), (partner, seq, n, fixed, forwards, width, drafts, q, u, u_emit, u_draw,
                                              *tables)

    def __call__(self, logits, partner, seq, n, fixed, forwards, width, drafts, q, u, u_emit, u_draw, *tables):
        """``(seq, fixed, counts, num_accepted, next_tokens, carried, carried_probs, count)`` after
        the step."""
        greedy = self.sampling.greedy
        constrained = (n, *tables) if self.constraints is not None else ()
        probs, accepted, emitted = step_verdict(self.sampling, self.constraints, logits, partner, drafts,
                                                None if greedy else q, u, u_emit, *constrained)
        seq, fixed, counts = commit_window(seq, fixed, n, forwards, drafts, accepted, emitted)
        new = probs.argmax(-1) if greedy else inverse_cdf(probs, u_draw)
        return (seq, fixed, counts, accepted, emitted, *carry_after(new, probs, counts, width))

    def example_args(self, model_rows: int, window: int, vocab_size: int, device=None) -> tuple:
        """Arguments of the shapes and dtypes a step of ``model_rows`` rows and ``window`` tokens
        hands it (to compile its graph before decoding)."""
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)
        k, sampled = window - 1, not self.sampling.greedy
        uniforms = [zeros(model_rows, k, dtype=torch.float64) if self.init == "random" else None,
                    *([zeros(model_rows, k, dtype=torch.float64), zeros(model_rows, dtype=torch.float64),
                       zeros(model_rows, window, dtype=torch.float64)] if sampled else [None] * 3)]
        tables = () if self.constraints is None else self.constraints.example_tables(model_rows, vocab_size, device)
        return (zeros(model_rows), zeros(model_rows, self.num_tokens), zeros(model_rows), zeros(model_rows, self.num_tokens),
                zeros(model_rows), zeros(model_rows, FUSED_WIDTH),
                zeros(model_rows, FUSED_WIDTH, vocab_size, dtype=torch.float32), zeros(model_rows), *uniforms, *tables)


def coupled_redraft(drafts: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                    generator: Generator = None) -> torch.Tensor:
    """Maximal coupling of each old draft x ~ q with a new draw from p (SCD, "speculative coupled
    decoding"): keep x with probability ``min(1, p(x) / q(x))``, else draw from the residual
    ``norm(max(p - q, 0))``. The result has law exactly p, and equals x with probability
    ``sum min(p, q)``, the largest any coupling of q and p allows, so when p barely moved the draft
    stays. ``drafts`` (B, K), ``draft_probs`` (B, K, V) or None (point masses), ``target_probs``
    (B, K, V) -> (B, K) long.
    """
    if drafts.shape[1] == 0:
        return drafts
    q = point_mass(drafts, target_probs.shape[-1]) if draft_probs is None else draft_probs
    q_x = q.gather(-1, drafts[..., None])[..., 0].double()
    p_x = target_probs.gather(-1, drafts[..., None])[..., 0].double()
    u = uniform(drafts.shape, generator, device=drafts.device)
    keep = (q_x > 0) & (u * q_x < p_x)
    return torch.where(keep, drafts, sample(residual(target_probs, q), generator))


class JacobiCarry:
    """The rows of a drafter whose state is a Jacobi carry, ``self.carry`` (:func:`carry_after`'s
    tokens, laws and counts, or None before the first step): dropped and restarted with it."""

    def select(self, rows):
        if self.carry is not None:
            self.carry = tuple(x[rows] for x in self.carry)

    def reset(self, rows, requests):
        if self.carry is not None:
            self.carry[2][rows] = 0


class JacobiDrafter(JacobiCarry, Drafter):
    """Jacobi self-drafting, as in Speculative Jacobi Decoding (Teng et al. 2024).

    Each step the target predicts every position of its window at once. After verification, the
    target's samples at the positions past each row's committed ones become the next drafts, with
    draft distribution q = the target's distribution there in that iteration: this is SJD's
    probabilistic Jacobi criterion when verified by :func:`visualspec.core.verify.speculative_verify`.
    With ``coupling=True`` the next draft at a position that already held a draft is the maximal
    coupling of that draft with the new distribution (:func:`coupled_redraft`), so it stays where
    the distribution barely changed; its law, and so its q, is still the new distribution, which
    keeps verification lossless. Positions nobody has predicted yet are filled by an
    initialisation scheme and are point masses:

    - ``random``: uniform over the vocabulary (or ``init_vocab``: token ids ``[lo, hi)``),
    - ``repeat_left``: the token one position to the left,
    - ``repeat_above``: the token one row above in a ``grid_width``-wide image (vertical repeat;
      the first row repeats left).
    """

    carries_drafts = True

    def __init__(self, vocab_size: int, init: str = "random", grid_width: int | None = None,
                 init_vocab: tuple[int, int] | None = None, coupling: bool = False):
        if init not in INIT_SCHEMES:
            raise ValueError(f"unknown Jacobi init scheme {init!r}; choose one of {INIT_SCHEMES}")
        if init == "repeat_above" and not grid_width:
            raise ValueError("init='repeat_above' needs grid_width (tokens per image row)")
        self.vocab_size = vocab_size
        self.init = init
        self.grid_width = grid_width
        self.init_vocab = init_vocab or (0, vocab_size)
        self.coupling = coupling

    def cost_tag(self):
        return type(self).__name__ + ("+coupling" if self.coupling else "")

    def start(self, batch_size, num_tokens, sampling):
        self.sampling = sampling
        # what each row carries past its committed prefix (:func:`carry_after`): None before the first step
        self.carry: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.width = 0  # columns the carry keeps (a fused step fixes it: :meth:`fused_step`)
        self.proposed = None  # (drafts, q) of the latest proposal, for coupling

    def propose(self, tokens, n, k, generator=None):
        B, device = tokens.shape[0], tokens.device
        n = per_row(n, B, device)
        u = uniform((B, k), generator, device=device) if self.init == "random" else None  # k draws, whatever it carries
        at = carried_at(self.carry, k) if self.carry is not None else None
        fresh = fresh_drafts(self.init, self.init_vocab, self.grid_width, u, tokens, n, k, at)
        drafts, q = jacobi_drafts(at, fresh) if at is not None else (fresh, None)  # none carried: point masses
        self.proposed = (drafts, q)
        return drafts, q

    def observe(self, n, committed, target_probs, generator=None):
        # target_probs[:, j] is the target's distribution at position n + j; keep, per row, the
        # ones past its committed prefix, with a fresh (or coupled) sample from each (the Jacobi update)
        B, K1, V = target_probs.shape
        committed = per_row(committed, B, target_probs.device)
        new = self.sampling.draw(target_probs, generator)
        if self.coupling and not self.sampling.greedy and self.proposed is not None and K1 > 1:
            drafts, q = self.proposed
            new[:, :K1 - 1] = coupled_redraft(drafts, q, target_probs[:, :K1 - 1], generator)
        self.width = max(self.width, K1)
        self.carry = carry_after(new, target_probs, committed, self.width)
        self.proposed = None

    def fused_step(self, sampling, rule, num_tokens, constraints=None):
        """The whole step, run inside the target's step (:class:`JacobiStep`; ``constraints``: the
        decode's :class:`~visualspec.core.constraints.StepConstraints`, or None), where the drafts
        are uncoupled and verified by the lossless rule; else None."""
        if self.coupling or rule is not default_rule(sampling):
            return None
        return JacobiStep(sampling, num_tokens, self.init, self.init_vocab, self.grid_width, constraints)

    def step_state(self, rows, device=None) -> tuple:
        """The carry a fused step reads: :data:`FUSED_WIDTH` columns from now on (one shape for its
        graphs), empty before the first step."""
        self.width = max(self.width, FUSED_WIDTH)
        if self.carry is None:
            self.carry = (torch.zeros(rows, self.width, dtype=torch.long, device=device),
                          torch.zeros(rows, self.width, self.vocab_size, device=device),
                          torch.zeros(rows, dtype=torch.long, device=device))
        elif self.carry[0].shape[1] < self.width:  # unfused steps carried fewer columns
            more = self.width - self.carry[0].shape[1]
            tokens, probs, count = self.carry
            self.carry = (torch.nn.functional.pad(tokens, (0, more)), torch.nn.functional.pad(probs, (0, 0, 0, more)),
                          count)
        return self.carry

    def stepped(self, state: tuple) -> None:
        self.carry, self.width = state, state[0].shape[1]
