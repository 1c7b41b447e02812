"""Prompt lookup: drafts copied from the context after the latest n-gram match."""

from __future__ import annotations

import torch

from ..core.engine import Drafter
from ..core.rows import per_row


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
