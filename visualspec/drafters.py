"""Drafters: where draft tokens and their draft distributions come from.

A drafter proposes up to ``k`` tokens after the ``n`` committed ones and says, for each, the
distribution q it was sampled from (``None`` when every draft is deterministic). After the target
has verified them, :meth:`Drafter.observe` tells the drafter what happened, so that self-drafting
(Jacobi) can reuse the target's own predictions and a draft model can roll its cache back.
"""

from __future__ import annotations

import torch

from .sampling import Generator, SamplingConfig, sample, uniform
from .verify import point_mass

INIT_SCHEMES = ("random", "repeat_left", "repeat_above")


class Drafter:
    """Interface of a drafter; the decode engine calls these in order for every step."""

    def start(self, batch_size: int, num_tokens: int, sampling: SamplingConfig, generator: Generator) -> None:
        """A new decode of ``num_tokens`` tokens begins."""

    def propose(self, tokens: torch.Tensor, n: int, k: int):
        """Draft positions n..n+k-1 given ``tokens[:, :n]`` (committed).

        Returns ``(drafts (B, k) long, draft_probs (B, k, V) float or None)``.
        """
        raise NotImplementedError

    def observe(self, n: int, committed: int, target_probs: torch.Tensor) -> None:
        """The target verified the last proposal at positions n.. and committed ``committed``
        tokens (positions n..n+committed-1); ``target_probs`` (B, k+1, V) are its distributions
        at positions n..n+k."""

    @property
    def forwards(self) -> int:
        """Forward passes of a draft model so far (0 for model-free drafters)."""
        return 0


class JacobiDrafter(Drafter):
    """Jacobi self-drafting, as in Speculative Jacobi Decoding (Teng et al. 2024).

    Each step the target predicts every position of its window at once. After verification, the
    target's samples at the positions past the committed ones become the next drafts, with draft
    distribution q = the target's distribution there in that iteration: this is SJD's
    probabilistic Jacobi criterion when verified by :func:`visualspec.verify.speculative_verify`.
    Positions nobody has predicted yet are filled by an initialisation scheme and are point masses:

    - ``random``: uniform over the vocabulary (or ``init_vocab``: token ids ``[lo, hi)``),
    - ``repeat_left``: the token one position to the left,
    - ``repeat_above``: the token one row above in a ``grid_width``-wide image (vertical repeat;
      the first row repeats left).
    """

    def __init__(self, vocab_size: int, init: str = "random", grid_width: int | None = None,
                 init_vocab: tuple[int, int] | None = None):
        if init not in INIT_SCHEMES:
            raise ValueError(f"unknown Jacobi init scheme {init!r}; choose one of {INIT_SCHEMES}")
        if init == "repeat_above" and not grid_width:
            raise ValueError("init='repeat_above' needs grid_width (tokens per image row)")
        self.vocab_size = vocab_size
        self.init = init
        self.grid_width = grid_width
        self.init_vocab = init_vocab or (0, vocab_size)

    def start(self, batch_size, num_tokens, sampling, generator):
        self.sampling, self.generator = sampling, generator
        self.carried = None  # (B, c) tokens predicted by the target past the committed prefix
        self.carried_probs = None  # (B, c, V) the distributions they were sampled from

    def propose(self, tokens, n, k):
        B = tokens.shape[0]
        c = 0 if self.carried is None else min(self.carried.shape[1], k)
        drafts = tokens.new_empty(B, k)
        drafts[:, :c] = self.carried[:, :c] if c else drafts[:, :0]
        for j in range(c, k):  # fresh positions, initialised left to right
            drafts[:, j] = self._init_token(tokens, drafts, n, j, B)
        if c == 0:
            return drafts, None
        q = point_mass(drafts, self.vocab_size)
        q[:, :c] = self.carried_probs[:, :c]
        return drafts, q

    def _init_token(self, tokens, drafts, n, j, B):
        pos = n + j

        def token_at(p):  # committed token, or a draft already placed in this window
            return tokens[:, p] if p < n else drafts[:, p - n]

        if self.init == "repeat_above" and pos >= self.grid_width:
            return token_at(pos - self.grid_width)
        if self.init in ("repeat_left", "repeat_above") and pos >= 1:
            return token_at(pos - 1)
        lo, hi = self.init_vocab
        u = uniform((B,), self.generator, device=tokens.device)
        return (lo + (u * (hi - lo)).long().clamp(max=hi - lo - 1)).to(tokens.dtype)

    def observe(self, n, committed, target_probs):
        # target_probs[:, j] is the target's distribution at position n + j; keep the ones past
        # the committed prefix, with a fresh sample from each (the Jacobi update).
        rest = target_probs[:, committed:]
        if rest.shape[1] == 0:
            self.carried = self.carried_probs = None
            return
        self.carried_probs = rest
        self.carried = rest.argmax(-1) if self.sampling.greedy else sample(rest, self.generator)


class DraftModelDrafter(Drafter):
    """Drafting with a smaller model of the same vocabulary (Leviathan et al. 2023).

    The draft model runs autoregressively for k tokens with its own KV cache, sampling each draft
    from q = ``sampling.probs(draft logits)``: the same guidance, temperature, top-k and top-p as
    the target. After verification its cache is cropped back to the accepted prefix.
    """

    def __init__(self, model, prefix):
        self.model = model
        self.prefix = prefix
        self._forwards = 0

    @property
    def forwards(self):
        return self._forwards

    def start(self, batch_size, num_tokens, sampling, generator):
        self.sampling, self.generator = sampling, generator
        self.model.prefill(self.prefix, num_tokens)
        self._forwards = 1
        self.consumed = 0  # generated positions [0, consumed) are in the draft cache

    def _forward(self, window, start):
        if self.sampling.uses_guidance:
            window = torch.cat([window, window])
        self._forwards += 1
        return self.model.forward_window(window, start)[:, -1]

    def propose(self, tokens, n, k):
        B = tokens.shape[0]
        drafts = tokens.new_empty(B, k)
        if k == 0:
            return drafts, None
        probs = []
        # catch up on committed tokens the draft model has not seen (at least x_{n-1})
        logits = self._forward(tokens[:, self.consumed:n], self.consumed)
        for j in range(k):
            q = self.sampling.probs(logits)
            drafts[:, j] = q.argmax(-1) if self.sampling.greedy else sample(q, self.generator)
            probs.append(q)
            if j + 1 < k:
                logits = self._forward(drafts[:, j:j + 1], n + j)
        self.consumed = n + k - 1
        return drafts, (torch.stack(probs, 1) if probs else None)

    def observe(self, n, committed, target_probs):
        # drafts at positions n..n+committed-2 were accepted; the last committed token may differ
        self.consumed = min(self.consumed, n + committed - 1)
        self.model.crop(self.consumed)


class NGramDrafter(Drafter):
    """Prompt-lookup (n-gram) drafting: no model at all (Saxena 2023; transformers'
    ``prompt_lookup_num_tokens``; vLLM's n-gram proposer).

    For each row, the last ``n`` tokens of the context (prompt + committed tokens) are searched for
    in the earlier context, longest n first (``max_ngram`` down to ``min_ngram``), most recent match
    first; the tokens that followed the match are the drafts. Drafts are deterministic, so they
    are point masses for verification (accept with probability p(x)). Where nothing matches (or
    the continuation is shorter than k) the last token is repeated.
    """

    def __init__(self, prompts, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.prompts = [list(map(int, p)) for p in prompts]
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, batch_size, num_tokens, sampling, generator):
        if len(self.prompts) != batch_size:
            raise ValueError(f"NGramDrafter has {len(self.prompts)} prompts for a batch of {batch_size}")

    def propose(self, tokens, n, k):
        B = tokens.shape[0]
        drafts = tokens.new_empty(B, k)
        generated = tokens[:, :n].tolist()
        for b in range(B):
            drafts[b] = torch.tensor(self.lookup(self.prompts[b] + generated[b], k), dtype=tokens.dtype)
        return drafts, None

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the context's last n-gram."""
        if k == 0:
            return []
        for size in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            pattern = context[-size:]
            for start in range(len(context) - size - 1, -1, -1):  # most recent match first
                if context[start:start + size] == pattern:
                    follow = context[start + size:start + size + k]
                    return follow + [follow[-1]] * (k - len(follow))
        return [context[-1]] * k
