"""Any Hugging Face transformers causal LM as a token model for the decode engine."""

from __future__ import annotations

import copy
import inspect
import math
import weakref

import torch

from visualspec.core.compiled import COMPILED_WINDOWS, StepCompiler, dense, dense_args, fixed_address, step_compiler

# the per-row state beside the cache (what select, branch and refill carry along)
_ROW_STATE = ("prefix_mask", "first_position", "column_position", "column_valid")

STATIC_ROUND = 128  # a static cache's length is a multiple of this: one compiled graph per multiple
STATIC_SLACK = 64   # columns past prefix + new tokens for the windows and trees in flight

# one step compiler per transformers model, whichever adapter runs it: a later call with the same
# model (a new HFCausalLM each generate_text call) finds its buckets compiled
_COMPILERS: "weakref.WeakKeyDictionary[torch.nn.Module, StepCompiler]" = weakref.WeakKeyDictionary()
_TREE_COMPILERS: "weakref.WeakKeyDictionary[torch.nn.Module, StepCompiler]" = weakref.WeakKeyDictionary()
# models whose step torch could not compile with a post inside (HFCausalLM.takes_post)
_POSTS_REFUSED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def static_length(needed: int, round_to: int = STATIC_ROUND) -> int:
    """The columns of a static cache that must hold ``needed``: ``ceil(needed / round_to) * round_to``."""
    return math.ceil(needed / round_to) * round_to


def window_bucket(length: int) -> int:
    """The compiled window a window of ``length`` tokens runs in: the next power of two,
    ``2 ** ceil(log2(length))``, so windows 1 to 32 need six graphs, not 32 (the padding
    tokens' logits are dropped and their cache columns given back)."""
    if length < 1:
        raise ValueError(f"a window has at least one token, got {length}")
    return 1 << (length - 1).bit_length()


def visible(valid: torch.Tensor, start: torch.Tensor, length: int) -> torch.Tensor:
    """(B, 1, L, M) bool: key column c is visible to query i of a window fed at columns
    ``start .. start + L - 1`` iff ``valid[b, c]`` and ``c <= start + i`` (causal), for
    ``valid`` (B, M) and a 0-d ``start``."""
    columns = torch.arange(valid.shape[1], device=valid.device)
    queries = start + torch.arange(length, device=valid.device)
    return valid[:, None, None, :] & (columns[None, :] <= queries[:, None])[None, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as the additive float mask transformers takes: 0 where allowed, the dtype's
    lowest value elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                         torch.finfo(dtype).min)


def linear_rows(layer: torch.nn.Module, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight (K, D) and bias (K,) or None of a linear layer's output rows ``rows`` (K,), copied
    contiguous and detached: the layer restricted to K of its outputs, for K/V of its cost."""
    rows = rows.to(layer.weight.device)
    bias = getattr(layer, "bias", None)
    return layer.weight.detach()[rows].contiguous(), None if bias is None else bias.detach()[rows]


class KeptHead(torch.nn.Module):
    """An LM head restricted to the token ids ``keep`` (K,): logits over the whole vocabulary of
    ``vocab_size``, the head's at ``keep`` and -inf elsewhere, computed from the K kept rows only
    (FR-Spec's draft head, as a module a compiled draft chain calls)."""

    def __init__(self, head: torch.nn.Module, keep: torch.Tensor, vocab_size: int):
        super().__init__()
        weight, bias = linear_rows(head, keep)
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.register_buffer("keep", keep.to(weight.device), persistent=False)
        self.vocab_size = vocab_size

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        kept = torch.nn.functional.linear(features, self.weight, self.bias)
        return kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf")).index_copy(-1, self.keep, kept)


_KEPT_HEADS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


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

    ``static=True`` keeps the cache in transformers' ``StaticCache`` instead: fixed buffers of
    :func:`static_length` columns, written in place, every forward given its full (B, 1, L, M)
    mask (:func:`visible`), so a window's forward has the same shapes at every step. That is what
    :meth:`compile_step` compiles.
    """

    def __init__(self, model, head_rows=None, raw_head: bool = False, static: bool = False):
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
        self.static = self._static_choice = bool(static)
        self._compiler = self._tree_compiler = None
        self._compiled = False
        self._prefill_rows = 0
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
            self.head_weight, self.head_bias = linear_rows(head, self.head_rows)  # (K, hidden), (K,)
            self.softcap = getattr(model.config, "final_logit_softcapping", None)

    def _logits(self, last_only: bool = False, features: bool | tuple = False, **inputs):
        """Logits of the model (all V columns, or the K ``head_rows``) for ``inputs``; with
        ``features``, ``(logits, features)``: the base model's last hidden states (B, L, D), which
        the LM head reads (so this assumes the model's logits are its head applied to them, as
        ``head_rows`` does), or, where ``features`` is a tuple of indices of transformers'
        ``hidden_states`` (a fusing drafter's request, EAGLE-3), those states side by side (B, L,
        nD). The KV cache goes in under the keyword this transformers version names it (``cache``,
        formerly ``past_key_values``)."""
        inputs[self._cache_keyword] = inputs.pop("past_key_values")
        if self.head_rows is None and not self.raw_head and not features:
            return self.model(**inputs).logits
        layers = features if isinstance(features, tuple) else None
        out = self.model.base_model(**inputs, **({"output_hidden_states": True} if layers else {}))
        hidden = out.last_hidden_state
        states = hidden if layers is None else torch.cat([out.hidden_states[i] for i in layers], -1)
        if last_only:
            hidden = hidden[:, -1:]
        if self.head_rows is None:  # the LM head alone (raw_head: without the class's own logit masking)
            logits = self.model.get_output_embeddings()(hidden)
        else:
            logits = torch.nn.functional.linear(hidden, self.head_weight, self.head_bias)
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
        return (logits, states) if features else logits

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's input embeddings of ``tokens`` (what a feature drafter reads beside the features)."""
        return self.model.get_input_embeddings()(tokens)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """The LM head on ``features`` (B, L, D): logits (B, L, V) in float32, as :meth:`forward_window`
        gives them for the features it returns (all V columns; a trimmed head's K)."""
        if self.head_rows is None:
            return self.model.get_output_embeddings()(features).float()
        logits = torch.nn.functional.linear(features, self.head_weight, self.head_bias)
        return (torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits).float()

    def chain_modules(self, keep: torch.Tensor | None = None):
        """``(head, embedding)``: the modules :meth:`head` and :meth:`embed_tokens` call, for a
        feature drafter's compiled draft chain, which calls them inside its graph (they outlive this
        adapter, so the graphs serve every call on the model); with ``keep`` (K token ids), the head
        restricted to them (:class:`KeptHead`, made once per model and set of ids, as
        :meth:`kept_head` computes it); None where the head is trimmed (``head_rows``) or an adapter
        reads its head or embeddings otherwise (Janus's generation head: its own :meth:`head`)."""
        own = type(self).head is HFCausalLM.head and type(self).embed_tokens is HFCausalLM.embed_tokens
        if self.head_rows is not None or not own:
            return None
        head = self.model.get_output_embeddings()
        if keep is not None:
            heads = _KEPT_HEADS.setdefault(self.model, {})
            ids = tuple(keep.tolist())
            if ids not in heads:
                heads[ids] = KeptHead(head, keep, self.vocab_size)
            head = heads[ids]
        return head, self.model.get_input_embeddings()

    def kept_head(self, keep: torch.Tensor):
        """The LM head of :meth:`head` restricted to token ids ``keep`` (K,): a function of features
        (..., D) giving logits (..., K) in float32, :meth:`head`'s columns at ``keep`` for K/V of its
        cost (a feature drafter's frequency-ranked draft head, FR-Spec)."""
        if self.head_rows is not None:
            raise ValueError("this target's LM head is trimmed already (head_rows); give the full model")
        weight, bias = linear_rows(self.model.get_output_embeddings(), keep)
        return lambda features: torch.nn.functional.linear(features, weight, bias).float()

    @property
    def feature_size(self) -> int:
        """The width D of the features :meth:`forward_window` returns with ``features=True``."""
        return self.model.get_output_embeddings().weight.shape[1]

    def prefill(self, prefix, max_new_tokens: int, static: bool | None = None, features: bool | tuple = False):
        """Reset the cache and run ``prefix``; logits (B, V) for generated position 0, and with
        ``features`` also the prefix's features (B, T, D), column for column (padding included).
        As a new decode begins, each compiled bucket's guards are checked once more, then skipped
        (:meth:`~visualspec.core.compiled.StepCompiler.recheck`)."""
        from transformers import DynamicCache, StaticCache

        for compiler in (self._compiler, self._tree_compiler):
            if compiler is not None:
                compiler.recheck()
        static = self.static if static is None else static
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
        self._prefill_rows = input_ids.shape[0]
        if not static:
            self.cache = DynamicCache(config=self.model.config)
            mask = self.prefix_mask
        else:
            length = static_length(self.prefix_len + max_new_tokens + STATIC_SLACK)
            self.cache = self._reused_static_cache(length, input_ids.shape[0]) or StaticCache(
                config=self.model.config, max_cache_len=length)
            mask = self._static_mask(self.column_valid, 0, self.prefix_len)
        out = self._logits(last_only=True, features=features, input_ids=input_ids, attention_mask=mask,
                           position_ids=positions, past_key_values=self.cache, use_cache=True)
        if features:
            return out[0][:, -1].float(), out[1]
        return out[:, -1].float()

    def _reused_static_cache(self, length: int, rows: int):
        """The last prefill's static cache, emptied, when its buffers have ``rows`` rows and ``length``
        columns on the model's device and dtype (else None). Reusing it keeps the buffers' addresses,
        which a CUDA graph of the step has baked in: new ones would make torch record it again."""
        from transformers import StaticCache

        layers = getattr(self.cache, "layers", None)
        if not isinstance(self.cache, StaticCache) or not all(
                getattr(layer, "is_initialized", False) and layer.max_cache_len == length
                and layer.keys.shape[0] == rows and layer.keys.shape[2] == length
                and layer.keys.device == self.model.device and layer.keys.dtype == self._dtype
                for layer in layers):
            return None
        self.cache.reset()
        return self.cache

    def _append(self, positions: torch.Tensor) -> None:
        """Record the columns of tokens just fed at generated positions ``positions`` (B, L)."""
        self.column_position = torch.cat([self.column_position, positions], 1)
        self.column_valid = torch.cat([self.column_valid, torch.ones_like(positions, dtype=torch.bool)], 1)

    #: whether :meth:`forward_window` takes ``post`` (the engine's sampling and rule, or a drafter's
    #: whole step, run inside the step). Text drafters may stop early, so a text decode's windows take
    #: every length up to its longest: the engine's sampler and rule run in the window's power-of-two
    #: bucket (:func:`window_bucket`), their arguments padded (:func:`pads`), as a window without
    #: them does; a drafter's whole step runs at its own length.
    posts_inside = True

    @property
    def takes_post(self) -> bool:
        """Whether :meth:`forward_window` takes ``post``: :attr:`posts_inside`, unless torch could not
        compile this model's step with one (:func:`~visualspec.core.engine.precompile_decode` then
        sets it False, for every adapter of the model from then on: a pipeline makes one a call)."""
        return self.posts_inside and self.model not in _POSTS_REFUSED

    @takes_post.setter
    def takes_post(self, value: bool) -> None:
        (_POSTS_REFUSED.discard if value else _POSTS_REFUSED.add)(self.model)

    def forward_window(self, tokens: torch.Tensor, start, features: bool | tuple = False, post=None, post_args=(),
                       compile_new: bool = False):
        """Tokens (B, L), row b at generated positions start[b].. (an int or (B,) tensor). The
        window attends to each row's valid columns and causally to itself. Returns logits (B, L, V),
        and with ``features`` ``(logits, features (B, L, D))``: the last hidden states the head read
        (a tuple of hidden-state indices: those states side by side, (B, L, nD); see :meth:`_logits`).

        ``post(logits, *post_args)``, if given (where :attr:`takes_post`), runs on the logits inside
        the step, in its compiled graph where the step is compiled, and its result is returned in
        their place (the engine's :class:`~visualspec.core.sampling.StepSampler`, or a drafter's
        whole step, whose ``window`` makes the window from ``post_args``: ``tokens`` give its
        shape); ``post_args`` hold one row per row. ``post`` must be hashable: each distinct one
        gets its own graphs, one per window bucket (:func:`pads`; a drafter's whole step: one per
        window length), compiled by :meth:`precompile` (``compile_new``: now) and never mid-decode."""
        B, L = tokens.shape
        start = torch.as_tensor(start, device=tokens.device).expand(B)
        positions = start[:, None] + torch.arange(L, device=tokens.device)
        if self.static:
            out = self._static_window(tokens, self.first_position + positions, features, post, post_args, compile_new)
            self._append(positions)
            return out
        if hasattr(post, "window"):
            tokens, post_args = post.window(tokens, *post_args)
        mask = None
        if not bool(self.column_valid.all()):  # ragged rows or a padded prefix: say which columns count
            mask = torch.cat([self.column_valid, self.column_valid.new_ones(B, L)], 1).long()
        out = self._logits(features=features, input_ids=tokens, attention_mask=mask,
                           position_ids=self.first_position + positions, past_key_values=self.cache, use_cache=True)
        self._append(positions)
        return _then(post, post_args, out, features)

    def crop(self, lengths) -> None:
        """Keep each row's generated positions < lengths[b]. A dynamic cache gives back the trailing
        columns no row uses; a static one keeps them, masked, until it fills and packs
        (:meth:`_make_room`): finding which trailing ones to give back would read the device a step
        (docs/experiments/2026-12-07-text-step-inside.md)."""
        lengths = torch.as_tensor(lengths, device=self.column_position.device).expand(self.column_valid.shape[0])
        self.column_valid &= self.column_position < lengths[:, None]
        if self.static:
            return
        used = self.column_valid.any(0).nonzero()
        keep = max(self.prefix_len, int(used.max()) + 1 if len(used) else 0)
        remove = self.column_valid.shape[1] - keep
        if remove > 0:  # a negative argument removes that many tokens, in old and new transformers alike
            self.cache.crop(-remove)
            self.column_position = self.column_position[:, :keep]
            self.column_valid = self.column_valid[:, :keep]

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (in that order) and drop the others."""
        if self.static:
            self._map_cache(lambda value: value[rows])
        else:
            self.cache.batch_select_indices(rows)
        for name in _ROW_STATE:
            setattr(self, name, getattr(self, name)[rows])
        self._pack_columns()

    def refill(self, rows: torch.Tensor, prefix, features: bool | tuple = False):
        """Start new sequences in rows ``rows`` (continuous batching): run ``prefix`` (r rows) alone,
        then write its cache into those rows, right-aligned to the prefix columns (every row's cache
        is left-padded with columns nobody attends to when the new prefix is longer); the columns
        of tokens fed since are invalid for the new rows. Returns logits (r, V) for position 0 (with
        ``features``, and the prefix's features, as :meth:`prefill` gives them)."""
        old = {name: getattr(self, name) for name in ("cache", "prefix_len", "_prefill_rows", *_ROW_STATE)}
        logits = self.prefill(prefix, 0, static=False, features=features)
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
                getattr(layer, name)[rows, :, :columns] = full
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
                if self.static:  # in place: the buffers keep their length
                    value[:, :, :columns.shape[1]] = value.gather(2, index)
                else:
                    setattr(layer, name, value.gather(2, index))
        self.column_position = self.column_position.gather(1, columns)
        self.column_valid = self.column_valid.gather(1, columns)

    def _pad_left(self, n: int) -> None:
        """Put ``n`` prefix columns that no row attends to before every row's cache."""
        if self.static:
            self._make_room(n)
        columns = self.column_valid.shape[1]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                value = getattr(layer, name)
                if self.static:
                    value[:, :, n:columns + n] = value[:, :, :columns].clone()
                    value[:, :, :n] = 0
                else:
                    setattr(layer, name, torch.nn.functional.pad(value, (0, 0, n, 0)))
        self.prefix_mask = torch.nn.functional.pad(self.prefix_mask, (n, 0))
        self.column_position = torch.nn.functional.pad(self.column_position, (n, 0), value=-1)
        self.column_valid = torch.nn.functional.pad(self.column_valid, (n, 0))
        self.prefix_len += n

    # ------------------------------------------------------------------ trees and branches

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     start, features: bool | tuple = False, compile_new: bool = False):
        """Tree attention (see :class:`visualspec.core.engine.TreeTokenModel`): one forward over the
        flattened tree with a 4-D mask, node i of row b at position ``start[b] + depths[i]``;
        ``ancestors`` (N, N), or (B, N, N) for trees shaped per row. ``features``: also the last
        hidden states (B, N, D), as :meth:`forward_window` gives them. With the step compiled, a
        tree shape runs its graph once :meth:`precompile_tree` compiled it (``compile_new``: compile
        it now), else eagerly, so nothing compiles mid-decode."""
        B, N = tokens.shape
        start = torch.as_tensor(start, device=tokens.device).expand(B)
        if self.static:
            self._make_room(N)
        past = self.column_valid.shape[1]
        ancestors = ancestors.expand(B, N, N)
        allowed = torch.cat([self.column_valid[:, None, :].expand(B, N, past), ancestors], dim=2)
        if self.static:  # the columns past the tree are invisible
            allowed = torch.nn.functional.pad(allowed, (0, self._static_columns() - past - N))
        mask = additive_mask(allowed[:, None], self._dtype)
        positions = start[:, None] + depths[None].to(tokens.device)
        column = torch.tensor(past, device=tokens.device) if self.static else None  # where the tree's columns go
        if self._compiled and self.static:
            key = _bucket(B, -N, mask.shape[-1], self._dtype, tokens.device, self.head_rows is not None, features)
            out = self._tree_compiler(key, self, dense(tokens), dense(self.first_position + positions), dense(mask),
                                      features, column, compile_new=compile_new)
        else:
            out = _masked_forward(self, tokens, self.first_position + positions, mask, features, column)
        self._append(positions)
        self.tree_nodes = N
        return (out[0].float(), out[1]) if features else out.float()

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
        if self.static:
            self._map_cache(lambda value: value.repeat_interleave(k, 0))
        else:
            self.cache.batch_repeat_interleave(k)
        for name in _ROW_STATE:
            setattr(self, name, getattr(self, name).repeat_interleave(k, 0))
        return saved

    def unbranch(self, saved) -> None:
        self.cache, values = saved
        for name, value in values.items():
            setattr(self, name, value)

    # ------------------------------------------------------------------ the static cache and compiled step (#48)

    @property
    def _dtype(self) -> torch.dtype:
        """The model's float dtype (its LM head's): the masks' and the compiled graphs'."""
        return self.model.get_output_embeddings().weight.dtype

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """Run window forwards of up to :data:`COMPILED_WINDOWS` tokens through ``torch.compile``
        (``enabled=False``: eagerly again, on the cache the adapter was made with); ``mode`` is
        ``torch.compile``'s (``"auto"``: CUDA graphs on a GPU,
        :func:`~visualspec.core.compiled.compile_mode`). Compiling needs the static cache, so this sets ``static`` too (from
        the next :meth:`prefill`). A window runs in its :func:`window_bucket`, so a decode needs
        one graph per power of two up to its longest window (and per batch size and cache
        length), each compiled once (:meth:`precompile` compiles them before a decode, with one
        progress line each). Prefills, trees and refills stay eager, and so do the rows left once
        some have finished (:meth:`select`), unless their bucket was compiled before: nothing
        compiles mid-decode."""
        if enabled:
            self.static = True
            self._compiler = _COMPILERS[self.model] = step_compiler(
                _COMPILERS.get(self.model), _window_forward, f"the {type(self.model).__name__} decode step",
                _describe_bucket, mode, self.model.device)
            self._tree_compiler = _TREE_COMPILERS[self.model] = step_compiler(
                _TREE_COMPILERS.get(self.model), _masked_forward, f"the {type(self.model).__name__} tree step",
                _describe_bucket, mode, self.model.device)
        else:
            self.static = self._static_choice
        self._compiled = bool(enabled)

    @property
    def compiled_step(self) -> bool:
        """Whether window forwards run compiled (:meth:`compile_step`)."""
        return self._compiled

    @torch.no_grad()
    def precompile(self, prefix, max_new_tokens: int, windows, features: bool | tuple = False, post=None) -> None:
        """Compile the bucket of every window length in ``windows`` that a decode of ``prefix`` runs
        (its rows, its cache length; ``features``: the steps that also return features, for a
        feature drafter; ``post``: the steps that run it, one graph per window length, with arguments
        of the shapes its ``example_args`` gives), so that none compiles inside the decode or a
        timed call.
        Leaves junk in the cache when it compiles: prefill again before decoding."""
        if not self._compiled:
            raise RuntimeError("precompile() compiles the compiled step: call compile_step() first")
        input_ids = prefix[0] if isinstance(prefix, (tuple, list)) else prefix
        rows, columns = input_ids.shape[0], static_length(input_ids.shape[1] + max_new_tokens + STATIC_SLACK)
        runs = sorted({window_bucket(w) if pads(post) else w for w in windows if 1 <= w <= COMPILED_WINDOWS})
        todo = [run for run in runs
                if _bucket(rows, run, columns, self._dtype, input_ids.device, self.head_rows is not None, features)
                + (() if post is None else (post,)) not in self._compiler.compile_s]
        if todo:
            self.prefill(prefix, max_new_tokens)
        for run in todo:
            args = () if post is None else post.example_args(rows, run, self.vocab_size, input_ids.device)
            self.forward_window(torch.zeros(rows, run, dtype=torch.long, device=input_ids.device), 0, features=features,
                                post=post, post_args=args, compile_new=True)
            self.crop(0)

    @torch.no_grad()
    def precompile_tree(self, prefix, max_new_tokens: int, nodes: int, features: bool | tuple = False) -> None:
        """Compile the tree forward of ``nodes`` nodes (:meth:`forward_tree`: a dynamic tree's fixed
        size) that a decode of ``prefix`` runs, as :meth:`precompile` does the windows; leaves junk
        in the cache when it compiles."""
        if not self._compiled:
            raise RuntimeError("precompile_tree() compiles the compiled step: call compile_step() first")
        input_ids = prefix[0] if isinstance(prefix, (tuple, list)) else prefix
        rows, device = input_ids.shape[0], input_ids.device
        columns = static_length(input_ids.shape[1] + max_new_tokens + STATIC_SLACK)  # as precompile() sizes them
        if _bucket(rows, -nodes, columns, self._dtype, device, self.head_rows is not None,
                   features) in self._tree_compiler.compile_s:
            return
        self.prefill(prefix, max_new_tokens)
        chain = torch.ones(nodes, nodes, dtype=torch.bool, device=device).tril()
        self.forward_tree(torch.zeros(rows, nodes, dtype=torch.long, device=device), torch.arange(nodes, device=device),
                          chain, 0, features=features, compile_new=True)

    def _static_window(self, tokens: torch.Tensor, positions: torch.Tensor, features: bool | tuple = False, post=None,
                       post_args=(), compile_new: bool = False):
        """A window forward on the static cache: (B, L) tokens at position ids ``positions``,
        compiled in its :func:`window_bucket` when the step is compiled (the padding tokens sit
        after the window, where nothing real attends them; the next window writes over their
        columns, :func:`write_from`), and
        ``post`` on its logits (:meth:`forward_window`: its arguments padded to the bucket and its
        output cropped back, :func:`pads`; a drafter's whole step runs at the window's own length),
        in a graph compiled before the decode, else eagerly."""
        B, L = tokens.shape
        run = window_bucket(L) if self._compiled and L <= COMPILED_WINDOWS and pads(post) else L
        if run > L:
            extra = torch.arange(1, run - L + 1, device=tokens.device)
            tokens = torch.cat([tokens, tokens.new_zeros(B, run - L)], 1)
            positions = torch.cat([positions, positions[:, -1:] + extra], 1)
            if post is not None:
                post_args = post.padded(post_args, L, run)
        valid = self._static_mask_columns(L, room=run)
        start = torch.tensor(self.column_valid.shape[1], device=tokens.device)
        key = _bucket(B, run, valid.shape[1], self._dtype, tokens.device, self.head_rows is not None, features)
        key += () if post is None else (post,)
        if self._compiled and run <= COMPILED_WINDOWS and (key in self._compiler.compile_s or compile_new
                                                          or B == self._prefill_rows and post is None):
            tokens, positions, *post_args = dense_args([tokens, positions, *post_args])  # one layout per bucket
            out = self._compiler(key, self, tokens, positions, valid, start, features, post, *post_args)
        else:  # rows that finished left the batch (or a window no graph was compiled for): the rest runs
            out = _window_forward(self, tokens, positions, valid, start, features, post, *post_args)  # eagerly
        if post is not None:
            return post.cropped(out, L) if run > L else out
        logits, states = out if features else (out, None)
        if run > L:
            logits, states = logits[:, :L], None if states is None else states[:, :L]
        return (logits.float(), states) if features else logits.float()

    def _static_mask_columns(self, length: int, room: int) -> torch.Tensor:
        """(B, M) bool: the valid cache columns, then ``length`` window columns, once there is room
        for ``room`` >= ``length`` columns (the window and its padding)."""
        self._make_room(room)
        past = self.column_valid.shape[1]
        valid = self.column_valid.new_zeros(self.column_valid.shape[0], self._static_columns())
        valid[:, :past] = self.column_valid
        valid[:, past:past + length] = True
        return valid

    def _static_mask(self, valid: torch.Tensor, start: int, length: int) -> torch.Tensor:
        """The additive (B, 1, L, M) mask of a window at columns ``start ..`` over ``valid`` (B, <= M)."""
        padded = torch.nn.functional.pad(valid, (0, self._static_columns() - valid.shape[1]))
        return additive_mask(visible(padded, torch.tensor(start), length),
                             self._dtype)

    def _static_columns(self) -> int:
        return self.cache.layers[0].max_cache_len

    def _make_room(self, extra: int) -> None:
        """Room for ``extra`` columns after the cache's: when they do not fit, pack each row's
        valid columns first (rows that accept different numbers of drafts leave holes, so the
        shared columns outgrow every single row); grow the buffers (a new length bucket, so a new
        graph) only when that is not enough."""
        if self.column_valid.shape[1] + extra <= self._static_columns():
            return
        self._pack_columns()
        needed = self.column_valid.shape[1] + extra
        if needed <= self._static_columns():
            return
        length = static_length(needed + STATIC_SLACK)
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                for name in ("keys", "values"):
                    value = getattr(layer, name)
                    grown = value.new_zeros(*value.shape[:2], length, value.shape[3])
                    grown[:, :, :value.shape[2]] = value
                    setattr(layer, name, fixed_address(grown))
            layer.max_cache_len = length

    def _map_cache(self, fn) -> None:
        """Replace every layer's keys and values by ``fn`` of them."""
        for layer in self.cache.layers:
            layer.keys, layer.values = fixed_address(fn(layer.keys)), fixed_address(fn(layer.values))



def _window_forward(lm: HFCausalLM, tokens, positions, valid, start, features: bool | tuple = False, post=None, *post_args):
    """``lm``'s forward of a window fed at cache columns ``start ..`` (a 0-d tensor), position ids
    ``positions`` (B, L), attending the columns ``valid`` (B, M) causally (:func:`visible`); with
    ``features``, the logits and the last hidden states. With ``post``, its result on the logits in
    their place (a ``post`` with a ``window`` makes the window first: :meth:`HFCausalLM.forward_window`)."""
    if hasattr(post, "window"):
        tokens, post_args = post.window(tokens, *post_args)
    write_from(lm.cache, start)
    mask = additive_mask(visible(valid, start, tokens.shape[1]), lm._dtype)
    out = lm._logits(features=features, input_ids=tokens, attention_mask=mask, position_ids=positions,
                     past_key_values=lm.cache, use_cache=True)
    return out if post is None else _then(post, post_args, out, features)


def _then(post, post_args, out, features: bool):
    """A window's output ``out`` (logits, or with ``features`` ``(logits, states)``) with its logits
    in float32, or ``post(logits, *post_args)`` in their place."""
    logits, states = out if features else (out, None)
    logits = logits.float() if post is None else post(logits, *post_args)
    return (logits, states) if features else logits


def write_from(cache, column: torch.Tensor) -> None:
    """A static cache's layers write the next keys and values from cache column ``column`` (a 0-d
    tensor) on, whatever they wrote last: a forward says where its window goes (the first column
    past those the adapter keeps), so dropping columns (padding, rejected drafts) needs no write to
    the cache, one a layer."""
    for layer in cache.layers:
        layer.cumulative_length.copy_(column)


def _masked_forward(lm: HFCausalLM, tokens, positions, mask, features: bool | tuple = False, start=None):
    """``lm``'s forward of ``tokens`` at position ids ``positions`` under the additive attention
    ``mask`` (B, 1, L, M) (a tree's), written from cache column ``start`` (a 0-d tensor) on a static
    cache (:func:`write_from`); with ``features``, the logits and the last hidden states."""
    if start is not None:
        write_from(lm.cache, start)
    return lm._logits(features=features, input_ids=tokens, attention_mask=mask, position_ids=positions,
                      past_key_values=lm.cache, use_cache=True)


def pads(post) -> bool:
    """Whether a window with ``post`` (or none) runs in its :func:`window_bucket`, padded: one whose
    arguments can be padded to the bucket and its output cropped back (``padded``, ``cropped``: the
    engine's sampler and rule) does; a drafter's whole step, which makes its window inside the step
    (``window``), runs at its own length."""
    return post is None or hasattr(post, "padded")


def _bucket(rows, window, columns, dtype, device, trimmed, features=False) -> tuple:
    """The key of a compiled graph: its shapes, dtype, device, whether the head is trimmed, whether
    it returns features, and the grad mode."""
    return rows, window, columns, dtype, device, trimmed, features, torch.is_grad_enabled()


def _describe_bucket(key) -> str:
    rows, window, columns, *_ = key  # a tree's bucket holds minus its node count
    shape = f"window {window}" if window > 0 else f"a tree of {-window} nodes"
    post = key[8] if len(key) > 8 else None  # a window's key ends with the post it runs, if any
    then = "" if post is None else f", with its {getattr(post, 'label', 'post-processing')}"
    return f"{rows} rows, {shape}, a {columns}-column cache{then}"
