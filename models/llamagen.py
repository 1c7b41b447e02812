"""The LlamaGen GPT (Sun et al. 2024, "Autoregressive Model Beats Diffusion"), readable top to bottom.

A Llama-style decoder over VQ image tokens: pre-norm RMSNorm, fused-QKV attention with 2D rotary
embeddings, SwiGLU feed-forward, no biases. The sequence is a conditioning prefix followed by the
image tokens in raster order:

- class-conditional (``model_type="c2i"``): one class embedding; index ``num_classes`` is the null
  class used for classifier-free guidance;
- text-conditional (``model_type="t2i"``): ``cls_token_num`` caption features projected by a
  two-layer MLP; a learned null caption (``uncond_embedding``) is the unconditional input.

Parameter and buffer names follow the official checkpoints, so their state dicts load strictly.
A known quirk is reproduced on purpose: the rotary table is all zeros on the conditioning prefix,
which zeroes queries and keys there, so every image token attends to every caption token with the
same logit (the caption reaches the image only as an average). ``prefix_rope="identity"`` leaves the
prefix unrotated instead, so attention to caption tokens depends on their content; the shipped
shapes model is trained that way, official checkpoints keep the default ``"zeros"``.

Either way the prefix has no positions of its own: word order reaches the image tokens through the
text encoder's features (FLAN-T5 XL writes it there) or, faintly, through the causal mask among
the prefix tokens. A small encoder trained from scratch may not write it ("a red circle and a blue
square" and "a blue circle and a red square" then give the same set of caption features), so
``caption_positions=True`` adds a learned embedding per caption slot
(``cls_embedding.position_embedding``, absent from official checkpoints).

Besides the training forward, the model implements the decode engine's token-model protocol
(:class:`visualspec.core.engine.TokenModel`): ``prefill``, ``forward_window`` and ``crop`` over a
static KV cache. Both forwards also take noised inputs (``noise=``, :meth:`LlamaGenGPT.embed_noised`):
SJD2's drafts, for a GPT fine-tuned for them (``denoising_steps`` > 0 in its config).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.compiled import COMPILED_WINDOWS, bucket_slots, dense_args, fixed_address, step_compiler

from .checkpoints import load_state_dict_strict, read_checkpoint
from .hf import linear_rows
from .rotary import apply_rope

# name -> (n_layer, n_head, dim); all official sizes (head_dim = dim / n_head, 100 for 3B)
GPT_CONFIGS = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-XXXL": dict(n_layer=48, n_head=40, dim=2560),
    "GPT-1B": dict(n_layer=22, n_head=32, dim=2048),
    "GPT-3B": dict(n_layer=24, n_head=32, dim=3200),
    "GPT-7B": dict(n_layer=32, n_head=32, dim=4096),
}


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LabelEmbedder(nn.Module):
    """Class label -> one prefix token. Row ``num_classes`` is the null class."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float):
        super().__init__()
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)

    def forward(self, labels, drop: torch.Tensor | None = None):
        if drop is not None:
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels).unsqueeze(1)  # (B, 1, dim)


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """Caption features (B, T, caption_dim) -> T prefix tokens; ``uncond_embedding`` is the null caption.

    With ``positions`` a learned vector per caption slot (``position_embedding``, zero at first) is
    added to the features before the MLP, so each prefix token says where in the caption it stands.
    """

    def __init__(self, caption_dim: int, dim: int, token_num: int, positions: bool = False):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim**0.5)
        self.position_embedding = nn.Parameter(torch.zeros(token_num, caption_dim)) if positions else None

    def forward(self, captions, drop: torch.Tensor | None = None):
        if drop is not None:
            captions = torch.where(drop[:, None, None], self.uncond_embedding.to(captions.dtype), captions)
        if self.position_embedding is not None:
            captions = captions + self.position_embedding.to(captions.dtype)
        return self.cap_proj(captions)


def attend(q, k, v, mask):
    """softmax(q k^T / sqrt(head_dim), over the keys ``mask`` allows (causal if None)) v; ``mask`` is
    bool (True = attend) or additive (0 or -inf).

    PyTorch's fused kernel, except when training on a CPU: there the product is written out. With
    the training forward compiled, a shapes-GPT step (batch 32, 272 positions) took 1.67 to 1.88 s
    written out against 1.80 to 2.10 s with the fused CPU kernel, whose backward is slow at these
    sizes (three side-by-side pairs of runs; docs/experiments/2026-11-25-cpu-training-attention.md).
    """
    if not (torch.is_grad_enabled() and q.requires_grad and q.device.type == "cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # softmax in float32 at least
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1).type_as(v) @ v


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_head: int):
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = dim // n_head
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(n_head * self.head_dim, dim, bias=False)

    def forward(self, x, rope, mask, cache=None, input_pos=None):
        """x (B, L, dim); rope the (cos, sin) of :func:`rotary`; mask (B, 1, L, S) bool or None for causal.

        With ``cache = (k_cache, v_cache, rows)``, caches of shape (B_max, H_kv, S_max, head_dim),
        the keys and values of x are written in cache rows ``rows`` (default: the first B) at
        ``input_pos`` (B, L), and attention runs over those rows' positions < S = mask's S.
        """
        B = x.shape[0]
        q, k, v = self.project(x, rope)
        if cache is not None:
            k_cache, v_cache, rows = cache
            at = (torch.arange(B, device=x.device) if rows is None else rows)[:, None]
            k_cache[at, :, input_pos] = k.transpose(1, 2)
            v_cache[at, :, input_pos] = v.transpose(1, 2)
            S = mask.shape[-1]
            if rows is None:
                k, v = k_cache[:B, :, :S], v_cache[:B, :, :S]
            else:
                k, v = k_cache[rows, :, :S], v_cache[rows, :, :S]
        return self.output(q, k, v, mask)

    def project(self, x, rope):
        """Queries (B, H, L, hd), keys and values (B, H_kv, L, hd) of x (B, L, dim), queries and keys
        turned by ``rope``."""
        B, L, _ = x.shape
        hd = self.head_dim
        qk, v = self.wqkv(x).split([(self.n_head + self.n_kv_head) * hd, self.n_kv_head * hd], dim=-1)
        q, k = apply_rope(qk.view(B, L, self.n_head + self.n_kv_head, hd), *rope).transpose(1, 2).split(
            [self.n_head, self.n_kv_head], dim=1)  # queries and keys turned in one go
        return q, k, v.view(B, L, self.n_kv_head, hd).transpose(1, 2)

    def output(self, q, k, v, mask):
        """The attention's output (B, L, dim) for queries q over keys k and values v (:func:`attend`)."""
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        B, _, L, _ = q.shape
        return self.wo(attend(q, k, v, mask).transpose(1, 2).reshape(B, L, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_head, n_kv_head, ffn_hidden, norm_eps):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv_head)
        self.feed_forward = FeedForward(dim, ffn_hidden)
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.ffn_norm = RMSNorm(dim, norm_eps)

    def forward(self, x, rope, mask, cache=None, input_pos=None):
        x = x + self.attention(self.attention_norm(x), rope, mask, cache, input_pos)
        return x + self.feed_forward(self.ffn_norm(x))


def rope_2d(grid_size: int, head_dim: int, base: float, cls_token_num: int, prefix: str = "zeros") -> torch.Tensor:
    """Rotary table (cls_token_num + grid_size**2, head_dim/2, 2) of (cos, sin).

    The head dimension is split in half: the first half of the rotated pairs turns with the image
    row, the second with the column, each with frequencies ``1 / base**(2i / (head_dim/2))``.
    The conditioning prefix gets an all-zero table (LlamaGen's quirk, ``prefix="zeros"``) or the
    identity rotation cos 1, sin 0 (``prefix="identity"``).
    """
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    angles = torch.outer(torch.arange(grid_size).float(), freqs)  # (grid, half/2)
    rows = angles[:, None, :].expand(grid_size, grid_size, -1)
    cols = angles[None, :, :].expand(grid_size, grid_size, -1)
    grid = torch.cat([rows, cols], dim=-1).reshape(grid_size * grid_size, -1)  # (grid^2, half)
    table = torch.stack([grid.cos(), grid.sin()], dim=-1)
    head = torch.zeros(cls_token_num, table.shape[1], 2)
    if prefix == "identity":
        head[..., 0] = 1.0
    elif prefix != "zeros":
        raise ValueError(f"prefix_rope must be 'zeros' or 'identity', got {prefix!r}")
    return torch.cat([head, table])


def noised_embeddings(embeddings: torch.Tensor, levels: torch.Tensor, eps: torch.Tensor,
                      sigma: torch.Tensor) -> torch.Tensor:
    """SJD2's noisy token inputs (next-clean-token prediction, arXiv 2510.08994): at noise level
    ``s`` (B, L) in [0, 1], ``x = (1 - s) e + s sigma eps``, with ``e`` (B, L, D) the token's
    embedding, ``eps`` (B, L, D) standard normal and ``sigma`` the embedding table's standard
    deviation (pure noise, ``s = 1``, is as large as a token's embedding); ``s = 0`` leaves ``e``."""
    s = levels[..., None].to(embeddings.dtype)
    return (1 - s) * embeddings + s * sigma.to(embeddings.dtype) * eps.to(embeddings.dtype)


def rotary(rope: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) factors of :func:`visualspec.models.rotary.apply_rope`, each (1 or B, L, 1, head_dim/2), from a rope
    table's rows (L, head_dim/2, 2) or per-row rows (B, L, head_dim/2, 2). Made once per forward
    and shared by every layer."""
    rope = rope.to(torch.promote_types(dtype, torch.float32))
    if rope.dim() == 3:
        rope = rope[None]
    return rope[:, :, None, :, 0].contiguous(), rope[:, :, None, :, 1].contiguous()


class LlamaGenGPT(ModelMixin, ConfigMixin):
    """LlamaGen's GPT. ``block_size`` is the number of image tokens (a square grid)."""

    @register_to_config
    def __init__(
        self,
        vocab_size: int = 16384,
        dim: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        n_kv_head: int | None = None,
        multiple_of: int = 256,
        ffn_dim_multiplier: float | None = None,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-5,
        model_type: str = "c2i",
        num_classes: int = 1000,
        caption_dim: int = 2048,
        class_dropout_prob: float = 0.1,
        cls_token_num: int = 1,
        block_size: int = 256,
        prefix_rope: str = "zeros",
        caption_positions: bool = False,
        denoising_steps: int = 0,
    ):
        super().__init__()
        if model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {model_type!r}")
        if math.isqrt(block_size) ** 2 != block_size:
            raise ValueError(f"block_size must be a square number of image tokens, got {block_size}")
        if dim % n_head:
            raise ValueError(f"dim {dim} is not divisible by n_head {n_head}")
        n_kv_head = n_kv_head or n_head
        hidden = int(2 * 4 * dim / 3)
        if ffn_dim_multiplier is not None:
            hidden = int(ffn_dim_multiplier * hidden)
        hidden = find_multiple(hidden, multiple_of)

        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        if model_type == "c2i":
            self.cls_embedding = LabelEmbedder(num_classes, dim, class_dropout_prob)
        else:
            self.cls_embedding = CaptionEmbedder(caption_dim, dim, cls_token_num, caption_positions)
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_head, n_kv_head, hidden, norm_eps) for _ in range(n_layer)
        )
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.rope = rope_2d(math.isqrt(block_size), dim // n_head, rope_base, cls_token_num, prefix_rope)
        # (keys, values): a list with a tensor (B, H_kv, S_max, head_dim) per layer, so that a compiled
        # step writes each in place (views of one all-layer tensor made it copy the whole cache)
        self._cache = None
        self._key_valid = None  # (B, S_max) bool: False at padded caption positions
        # attend over every cache slot, masked, instead of the slots up to the furthest position:
        # fixed shapes and no host synchronisation in a step (what torch.compile needs; #48)
        self.static_step = False
        self._compiler = None  # a StepCompiler of _window, once compile_step() asked for one
        self._compiled = False
        self.initialize_weights()

    @classmethod
    def from_name(cls, name: str, **overrides) -> "LlamaGenGPT":
        """Build an official size by name (``"GPT-XL"``), e.g. ``from_name("GPT-B", block_size=576)``."""
        if name not in GPT_CONFIGS:
            raise ValueError(f"unknown LlamaGen size {name!r}; choose one of {sorted(GPT_CONFIGS)}")
        return cls(**{**GPT_CONFIGS[name], **overrides})

    @classmethod
    def from_llamagen_checkpoint(cls, path: str, name: str, block_size: int = 256, key: str | None = None,
                                 **overrides) -> "LlamaGenGPT":
        """Load an official LlamaGen GPT checkpoint (``c2i_L_384.pt``, ``t2i_XL_stage1_256.pt``,
        FSDP ``consolidated.pth`` ...) strictly. ``name`` is its size (``"GPT-XL"``) and
        ``block_size`` its number of image tokens ((image_size / 16) ** 2 for VQ-16). Whether it is
        class- or text-conditional, its vocabulary and prefix length are read from the weights."""
        state = read_checkpoint(path, key)
        if "tok_embeddings.weight" not in state:
            raise ValueError(f"{path} does not look like a LlamaGen GPT checkpoint: no tok_embeddings.weight")
        config = dict(vocab_size=state["tok_embeddings.weight"].shape[0])
        if "cls_embedding.uncond_embedding" in state:
            tokens, caption_dim = state["cls_embedding.uncond_embedding"].shape
            config.update(model_type="t2i", cls_token_num=tokens, caption_dim=caption_dim)
        else:
            config.update(model_type="c2i", num_classes=state["cls_embedding.embedding_table.weight"].shape[0] - 1)
        model = cls.from_name(name, block_size=block_size, **{**config, **overrides})
        load_state_dict_strict(model, state, f"{path} (loaded as {name})")
        return model.eval()

    def initialize_weights(self):
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.zeros_(self.output.weight)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def grid_size(self) -> int:
        return math.isqrt(self.config.block_size)

    # ------------------------------------------------------------------ conditioning prefix

    def embed_condition(self, cond, drop: torch.Tensor | None = None):
        """Class labels (B,) or caption features (B, cls_token_num, caption_dim) -> (B, T, dim)."""
        if self.config.model_type == "c2i":
            if cond.dtype not in (torch.int32, torch.int64) or cond.dim() != 1:
                raise ValueError("a class-conditional LlamaGen takes class labels of shape (B,)")
            return self.cls_embedding(cond, drop)
        expected = (self.config.cls_token_num, self.config.caption_dim)
        if cond.dim() != 3 or tuple(cond.shape[1:]) != expected:
            raise ValueError(f"a text-conditional LlamaGen takes caption features (B, {expected[0]}, {expected[1]}), "
                             f"got {tuple(cond.shape)}")
        return self.cls_embedding(cond.to(self.dtype), drop)

    def null_condition(self, batch_size: int):
        """The unconditional input for guidance: the null class or the learned null caption."""
        if self.config.model_type == "c2i":
            return torch.full((batch_size,), self.config.num_classes, dtype=torch.long, device=self.device)
        return self.cls_embedding.uncond_embedding[None].expand(batch_size, -1, -1)

    # ------------------------------------------------------------------ training forward

    def forward(self, cond, tokens, cond_mask=None, drop_condition=None, features: bool | tuple = False, noise=None):
        """Teacher-forced logits (B, N, V) for image tokens (B, N): row i predicts token i.

        ``cond_mask`` (B, cls_token_num) marks valid caption positions (t2i); ``drop_condition``
        (B,) bool replaces the condition by the null one (classifier-free guidance training).
        ``features``: the hidden states (B, N, D) the head reads instead (row i's predicts token i),
        or those a tuple of indices names, side by side (:meth:`_states`). ``noise``: ``(levels (B,
        N - 1), eps (B, N - 1, D))``, the inputs tokens[:, :-1] noised (:meth:`embed_noised`; SJD2's
        training, where row i still predicts the clean token i).
        """
        prefix = self.embed_condition(cond, drop_condition)
        x = torch.cat([prefix, self.embed_noised(tokens[:, :-1], noise)], dim=1)
        T = x.shape[1]
        mask = None
        if cond_mask is not None:
            key_valid = torch.cat([cond_mask.bool(), cond_mask.new_ones(x.shape[0], T - cond_mask.shape[1]).bool()], 1)
            mask = self._attention_mask(torch.arange(T, device=x.device), key_valid)
        rope = rotary(self.rope[:T].to(x.device), x.dtype)
        hidden = []
        for layer in self.layers:
            hidden.append(x)
            x = layer(x, rope, mask)
        cut = slice(self.config.cls_token_num - 1, None)
        if not features:
            return self._logits(x[:, cut])
        return self._states([h[:, cut] for h in hidden], self.norm(x[:, cut]), features)

    @staticmethod
    def _attention_mask(query_pos, key_valid):
        """(B, 1, L, S) bool for query positions (L,) or (B, L): causal, minus invalid keys; a
        query always sees itself."""
        S = key_valid.shape[1]
        key_pos = torch.arange(S, device=query_pos.device)
        query_pos = query_pos.expand(key_valid.shape[0], -1)[:, :, None]  # (B, L, 1)
        mask = (key_pos <= query_pos) & key_valid[:, None, :]
        mask |= key_pos == query_pos
        return mask[:, None]

    # ------------------------------------------------------------------ token-model protocol

    def prefill(self, prefix, max_new_tokens: int, features: bool | tuple = False):
        """Allocate a static cache and run the condition. ``prefix`` is class labels (B,) or
        ``(caption_features, caption_mask)``. Returns logits (B, V) for image token 0 (with
        ``features``, and the condition's features (B, T, D): the hidden states the head reads)."""
        cond, cond_mask = prefix if isinstance(prefix, (tuple, list)) else (prefix, None)
        if max_new_tokens > self.config.block_size:
            raise ValueError(f"this model generates at most {self.config.block_size} tokens, asked for {max_new_tokens}")
        x = self.embed_condition(cond)
        B, T = x.shape[:2]
        S = T + max_new_tokens
        shape = (B, self.layers[0].attention.n_kv_head, S, self.config.dim // self.config.n_head)
        self._new_cache(shape, S, x.dtype, x.device)
        self._rows, self._max_new = B, max_new_tokens
        if cond_mask is not None:
            self._key_valid[:, :T] = cond_mask.bool()
        return _last(self._run(x, torch.arange(T, device=x.device).expand(B, T), features=features))

    def _new_cache(self, shape: tuple, slots: int, dtype, device) -> None:
        """A prefill's cache: the static key/value buffers of ``shape`` (reused where the shape is
        the last one's), every one of the ``slots`` key slots valid in each row, and, as a new decode
        begins, each compiled bucket's guards checked once more (:meth:`~visualspec.core.compiled.StepCompiler.recheck`)."""
        self._cache = _static_cache(self._cache, shape, len(self.layers), dtype, device)
        self._key_valid = torch.ones(shape[0], slots, dtype=torch.bool, device=device)
        if self._compiler is not None:
            self._compiler.recheck()

    def refill(self, rows: torch.Tensor, prefix, features: bool | tuple = False):
        """Start new images in cache rows ``rows`` (r,) with the condition ``prefix`` (r rows);
        returns logits (r, V) for their image token 0 (continuous batching)."""
        if self._cache is None:
            raise RuntimeError("call prefill() before refill()")
        cond, cond_mask = prefix if isinstance(prefix, (tuple, list)) else (prefix, None)
        x = self.embed_condition(cond)
        T = x.shape[1]
        self._key_valid[rows] = True
        if cond_mask is not None:
            self._key_valid[rows, :T] = cond_mask.bool()
        return _last(self._run(x, torch.arange(T, device=x.device).expand(len(rows), T), rows, features=features))

    #: :meth:`forward_window` takes ``post`` (the engine's sampling, run inside the step)
    takes_post = True
    #: :meth:`forward_window` takes ``noise=`` (SJD2's noised inputs, :meth:`embed_noised`)
    takes_noise = True

    def forward_window(self, tokens: torch.Tensor, start, features: bool | tuple = False, post=None, post_args=(),
                       noise=None):
        """Image tokens (B, L), row b at image positions start[b]..start[b]+L-1 (``start`` an int or
        (B,) tensor) -> logits (B, L, V) (with ``features``, and the hidden states (B, L, D) the head
        read). Positions past the last image token are clamped to it: they are fillers of rows that
        end inside the window, never read by a real token.

        ``post(logits, *post_args)``, if given, is applied to the logits inside the step, in its
        compiled graph where the step is compiled (the engine's :class:`~visualspec.core.sampling.
        StepSampler`), and its result is returned in their place; ``post_args`` are tensors of one
        row per model row (or None), padded with zeros as the step pads its rows; it may return a
        tuple of such tensors. ``post`` must be hashable: each distinct one gets its own graphs.

        ``noise``: ``(levels (B, L), eps (B, L, D))``, the window's inputs noised (:meth:`embed_noised`:
        SJD2's drafts past the verified ones); such a window runs eagerly."""
        if self._cache is None:
            raise RuntimeError("call prefill() before forward_window()")
        B, L = tokens.shape[:2]  # (B, L) token ids, or (B, L, D) continuous tokens of a subclass
        start = torch.as_tensor(start, device=tokens.device).expand(B)
        pos = (start[:, None] + torch.arange(L, device=tokens.device)).clamp(max=self._max_new - 1)
        if noise is not None:
            if post is not None or features:
                raise ValueError("a noised window (noise=) runs eagerly, without a post step or features")
            return self._run(self.embed_noised(tokens, noise), self.config.cls_token_num + pos)
        if self._compiled and L <= COMPILED_WINDOWS and 2 * B > self._key_valid.shape[0]:
            return self._compiled_window(tokens, pos, features, post, post_args)
        return self._step(tokens, pos, None, features, post, *post_args)

    def _step(self, tokens: torch.Tensor, pos: torch.Tensor, attended: int | None, features: bool, post, *post_args):
        """:meth:`_window`, then ``post`` on its logits (what the compiled step compiles). A ``post``
        with a ``window`` method makes the window itself, from its arguments (a drafter's whole step,
        :class:`~visualspec.drafters.JacobiStep`): ``tokens`` only give its shape."""
        if hasattr(post, "window"):
            tokens, post_args = post.window(tokens, *post_args)
        out = self._window(tokens, pos, attended, features)
        if post is None:
            return out
        return (post(out[0], *post_args), out[1]) if features else post(out, *post_args)

    def _window(self, tokens: torch.Tensor, pos: torch.Tensor, attended: int | None = None, features: bool | tuple = False):
        """The window forward at image positions ``pos`` (B, L), attending ``attended`` cache
        slots (default: as :meth:`_run` decides)."""
        return self._run(self.tok_embeddings(tokens), self.config.cls_token_num + pos, attended=attended,
                         features=features)

    def embed_noised(self, tokens: torch.Tensor, noise=None) -> torch.Tensor:
        """The embeddings of ``tokens`` (B, L), noised where ``noise`` = ``(levels (B, L), eps (B, L,
        D))`` says (:func:`noised_embeddings`, at the embedding table's standard deviation)."""
        x = self.tok_embeddings(tokens)
        if noise is None:
            return x
        return noised_embeddings(x, *noise, self.tok_embeddings.weight.detach().float().std())

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The image-token embeddings of ``tokens`` (what a feature drafter reads beside the features)."""
        return self.tok_embeddings(tokens)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """The output head on ``features`` (the final norm's output, as ``features=True`` returns them)."""
        return self._head_dtype(self.output(features))

    @staticmethod
    def _head_dtype(logits: torch.Tensor) -> torch.Tensor:
        """Logits in float32 (float64 ones kept: the tests' exact models)."""
        return logits if logits.dtype == torch.float64 else logits.float()

    def kept_head(self, keep: torch.Tensor):
        """:meth:`head` restricted to token ids ``keep`` (K,): features (..., D) -> logits (..., K),
        for K/V of its cost (a feature drafter's frequency-ranked draft head)."""
        weight, bias = linear_rows(self.output, keep)
        return lambda features: self._head_dtype(torch.nn.functional.linear(features, weight, bias))

    @property
    def feature_size(self) -> int:
        return self.config.dim

    # ------------------------------------------------------------------ the compiled step (#48)

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """Run :meth:`forward_window` through ``torch.compile`` (``enabled=False``: the eager step
        again); ``mode`` is ``torch.compile``'s (``"auto"``: CUDA graphs on a GPU,
        :func:`~visualspec.core.compiled.compile_mode`).

        The compiled step is static. It runs every cache row: rows that finished write only into
        their own unused rows, and once half of them have finished, the eager step runs the rest,
        which costs less than all the rows (SJD at batch 16 went from 0.8-0.9x to 1.0x the compiled
        AR, docs/experiments/2026-11-27-compiled-decode-cpu.md). It attends a bucket of the cache
        slots (:func:`~visualspec.core.compiled.bucket_slots`). So a decode needs two graphs per
        window length, compiled once each (:meth:`precompile`, announced) and never mid-step.
        Trees, prefills and refills stay eager."""
        if enabled:
            self._compiler = step_compiler(self._compiler, self._step, f"the {type(self).__name__} decode step",
                                           _describe_bucket, mode, self.tok_embeddings.weight.device)
        self._compiled = bool(enabled)

    @property
    def compiled_step(self) -> bool:
        """Whether :meth:`forward_window` runs compiled (:meth:`compile_step`)."""
        return self._compiled

    @torch.no_grad()
    def precompile(self, prefix, max_new_tokens: int, windows, features: bool | tuple = False, post=None) -> None:
        """Compile every bucket a decode of ``prefix`` with these window lengths can step through
        (each slot bucket of each window, without gradients, as decoding runs), so that none
        compiles inside a decode (or a timed call); with ``post``, the graphs that run it
        (:meth:`forward_window`; ``post.example_args(rows, window, device)`` gives arguments of
        its shapes). When one is missing, runs a prefill and leaves junk in the cache: prefill
        again before decoding."""
        cond = prefix[0] if isinstance(prefix, (tuple, list)) else prefix
        rows, cls = cond.shape[0], self._prefix_length(prefix)
        total = cls + max_new_tokens
        dtype = self.tok_embeddings.weight.dtype
        lengths = sorted({int(w) for w in windows if 1 <= w <= min(max_new_tokens, COMPILED_WINDOWS)})
        buckets = [(window, attended) for window in lengths
                   for attended in sorted({bucket_slots(n, total) for n in range(cls + window, total + 1)})]
        todo = [(window, attended) for window, attended in buckets
                if _bucket(rows, window, attended, total, total + self._scratch_slots, dtype, cond.device, features)
                + (post,) not in self._compiler.compile_s]
        if todo:
            self.prefill(prefix, max_new_tokens)
        for window, attended in todo:
            start = min(attended - cls - window, max_new_tokens - window)
            args = post.example_args(rows, window, self.vocab_size, cond.device) if post is not None else ()
            self.forward_window(torch.zeros(rows, window, dtype=torch.long, device=cond.device), start, features=features,
                                post=post, post_args=args)

    def _compiled_window(self, tokens: torch.Tensor, pos: torch.Tensor, features: bool | tuple = False, post=None,
                         post_args=()):
        """The window forward (and ``post``) through the compiled graph of its bucket: every cache
        row (the rows of finished images padded in, writing only into their own rows; ``post_args``
        padded likewise), slots a bucket of the cache."""
        B, L = tokens.shape[:2]
        rows, total = self._key_valid.shape
        # the slots up to the furthest position, in a bucket: read on a CPU, where the read is free and
        # attention over unused slots is not; a GPU attends them all, which costs it nothing measurable
        # (docs/experiments/2026-11-26-gpu-h200.md), rather than wait for the device every step
        attended = (bucket_slots(self._image_start + int(pos.max()) + 1, total) if pos.device.type == "cpu"
                    else total)
        if rows > B:
            tokens, pos, *post_args = [x if x is None else torch.cat([x, x.new_zeros(rows - B, *x.shape[1:])])
                                       for x in (tokens, pos, *post_args)]
        cache = self._cache[0][0]  # its slots grow past ``total`` once a tree needs scratch slots
        key = _bucket(rows, L, attended, total, cache.shape[2], cache.dtype, cache.device, features) + (post,)
        tokens, pos, *post_args = dense_args([tokens, pos, *post_args])  # one layout per bucket
        out = self._compiler(key, tokens, pos, attended, features, post, *post_args)
        return (_first_rows(out[0], B), out[1][:B]) if features else _first_rows(out, B)

    def crop(self, lengths) -> None:
        """Static cache: positions >= length are simply overwritten later and masked until then."""

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     start) -> torch.Tensor:
        """Tree attention (:class:`visualspec.core.engine.TreeTokenModel`): node i of row b at image
        position ``start[b] + depths[i]`` sees the row's cached positions before ``start[b]`` and
        the nodes j with ``ancestors[i, j]``. The nodes' keys and values go to scratch slots after
        the sequence (grown once when a tree needs more) until :meth:`keep` moves the kept ones
        to their positions. Returns logits (B, N, V)."""
        if self._cache is None:
            raise RuntimeError("call prefill() before forward_tree()")
        B, N = tokens.shape
        device = tokens.device
        base = self._key_valid.shape[1]  # the sequence's slots; scratch follows
        self._grow_cache(base + N)
        start = torch.as_tensor(start, device=device).expand(B)
        cls = self.config.cls_token_num
        pos = (start[:, None] + depths.to(device)[None]).clamp(max=self._max_new - 1)
        past = self._key_valid[:B] & (torch.arange(base, device=device)[None] < cls + start[:, None])
        allowed = torch.cat([past[:, None, :].expand(B, N, base), ancestors.to(device)[None].expand(B, N, N)], 2)
        slots = (base + torch.arange(N, device=device)).expand(B, N)
        self._tree_start = start
        return self._run(self.tok_embeddings(tokens), cls + pos, slots=slots, allowed=allowed[:, None])

    def _grow_cache(self, slots: int) -> None:
        """Give the cache at least ``slots`` slots (scratch slots after the sequence's: tree nodes,
        draft queries), grown once and kept."""
        if self._cache[0][0].shape[2] < slots:
            for buffers in self._cache:
                for i, buffer in enumerate(buffers):
                    buffers[i] = fixed_address(torch.nn.functional.pad(buffer, (0, 0, 0, slots - buffer.shape[2])))

    def keep(self, nodes: torch.Tensor, counts: torch.Tensor) -> None:
        """After :meth:`forward_tree`: row b's nodes ``nodes[b, :counts[b]]`` become its positions
        ``start[b]``, ``start[b] + 1``, ... (their keys and values are copied from the scratch slots)."""
        B, m = nodes.shape
        device = nodes.device
        base = self._key_valid.shape[1]
        j = torch.arange(m, device=device)[None]
        src = base + nodes
        dst = torch.where(j < counts[:, None], self.config.cls_token_num + self._tree_start[:, None] + j, src)
        rows = torch.arange(B, device=device)[:, None].expand(B, m)
        for buffer in (*self._cache[0], *self._cache[1]):
            buffer[rows, :, dst] = buffer[rows, :, src]

    def select(self, rows: torch.Tensor) -> None:
        """Keep cache rows ``rows`` (in that order) as rows 0..len(rows)-1 and drop the others."""
        m = len(rows)
        for buffer in (*self._cache[0], *self._cache[1]):
            buffer[:m] = buffer[rows]
        self._key_valid[:m] = self._key_valid[rows]
        self._rows = m

    def _run(self, x, input_pos, rows=None, slots=None, allowed=None, attended=None, features: bool | tuple = False):
        """x (b, L, dim) at sequence positions ``input_pos`` (b, L), for the cache rows ``rows``
        (default: the first b). Keys and values are stored at ``slots`` (default: the positions);
        ``allowed`` (b, 1, L, S) says which cache slots each token sees (default: causal, over the
        first ``attended`` slots: all of them for a static step, else up to the furthest position)."""
        b = x.shape[0]
        if allowed is None:
            S = attended or (self._key_valid.shape[1] if self.static_step else int(input_pos.max()) + 1)
            key_valid = self._key_valid[:b] if rows is None else self._key_valid[rows]
            allowed = self._attention_mask(input_pos, key_valid[:, :S])
        # additive, made once for every layer (the fused kernel would convert a bool mask per call)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill_(~allowed, float("-inf"))
        rope = rotary(self._rope(input_pos, rows), x.dtype)
        k_all, v_all = self._cache
        hidden = []
        for i, layer in enumerate(self.layers):
            hidden.append(x)
            x = layer(x, rope, mask, (k_all[i], v_all[i], rows), input_pos if slots is None else slots)
        if features:
            top = self.norm(x)
            return self.head(top), self._states(hidden, top, features)
        return self._logits(x)

    @staticmethod
    def _states(hidden: list, top: torch.Tensor, features: bool | tuple) -> torch.Tensor:
        """The features a forward returns, from the layers' inputs ``hidden`` and ``top``, the
        final norm's output: with True, ``top`` (what the head reads); with a tuple of indices, as
        transformers numbers its ``hidden_states`` (0 the embeddings, i the input of layer i,
        ``n_layer`` the normed output), those states side by side (a fusing feature drafter's
        request, EAGLE-3)."""
        if not isinstance(features, tuple):
            return top
        every = [*hidden, top]
        return torch.cat([every[i] for i in features], -1)

    #: cache slots after the sequence's, allocated by every prefill (an any-order model's draft queries)
    _scratch_slots = 0

    def _rope(self, input_pos: torch.Tensor, rows=None) -> torch.Tensor:
        """The rotary table's rows (b, L, head_dim/2, 2) at sequence positions ``input_pos`` (b, L)
        of the cache rows ``rows`` (an any-order model turns a slot by its cell's angle)."""
        return self.rope.to(input_pos.device)[input_pos]

    @property
    def _image_start(self) -> int:
        """The cache slot of generated position 0 (the prefix's length)."""
        return self.config.cls_token_num

    def _prefix_length(self, prefix) -> int:
        """The cache slots a prefill of ``prefix`` fills."""
        return self.config.cls_token_num

    def _logits(self, x):
        """The output head on the final hidden states, in float32 at least (float64 stays)."""
        out = self.output(self.norm(x))
        return out if out.dtype == torch.float64 else out.float()


def _static_cache(cache, shape, layers: int, dtype, device):
    """Zeroed key and value buffers of ``shape`` for ``layers`` layers: ``cache``'s own, emptied, when
    they have that shape, dtype and device, else new ones. Reusing them keeps their addresses, which
    a CUDA graph of the step has baked in (new buffers would make torch record the graph again);
    on a GPU they are marked so (``torch._dynamo.mark_static_address``)."""
    if (cache is not None and len(cache[0]) == layers
            and all(b.shape == shape and b.dtype == dtype and b.device == device for b in (*cache[0], *cache[1]))):
        for buffer in (*cache[0], *cache[1]):
            buffer.zero_()
        return cache
    return tuple([fixed_address(torch.zeros(shape, dtype=dtype, device=device)) for _ in range(layers)]
                 for _ in "kv")


def _bucket(rows, window, attended, total, cache_slots, dtype, device, features=False) -> tuple:
    """The key of a compiled graph: the shapes, dtype and device it runs at, whether it returns
    features, and the grad mode."""
    return rows, window, attended, total, cache_slots, dtype, device, features, torch.is_grad_enabled()


def _last(out):
    """A prefill's logits at its last column (and its features, all columns, where asked for)."""
    return (out[0][:, -1], out[1]) if isinstance(out, tuple) else out[:, -1]


def _first_rows(out, rows: int):
    """The first ``rows`` rows of a step's output: a tensor, or each tensor of a tuple (what a
    ``post`` may return)."""
    if isinstance(out, tuple):
        return tuple(x if len(x) == rows else x[:rows] for x in out)
    return out if len(out) == rows else out[:rows]


def _describe_bucket(key) -> str:
    rows, window, attended, total, *_, post = key
    then = "" if post is None else f", with its {getattr(post, 'label', 'post-processing')}"
    return f"{rows} model rows, window {window}, {attended} of {total} cache slots{then}"
