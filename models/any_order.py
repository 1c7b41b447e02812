"""An any-order LlamaGen GPT: image tokens generated in any order, any set of them predicted at once.

The model reads the image as a sequence in an order sigma (a permutation of the grid's cells,
chosen per image). Slot s of the sequence holds the token of cell sigma(s) and says where the
next token goes, as sigma-GPT does it (Pannatier et al. 2024, "double positional encoding"):

    input(s) = token_embedding(x[sigma(s)]) + query_embedding(sigma(s + 1)),
    rotary angle of slot s = the 2D angle of cell sigma(s),

and the last caption slot carries ``query_embedding(sigma(0))``. The output at slot s predicts the
token of cell sigma(s + 1) from the caption and the tokens of slots <= s. RandAR (Pang et al. 2025)
gives the same information with a position-instruction token before every image token; folding
the instruction into the slot before keeps the sequence at 256 image tokens, half RandAR's length,
which halves training and verification compute.

Trained on uniformly random orders (``forward(..., orders=)``), the model predicts any cell from
any committed subset: a query row ``token_embedding(x[sigma(n - 1)]) + query_embedding(c)`` that
sees the committed slots before n - 1 and itself is, to the network, the slot that would precede
cell c in an order that visits c next. That is the two things ASSD needs (Guo and Ermon 2025):

- :meth:`forward_queries`: the distributions of k not-yet-generated cells, each conditioned only
  on the committed tokens, in one forward (the drafts);
- :meth:`forward_window`: the joint along the order, every p(x[sigma(s)] | x[sigma(<s)]) of a
  window, in one forward (the verification), exactly as the engine verifies any drafts.

Decoding takes ``prefix = (caption_features, caption_mask, orders, kept)``: ``orders`` (B, N) the
permutation of each row, ``kept`` (B, m) tokens of the first m cells of each order, given (infilling:
those cells are fixed and fed with the caption in the prefill; ``m = 0`` for a fresh image). The
engine's position i is then slot m + i. Orders live in the model with its cache, row by row, so
ragged rows, guidance (the null caption's rows share their image's order) and continuous batching
work as for the raster model. Sibling trees are not supported (there is no raster neighbour to
draft from).
"""

from __future__ import annotations

import torch
from diffusers import ModelMixin  # noqa: F401  (diffusers' loader finds a component's load method by this name)
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.compiled import fixed_address, step_compiler

from .llamagen import LlamaGenGPT, _last, rotary


def check_orders(orders: torch.Tensor, cells: int) -> torch.Tensor:
    """``orders`` (B, cells) as long, or a ValueError unless each row is a permutation of 0..cells-1."""
    orders = torch.as_tensor(orders)
    if orders.dim() != 2 or orders.shape[1] != cells:
        raise ValueError(f"an order is a permutation of the {cells} cells: expected shape (B, {cells}), "
                         f"got {tuple(orders.shape)}")
    if orders.dtype not in (torch.int32, torch.int64) or not bool(
            (orders.sort(dim=1).values == torch.arange(cells, device=orders.device)).all()):
        raise ValueError(f"every order must be a permutation of 0..{cells - 1} (each cell exactly once)")
    return orders.long()


class AnyOrderGPT(LlamaGenGPT):
    """LlamaGen's GPT with a learned embedding per grid cell saying which cell comes next.

    Same configuration as :class:`LlamaGenGPT` (text-conditional); its weights are the raster
    model's plus ``query_embeddings`` (block_size, dim), so a raster GPT initialises it
    (:meth:`from_raster`)."""

    @register_to_config
    def __init__(self, vocab_size: int = 16384, dim: int = 768, n_layer: int = 12, n_head: int = 12,
                 n_kv_head: int | None = None, multiple_of: int = 256, ffn_dim_multiplier: float | None = None,
                 rope_base: float = 10000.0, norm_eps: float = 1e-5, model_type: str = "t2i",
                 num_classes: int = 1000, caption_dim: int = 2048, class_dropout_prob: float = 0.1,
                 cls_token_num: int = 120, block_size: int = 256, prefix_rope: str = "identity",
                 caption_positions: bool = False):
        super().__init__(vocab_size=vocab_size, dim=dim, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
                         multiple_of=multiple_of, ffn_dim_multiplier=ffn_dim_multiplier, rope_base=rope_base,
                         norm_eps=norm_eps, model_type=model_type, num_classes=num_classes, caption_dim=caption_dim,
                         class_dropout_prob=class_dropout_prob, cls_token_num=cls_token_num, block_size=block_size,
                         prefix_rope=prefix_rope, caption_positions=caption_positions)
        self.query_embeddings = nn.Embedding(block_size, dim)
        nn.init.zeros_(self.query_embeddings.weight)  # a raster model's start: the query adds nothing yet
        self._orders = None  # (B_max, N) long: each cache row's order
        self._kept = 0  # m: cells given before the first generated one

    #: scratch slots for draft queries, allocated with the cache so that a compiled step's graphs
    #: keep their shapes (ASSD with k up to 17; a larger k grows the cache once)
    _scratch_slots = 16

    @classmethod
    def from_raster(cls, raster: LlamaGenGPT) -> "AnyOrderGPT":
        """An any-order model that starts from a raster GPT's weights (its queries zero)."""
        if isinstance(raster, AnyOrderGPT) or not isinstance(raster, LlamaGenGPT):
            raise ValueError(f"from_raster takes a raster LlamaGenGPT, got {type(raster).__name__}")
        # SJD2's noised inputs (a raster GPT's denoising_steps) are a raster decode's, not an any-order one's
        model = cls(**{k: v for k, v in raster.config.items() if k != "denoising_steps"})
        missing, unexpected = model.load_state_dict(raster.state_dict(), strict=False)
        if unexpected or set(missing) != {"query_embeddings.weight"}:
            raise ValueError(f"not a LlamaGen GPT of this shape: missing {missing}, unexpected {unexpected}")
        return model.to(raster.dtype)

    @property
    def cells(self) -> int:
        return self.config.block_size

    # ------------------------------------------------------------------ embeddings along an order

    def _queries(self, orders: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """query_embedding(sigma(s + 1)) for slots (b, L) of rows with ``orders`` (b, N); zero past
        the last slot (nothing follows it)."""
        following = slots + 1
        cells = orders.gather(1, following.clamp(max=self.cells - 1))
        return self.query_embeddings(cells) * (following < self.cells)[..., None].to(self.query_embeddings.weight.dtype)

    def _rope_rows(self, orders: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Rotary table rows (b, L, head_dim/2, 2) of sequence positions ``input_pos`` (b, L): a
        caption position's own, an image slot's its cell's."""
        cls = self.config.cls_token_num
        slots = (input_pos - cls).clamp(0, self.cells - 1)
        table = torch.where(input_pos < cls, input_pos, cls + orders.gather(1, slots))
        return self.rope.to(input_pos.device)[table]

    # ------------------------------------------------------------------ training forward

    def forward(self, cond, tokens, cond_mask=None, drop_condition=None, features: bool = False, orders=None):
        """Teacher-forced logits (B, N, V) along ``orders`` (B, N): row s predicts the token of cell
        ``orders[:, s]`` from the caption and the cells before it in the order (``tokens`` (B, N) are
        in raster order). Without ``orders``, raster order."""
        B, N = tokens.shape
        if orders is None:
            orders = torch.arange(N, device=tokens.device).expand(B, N)
        sequence = tokens.gather(1, orders)
        prefix = self.embed_condition(cond, drop_condition)
        cls = prefix.shape[1]
        slots = torch.arange(N - 1, device=tokens.device).expand(B, N - 1)
        images = self.tok_embeddings(sequence[:, :-1]) + self._queries(orders, slots)
        prefix = torch.cat([prefix[:, :-1], prefix[:, -1:] + self.query_embeddings(orders[:, :1])], 1)
        x = torch.cat([prefix, images], dim=1)
        T = x.shape[1]
        mask = None
        if cond_mask is not None:
            key_valid = torch.cat([cond_mask.bool(), cond_mask.new_ones(B, T - cls).bool()], 1)
            mask = self._attention_mask(torch.arange(T, device=x.device), key_valid)
        rope = rotary(self._rope_rows(orders, torch.arange(T, device=x.device).expand(B, T)), x.dtype)
        for layer in self.layers:
            x = layer(x, rope, mask)
        x = x[:, cls - 1:]
        return self.norm(x) if features else self._logits(x)

    # ------------------------------------------------------------------ token-model protocol

    def _split_prefix(self, prefix):
        if not (isinstance(prefix, (tuple, list)) and len(prefix) == 4):
            raise ValueError("an any-order model's prefix is (caption_features, caption_mask, orders, kept)")
        cond, cond_mask, orders, kept = prefix
        orders = check_orders(orders, self.cells).to(cond.device)
        kept = orders.new_zeros(orders.shape[0], 0) if kept is None else kept.long().to(cond.device)
        if kept.dim() != 2 or kept.shape[0] != orders.shape[0]:
            raise ValueError(f"kept tokens are (B, m) for B = {orders.shape[0]} rows, got {tuple(kept.shape)}")
        return cond, cond_mask, orders, kept

    def _embed_prefix(self, cond, orders, kept):
        """Caption embeddings with the first query on the last caption slot, then the kept tokens
        (slots 0..m-1) with theirs: (b, T + m, dim)."""
        x = self.embed_condition(cond)
        x = torch.cat([x[:, :-1], x[:, -1:] + self.query_embeddings(orders[:, :1])], 1)
        m = kept.shape[1]
        slots = torch.arange(m, device=x.device).expand(len(kept), m)
        return torch.cat([x, self.tok_embeddings(kept) + self._queries(orders, slots)], 1)

    def prefill(self, prefix, max_new_tokens: int, features: bool = False):
        """Allocate a static cache, run the caption and the kept tokens; logits (B, V) for the
        first generated cell (slot m). ``max_new_tokens`` must be N - m (every other cell)."""
        cond, cond_mask, orders, kept = self._split_prefix(prefix)
        m = kept.shape[1]
        if m + max_new_tokens != self.cells:
            raise ValueError(f"with {m} kept cells this model generates the other {self.cells - m}, "
                             f"asked for {max_new_tokens}")
        x = self._embed_prefix(cond, orders, kept)
        B, T = x.shape[0], self.config.cls_token_num
        S = T + self.cells
        shape = (B, self.layers[0].attention.n_kv_head, S + self._scratch_slots, self.config.dim // self.config.n_head)
        self._new_cache(shape, S, x.dtype, x.device)
        self._orders = fixed_address(orders.clone())
        self._kept, self._rows, self._max_new = m, B, max_new_tokens
        if cond_mask is not None:
            self._key_valid[:, :T] = cond_mask.bool()
        return _last(self._run(x, torch.arange(T + m, device=x.device).expand(B, T + m), features=features))

    def refill(self, rows: torch.Tensor, prefix, features: bool = False):
        """New images in cache rows ``rows`` (continuous batching; the same number of kept cells)."""
        if self._cache is None:
            raise RuntimeError("call prefill() before refill()")
        cond, cond_mask, orders, kept = self._split_prefix(prefix)
        if kept.shape[1] != self._kept:
            raise ValueError(f"rows of one decode keep the same number of cells: {self._kept}, got {kept.shape[1]}")
        self._orders[rows] = orders
        x = self._embed_prefix(cond, orders, kept)
        T = self.config.cls_token_num
        self._key_valid[rows] = True
        if cond_mask is not None:
            self._key_valid[rows, :T] = cond_mask.bool()
        L = x.shape[1]
        return _last(self._run(x, torch.arange(L, device=x.device).expand(len(rows), L), rows, features=features))

    @property
    def _image_start(self) -> int:
        return self.config.cls_token_num + self._kept

    def _prefix_length(self, prefix) -> int:
        return self.config.cls_token_num + self._split_prefix(prefix)[3].shape[1]

    def _window(self, tokens: torch.Tensor, pos: torch.Tensor, attended: int | None = None, features: bool = False):
        slots = self._kept + pos
        x = self.tok_embeddings(tokens) + self._queries(self._orders[: len(tokens)], slots)
        return self._run(x, self.config.cls_token_num + slots, attended=attended, features=features)

    def _rope(self, input_pos: torch.Tensor, rows=None) -> torch.Tensor:
        orders = self._orders[: len(input_pos)] if rows is None else self._orders[rows]
        return self._rope_rows(orders, input_pos)

    @torch.no_grad()
    def forward_queries(self, tokens: torch.Tensor, start, k: int) -> torch.Tensor:
        """ASSD's draft forward. ``tokens`` (b, L) are each row's generated positions
        start-L..start-1 (written to the cache, as a window is); returns logits (b, k, V) for
        positions start..start+k-1, each conditioned on the positions before ``start`` only.

        Position start comes from the window's last row (its slot's own query); positions
        start + j, j >= 1, from query rows that repeat that slot's token with cell
        sigma(start + j)'s query, see the cache before the slot and themselves, and write their
        keys and values to scratch slots after the sequence. Positions past the end are fillers.
        With the compiled step (:meth:`compile_step`), a one-token call (ASSD's drafts) runs
        through a graph per k, over every cache row, as the compiled window does."""
        if self._cache is None:
            raise RuntimeError("call prefill() before forward_queries()")
        b, L = tokens.shape
        start = torch.as_tensor(start, device=tokens.device).expand(b)
        rows = self._key_valid.shape[0]
        if self._compiled and L == 1 and 1 < k <= self._scratch_slots + 1 and 2 * b > rows:
            if rows > b:
                tokens = torch.cat([tokens, tokens.new_zeros(rows - b, L)])
                start = torch.cat([start, start.new_ones(rows - b)])
            cache = self._cache[0][0]
            key = ("queries", rows, k, cache.shape[2], cache.dtype, cache.device, torch.is_grad_enabled())
            return self._query_compiler(key, tokens.contiguous(), start.contiguous(), k)[:b]
        return self._queries_forward(tokens, start, k)

    def _queries_forward(self, tokens: torch.Tensor, start: torch.Tensor, k: int) -> torch.Tensor:
        b, L = tokens.shape
        device = tokens.device
        cls, base, extra = self.config.cls_token_num, self._key_valid.shape[1], k - 1
        self._grow_cache(base + extra)
        orders = self._orders[:b]
        slots = self._kept + (start[:, None] - L + torch.arange(L, device=device)).clamp(min=0)  # the window's
        last = slots[:, -1:]
        asked = (last + 2 + torch.arange(extra, device=device)).clamp(max=self.cells - 1)  # slots of the extra cells
        x = torch.cat([self.tok_embeddings(tokens) + self._queries(orders, slots),
                       self.tok_embeddings(tokens[:, -1:]) + self.query_embeddings(orders.gather(1, asked))], 1)
        input_pos = cls + torch.cat([slots, last.expand(b, extra)], 1)
        key = torch.arange(base, device=device)[None, None]
        window_sees = (key <= (cls + slots)[:, :, None]) & self._key_valid[:b, None]  # causal over the sequence
        query_sees = (key < cls + last[:, :, None]) & self._key_valid[:b, None]  # what precedes the last slot
        allowed = torch.cat([
            torch.cat([window_sees, torch.zeros(b, L, extra, dtype=torch.bool, device=device)], 2),
            torch.cat([query_sees.expand(b, extra, base),
                       torch.eye(extra, dtype=torch.bool, device=device).expand(b, extra, extra)], 2)], 1)
        write = torch.cat([cls + slots, (base + torch.arange(extra, device=device)).expand(b, extra)], 1)
        logits = self._run(x, input_pos, slots=write, allowed=allowed[:, None])
        return logits[:, L - 1:]

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """:meth:`LlamaGenGPT.compile_step`, and ASSD's draft forward with it."""
        super().compile_step(enabled, mode)
        if enabled:
            self._query_compiler = step_compiler(getattr(self, "_query_compiler", None), self._queries_forward,
                                                 f"the {type(self).__name__} draft forward",
                                                 lambda key: f"{key[1]} model rows, {key[2]} cells",
                                                 mode, self.tok_embeddings.weight.device)

    @torch.no_grad()
    def precompile(self, prefix, max_new_tokens: int, windows, features: bool = False, post=None) -> None:
        """:meth:`LlamaGenGPT.precompile`, and the draft forward of every window's k = window - 1
        (then prefill again before decoding)."""
        super().precompile(prefix, max_new_tokens, windows, features, post)
        rows = self._split_prefix(prefix)[0].shape[0]
        todo = [w - 1 for w in sorted(set(windows)) if 1 < w - 1 <= self._scratch_slots + 1]
        if todo:
            self.prefill(prefix, max_new_tokens)
        for k in todo:
            self.forward_queries(torch.zeros(rows, 1, dtype=torch.long, device=self.device), 1, k)

    def forward_tree(self, *args, **kwargs):
        raise TypeError("an any-order model verifies chains along its order; it has no sibling trees")

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self._orders[: len(rows)] = self._orders[rows]
