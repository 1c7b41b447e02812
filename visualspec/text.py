"""Speculative decoding for Hugging Face causal language models, on the image pipelines' core.

    out = generate_text(model, tokenizer, "def fib(n):", drafter="ngram", max_new_tokens=64, temperature=0)
    out.text, out.token_ids, out.stats

The target is wrapped as a token model (:class:`visualspec.hf.HFCausalLM`) and decoded by the one
engine (:func:`visualspec.engine.decode`) with the verification rules of :mod:`visualspec.verify`;
nothing here re-implements a rule. Drafters:

- a transformers model (a smaller one with the same vocabulary): :class:`DraftModelDrafter`;
- ``"ngram"``: prompt lookup (:class:`visualspec.drafters.NGramDrafter`), deterministic drafts;
- ``"jacobi"``: Jacobi self-drafting (:class:`visualspec.drafters.JacobiDrafter`).

``acceptance="exact"`` is lossless speculative sampling (greedy matching at ``temperature=0``);
``"typical"`` is Medusa's typical acceptance (lossy).

Generation stops at ``max_new_tokens``; the text and ``token_ids`` end at the first end-of-sequence
token, as transformers' ``generate`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from .drafters import DraftModelDrafter, JacobiDrafter, NGramDrafter
from .engine import decode
from .hf import HFCausalLM
from .sampling import SamplingConfig, check_sampling_args, make_generator
from .stats import DecodeStats
from .verify import greedy_verify, speculative_verify, typical_verify

DRAFTERS = ("ngram", "jacobi")
ACCEPTANCE = ("exact", "typical")


@dataclass
class TextOutput:
    """``text``: the new text (a string, or a list for a list of prompts); ``token_ids``: the new
    tokens of each row up to and including the first EOS; ``stats``: the decode statistics."""

    text: str | list[str]
    token_ids: list[list[int]]
    stats: DecodeStats


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _encode(tokenizer, prompt):
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("prompt must be a non-empty string or a non-empty list of non-empty strings")
    side, pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"  # generation continues every row from its last real token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad
    return prompts, enc.input_ids, enc.attention_mask


def _drafter(drafter, model, prefix, input_ids, attention_mask, window: int, ngram: int):
    if drafter is None:
        return None
    if isinstance(drafter, str):
        if drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {drafter!r}; choose one of {DRAFTERS} or pass a draft model")
        if drafter == "ngram":
            rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
            return NGramDrafter(rows, max_ngram=ngram)
        return JacobiDrafter(_vocab_size(model), "repeat_left")
    if not hasattr(drafter, "get_output_embeddings"):
        raise TypeError(f"drafter must be a transformers model or one of {DRAFTERS}, not {type(drafter).__name__}")
    if _vocab_size(drafter) != _vocab_size(model):
        raise ValueError(f"the draft model's vocabulary ({_vocab_size(drafter)} tokens) differs from the target's "
                         f"({_vocab_size(model)}); draft and target must share one tokenizer")
    return DraftModelDrafter(HFCausalLM(drafter), prefix)


@torch.no_grad()
def generate_text(model, tokenizer, prompt, drafter=None, acceptance: str = "exact", max_new_tokens: int = 64,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                  generator=None, window: int = 8, ngram: int = 3, typical_epsilon: float = 0.09,
                  typical_delta: float = 0.3) -> TextOutput:
    """Generate ``max_new_tokens`` tokens after ``prompt`` (a string or a list of strings).

    ``drafter``: ``None`` (plain autoregressive), a draft model, ``"ngram"`` or ``"jacobi"``;
    ``window``: tokens per target forward (``window - 1`` drafts); ``temperature=0`` is greedy.
    """
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"unknown acceptance {acceptance!r}; choose one of {ACCEPTANCE}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    check_sampling_args(temperature, top_k, top_p, 1.0)
    prompts, input_ids, attention_mask = _encode(tokenizer, prompt)
    device = next(model.parameters()).device
    prefix = (input_ids.to(device), attention_mask.to(device))
    target = HFCausalLM(model)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    drafts = _drafter(drafter, model, prefix, input_ids, attention_mask, window, ngram)
    if acceptance == "typical":
        rule = partial(typical_verify, epsilon=typical_epsilon, delta=typical_delta)
    else:
        rule = greedy_verify if sampling.greedy else speculative_verify
    tokens, stats = decode(target, prefix, max_new_tokens, sampling, drafter=drafts, rule=rule, window=window,
                           generator=make_generator(seed, generator, device=device),
                           mode="ar" if drafts is None else (drafter if isinstance(drafter, str) else "draft model"))
    eos = tokenizer.eos_token_id
    token_ids = []
    for row in tokens.tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        token_ids.append(row)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids]
    return TextOutput(text=texts[0] if isinstance(prompt, str) else texts, token_ids=token_ids, stats=stats)
