"""STAND: a stochastic n-gram memory of the target's own distributions."""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..core.checks import check_positive_int, check_probability
from ..core.engine import Drafter
from ..core.multidraft import DraftTree, gumbel_top_k
from ..core.rows import per_row


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
    (B, k, V) so that :func:`visualspec.core.verify.speculative_verify` stays lossless. With no stored
    suffix the draft repeats the last token as a point mass. At temperature 0 the draft is
    ``argmax q`` (ties: smaller id) and the drafts are returned as point masses (``None``).

    ``stop_below`` ends a step's chain early: once every row's latest draft has probability below
    it under q (that draft kept), no more drafts are made, as a draft model's ``stop_below`` does.
    The stop depends only on the drafts drawn and their laws, so verification stays lossless; it
    saves window columns where STAND's memory is unsure.

    :meth:`propose_tree` drafts a tree for tree verification: ``branches`` distinct first tokens
    drawn from q without replacement (Gumbel-top-k), each followed by a chain.
    """

    def __init__(self, prompts, vocab_size: int, max_ngram: int = 3, top_m: int = 8, max_entries: int = 65536,
                 stop_below: float | None = None):
        for name, value in (("vocab_size", vocab_size), ("max_ngram", max_ngram), ("top_m", top_m),
                            ("max_entries", max_entries)):
            check_positive_int(name, value)
        self.stop_below = None if stop_below is None else check_probability("stop_below", stop_below)
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
        # the next propose (which sees the committed tokens). At temperature 0 each distribution is
        # a point mass on the token committed there, which that catch-up learns without it
        if self.sampling.greedy:
            return
        vals, ids = target_probs.topk(min(self.top_m, target_probs.shape[-1]), dim=-1)
        vals, ids = vals.tolist(), ids.tolist()
        B = target_probs.shape[0]
        for b, (start, count) in enumerate(zip(per_row(n, B).tolist(), per_row(committed, B).tolist())):
            for j in range(count):
                self.pending[b][start + j] = (ids[b][j], vals[b][j])

    def _catch_up(self, tokens: torch.Tensor, n: torch.Tensor) -> list:
        """Learn each row's generated positions [learned, n) from its committed tokens; returns the
        rows' contexts (:meth:`_contexts`), from the same one read of the tokens."""
        rows, lengths = tokens.tolist(), per_row(n, tokens.shape[0]).tolist()
        for b, (row, length) in enumerate(zip(rows, lengths)):
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
        return self._row_contexts(rows, lengths)

    def _contexts(self, tokens: torch.Tensor, n: torch.Tensor) -> list:
        """The last ``max_ngram`` tokens of prompt + committed tokens, per row."""
        return self._row_contexts(tokens.tolist(), per_row(n, tokens.shape[0]).tolist())

    def _row_contexts(self, rows: list, lengths: list) -> list:
        """:meth:`_contexts` of the rows' tokens and committed counts, as lists."""
        m = self.max_ngram
        return [row[length - m:length] if length >= m else (self.prompts[self.rows[b]] + row[:length])[-m:]
                for b, (row, length) in enumerate(zip(rows, lengths))]

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

    def _chains(self, tables: list, contexts: list, shape: tuple, k: int, device, generator=None,
                stop_below: float | None = None):
        """k tokens after each context (extended in place): tokens (*shape, k), q (*shape, k, V);
        with ``stop_below``, fewer, ending at the first draft every context's q gives less than it."""
        if k == 0:
            return (torch.empty(*shape, 0, dtype=torch.long, device=device),
                    torch.empty(*shape, 0, self.vocab_size, device=device))
        drafts, probs = [], []
        for _ in range(k):
            q = self._dense(tables, contexts, device).view(*shape, self.vocab_size)
            x = self.sampling.draw(q, generator)
            drafts.append(x)
            probs.append(q)
            if stop_below is not None and bool((q.gather(-1, x[..., None]) < stop_below).all()):
                break
            self._advance(contexts, x.flatten().tolist())
        return torch.stack(drafts, -1), torch.stack(probs, -2)

    def _advance(self, contexts: list, tokens: list) -> None:
        """Each context (its last ``max_ngram`` tokens) followed by its token, in place."""
        for ctx, t in zip(contexts, tokens):
            ctx.append(t)
            if len(ctx) > self.max_ngram:
                del ctx[0]

    def _greedy_chains(self, contexts: list, k: int, stop_below: float | None = None) -> list:
        """:meth:`_chains` at temperature 0 without its dense laws: per context, the heaviest stored
        token (ties: the smaller id), argmax q, or the last token where nothing is stored; with
        ``stop_below``, ending at the first draft whose weight share is below it in every context.
        The drafts, a list of steps of one token per context."""
        drafts = []
        for _ in range(k):
            step, sure = [], stop_below is None
            for table, ctx in zip(self.tables, contexts):
                entry = self._lookup(table, ctx)
                if entry is None:
                    step.append(ctx[-1])
                    sure = True
                    continue
                token, weight = min(entry.items(), key=lambda tw: (-tw[1], tw[0]))
                step.append(token)
                if not sure:
                    sure = weight >= stop_below * sum(entry.values())
            drafts.append(step)
            if not sure:
                break
            self._advance(contexts, step)
        return drafts

    def propose(self, tokens, n, k, generator=None):
        contexts = self._catch_up(tokens, n)
        B = tokens.shape[0]
        if k == 0:
            return tokens.new_empty(B, 0), None
        if self.sampling.greedy:  # point masses: no law to build
            drafts = self._greedy_chains(contexts, k, self.stop_below)
            return torch.tensor(drafts, dtype=tokens.dtype, device=tokens.device).T.reshape(B, -1), None
        drafts, q = self._chains(self.tables, contexts, (B,), k, tokens.device, generator, self.stop_below)
        return drafts.to(tokens.dtype), q

    def propose_tree(self, tokens: torch.Tensor, n: torch.Tensor, branches: int, depth: int, generator=None):
        """A draft tree after ``tokens[:, :n]``: ``branches`` chains of ``depth`` tokens, returned as a
        :class:`visualspec.core.multidraft.DraftTree` for the tree decoder.

        The first tokens are ``branches`` draws without replacement from the first-token q
        (``first_q``, B x V) by :func:`visualspec.core.multidraft.gumbel_top_k`, in draw order (scheme
        ``"without_replacement"``, verified by :func:`visualspec.core.multidraft.rsd_verify`); when q has
        fewer tokens of positive mass than ``branches``, the trailing first tokens have q = 0 and
        every rule rejects them. Each chain then continues after its own first token exactly as
        :meth:`propose` drafts (``chain_q``, B x branches x (depth - 1) x V). At temperature 0 the
        first tokens are the ``branches`` most probable ones and the chains are argmax drafts
        (scheme ``"greedy"``, no distributions).
        """

        if not 1 <= branches <= self.vocab_size or depth < 1:
            raise ValueError(f"need 1 <= branches <= {self.vocab_size} and depth >= 1, "
                             f"got branches={branches}, depth={depth}")
        contexts = self._catch_up(tokens, n)
        B, device = tokens.shape[0], tokens.device
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
