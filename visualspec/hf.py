"""Any Hugging Face transformers causal LM as a token model for the decode engine."""

from __future__ import annotations

import copy

import torch


class HFCausalLM:
    """Adapter from a transformers ``AutoModelForCausalLM`` to :class:`visualspec.engine.TokenModel`.

    The prefix is ``input_ids`` (B, T) or ``(input_ids, attention_mask)`` for left-padded batches;
    positions follow the attention mask, so padded rows generate exactly as they would alone.
    The KV cache is a transformers ``DynamicCache``, cropped after every verification.

    ``head_rows`` (optional, a 1-D list or tensor of K token ids) trims the LM head for VocabTrim
    (:class:`visualspec.drafters.VocabTrimDrafter`): the base model's last hidden state goes
    through those K rows of the output embedding only (and its bias), so the logits have K columns,
    in the order of ``head_rows``, and the head costs K/V of the full one. ``vocab_size`` stays the
    full V. This assumes the model's logits are its LM head applied to the base model's output (as
    in Llama, Mistral, Qwen, GPT-2, ...); a ``final_logit_softcapping`` in the config is applied too.
    Without ``head_rows`` the adapter returns the model's own full logits.
    """

    def __init__(self, model, head_rows=None):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        if not getattr(model.config, "use_cache", True):
            raise ValueError(f"{type(model).__name__} has use_cache=False; speculative decoding needs a KV cache")
        self.model = model
        head = model.get_output_embeddings()
        self.vocab_size = head.weight.shape[0]
        self.cache = None
        self.head_rows = None
        if head_rows is not None:
            rows = torch.as_tensor(head_rows).to(device=head.weight.device)
            if rows.dim() != 1 or rows.numel() == 0 or rows.is_floating_point() or rows.dtype == torch.bool:
                raise ValueError("head_rows must be a non-empty 1-D list of token ids")
            if int(rows.min()) < 0 or int(rows.max()) >= self.vocab_size:
                raise ValueError(f"head_rows must be token ids in [0, {self.vocab_size})")
            if model.base_model is model:
                raise ValueError(f"cannot trim the LM head of {type(model).__name__}: it has no separate base model")
            self.head_rows = rows.long()
            self.head_weight = head.weight.detach()[self.head_rows].contiguous()  # (K, hidden)
            bias = getattr(head, "bias", None)
            self.head_bias = None if bias is None else bias.detach()[self.head_rows]
            self.softcap = getattr(model.config, "final_logit_softcapping", None)

    def _logits(self, last_only: bool = False, **inputs) -> torch.Tensor:
        """Logits of the model (all V columns, or the K ``head_rows``) for ``inputs``."""
        if self.head_rows is None:
            return self.model(**inputs).logits
        hidden = self.model.base_model(**inputs).last_hidden_state
        if last_only:
            hidden = hidden[:, -1:]
        logits = torch.nn.functional.linear(hidden, self.head_weight, self.head_bias)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def prefill(self, prefix, max_new_tokens: int) -> torch.Tensor:
        from transformers import DynamicCache

        input_ids, attention_mask = prefix if isinstance(prefix, (tuple, list)) else (prefix, None)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        self.prefix_mask = attention_mask.long()
        self.padded = not bool(self.prefix_mask.all())  # unpadded: the model builds its causal mask itself
        self.prefix_len = input_ids.shape[1]
        positions = (self.prefix_mask.cumsum(-1) - 1).clamp(min=0)
        self.first_position = positions[:, -1:] + 1  # position id of generated token 0, per row
        self.cache = DynamicCache(config=self.model.config)
        logits = self._logits(last_only=True, input_ids=input_ids, attention_mask=self.prefix_mask,
                              position_ids=positions, past_key_values=self.cache, use_cache=True)
        return logits[:, -1].float()

    def forward_window(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        B, L = tokens.shape
        mask = torch.cat([self.prefix_mask, self.prefix_mask.new_ones(B, start + L)], dim=1) if self.padded else None
        positions = self.first_position + start + torch.arange(L, device=tokens.device)
        return self._logits(input_ids=tokens, attention_mask=mask, position_ids=positions,
                            past_key_values=self.cache, use_cache=True).float()

    def crop(self, length: int) -> None:
        # a negative argument removes that many tokens, in old and new transformers alike
        remove = self.cache.get_seq_length() - (self.prefix_len + length)
        if remove > 0:
            self.cache.crop(-remove)

    # ------------------------------------------------------------------ trees and branches

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     start: int) -> torch.Tensor:
        """Tree attention (see :class:`visualspec.engine.TreeTokenModel`): one forward over the
        flattened tree with a 4-D mask, node i at position ``start + depths[i]``."""
        B, N = tokens.shape
        past = self.cache.get_seq_length()
        allowed = torch.cat([self.prefix_mask.bool(), self.prefix_mask.new_ones(B, past - self.prefix_len).bool()], 1)
        allowed = torch.cat([allowed[:, None, :].expand(B, N, past), ancestors[None].expand(B, N, N)], dim=2)
        dtype = self.model.get_output_embeddings().weight.dtype
        mask = torch.zeros(B, 1, N, past + N, dtype=dtype, device=tokens.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        positions = self.first_position + start + depths[None].to(tokens.device)
        return self._logits(input_ids=tokens, attention_mask=mask, position_ids=positions,
                            past_key_values=self.cache, use_cache=True).float()

    def _layers(self):
        """(keys, values, setter) of every cache layer, across transformers versions."""
        if hasattr(self.cache, "layers"):
            for layer in self.cache.layers:
                yield layer.keys, layer.values, lambda k, v, layer=layer: (setattr(layer, "keys", k),
                                                                           setattr(layer, "values", v))
        else:  # transformers < 4.56
            for i in range(len(self.cache.key_cache)):
                def put(k, v, i=i):
                    self.cache.key_cache[i], self.cache.value_cache[i] = k, v
                yield self.cache.key_cache[i], self.cache.value_cache[i], put

    def keep(self, start: int, nodes: torch.Tensor) -> None:
        """Keep the cache before ``start`` and, per row, the tree nodes ``nodes`` (B, m) in order."""
        base = self.prefix_len + start
        for keys, values, put in self._layers():
            index = nodes[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1]).to(keys.device)
            put(torch.cat([keys[:, :, :base], keys[:, :, base:].gather(2, index)], dim=2),
                torch.cat([values[:, :, :base], values[:, :, base:].gather(2, index)], dim=2))

    def branch(self, k: int):
        """Repeat every row k times (rows b*k .. b*k+k-1 continue row b) and return what
        :meth:`unbranch` needs to restore the unbranched state; used to draft k chains at once."""
        saved = (self.cache, self.prefix_mask, self.first_position)
        self.cache = copy.deepcopy(self.cache)
        self.cache.batch_repeat_interleave(k)
        self.prefix_mask = self.prefix_mask.repeat_interleave(k, 0)
        self.first_position = self.first_position.repeat_interleave(k, 0)
        return saved

    def unbranch(self, saved) -> None:
        self.cache, self.prefix_mask, self.first_position = saved
