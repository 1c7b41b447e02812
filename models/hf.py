"""Any Hugging Face transformers causal LM as a token model for the decode engine."""

from __future__ import annotations

import copy
import inspect

import torch

# the per-row state beside the cache (what select, branch and refill carry along)
_ROW_STATE = ("prefix_mask", "first_position", "column_position", "column_valid")


class HFCausalLM:
    """Adapter from a transformers ``AutoModelForCausalLM`` to :class:`visualspec.core.engine.TokenModel`.

    The prefix is ``input_ids`` (B, T) or ``(input_ids, attention_mask)`` for left-padded batches;
    positions follow the attention mask, so padded rows generate exactly as they would alone.
    The KV cache is a transformers ``DynamicCache``, cropped after every verification.

    ``head_rows`` (optional, a 1-D list or tensor of K token ids) trims the LM head for VocabTrim
    (:class:`visualspec.drafters.VocabTrimDrafter`): the base model's last hidden state goes
    through those K rows of the output embedding only (and its bias), so the logits have K columns,
    in the order of ``head_rows``, and the head costs K/V of the full one. ``vocab_size`` stays the
    full V. This assumes the model's logits are its LM head applied to the base model's output (as
    in Llama, Mistral, Qwen, GPT-2, ...); a ``final_logit_softcapping`` in the config is applied too.
    Without ``head_rows`` the adapter returns the model's own full logits, or with ``raw_head=True``
    the LM head applied to the base model's output: transformers' Chameleon sets the image tokens'
    logits to the lowest float (it only generates text), and image generation needs them.
    """

    def __init__(self, model, head_rows=None, raw_head: bool = False):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        if not getattr(model.config, "use_cache", True):
            raise ValueError(f"{type(model).__name__} has use_cache=False; speculative decoding needs a KV cache")
        self.model = model
        forward = inspect.signature(model.forward).parameters
        self._cache_keyword = "cache" if "cache" in forward else "past_key_values"
        head = model.get_output_embeddings()
        self.vocab_size = head.weight.shape[0]
        self.cache = None
        self.head_rows = None
        self.raw_head = raw_head
        if raw_head and model.base_model is model:
            raise ValueError(f"{type(model).__name__} has no separate base model to read raw logits from")
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
        """Logits of the model (all V columns, or the K ``head_rows``) for ``inputs``. The KV cache
        goes in under the keyword this transformers version names it (``cache``, formerly
        ``past_key_values``)."""
        inputs[self._cache_keyword] = inputs.pop("past_key_values")
        if self.head_rows is None and not self.raw_head:
            return self.model(**inputs).logits
        hidden = self.model.base_model(**inputs).last_hidden_state
        if last_only:
            hidden = hidden[:, -1:]
        if self.head_rows is None:  # raw_head: the LM head alone, without the class's own logit masking
            return self.model.get_output_embeddings()(hidden)
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
        self.prefix_len = input_ids.shape[1]
        positions = (self.prefix_mask.cumsum(-1) - 1).clamp(min=0)
        self.first_position = positions[:, -1:] + 1  # position id of generated token 0, per row
        # cache columns: the prefix, then every fed token; per row, the generated position each
        # column holds (-1 for the prefix) and whether the row may attend to it
        self.column_position = torch.full_like(self.prefix_mask, -1)
        self.column_valid = self.prefix_mask.bool()
        self.cache = DynamicCache(config=self.model.config)
        logits = self._logits(last_only=True, input_ids=input_ids, attention_mask=self.prefix_mask,
                              position_ids=positions, past_key_values=self.cache, use_cache=True)
        return logits[:, -1].float()

    def _append(self, positions: torch.Tensor) -> None:
        """Record the columns of tokens just fed at generated positions ``positions`` (B, L)."""
        self.column_position = torch.cat([self.column_position, positions], 1)
        self.column_valid = torch.cat([self.column_valid, torch.ones_like(positions, dtype=torch.bool)], 1)

    def forward_window(self, tokens: torch.Tensor, start) -> torch.Tensor:
        """Tokens (B, L), row b at generated positions start[b].. (an int or (B,) tensor). The
        window attends to each row's valid columns and causally to itself."""
        B, L = tokens.shape
        start = torch.as_tensor(start, device=tokens.device).expand(B)
        positions = start[:, None] + torch.arange(L, device=tokens.device)
        mask = None
        if not bool(self.column_valid.all()):  # ragged rows or a padded prefix: say which columns count
            mask = torch.cat([self.column_valid, self.column_valid.new_ones(B, L)], 1).long()
        logits = self._logits(input_ids=tokens, attention_mask=mask, position_ids=self.first_position + positions,
                              past_key_values=self.cache, use_cache=True).float()
        self._append(positions)
        return logits

    def crop(self, lengths) -> None:
        """Keep each row's generated positions < lengths[b]; drop trailing columns no row uses."""
        lengths = torch.as_tensor(lengths, device=self.column_position.device).expand(self.column_valid.shape[0])
        self.column_valid &= self.column_position < lengths[:, None]
        used = self.column_valid.any(0).nonzero()
        keep = max(self.prefix_len, int(used.max()) + 1 if len(used) else 0)
        remove = self.column_valid.shape[1] - keep
        if remove > 0:  # a negative argument removes that many tokens, in old and new transformers alike
            self.cache.crop(-remove)
            self.column_position = self.column_position[:, :keep]
            self.column_valid = self.column_valid[:, :keep]

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (in that order) and drop the others."""
        self.cache.batch_select_indices(rows)
        for name in _ROW_STATE:
            setattr(self, name, getattr(self, name)[rows])
        self._pack_columns()

    def refill(self, rows: torch.Tensor, prefix) -> torch.Tensor:
        """Start new sequences in rows ``rows`` (continuous batching): run ``prefix`` (r rows) alone,
        then write its cache into those rows, right-aligned to the prefix columns (every row's cache
        is left-padded with columns nobody attends to when the new prefix is longer); the columns
        of tokens fed since are invalid for the new rows. Returns logits (r, V) for position 0."""
        old = {name: getattr(self, name) for name in ("cache", "prefix_len", *_ROW_STATE)}
        logits = self.prefill(prefix, 0)
        new = {name: getattr(self, name) for name in old}
        for name, value in old.items():
            setattr(self, name, value)
        if new["prefix_len"] > self.prefix_len:
            self._pad_left(new["prefix_len"] - self.prefix_len)
        rows = torch.as_tensor(rows, device=self.column_valid.device)
        r, columns, pad = len(rows), self.column_valid.shape[1], self.prefix_len - new["prefix_len"]
        for layer, fresh in zip(self.cache.layers, new["cache"].layers):
            for name in ("keys", "values"):
                value = getattr(fresh, name)
                full = value.new_zeros(r, value.shape[1], columns, value.shape[3])
                full[:, :, pad:self.prefix_len] = value
                getattr(layer, name)[rows] = full
        self.prefix_mask[rows] = torch.nn.functional.pad(new["prefix_mask"], (pad, 0))
        self.first_position[rows] = new["first_position"]
        self.column_position[rows] = -1
        self.column_valid[rows] = torch.nn.functional.pad(new["column_valid"], (pad, columns - self.prefix_len))
        self._pack_columns()
        return logits

    def _pack_columns(self) -> None:
        """Move each row's valid columns after the prefix to the front of that region, in their
        order, and cut the columns no row needs: the cache of a queue stays as wide as the prefix
        and its longest live row, however many sequences went through it. Past keys may stand in
        any order: they carry their rotary positions, and every past column is before every new
        one."""
        generated = self.column_valid[:, self.prefix_len:]
        width = int(generated.sum(1).max()) if generated.numel() else 0
        if width == generated.shape[1]:
            return
        rows = generated.shape[0]
        order = torch.argsort((~generated).to(torch.int8), dim=1, stable=True)[:, :width] + self.prefix_len
        columns = torch.cat([torch.arange(self.prefix_len, device=order.device).expand(rows, -1), order], 1)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                value = getattr(layer, name)
                index = columns[:, None, :, None].expand(rows, value.shape[1], -1, value.shape[3])
                setattr(layer, name, value.gather(2, index))
        self.column_position = self.column_position.gather(1, columns)
        self.column_valid = self.column_valid.gather(1, columns)

    def _pad_left(self, n: int) -> None:
        """Put ``n`` prefix columns that no row attends to before every row's cache."""
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                value = getattr(layer, name)
                setattr(layer, name, torch.nn.functional.pad(value, (0, 0, n, 0)))
        self.prefix_mask = torch.nn.functional.pad(self.prefix_mask, (n, 0))
        self.column_position = torch.nn.functional.pad(self.column_position, (n, 0), value=-1)
        self.column_valid = torch.nn.functional.pad(self.column_valid, (n, 0))
        self.prefix_len += n

    # ------------------------------------------------------------------ trees and branches

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     start) -> torch.Tensor:
        """Tree attention (see :class:`visualspec.core.engine.TreeTokenModel`): one forward over the
        flattened tree with a 4-D mask, node i of row b at position ``start[b] + depths[i]``."""
        B, N = tokens.shape
        start = torch.as_tensor(start, device=tokens.device).expand(B)
        past = self.column_valid.shape[1]
        allowed = torch.cat([self.column_valid[:, None, :].expand(B, N, past), ancestors[None].expand(B, N, N)], dim=2)
        dtype = self.model.get_output_embeddings().weight.dtype
        mask = torch.zeros(B, 1, N, past + N, dtype=dtype, device=tokens.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        positions = start[:, None] + depths[None].to(tokens.device)
        logits = self._logits(input_ids=tokens, attention_mask=mask, position_ids=self.first_position + positions,
                              past_key_values=self.cache, use_cache=True).float()
        self._append(positions)
        self.tree_nodes = N
        return logits

    def keep(self, nodes: torch.Tensor, counts: torch.Tensor) -> None:
        """Of the last tree's nodes, keep ``nodes[b, :counts[b]]`` of each row b; drop the others."""
        kept = torch.arange(nodes.shape[1], device=nodes.device)[None] < counts[:, None]
        valid = torch.zeros(nodes.shape[0], self.tree_nodes, dtype=torch.bool, device=nodes.device)
        valid.scatter_(1, nodes, kept)
        self.column_valid[:, -self.tree_nodes:] = valid
        self.crop(torch.full_like(counts, torch.iinfo(torch.long).max))

    def branch(self, k: int):
        """Repeat every row k times (rows b*k .. b*k+k-1 continue row b) and return what
        :meth:`unbranch` needs to restore the unbranched state; used to draft k chains at once."""
        saved = (self.cache, {name: getattr(self, name) for name in _ROW_STATE})
        self.cache = copy.deepcopy(self.cache)
        self.cache.batch_repeat_interleave(k)
        for name in _ROW_STATE:
            setattr(self, name, getattr(self, name).repeat_interleave(k, 0))
        return saved

    def unbranch(self, saved) -> None:
        self.cache, values = saved
        for name, value in values.items():
            setattr(self, name, value)
