"""Drafting with a smaller model of the same vocabulary, whole or with a trimmed LM head."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, Sequence

import torch

from ..core.checks import check_positive_int
from ..core.engine import Drafter
from ..core.multidraft import DraftTree, gumbel_top_k, iid_drafts
from ..core.rows import per_row
from ..core.window_costs import config_hash, first_parameter


class DraftModelDrafter(Drafter):
    """Drafting with a smaller model of the same vocabulary (Leviathan et al. 2023).

    The draft model runs autoregressively for k tokens with its own KV cache, sampling each draft
    from q = ``sampling.probs(draft logits)``: the same guidance, temperature, top-k and top-p as
    the target. After verification its cache is cropped back to each row's accepted prefix.
    ``prefix`` is the draft model's prefix for the rows, or (with continuous batching) a function of
    the request indices, as :class:`visualspec.core.engine.Requests` takes it.

    ``stop_below`` ends a draft early (as transformers' ``assistant_confidence_threshold`` does):
    once every row's latest draft has probability below it under the draft model (softmax of its
    guided logits at temperature 1), no more drafts are made this step. The decision depends only
    on the draft model's own outputs, so verification stays lossless; it saves draft forwards that
    would likely be rejected, and lets a long ``window`` pay off where the draft is sure.
    """

    prices_drafts = True

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
        return self.sampling.model_batch(x)

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
            drafts[:, j] = self.sampling.draw(q, generator)
            probs.append(q)
            if j + 1 == k:
                break
            if self.stop_below is not None and self._unsure(logits, drafts[:, j]):
                k = j + 1
                break
            logits = self._forward(drafts[:, j:j + 1], n + j)[:, 0]
        self.consumed = n + k - 1
        return drafts[:, :k], torch.stack(probs, 1)

    def draft_timer(self, batch_size, num_tokens, sampling):
        """Proposals as a decode step makes them: the k + 1 tokens the step before committed caught
        up in one draft forward, then k - 1 one-token forwards and k draws (never stopping early:
        ``stop_below`` is a saving the timer does not count), after a prefill of ``batch_size``
        rows (the prefix must cover them: a function of the request indices does)."""
        self.start(batch_size, num_tokens, sampling)
        param = first_parameter(self.model)
        tokens = torch.zeros(batch_size, num_tokens, dtype=torch.long, device=None if param is None else param.device)
        filled = 0  # positions the draft cache holds (a cache that grows must hold those before a forward)

        def propose(n: int, k: int) -> None:
            nonlocal filled
            before = max(n - k - 1, 0)
            if before > filled:
                self._forward(tokens[:, filled:before], torch.full((batch_size,), filled, device=tokens.device))
            self.consumed = torch.full((batch_size,), before, device=tokens.device)
            self.model.crop(self._rows(self.consumed))
            stop, self.stop_below = self.stop_below, None
            try:
                self.propose(tokens, torch.full((batch_size,), n, device=tokens.device), k)
            finally:
                self.stop_below = stop
            filled = n + k - 1

        return propose

    def cost_tag(self):
        return f"{type(self).__name__}={config_hash(self.model)}"

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
        return self.sampling.model_rows(rows, self.batch_size)

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
        (:func:`visualspec.core.tree.decode_tree`): the first tokens are drawn from the draft's q by
        ``self.tree_scheme`` ("without_replacement", Gumbel-top-k, or "iid"; the top tokens at
        temperature 0), and each chain continues autoregressively, all chains in one batch (the
        draft model needs ``branch``/``unbranch``, as :class:`visualspec.models.hf.HFCausalLM` has)."""

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
                chain.append(self.sampling.draw(q, generator))
                chain_q.append(q)
            self.model.unbranch(saved)
        tokens_tree = torch.stack(chain, -1)  # (B, branches, depth)
        q_tree = None if self.sampling.greedy or depth == 1 else torch.stack(chain_q, 2)
        return DraftTree(tokens_tree, first_q, q_tree, scheme)


def full_vocabulary(kept: torch.Tensor, keep: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits (..., K) of the kept token ids ``keep`` (K,) placed in a (..., ``vocab_size``) tensor
    that is -inf at every other id, so that any sampling gives those ids probability zero."""
    full = kept.new_full((*kept.shape[:-1], vocab_size), float("-inf"))
    return full.index_copy_(-1, keep.to(kept.device), kept)


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
    check_positive_int("size", size)
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
    (:class:`visualspec.models.hf.HFCausalLM` built with ``head_rows=keep``) its logits are already the K
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
        return full_vocabulary(self.sampling.guide(kept), keep, self.vocab_size)  # guided on finite logits only

    def _draft_probs(self, logits):
        return self._unguided.probs(self._guided_logits(logits))


# ----------------------------------------------------------------------------------------------
# STAND: stochastic drafting from an n-gram memory of the target's distributions
# ----------------------------------------------------------------------------------------------
