"""Drafters: where draft tokens and their draft distributions come from.

A drafter proposes up to ``k`` tokens after the ``n`` committed ones and says, for each, the
distribution q it was sampled from (``None`` when every draft is deterministic). After the target
has verified them, :meth:`Drafter.observe` tells the drafter what happened, so that self-drafting
(Jacobi) can reuse the target's own predictions and a draft model can roll its cache back.

Model-free drafters: :class:`NGramDrafter` (prompt lookup, deterministic drafts) and
:class:`StandDrafter` (a stochastic n-gram memory of the target's own distributions). Draft-model
drafters: :class:`DraftModelDrafter` and :class:`VocabTrimDrafter` (a draft model whose LM head is
restricted to a kept set of tokens, chosen e.g. with :func:`frequent_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict
from typing import Iterable, Sequence

import torch

from .sampling import Generator, SamplingConfig, sample, uniform
from .verify import point_mass, residual

INIT_SCHEMES = ("random", "repeat_left", "repeat_above")


class Drafter:
    """Interface of a drafter; the decode engine calls these in order for every step.

    Rows are ragged: ``n`` (B,) is each row's committed count, and ``committed`` (B,) what each
    row committed in a step. ``generator`` is that step's randomness (one generator, or one per
    row). With continuous batching the engine also drops rows (:meth:`select`) and starts new
    sequences in rows (:meth:`reset`).
    """

    def start(self, batch_size: int, num_tokens: int, sampling: SamplingConfig) -> None:
        """A new decode of ``num_tokens`` tokens per row begins."""

    def propose(self, tokens: torch.Tensor, n: torch.Tensor, k: int, generator: Generator = None):
        """Draft positions n[b]..n[b]+k-1 of each row b given ``tokens[b, :n[b]]`` (committed).

        Returns ``(drafts (B, k) long, draft_probs (B, k, V) float or None)``.
        """
        raise NotImplementedError

    def observe(self, n: torch.Tensor, committed: torch.Tensor, target_probs: torch.Tensor,
                generator: Generator = None) -> None:
        """The target verified the last proposal at positions n.. and row b committed
        ``committed[b]`` tokens (positions n[b]..n[b]+committed[b]-1); ``target_probs`` (B, k+1, V)
        are its distributions at positions n..n+k."""

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (in that order) and drop the others."""
        raise NotImplementedError(f"{type(self).__name__} cannot drop rows")

    def reset(self, rows: torch.Tensor, requests: list[int]) -> None:
        """Rows ``rows`` start new sequences (requests ``requests``) after their first token."""
        raise NotImplementedError(f"{type(self).__name__} cannot start new sequences mid-decode")

    @property
    def forwards(self) -> int:
        """Forward passes of a draft model so far (0 for model-free drafters)."""
        return 0


def per_row(x, rows: int, device=None) -> torch.Tensor:
    """An int or a (rows,) tensor of per-row counts -> a (rows,) long tensor."""
    return torch.as_tensor(x, dtype=torch.long, device=device).expand(rows)


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


class JacobiDrafter(Drafter):
    """Jacobi self-drafting, as in Speculative Jacobi Decoding (Teng et al. 2024).

    Each step the target predicts every position of its window at once. After verification, the
    target's samples at the positions past each row's committed ones become the next drafts, with
    draft distribution q = the target's distribution there in that iteration: this is SJD's
    probabilistic Jacobi criterion when verified by :func:`visualspec.verify.speculative_verify`.
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

    def start(self, batch_size, num_tokens, sampling):
        self.sampling = sampling
        self.carried = None  # (B, C) tokens predicted by the target past each row's committed prefix
        self.carried_probs = None  # (B, C, V) the distributions they were sampled from
        self.count = torch.zeros(batch_size, dtype=torch.long)  # valid carried tokens per row
        self.proposed = None  # (drafts, q) of the latest proposal, for coupling

    def propose(self, tokens, n, k, generator=None):
        B, device = tokens.shape[0], tokens.device
        n = per_row(n, B, device)
        offsets = torch.arange(k, device=device)
        count = self.count.to(device)
        carried = (offsets[None] < count[:, None]) if self.carried is not None else offsets[None].expand(B, k) < 0
        from_carry = tokens.new_zeros(B, k)
        if self.carried is not None:
            index = offsets.clamp(max=self.carried.shape[1] - 1)[None].expand(B, k)
            from_carry = self.carried.gather(1, index)
        if self.init == "random":  # k draws per row, whatever it carries
            lo, hi = self.init_vocab
            u = uniform((B, k), generator, device=device)
            fresh = (lo + (u * (hi - lo)).long().clamp(max=hi - lo - 1)).to(tokens.dtype)
            drafts = torch.where(carried, from_carry, fresh)
        else:
            drafts = self._repeat(tokens, n[:, None] + offsets, carried, from_carry)
        q = None
        if self.carried is not None and bool(carried.any()):
            index = offsets.clamp(max=self.carried.shape[1] - 1)[None, :, None].expand(B, k, self.vocab_size)
            q = torch.where(carried[..., None], self.carried_probs.gather(1, index), point_mass(drafts, self.vocab_size))
        self.proposed = (drafts, q)
        return drafts, q

    def _repeat(self, tokens, pos, carried, from_carry):
        """Drafts at positions ``pos`` (B, k) by ``repeat_left`` / ``repeat_above``: a carried
        position keeps its carried token, a fresh one copies its source position (one to the left,
        or one image row up), which may itself be a fresh position of this window. Sources are
        followed to their end by pointer jumping (log2 k gathers, no loop over the window)."""
        B, k = pos.shape
        if self.init == "repeat_above":
            src = torch.where(pos >= self.grid_width, pos - self.grid_width, pos - 1)
        else:
            src = pos - 1
        length = tokens.shape[1] + k  # room for window positions past the end (fillers)
        values = torch.cat([tokens, tokens.new_zeros(B, k)], dim=1).scatter(1, pos, from_carry)
        pointer = torch.arange(length, device=pos.device).expand(B, length).clone()
        pointer.scatter_(1, pos, torch.where(carried, pos, src.clamp(min=0)))
        for _ in range(k.bit_length()):  # 2 ** rounds > k, the longest chain
            pointer = pointer.gather(1, pointer)
        return values.gather(1, pointer.gather(1, pos))

    def observe(self, n, committed, target_probs, generator=None):
        # target_probs[:, j] is the target's distribution at position n + j; keep, per row, the
        # ones past its committed prefix, with a fresh (or coupled) sample from each (the Jacobi update)
        B, K1, V = target_probs.shape
        committed = per_row(committed, B, target_probs.device)
        if self.sampling.greedy:
            new = target_probs.argmax(-1)
        else:
            new = sample(target_probs, generator)
            if self.coupling and self.proposed is not None and K1 > 1:
                drafts, q = self.proposed
                new[:, :K1 - 1] = coupled_redraft(drafts, q, target_probs[:, :K1 - 1], generator)
        index = (committed[:, None] + torch.arange(K1, device=new.device)).clamp(max=K1 - 1)
        self.carried = new.gather(1, index)
        self.carried_probs = target_probs.gather(1, index[..., None].expand(B, K1, V))
        self.count = (K1 - committed).clamp(min=0).cpu()
        self.proposed = None

    def select(self, rows):
        self.count = self.count[rows.cpu()]
        if self.carried is not None:
            self.carried, self.carried_probs = self.carried[rows], self.carried_probs[rows]

    def reset(self, rows, requests):
        self.count[rows.cpu()] = 0


class DraftModelDrafter(Drafter):
    """Drafting with a smaller model of the same vocabulary (Leviathan et al. 2023).

    The draft model runs autoregressively for k tokens with its own KV cache, sampling each draft
    from q = ``sampling.probs(draft logits)``: the same guidance, temperature, top-k and top-p as
    the target. After verification its cache is cropped back to each row's accepted prefix.
    ``prefix`` is the draft model's prefix for the rows, or (with continuous batching) a function of
    the request indices, as :class:`visualspec.engine.Requests` takes it.

    ``stop_below`` ends a draft early (as transformers' ``assistant_confidence_threshold`` does):
    once every row's latest draft has probability below it under the draft model (softmax of its
    guided logits at temperature 1), no more drafts are made this step. The decision depends only
    on the draft model's own outputs, so verification stays lossless; it saves draft forwards that
    would likely be rejected, and lets a long ``window`` pay off where the draft is sure.
    """

    def __init__(self, model, prefix, tree_scheme: str = "without_replacement", stop_below: float | None = None):
        if tree_scheme not in ("without_replacement", "iid"):
            raise ValueError(f"unknown tree scheme {tree_scheme!r}; choose 'without_replacement' or 'iid'")
        if stop_below is not None and not 0.0 <= stop_below <= 1.0:
            raise ValueError(f"stop_below must be a probability in [0, 1] or None, got {stop_below!r}")
        self.model = model
        self.prefix = prefix
        self.tree_scheme = tree_scheme
        self.stop_below = stop_below
        self._forwards = 0

    @property
    def forwards(self):
        return self._forwards

    def _prefix_of(self, requests):
        return self.prefix(requests) if callable(self.prefix) else self.prefix

    def start(self, batch_size, num_tokens, sampling):
        self.sampling = sampling
        self.model.prefill(self._prefix_of(list(range(batch_size))), num_tokens)
        self._forwards = 1
        self.consumed = None  # (B,) generated positions [0, consumed) of each row are in the draft cache
        self.batch_size = batch_size

    def _rows(self, x):
        """Per-row values -> the draft model's rows (twice under guidance)."""
        return torch.cat([x, x]) if self.sampling.uses_guidance else x

    def _forward(self, window, start):
        self._forwards += 1
        return self.model.forward_window(self._rows(window), self._rows(start))

    def _catch_up(self, tokens, n):
        """Feed each row's committed tokens the draft cache lacks (at least x_{n-1}); return the
        draft logits at position n (B or 2B rows, V)."""
        if self.consumed is None:
            self.consumed = torch.zeros_like(n)
        need = n - self.consumed  # >= 1
        index = (self.consumed[:, None] + torch.arange(int(need.max()), device=n.device)).clamp(max=tokens.shape[1] - 1)
        logits = self._forward(tokens.gather(1, index), self.consumed)  # left-aligned; fillers after n-1
        last = self._rows(need - 1)[:, None, None].expand(-1, 1, logits.shape[-1])
        self.model.crop(self._rows(n))  # forget the fillers
        self.consumed = n
        return logits.gather(1, last)[:, 0]

    def propose(self, tokens, n, k, generator=None):
        B = tokens.shape[0]
        n = per_row(n, B, tokens.device)
        drafts = tokens.new_empty(B, k)
        if k == 0:
            return drafts, None
        probs = []
        logits = self._catch_up(tokens, n)
        for j in range(k):
            q = self._draft_probs(logits)
            drafts[:, j] = q.argmax(-1) if self.sampling.greedy else sample(q, generator)
            probs.append(q)
            if j + 1 == k:
                break
            if self.stop_below is not None and self._unsure(logits, drafts[:, j]):
                k = j + 1
                break
            logits = self._forward(drafts[:, j:j + 1], n + j)[:, 0]
        self.consumed = n + k - 1
        return drafts[:, :k], torch.stack(probs, 1)

    def _unsure(self, logits: torch.Tensor, drafted: torch.Tensor) -> bool:
        """Whether every row's draft ``drafted`` (B,) has draft probability below ``stop_below``."""
        p = self._guided_logits(logits).float().softmax(-1).gather(-1, drafted[:, None])
        return bool((p < self.stop_below).all())

    def _guided_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits after guidance, over the full vocabulary (B, V)."""
        return self.sampling.guide(logits)

    def _draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft distribution q (B, V) that a draft is sampled from, given the model's logits."""
        return self.sampling.probs(logits)

    def _top_tokens(self, logits: torch.Tensor, k: int) -> torch.Tensor:
        """The k most likely draft tokens (B, k), best first (greedy tree drafting)."""
        return logits.topk(k, -1).indices

    def observe(self, n, committed, target_probs, generator=None):
        # drafts at positions n..n+committed-2 were accepted; the last committed token may differ
        if self.consumed is None:
            return
        B = self.consumed.shape[0]
        n, committed = per_row(n, B, self.consumed.device), per_row(committed, B, self.consumed.device)
        self.consumed = torch.minimum(self.consumed, n + committed - 1)
        self.model.crop(self._rows(self.consumed))

    def _model_rows(self, rows):
        """Row indices -> the draft model's row indices ([cond; uncond] under guidance)."""
        return torch.cat([rows, rows + self.batch_size]) if self.sampling.uses_guidance else rows

    def select(self, rows):
        self.model.select(self._model_rows(rows))
        self.batch_size = len(rows)
        if self.consumed is not None:
            self.consumed = self.consumed[rows]

    def reset(self, rows, requests):
        if not callable(self.prefix):
            raise ValueError("continuous batching with a draft model needs its prefix as a function of the "
                             "request indices")
        self.model.refill(self._model_rows(rows), self.prefix(requests))
        self._forwards += 1
        if self.consumed is not None:
            self.consumed[rows] = 0

    def propose_tree(self, tokens, n, branches: int, depth: int, generator=None):
        """``branches`` chains of ``depth`` tokens for tree verification
        (:func:`visualspec.engine.decode_tree`): the first tokens are drawn from the draft's q by
        ``self.tree_scheme`` ("without_replacement", Gumbel-top-k, or "iid"; the top tokens at
        temperature 0), and each chain continues autoregressively, all chains in one batch (the
        draft model needs ``branch``/``unbranch``, as :class:`visualspec.hf.HFCausalLM` has)."""
        from .multidraft import DraftTree, gumbel_top_k, iid_drafts

        B = tokens.shape[0]
        n = per_row(n, B, tokens.device)
        logits = self._catch_up(tokens, n)  # the cache now holds each row's positions < n
        if self.sampling.greedy:
            first, first_q, scheme = self._top_tokens(logits, branches), None, "greedy"
        else:
            first_q, scheme = self._draft_probs(logits), self.tree_scheme
            first = gumbel_top_k(first_q.log(), branches, generator) if scheme == "without_replacement" \
                else iid_drafts(first_q, branches, generator)
        chain, chain_q = [first], []  # (B, branches) each
        if depth > 1:
            saved = self.model.branch(branches)
            positions = n.repeat_interleave(branches)
            for d in range(1, depth):
                logits = self._forward(chain[-1].reshape(-1, 1), positions + d - 1)[:, 0]
                q = self._draft_probs(logits).view(B, branches, -1)
                chain.append(q.argmax(-1) if self.sampling.greedy else sample(q, generator))
                chain_q.append(q)
            self.model.unbranch(saved)
        tokens_tree = torch.stack(chain, -1)  # (B, branches, depth)
        q_tree = None if self.sampling.greedy or depth == 1 else torch.stack(chain_q, 2)
        return DraftTree(tokens_tree, first_q, q_tree, scheme)


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

    def start(self, batch_size, num_tokens, sampling):
        if len(self.prompts) != batch_size:
            raise ValueError(f"NGramDrafter has {len(self.prompts)} prompts for a batch of {batch_size}")
        self.rows = list(range(batch_size))

    def propose(self, tokens, n, k, generator=None):
        B = tokens.shape[0]
        drafts = tokens.new_empty(B, k)
        for b, (row, length) in enumerate(zip(tokens.tolist(), per_row(n, B).tolist())):
            context = self.prompts[self.rows[b]] + row[:length]
            drafts[b] = torch.tensor(self.lookup(context, k), dtype=tokens.dtype)
        return drafts, None

    def select(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]

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


# ----------------------------------------------------------------------------------------------
# VocabTrim: a draft model whose LM head covers a kept set of tokens only
# ----------------------------------------------------------------------------------------------


def kept_token_ids(ids, vocab_size: int) -> torch.Tensor:
    """Check a set of token ids to keep and return it as a sorted, duplicate-free 1-D long tensor.

    ``ids`` is a sequence or a 1-D integer tensor; a ValueError names an empty set, a non-integer
    id and an id outside ``[0, vocab_size)``.
    """
    t = ids.detach().cpu() if isinstance(ids, torch.Tensor) else torch.tensor(list(ids), dtype=None)
    if t.numel() and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise ValueError(f"kept token ids must be integers, got {t.dtype}")
    t = t.long()
    if t.dim() != 1:
        raise ValueError(f"kept token ids must be a 1-D list of ids, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError("the kept token set (draft vocabulary) is empty")
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"kept token id {bad} is out of range for a vocabulary of {vocab_size} tokens")
    return torch.unique(t)


def frequent_tokens(token_id_lists: Iterable[Sequence[int]], size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent token ids of calibration text, for :class:`VocabTrimDrafter`.

    ``token_id_lists`` are tokenized texts (lists or 1-D tensors of ids), ideally text generated by
    the target itself (VocabTrim's calibration). The ids in ``always`` (e.g. the EOS id) are kept
    whatever their count and count toward ``size``; the rest are the most frequent ids, ties broken
    by the smaller id. Returns a sorted 1-D long tensor of at most ``size`` ids (fewer when the text
    has fewer distinct ids).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    always = list(dict.fromkeys(int(t) for t in always))
    if len(always) > size:
        raise ValueError(f"{len(always)} ids must always be kept, more than size={size}")
    counts: Counter = Counter()
    for ids in token_id_lists:
        counts.update(int(t) for t in (ids.flatten().tolist() if isinstance(ids, torch.Tensor) else ids))
    if any(t < 0 for t in list(counts) + always):
        raise ValueError("token ids must be >= 0")
    chosen = set(always)
    ranked = [t for t in sorted(counts, key=lambda t: (-counts[t], t)) if t not in chosen]
    return torch.tensor(sorted(always + ranked[: size - len(always)]), dtype=torch.long)


class VocabTrimDrafter(DraftModelDrafter):
    """A draft model with its LM head restricted to a kept set of target tokens (VocabTrim,
    Goel et al. 2025).

    Only the rows of the output embedding for the kept ids ``keep`` (K of the V tokens, e.g. the
    most frequent ones: :func:`frequent_tokens`) are computed, which makes the draft's head K/V as
    expensive. Their logits are scattered into a full-vocabulary tensor filled with ``-inf``, and q
    is ``sampling.probs`` of that tensor (guidance applied to the kept logits first). So q is
    exactly zero outside the kept set, every draft is a kept token, and exact verification stays
    lossless: a target token outside the kept set can still be emitted, from the residual.

    ``model`` is a token model of the full vocabulary (``vocab_size`` V). When it has ``head_rows``
    (:class:`visualspec.hf.HFCausalLM` built with ``head_rows=keep``) its logits are already the K
    kept columns, in the order of ``keep`` (sorted ids); otherwise it returns full logits and the
    kept columns are picked from them (the same q, without the cheaper head).
    """

    def __init__(self, model, prefix, keep, vocab_size: int | None = None, stop_below: float | None = None):
        super().__init__(model, prefix, stop_below=stop_below)
        self.vocab_size = int(vocab_size if vocab_size is not None else model.vocab_size)
        self.keep = kept_token_ids(keep, self.vocab_size)
        rows = getattr(model, "head_rows", None)
        self.trimmed_head = rows is not None
        if self.trimmed_head and not torch.equal(torch.as_tensor(rows).cpu().long(), self.keep):
            raise ValueError("the draft model's head rows differ from the kept token ids (pass sorted, unique ids)")

    def start(self, batch_size, num_tokens, sampling):
        super().start(batch_size, num_tokens, sampling)
        self._unguided = dataclasses.replace(sampling, guidance_scale=1.0)

    def _top_tokens(self, logits, k):
        keep = self.keep.to(logits.device)
        kept = logits if self.trimmed_head else logits.index_select(-1, keep)
        return keep[kept.topk(k, -1).indices]

    def _guided_logits(self, logits):
        keep = self.keep.to(logits.device)
        kept = logits if self.trimmed_head else logits.index_select(-1, keep)
        kept = self.sampling.guide(kept)  # [cond; uncond] -> B rows, on finite logits only
        full = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, keep, kept)

    def _draft_probs(self, logits):
        return self._unguided.probs(self._guided_logits(logits))


# ----------------------------------------------------------------------------------------------
# STAND: stochastic drafting from an n-gram memory of the target's distributions
# ----------------------------------------------------------------------------------------------


class StandDrafter(Drafter):
    """Stochastic drafting from a logit n-gram memory, after STAND (Song et al. 2025). Model-free.

    **Memory.** Each batch row keeps a table (an LRU ``OrderedDict`` of at most ``max_entries``
    entries) from a context, the last n tokens for every n in 1..``max_ngram``, to a sparse
    distribution: at most ``top_m`` token ids with weights w. An observation of a distribution d
    after a context adds d's ``top_m`` largest probabilities to that context's weights, for each of
    its n suffixes; the entry then keeps its ``top_m`` heaviest tokens (ties: smaller id). Weights
    are therefore a running sum of the target's distributions after that context, truncated to the
    top ``top_m``. The table is seeded from the prompt, each prompt token adding weight 1 (a point
    mass) after its contexts, and learns from the target's own verification distributions: for
    every committed position, ``target_probs`` at that position (given to :meth:`observe`) is
    stored after the committed context before it (the first generated token, which has none,
    adds a point mass). Entries used or updated least recently are evicted first.

    **Drafting.** For draft j the context is the committed tokens plus drafts 0..j-1; its longest
    suffix in the table gives the draft distribution ``q(x) = w(x) / sum(w)`` over the stored ids
    (zero elsewhere), and the draft is sampled from exactly that q, which :meth:`propose` returns
    (B, k, V) so that :func:`visualspec.verify.speculative_verify` stays lossless. With no stored
    suffix the draft repeats the last token as a point mass. At temperature 0 the draft is
    ``argmax q`` (ties: smaller id) and the drafts are returned as point masses (``None``).

    :meth:`propose_tree` drafts a tree for tree verification: ``branches`` distinct first tokens
    drawn from q without replacement (Gumbel-top-k), each followed by a chain.
    """

    def __init__(self, prompts, vocab_size: int, max_ngram: int = 3, top_m: int = 8, max_entries: int = 65536):
        for name, value in (("vocab_size", vocab_size), ("max_ngram", max_ngram), ("top_m", top_m),
                            ("max_entries", max_entries)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.prompts = [list(map(int, p)) for p in prompts]
        for p in self.prompts:
            if p and not (0 <= min(p) and max(p) < vocab_size):
                raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got {p}")
        self.vocab_size, self.max_ngram, self.top_m, self.max_entries = vocab_size, max_ngram, top_m, max_entries
        self.tables: list[OrderedDict] = []

    # -- the memory -----------------------------------------------------------------------------

    def start(self, batch_size, num_tokens, sampling):
        if len(self.prompts) != batch_size:
            raise ValueError(f"StandDrafter has {len(self.prompts)} prompts for a batch of {batch_size}")
        self.sampling = sampling
        self.rows = list(range(batch_size))  # the prompt of each row
        self.tables = [OrderedDict() for _ in self.prompts]
        self.learned = [0] * batch_size  # generated positions [0, learned[b]) of row b are in its table
        self.pending = [{} for _ in self.prompts]  # per row: position -> (ids, probabilities), from observe
        for table, p in zip(self.tables, self.prompts):
            for t in range(1, len(p)):
                self._learn(table, p[max(0, t - self.max_ngram):t], [(p[t], 1.0)])

    def select(self, rows):
        rows = rows.tolist()
        for name in ("rows", "tables", "learned", "pending"):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in rows])

    def _learn(self, table: OrderedDict, context: list, items: list) -> None:
        """Add weights ``items`` [(token, weight)] after every suffix of ``context``."""
        for size in range(1, min(self.max_ngram, len(context)) + 1):
            key = tuple(context[-size:])
            entry = table.pop(key, None) or {}  # re-inserted below: now the most recently used
            for t, w in items:
                entry[t] = entry.get(t, 0.0) + w
            if len(entry) > self.top_m:
                entry = dict(sorted(entry.items(), key=lambda tw: (-tw[1], tw[0]))[: self.top_m])
            table[key] = entry
        while len(table) > self.max_entries:
            table.popitem(last=False)

    def _lookup(self, table: OrderedDict, context: list):
        """The entry of the longest suffix of ``context`` stored in ``table``, or None."""
        for size in range(min(self.max_ngram, len(context)), 0, -1):
            key = tuple(context[-size:])
            entry = table.get(key)
            if entry is not None:
                table.move_to_end(key)
                return entry
        return None

    def observe(self, n, committed, target_probs, generator=None):
        # positions n..n+committed-1 follow committed tokens only; store their top_m, learned at
        # the next propose (which sees the committed tokens)
        vals, ids = target_probs.topk(min(self.top_m, target_probs.shape[-1]), dim=-1)
        vals, ids = vals.tolist(), ids.tolist()
        B = target_probs.shape[0]
        for b, (start, count) in enumerate(zip(per_row(n, B).tolist(), per_row(committed, B).tolist())):
            for j in range(count):
                self.pending[b][start + j] = (ids[b][j], vals[b][j])

    def _catch_up(self, tokens: torch.Tensor, n: torch.Tensor) -> None:
        """Learn each row's generated positions [learned, n) from its committed tokens."""
        for b, (row, length) in enumerate(zip(tokens.tolist(), per_row(n, tokens.shape[0]).tolist())):
            if length <= self.learned[b]:
                continue
            prompt, table, pending = self.prompts[self.rows[b]], self.tables[b], self.pending[b]
            for pos in range(self.learned[b], length):
                context = (prompt + row[:pos])[-self.max_ngram:] if pos < self.max_ngram else row[pos - self.max_ngram:pos]
                dist = pending.pop(pos, None)
                items = [(row[pos], 1.0)] if dist is None else [(t, w) for t, w in zip(*dist) if w > 0]
                self._learn(table, context, items)
            self.pending[b] = {pos: d for pos, d in pending.items() if pos >= length}
            self.learned[b] = length

    def _contexts(self, tokens: torch.Tensor, n: torch.Tensor) -> list:
        """The last ``max_ngram`` tokens of prompt + committed tokens, per row."""
        out = []
        for b, (row, length) in enumerate(zip(tokens.tolist(), per_row(n, tokens.shape[0]).tolist())):
            out.append((self.prompts[self.rows[b]] + row[:length])[-self.max_ngram:])
        return out

    # -- drafting -------------------------------------------------------------------------------

    def _dense(self, tables: list, contexts: list, device) -> torch.Tensor:
        """q (R, V) for contexts[i] looked up in tables[i]: the normalised entry, or a point mass
        on the last token where no suffix is stored."""
        rows, cols, vals = [], [], []
        for i, (table, ctx) in enumerate(zip(tables, contexts)):
            entry = self._lookup(table, ctx)
            if entry is None:
                rows.append(i), cols.append(ctx[-1]), vals.append(1.0)
                continue
            total = sum(entry.values())
            for t, w in entry.items():
                rows.append(i), cols.append(t), vals.append(w / total)
        q = torch.zeros(len(contexts), self.vocab_size, device=device)
        q[rows, cols] = torch.tensor(vals, dtype=torch.float32, device=device)
        return q

    def _chains(self, tables: list, contexts: list, shape: tuple, k: int, device, generator=None):
        """k tokens after each context (extended in place): tokens (*shape, k), q (*shape, k, V)."""
        if k == 0:
            return (torch.empty(*shape, 0, dtype=torch.long, device=device),
                    torch.empty(*shape, 0, self.vocab_size, device=device))
        drafts, probs = [], []
        for _ in range(k):
            q = self._dense(tables, contexts, device).view(*shape, self.vocab_size)
            x = q.argmax(-1) if self.sampling.greedy else sample(q, generator)
            drafts.append(x)
            probs.append(q)
            for ctx, t in zip(contexts, x.flatten().tolist()):
                ctx.append(t)
                if len(ctx) > self.max_ngram:
                    del ctx[0]
        return torch.stack(drafts, -1), torch.stack(probs, -2)

    def propose(self, tokens, n, k, generator=None):
        self._catch_up(tokens, n)
        B = tokens.shape[0]
        if k == 0:
            return tokens.new_empty(B, 0), None
        drafts, q = self._chains(self.tables, self._contexts(tokens, n), (B,), k, tokens.device, generator)
        return drafts.to(tokens.dtype), (None if self.sampling.greedy else q)

    def propose_tree(self, tokens: torch.Tensor, n: torch.Tensor, branches: int, depth: int, generator=None):
        """A draft tree after ``tokens[:, :n]``: ``branches`` chains of ``depth`` tokens, returned as a
        :class:`visualspec.multidraft.DraftTree` for the tree decoder.

        The first tokens are ``branches`` draws without replacement from the first-token q
        (``first_q``, B x V) by :func:`visualspec.multidraft.gumbel_top_k`, in draw order (scheme
        ``"without_replacement"``, verified by :func:`visualspec.multidraft.rsd_verify`); when q has
        fewer tokens of positive mass than ``branches``, the trailing first tokens have q = 0 and
        every rule rejects them. Each chain then continues after its own first token exactly as
        :meth:`propose` drafts (``chain_q``, B x branches x (depth - 1) x V). At temperature 0 the
        first tokens are the ``branches`` most probable ones and the chains are argmax drafts
        (scheme ``"greedy"``, no distributions).
        """
        from .multidraft import DraftTree, gumbel_top_k

        if not 1 <= branches <= self.vocab_size or depth < 1:
            raise ValueError(f"need 1 <= branches <= {self.vocab_size} and depth >= 1, "
                             f"got branches={branches}, depth={depth}")
        self._catch_up(tokens, n)
        B, device = tokens.shape[0], tokens.device
        contexts = self._contexts(tokens, n)
        q0 = self._dense(self.tables, contexts, device)  # (B, V)
        if self.sampling.greedy:
            first = q0.topk(branches, dim=-1).indices
        else:
            first = gumbel_top_k(q0.double().log(), branches, generator)
        branch_ctx = [(ctx + [t])[-self.max_ngram:] for ctx, row in zip(contexts, first.tolist()) for t in row]
        tables = [table for table in self.tables for _ in range(branches)]
        rest, chain_q = self._chains(tables, branch_ctx, (B, branches), depth - 1, device, generator)
        tree_tokens = torch.cat([first[..., None], rest.to(first.dtype)], -1).to(tokens.dtype)
        if self.sampling.greedy:
            return DraftTree(tree_tokens, None, None, "greedy")
        return DraftTree(tree_tokens, q0, chain_q, "without_replacement")
