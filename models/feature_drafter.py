"""An EAGLE-style feature drafter: one decoder layer that predicts the target's next feature.

The target's feature f_c at column c is its last hidden state there (what its LM head reads to
predict token c + 1). The drafter reads, at column c, the target's embedding of token x_c beside
the feature of the column before, f_{c-1} (EAGLE, Li et al. 2024: the feature carries what the
target knows; the token says which of its possible continuations was taken), fuses them with one
linear layer and runs one pre-norm decoder layer (attention over the columns before, a SwiGLU MLP).
Its output g_c is a predicted f_c, and the target's own (frozen) LM head on g_c gives the draft
distribution of token c + 1. Drafting several tokens feeds g_c back in as the next column's
feature (feature-level autoregression). The target's embedding and head are not part of this
model: they are read from the target (:class:`visualspec.drafters.FeatureDrafter`).

With ``feature_layers`` (EAGLE-3's multi-layer fusion, Li et al. 2025) the target's feature is
not its last hidden state alone but several of its hidden states side by side, low, middle and top
(the indices of transformers' ``hidden_states``: 0 the embeddings, i the input of layer i, the last
the normed output the head reads), and one more linear layer (``reduce``) fuses them to width D
before they enter the pairs (:meth:`FeatureDraftModel.intake`). The drafter's own predicted features,
fed back when it drafts several tokens, are already of width D.

``forward`` is the training pass over whole sequences (causal); ``reset`` / ``step`` decode with a
key-value cache of fixed size, rows at their own columns (ragged), with columns that a row may not
attend (a left-padded prompt) masked out.
"""

from __future__ import annotations

import hashlib
import weakref

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from ..core.compiled import dense, fixed_address, step_compiler
from .hf import window_bucket
from .llamagen import TransformerBlock, rotary
from .rotary import rope_1d

COMPILED_WINDOWS = 16  # the longest window the compiled step takes (in power-of-two buckets)
CHAIN_DRAFTS = 15  # the most greedy drafts one compiled chain makes (windows up to 16); longer ones loop


class FeatureDraftModel(ModelMixin, ConfigMixin):
    """One fused input layer and one decoder layer over (token embedding, target feature) pairs.

    ``feature_size`` is the target's hidden width D (its embedding width too); ``target_hash``
    names the target the drafter was trained against (its weights' hash), so that a drafter is not
    used with another target by mistake; ``feature_layers``: the target's hidden states it reads,
    fused (see the module), or None for the head's input alone.
    """

    @register_to_config
    def __init__(self, feature_size: int = 256, n_head: int = 4, ffn_hidden: int = 768, max_len: int = 4096,
                 rope_base: float = 10000.0, norm_eps: float = 1e-6, target_hash: str = "",
                 feature_layers: list[int] | None = None):
        super().__init__()
        if feature_size % n_head:
            raise ValueError(f"feature_size {feature_size} must be a multiple of n_head {n_head}")
        if feature_layers is not None and (not feature_layers or min(feature_layers) < 0
                                           or len(set(feature_layers)) != len(feature_layers)):
            raise ValueError(f"feature_layers must be distinct hidden-state indices >= 0, got {feature_layers}")
        self.reduce = (nn.Linear(len(feature_layers) * feature_size, feature_size, bias=False)
                       if feature_layers else None)
        self.fc = nn.Linear(2 * feature_size, feature_size)
        self.layer = TransformerBlock(feature_size, n_head, n_head, ffn_hidden, norm_eps)
        self.register_buffer("rope", rope_1d(max_len, feature_size // n_head, rope_base), persistent=False)
        self._cache = None
        self._compiler, self._tree_compiler, self._compiled = None, None, False
        self._chains = {}  # (head, embedding) modules -> the compiler of their greedy draft chain

    def forward(self, embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Training: the pairs (B, L, D) each of columns 0..L-1 (``features`` already shifted: the
        feature at column c is the target's f_{c-1}) -> predicted features (B, L, D), causally."""
        x = self.fuse(embeddings, features)
        return self.layer(x, rotary(self.rope[:x.shape[1]], x.dtype), None)

    def unrolled_passes(self, embeddings: torch.Tensor, features: torch.Tensor, passes: int,
                        step_wise: bool = False) -> list[torch.Tensor]:
        """Training: the teacher-forced pass (:meth:`forward`) and ``passes`` more on the drafter's
        own predictions -> each pass's predicted features (B, L, D). Pass j >= 1 reads at column c
        the feature pass j - 1 predicted at column c - 1 (column 0 keeps its own), as the j-th draft
        of a chain reads the one before it.

        It attends its own columns, causally (a whole pass at a time), or with ``step_wise`` what
        that draft attends (EAGLE-3's training-time test, :func:`chain_attention_mask`): the real
        columns up to c - j (pass 0's keys) and, for 1 <= i <= j, pass i's key at column c - j + i,
        the chain's drafts so far; earlier passes' keys are reused, not recomputed."""
        L = embeddings.shape[1]
        layer, attention = self.layer, self.layer.attention
        rope = rotary(self.rope[:L], embeddings.dtype)
        keys, values, outs, inputs = [], [], [], features
        for j in range(1 + passes):
            if step_wise:
                x = self.fuse(embeddings, inputs)
                q, k, v = attention.project(layer.attention_norm(x), rope)
                keys.append(k)
                values.append(v)
                mask = chain_attention_mask(L, j, x.device)
                x = x + attention.output(q, torch.cat(keys, 2), torch.cat(values, 2), mask)
                outs.append(x + layer.feed_forward(layer.ffn_norm(x)))
            else:
                outs.append(self(embeddings, inputs))
            inputs = torch.cat([features[:, :1], outs[-1][:, :-1]], 1)
        return outs

    @property
    def feature_request(self):
        """What the drafter asks of its target's forward (a drafter's ``wants_features``): True for
        the head's input, else the tuple of hidden-state indices it fuses."""
        layers = self.config.feature_layers
        return tuple(layers) if layers else True

    @property
    def target_width(self) -> int:
        """The width of the target's features as this drafter asks for them: D times the number of
        fused hidden states (D without ``feature_layers``)."""
        return self.config.feature_size * len(self.config.feature_layers or [None])

    def intake(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features (..., :attr:`target_width`) as the pairs read them (..., D):
        ``reduce(features)`` with ``feature_layers`` (EAGLE-3's fusion), else as they are."""
        return features if self.reduce is None else self.reduce(features)

    def fuse(self, embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The layer's input at each column from its pair: ``fc([embedding; feature])``."""
        return self.fc(torch.cat([embeddings, features], -1))

    def reset(self, rows: int, columns: int, valid: torch.Tensor | None = None) -> None:
        """An empty cache of ``columns`` columns for ``rows`` rows; ``valid`` (rows, <= columns) bool
        marks the first columns a row may attend (the rest may all be attended once written). As a
        decode begins, each compiled bucket's guards are checked once more, then skipped until the
        next reset (:meth:`~visualspec.core.compiled.StepCompiler.recheck`, as the target's prefill
        does): a drafter step's bucket key names its rows, pairs, columns and dtype, and ``select``
        gives fewer rows, a new key."""
        if columns > self.rope.shape[0]:
            raise ValueError(f"the feature drafter decodes at most {self.rope.shape[0]} columns (max_len), "
                             f"asked for {columns}")
        attention = self.layer.attention
        shape = (rows, attention.n_kv_head, columns, attention.head_dim)
        weight = self.fc.weight
        self._cache = tuple(fixed_address(torch.zeros(shape, dtype=weight.dtype, device=weight.device)) for _ in "kv")
        self._valid = torch.ones(rows, columns, dtype=torch.bool, device=weight.device)
        if valid is not None:
            self._valid[:, :valid.shape[1]] = valid
        for compiler in (self._compiler, self._tree_compiler, *self._chains.values()):
            if compiler is not None:
                compiler.recheck()

    def step(self, embeddings: torch.Tensor, features: torch.Tensor, columns: torch.Tensor,
             compiled: bool = True, compile_new: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Decoding: pairs (B, L, D) at ``columns`` (B, L) of the cache (written there) -> predicted
        features (B, L, D); column c attends the row's valid columns up to c. Through the compiled
        graph of its shape where :meth:`compile_step` was called (and ``compiled``) and that shape
        was compiled before (:meth:`precompile`; ``compile_new``: compile it now); other shapes (rows
        left after some finished) run eagerly, so nothing compiles mid-decode. ``rows``: the pairs
        are of these cache rows only (eagerly; default: the first B)."""
        if self._cache is None:
            raise RuntimeError("call reset() before step()")
        B, L = columns.shape
        if rows is not None:
            return self._step(embeddings, features, columns, rows)
        if self._compiled and compiled and L <= COMPILED_WINDOWS:
            cache = self._cache[0]
            key = (B, L, cache.shape[2], cache.dtype, cache.device, torch.is_grad_enabled())
            return self._compiler(key, dense(embeddings), dense(features), dense(columns), compile_new=compile_new)
        return self._step(embeddings, features, columns)

    def _step(self, embeddings: torch.Tensor, features: torch.Tensor, columns: torch.Tensor,
              rows: torch.Tensor | None = None) -> torch.Tensor:
        valid = self._valid[:columns.shape[0]] if rows is None else self._valid[rows]
        S = valid.shape[1]
        columns = columns.clamp(max=S - 1)
        key = torch.arange(S, device=columns.device)
        allowed = (key <= columns[:, :, None]) & valid[:, None, :]
        allowed |= key == columns[:, :, None]
        x = self.fuse(embeddings, features)
        return self.layer(x, rotary(self.rope[columns], x.dtype), allowed[:, None], (*self._cache, rows), columns)

    def tree_step(self, embeddings: torch.Tensor, features: torch.Tensor, columns: torch.Tensor,
                  slots: torch.Tensor, attend: torch.Tensor, compile_new: bool = False) -> torch.Tensor:
        """Draft-tree nodes: pairs (B, L, D) turned by the rotary angles of ``columns`` (B, L), the
        columns a chain would hold them in, but written at cache columns ``slots`` (B, L), each
        attending the columns ``attend`` (B, L, S) marks -> predicted features. Compiled where
        :meth:`compile_step` was called and the shape was compiled before (:meth:`precompile_tree`;
        ``compile_new``: compile it now), else eager."""
        cache = self._cache[0]
        key = ("tree", *attend.shape, cache.shape[2], cache.dtype, cache.device, torch.is_grad_enabled())
        if self._compiled and attend.shape[0] == cache.shape[0]:
            return self._tree_compiler(key, dense(embeddings), dense(features), dense(columns), dense(slots),
                                       dense(attend), compile_new=compile_new)
        return self._tree_step(embeddings, features, columns, slots, attend)

    def _tree_step(self, embeddings, features, columns, slots, attend):
        x = self.fuse(embeddings, features)
        return self.layer(x, rotary(self.rope[columns], x.dtype), attend[:, None], (*self._cache, None), slots)

    def chains(self, k: int) -> bool:
        """Whether :meth:`greedy_chain` takes ``k`` drafts: compiled, and 1 <= k <= :data:`CHAIN_DRAFTS`."""
        return self._compiled and 1 <= k <= CHAIN_DRAFTS

    def greedy_chain(self, first: torch.Tensor, columns: torch.Tensor, k: int, head: nn.Module, embedding: nn.Module,
                     feature_dtype: torch.dtype, compile_new: bool = False) -> torch.Tensor:
        """``k`` greedy drafts (B, k) in one compiled graph, where :meth:`compile_step` was called and
        1 <= k <= :data:`CHAIN_DRAFTS`: draft j is the argmax of ``head`` (the target's LM head, a
        module) on the predicted feature ``g`` (``first`` (B, D) for j = 0), and, before the next,
        the pair (``embedding`` of draft j, g) is stepped at cache column ``columns + j`` (B,) for
        the next g; ``feature_dtype`` is the target's feature dtype, the head's input. The same
        drafts as drawing and stepping one at a time (:meth:`step`, greedy), with one call a
        proposal instead of 2k - 1. A chain shape not compiled before (:meth:`precompile_chain`;
        ``compile_new``: compile it now) runs eagerly."""
        if self._cache is None:
            raise RuntimeError("call reset() before greedy_chain()")
        if not self.chains(k):
            raise ValueError(f"a compiled draft chain takes 1 to {CHAIN_DRAFTS} drafts after compile_step(); "
                             f"got k={k} ({'compiled' if self._compiled else 'eager'})")
        compiler = self._chains.get((head, embedding))
        if compiler is None:
            compiler = self._chains[head, embedding] = step_compiler(
                None, lambda *a: self._chain(head, embedding, *a), "the feature drafter's draft chain",
                _describe_chain, self._compiler.mode, self.fc.weight.device)
        cache = self._cache[0]
        key = ("chain", first.shape[0], k, cache.shape[2], cache.dtype, cache.device, feature_dtype,
               torch.is_grad_enabled())
        return compiler(key, dense(first), dense(columns), k, feature_dtype, compile_new=compile_new)

    def _chain(self, head, embedding, first, columns, k: int, feature_dtype):
        g, drafts = first, []
        for j in range(k):
            drafts.append(head(g.to(feature_dtype)[:, None])[:, 0].float().argmax(-1))
            if j + 1 < k:
                emb = embedding(drafts[-1][:, None]).to(self.fc.weight.dtype)
                g = self._step(emb, g[:, None].to(emb.dtype), (columns + j)[:, None])[:, 0]
        return torch.stack(drafts, 1)

    @torch.no_grad()
    def precompile_chain(self, rows: int, columns: int, drafts, head: nn.Module, embedding: nn.Module,
                         feature_dtype: torch.dtype) -> None:
        """Compile the greedy draft chains (:meth:`greedy_chain`) of ``rows`` rows over a cache of
        ``columns`` columns for each count of ``drafts`` that chains (:meth:`chains`: up to
        :data:`CHAIN_DRAFTS`; longer ones loop); leaves an empty cache (reset before decoding)."""
        self.reset(rows, columns)
        first = self.fc.weight.new_zeros(rows, self.config.feature_size)
        for k in sorted({k for k in drafts if self.chains(k)}):
            self.greedy_chain(first, torch.zeros(rows, dtype=torch.long, device=first.device), k, head, embedding,
                              feature_dtype, compile_new=True)
        self.reset(rows, columns)

    @property
    def valid_columns(self) -> torch.Tensor:
        """(rows, columns) bool: the cache columns each row may attend once written (:meth:`reset`)."""
        return self._valid

    @property
    def embedding_width(self) -> int:
        """The width of a pair's token part: the target's embedding width D."""
        return self.config.feature_size

    def pairs_bucket(self, pairs: int) -> int:
        """How many pairs a step of ``pairs`` should feed (repeating the last one): its compiled
        bucket (a power of two) when the step is compiled, else ``pairs``."""
        return window_bucket(pairs) if self._compiled and pairs <= COMPILED_WINDOWS else pairs

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """Run :meth:`step` through ``torch.compile``, one graph per shape (rows, pairs, cache
        columns), each compiled once (:meth:`precompile` before a decode); ``enabled=False``: eager."""
        if enabled:
            self._compiler = step_compiler(self._compiler, self._step, "the feature drafter's step",
                                           _describe_bucket, mode, self.fc.weight.device)
            self._tree_compiler = step_compiler(self._tree_compiler, self._tree_step, "the feature drafter's tree step",
                                                _describe_tree_bucket, mode, self.fc.weight.device)
        self._compiled = bool(enabled)

    @torch.no_grad()
    def precompile(self, rows: int, columns: int, lengths) -> None:
        """Compile the steps of ``rows`` rows over a cache of ``columns`` columns that feed each of
        ``lengths`` pairs at once (those up to ``COMPILED_WINDOWS``: longer steps run eagerly);
        leaves an empty cache (reset before decoding)."""
        D = self.config.feature_size
        self.reset(rows, columns)
        for L in sorted({L for L in lengths if L <= COMPILED_WINDOWS}):
            x = self.fc.weight.new_zeros(rows, L, D)
            self.step(x.new_zeros(rows, L, self.embedding_width), x, torch.arange(L, device=x.device).expand(rows, L),
                      compile_new=True)
        self.reset(rows, columns)

    @torch.no_grad()
    def precompile_tree(self, rows: int, columns: int, width: int) -> None:
        """Compile the tree passes of ``width`` nodes of ``rows`` rows over a cache of ``columns``
        columns (a dynamic tree's: its scratch columns included); leaves an empty cache."""
        D = self.config.feature_size
        self.reset(rows, columns)
        x = self.fc.weight.new_zeros(rows, width, D)
        at = torch.arange(width, device=x.device).expand(rows, width)
        self.tree_step(x.new_zeros(rows, width, self.embedding_width), x, at, at,
                       torch.ones(rows, width, columns, dtype=torch.bool, device=x.device), compile_new=True)
        self.reset(rows, columns)

    def select(self, rows: torch.Tensor) -> None:
        """Keep cache rows ``rows`` (in that order)."""
        self._cache = tuple(fixed_address(c[rows]) for c in self._cache)
        self._valid = self._valid[rows]

    def clear_rows(self, rows: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Empty cache rows ``rows`` for new sequences (``valid`` as in :meth:`reset`, for those rows)."""
        for c in self._cache:
            c[rows] = 0
        self._valid[rows] = True
        if valid is not None:
            self._valid[rows, :valid.shape[1]] = valid


def chain_attention_mask(length: int, j: int, device=None) -> torch.Tensor:
    """What pass j of :meth:`FeatureDraftModel.unrolled_passes` attends step-wise: a (length, (j + 1) length)
    bool mask, query column c against key column s of pass i (key index i * length + s), True where
    (i = 0 and s <= c - j) or (1 <= i <= j and s = c - j + i)."""
    c = torch.arange(length, device=device)[:, None]
    s = torch.arange(length, device=device)[None, :]
    blocks = [s <= c - j] + [s == c - j + i for i in range(1, j + 1)]
    return torch.cat(blocks, 1)


def load_draft_model(folder, **kwargs) -> FeatureDraftModel:
    """The feature drafter saved in ``folder``, of the class its config names: an EAGLE one
    (:class:`FeatureDraftModel`) or a Chimera one (:class:`visualspec.models.chimera.ChimeraDraftModel`);
    ``kwargs`` go to ``from_pretrained``."""
    from .chimera import ChimeraDraftModel

    classes = {c.__name__: c for c in (FeatureDraftModel, ChimeraDraftModel)}
    name = FeatureDraftModel.load_config(folder).get("_class_name")
    if name not in classes:
        raise ValueError(f"{folder} holds a {name}, not a feature drafter ({' or '.join(classes)})")
    return classes[name].from_pretrained(folder, **kwargs)


def _describe_bucket(key) -> str:
    rows, pairs, columns, *_ = key
    return f"{rows} rows, {pairs} pairs, a {columns}-column cache"


def _describe_chain(key) -> str:
    _, rows, drafts, columns, *_ = key
    return f"{rows} rows, {drafts} drafts, a {columns}-column cache"


def _describe_tree_bucket(key) -> str:
    _, rows, nodes, _, columns, *_ = key
    return f"{rows} rows, {nodes} nodes, a {columns}-column cache"


_hashes: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def weights_hash(model: torch.nn.Module) -> str:
    """The first 16 hex digits of the SHA-256 of a model's state (names and float32 values, in name
    order): what a drafter records of the target it was trained against. Kept per model until a
    tensor of its state is replaced or changed in place (its storage or version counter moves), so
    checking a drafter on every call hashes a large target once."""
    state = sorted(model.state_dict().items())
    stamp = tuple((name, t.data_ptr(), t._version, t.dtype) for name, t in state)
    kept = _hashes.get(model)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    digest = hashlib.sha256()
    for name, p in state:
        digest.update(name.encode())
        digest.update(p.detach().float().cpu().numpy().tobytes())
    _hashes[model] = (stamp, digest.hexdigest()[:16])
    return _hashes[model][1]


def check_trained_for(what: str, model: torch.nn.Module, target_model: torch.nn.Module, feature_size: int,
                      command: str) -> None:
    """A model that reads a target's features (a feature drafter, a judge: ``what``) must read
    features of the target's width and should have been trained against this target (its config's
    ``target_hash``, when recorded): a mismatch is an error that names both, and ``command``."""
    if model.config.feature_size != feature_size:
        raise ValueError(f"the {what} reads features of width {model.config.feature_size}, but the "
                         f"target's are {feature_size} wide: it was trained for another target")
    layers = getattr(model.config, "feature_layers", None)
    if layers:
        count = hidden_states_count(target_model)
        if count is None:
            raise ValueError(f"the {what} fuses the target's hidden states {list(layers)} (EAGLE-3), but "
                             f"{type(target_model).__name__} returns only the features its head reads")
        if max(layers) >= count:
            raise ValueError(f"the {what} reads hidden state {max(layers)}, but the target has {count} "
                             f"(0 to {count - 1}): it was trained for another target")
    recorded = model.config.target_hash
    if recorded and recorded != weights_hash(target_model):
        raise ValueError(f"the {what} was trained against a target whose weights hash to {recorded}; "
                         f"this target's hash to {weights_hash(target_model)}. Train one for it ({command})")


def hidden_states_count(model: torch.nn.Module) -> int | None:
    """How many hidden states a transformers model (``output_hidden_states``) or a LlamaGen GPT
    (``features=`` a tuple) gives: the embeddings' output and one after each layer, the last
    normed; None for other models."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    return None if layers is None else layers + 1


def check_target(drafter: FeatureDraftModel, target_model: torch.nn.Module, feature_size: int) -> None:
    """:func:`check_trained_for` a feature drafter."""
    check_trained_for("feature drafter", drafter, target_model, feature_size, "visualspec train-drafter")
