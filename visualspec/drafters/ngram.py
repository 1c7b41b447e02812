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
    are point masses for verification (accept with probability p(x)). A step drafts only what
    matched, as transformers' prompt lookup does: as many tokens as the longest continuation a row
    found (at most k; none where no row matched: a plain one-token step), a row with a shorter one
    filled with its last token repeated (docs/experiments/2026-12-07-ngram-draft-what-matched.md:
    filling every window cost 7 to 21 % of the speed and added no accepted token).
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

    def contexts(self, tokens, n) -> list[list[int]]:
        """Each row's context: its prompt, then its ``n`` committed tokens of ``tokens`` (B, ...)."""
        return [self.prompts[self.rows[b]] + row[:length]
                for b, (row, length) in enumerate(zip(tokens.tolist(), per_row(n, tokens.shape[0]).tolist()))]

    def propose(self, tokens, n, k, generator=None):
        contexts = self.contexts(tokens, n)
        follows = [self.continuation(context, k)[0] for context in contexts]
        width = max(map(len, follows))
        if width == 0:
            return tokens.new_empty(tokens.shape[0], 0), None
        return filled([f or context[-1:] for f, context in zip(follows, contexts)], tokens, width), None

    def select(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the context's last n-gram."""
        if k == 0:
            return []
        follow = self.continuation(context, k)[0] or context[-1:]
        return follow + follow[-1:] * (k - len(follow))

    def continuation(self, context: list[int], k: int) -> tuple[list[int], int]:
        """``(follow, n)``: the at most k tokens that followed the context's longest earlier n-gram
        (``min_ngram <= n <= max_ngram``; the latest of equal length), and n; ``([], 0)`` where none."""
        end, size = longest_match(context, self.max_ngram) if k else (-1, 0)
        if size < self.min_ngram:
            return [], 0
        return context[end + 1:end + 1 + k], size


def filled(rows: list, like: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """Rows of drafts (non-empty lists) as a (B, width) tensor of ``like``'s dtype and device, each
    row filled to ``width`` (default: the longest row's length) with its last draft again."""
    width = width or max(map(len, rows))
    return torch.tensor([r + r[-1:] * (width - len(r)) for r in rows], dtype=like.dtype, device=like.device)


def longest_match(context: list[int], longest: int) -> tuple[int, int]:
    """``(e, n)``: the earlier occurrence of the context's end that matches it longest, ending at
    index e < len(context) - 1, and the length n of the match, at most ``longest``; among matches
    of equal length the most recent (largest e). ``(-1, 0)`` where the last token occurs nowhere
    before. With x the context and L its length: n(e) = max m <= min(longest, e + 1) with
    x[e - i] = x[L - 1 - i] for i < m, and e = argmax (n(e), e).

    One pass finds the earlier occurrences of the last token; each is then extended backwards, so
    the cost is the context's length plus the matches' lengths."""
    if len(context) < 2 or longest < 1:
        return -1, 0
    last, L = context[-1], len(context)
    best_end, best = -1, 0
    for e in [i for i, t in enumerate(context[:-1]) if t == last][::-1]:  # most recent first
        cap = min(longest, e + 1)
        if cap <= best:
            continue
        m = 1
        while m < cap and context[e - m] == context[L - 1 - m]:
            m += 1
        if m > best:
            best_end, best = e, m
            if best == longest:
                break
    return best_end, best


# ----------------------------------------------------------------------------------------------
# VocabTrim: a draft model whose LM head covers a kept set of tokens only
# ----------------------------------------------------------------------------------------------
