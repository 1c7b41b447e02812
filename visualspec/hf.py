"""Any Hugging Face transformers causal LM as a token model for the decode engine."""

from __future__ import annotations

import torch


class HFCausalLM:
    """Adapter from a transformers ``AutoModelForCausalLM`` to :class:`visualspec.engine.TokenModel`.

    The prefix is ``input_ids`` (B, T) or ``(input_ids, attention_mask)`` for left-padded batches;
    positions follow the attention mask, so padded rows generate exactly as they would alone.
    The KV cache is a transformers ``DynamicCache``, cropped after every verification.
    """

    def __init__(self, model):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        if not getattr(model.config, "use_cache", True):
            raise ValueError(f"{type(model).__name__} has use_cache=False; speculative decoding needs a KV cache")
        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.cache = None

    def prefill(self, prefix, max_new_tokens: int) -> torch.Tensor:
        from transformers import DynamicCache

        input_ids, attention_mask = prefix if isinstance(prefix, (tuple, list)) else (prefix, None)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        self.prefix_mask = attention_mask.long()
        self.prefix_len = input_ids.shape[1]
        positions = (self.prefix_mask.cumsum(-1) - 1).clamp(min=0)
        self.first_position = positions[:, -1:] + 1  # position id of generated token 0, per row
        self.cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=self.prefix_mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()

    def forward_window(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        B, L = tokens.shape
        mask = torch.cat([self.prefix_mask, self.prefix_mask.new_ones(B, start + L)], dim=1)
        positions = self.first_position + start + torch.arange(L, device=tokens.device)
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True)
        return out.logits.float()

    def crop(self, length: int) -> None:
        # a negative argument removes that many tokens, in old and new transformers alike
        remove = self.cache.get_seq_length() - (self.prefix_len + length)
        if remove > 0:
            self.cache.crop(-remove)
