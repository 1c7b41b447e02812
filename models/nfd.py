"""A Next-Frame Diffusion transformer (after NFD, Cheng et al. 2025), scaled down and readable.

The model denoises video one latent frame at a time. Its sequence is frames of ``latent_size**2``
tokens (one per latent pixel), and its attention is *block-wise causal*: a token sees every token
of its own frame (bidirectional) and of earlier frames (causal across frames), so all tokens of the
next frame are denoised in parallel.

- Positions: 3D rotary embeddings, the rotated pairs of each head split between the frame index,
  the latent row and the latent column. Rotary positions are relative, so a sliding window over
  the past gives the same attention wherever the window is.
- Conditioning: every frame has its own flow-matching time ``tau`` (0 = clean, 1 = noise;
  diffusion forcing: frames of one sequence may sit at different noise levels) and the action that
  led to it; their embeddings are summed and drive adaLN-zero (shift, scale and a zero-initialised
  gate around attention and MLP) of that frame's tokens. Index ``num_actions`` means "no action"
  (the first frame).
- Memory: each frame sees at most ``context_frames`` earlier frames (a sliding window, the same in
  training and generation).
- Output: the flow-matching velocity ``noise - clean`` per token (``x_tau = (1 - tau) x0 + tau eps``).

For generation the model keeps a :class:`FrameCache` of the past frames' keys and values: a forward
over some new frames reads the cache and can append the first ``write`` of them (the clean frames
just shown) to it. The sampling logic lives in :mod:`visualspec.video`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.compiled import dense, step_compiler

from .rotary import apply_rope


def rope_3d(frames: torch.Tensor, size: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotary table (len(frames) * size**2, head_dim/2, 2) of (cos, sin) for the given frame indices.

    Of the head_dim/2 rotated pairs a quarter turn with the frame index, and three eighths each
    with the latent row and column.
    """
    pairs = head_dim // 2
    n_t = pairs // 4
    n_h = (pairs - n_t) // 2
    n_w = pairs - n_t - n_h

    def angles(pos, n):
        freqs = 1.0 / (base ** (torch.arange(n, dtype=torch.float32) / n))
        return pos.float()[:, None] * freqs[None]

    t = frames.repeat_interleave(size * size)
    rows = torch.arange(size).repeat_interleave(size).repeat(len(frames))
    cols = torch.arange(size).repeat(size * len(frames))
    a = torch.cat([angles(t, n_t), angles(rows, n_h), angles(cols, n_w)], dim=-1)
    return torch.stack([a.cos(), a.sin()], dim=-1)


def timestep_embedding(tau: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features (…, dim) of tau in [0, 1] (scaled by 1000 like diffusion timesteps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=tau.device) / half)
    args = tau.float()[..., None] * 1000.0 * freqs
    return torch.cat([args.cos(), args.sin()], dim=-1)


class FrameCache:
    """Keys and values of the past (clean) frames, per layer, for a sliding window of frames.

    One cache may serve several worlds at once (:meth:`stack`, :meth:`split`): they must hold the
    same number of frames, and ``next_frame`` then holds each row's own frame index.
    """

    def __init__(self, num_layers: int, max_frames: int):
        self.max_frames = max_frames
        self.keys = [None] * num_layers
        self.values = [None] * num_layers
        self.frames = 0  # frames currently held
        self.next_frame: int | list[int] = 0  # absolute index of the next frame to be written (per row if stacked)

    @classmethod
    def stack(cls, caches: list["FrameCache"]) -> "FrameCache":
        """One cache whose rows are ``caches`` (each of batch 1, all holding the same number of frames)."""
        first = caches[0]
        if any(c.frames != first.frames or c.max_frames != first.max_frames for c in caches):
            raise ValueError(f"caches hold different numbers of frames: {[c.frames for c in caches]}")
        out = cls(len(first.keys), first.max_frames)
        out.frames, out.next_frame = first.frames, [c.next_frame for c in caches]
        if first.frames:
            out.keys = [torch.cat(layer) for layer in zip(*(c.keys for c in caches))]
            out.values = [torch.cat(layer) for layer in zip(*(c.values for c in caches))]
        return out

    def split(self) -> list["FrameCache"]:
        """The rows of a stacked cache, each a cache of batch 1 (the inverse of :meth:`stack`)."""
        rows = []
        for b, next_frame in enumerate(self.next_frame):
            row = FrameCache(len(self.keys), self.max_frames)
            row.frames, row.next_frame = self.frames, next_frame
            if self.frames:
                row.keys = [k[b:b + 1] for k in self.keys]
                row.values = [v[b:b + 1] for v in self.values]
            rows.append(row)
        return rows

    def read(self, layer: int):
        return self.keys[layer], self.values[layer]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, tokens_per_frame: int) -> None:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        keep = self.max_frames * tokens_per_frame
        self.keys[layer], self.values[layer] = k[:, :, -keep:], v[:, :, -keep:]


class DiTBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def attention(self, x, rope, mask, past_k=None, past_v=None):
        """Attention of x (B, L, D) over the past keys and values (B, H, S, d; None: no past) and
        itself; returns the output and x's own rotated keys and values (for a cache)."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        cos, sin = rope[..., 0], rope[..., 1]
        if rope.dim() == 4:  # a table per row (B, L, pairs): broadcast over the heads
            cos, sin = cos[:, None], sin[:, None]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = k, v
        if past_k is not None:
            keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(B, L, D)), k, v

    def forward(self, x, c, rope, mask, past_k=None, past_v=None):
        """x (B, L, D); c (B, L, 6D) the per-token modulation (already projected). Returns the new
        x and x's keys and values."""
        shift1, scale1, gate1, shift2, scale2, gate2 = c.chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        out, k, v = self.attention(h, rope, mask, past_k, past_v)
        x = x + gate1 * out
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h), k, v


class NextFrameDiT(ModelMixin, ConfigMixin):
    """Action-conditioned, block-causal flow-matching transformer over latent frames."""

    @register_to_config
    def __init__(self, latent_channels: int = 8, latent_size: int = 8, dim: int = 192, depth: int = 6,
                 num_heads: int = 3, mlp_ratio: float = 4.0, num_actions: int = 5, context_frames: int = 4,
                 rope_base: float = 10000.0):
        super().__init__()
        if dim % num_heads or (dim // num_heads) % 8:
            raise ValueError(f"dim {dim} / num_heads {num_heads} must give a head size divisible by 8")
        self.x_embed = nn.Linear(latent_channels, dim)
        self.t_embed = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.action_embed = nn.Embedding(num_actions + 1, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        self.final_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.final = nn.Linear(dim, latent_channels)
        self.initialize_weights()
        self._compiler, self._compiled = None, False  # the compiled trunk (compile_step), off by default
        self._precompiling = False
        self._masks: dict[tuple, torch.Tensor] = {}  # attention masks by (past, frames, device)

    def initialize_weights(self):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.action_embed.weight, std=0.02)
        for block in self.blocks:  # adaLN-zero: every block starts as the identity
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_modulation[-1].weight)
        nn.init.zeros_(self.final_modulation[-1].bias)
        nn.init.zeros_(self.final.weight)
        nn.init.zeros_(self.final.bias)

    @property
    def tokens_per_frame(self) -> int:
        return self.config.latent_size ** 2

    @property
    def no_action(self) -> int:
        return self.config.num_actions

    def attention_mask(self, past: int, frames: int) -> torch.Tensor:
        """(L, S) bool for ``frames`` new frames after ``past`` cached ones: block-causal, and each
        frame sees at most ``context_frames`` frames before its own (a sliding window)."""
        T = self.tokens_per_frame
        query = (torch.arange(frames) + past).repeat_interleave(T)[:, None]
        key = torch.arange(past + frames).repeat_interleave(T)[None, :]
        return (key <= query) & (key >= query - self.config.context_frames)

    def _mask(self, past: int, frames: int, device) -> torch.Tensor:
        """:meth:`attention_mask` on ``device``, built once per shape (a world asks for the same few)."""
        key = (past, frames, str(device))
        if key not in self._masks:
            self._masks[key] = self.attention_mask(past, frames).to(device)
        return self._masks[key]

    def new_cache(self) -> FrameCache:
        return FrameCache(len(self.blocks), self.config.context_frames)

    def forward(self, latents: torch.Tensor, taus: torch.Tensor, actions: torch.Tensor,
                cache: FrameCache | None = None, write: int = 0) -> torch.Tensor:
        """Velocity (B, F, C, h, w) for latent frames (B, F, C, h, w) at times ``taus`` (B, F) after
        ``actions`` (B, F) (index ``num_actions`` = none yet).

        Without a cache the F frames are a whole training sequence (block-causal). With a cache
        they follow the cached frames; the first ``write`` of them are appended to the cache.
        """
        B, Fr, C, h, w = latents.shape
        T = self.tokens_per_frame
        if (h, w) != (self.config.latent_size,) * 2 or C != self.config.latent_channels:
            raise ValueError(f"expected latents (B, F, {self.config.latent_channels}, {self.config.latent_size}, "
                             f"{self.config.latent_size}), got {tuple(latents.shape)}")
        if not 0 <= write <= Fr:
            raise ValueError(f"write must be in [0, {Fr}], got {write}")
        past = cache.frames if cache is not None else 0
        start = cache.next_frame if cache is not None else 0
        dtype = self.x_embed.weight.dtype  # the weights' (float32, or bfloat16 where loaded so)
        x = self.x_embed(latents.to(dtype).permute(0, 1, 3, 4, 2).reshape(B, Fr * T, C))
        cond = self.t_embed(timestep_embedding(taus, x.shape[-1]).to(dtype)) + self.action_embed(actions)  # (B, F, D)

        # cached keys were rotated when written, so only the new frames need their rotary table
        # (one per row when the rows are different worlds, each at its own frame index)
        def rotary(first: int) -> torch.Tensor:
            return rope_3d(torch.arange(first, first + Fr), self.config.latent_size,
                           x.shape[-1] // self.config.num_heads, self.config.rope_base)

        rope = torch.stack([rotary(s) for s in start]) if isinstance(start, list) else rotary(start)
        mask = self._mask(past, Fr, x.device)
        past_k = tuple(cache.keys) if cache is not None and past else (None,) * len(self.blocks)
        past_v = tuple(cache.values) if cache is not None and past else (None,) * len(self.blocks)
        args = (x, cond, rope.to(x.device, dtype), mask, past_k, past_v)
        key = (B, Fr, past, write, x.dtype, x.device)
        if self._compiled and not torch.is_grad_enabled():
            out, keys, values = self._compiler(key, *_dense_args(args), compile_new=self._precompiling)
        else:
            out, keys, values = self._trunk(*args)
        if cache is not None and write:
            for i, (k, v) in enumerate(zip(keys, values)):
                cache.write(i, k[:, :, :write * T], v[:, :, :write * T], T)
            cache.frames = min(cache.frames + write, cache.max_frames)
            cache.next_frame = ([f + write for f in cache.next_frame] if isinstance(cache.next_frame, list)
                                else cache.next_frame + write)
        return out.view(B, Fr, h, w, C).permute(0, 1, 4, 2, 3).to(latents.dtype)

    def _trunk(self, x, cond, rope, mask, past_k: tuple, past_v: tuple):
        """The blocks and the output layer over tokens x (B, L, D) with per-frame conditions ``cond``
        (B, F, D), after the past keys and values of each block: a pure function of tensors (what
        :meth:`compile_step` compiles). Returns the output tokens and each block's new keys and
        values."""
        T = self.tokens_per_frame
        keys, values = [], []
        for block, pk, pv in zip(self.blocks, past_k, past_v):
            c = block.adaLN_modulation(cond).repeat_interleave(T, dim=1)
            x, k, v = block(x, c, rope, mask, pk, pv)
            keys.append(k)
            values.append(v)
        shift, scale = self.final_modulation(cond).repeat_interleave(T, dim=1).chunk(2, dim=-1)
        return self.final(self.final_norm(x) * (1 + scale) + shift), tuple(keys), tuple(values)

    # ------------------------------------------------------------------ the compiled step (#48, #49)

    def compile_step(self, enabled: bool = True, mode: str | None = "auto") -> None:
        """Run generation forwards through ``torch.compile`` (``enabled=False``: eagerly). Only the
        shapes :meth:`precompile` compiled run compiled; any other (the first frames, while the
        cache fills) runs eagerly, so nothing compiles while a world plays (the app's worlds step
        in threads, and torch compiles in one). ``mode`` is ``torch.compile``'s (``"auto"``: CUDA
        graphs on a GPU)."""
        self._compiled = bool(enabled)
        if enabled:
            self._compiler = step_compiler(self._compiler, self._trunk, f"the {type(self).__name__} step",
                                           _describe_bucket, mode, self.x_embed.weight.device)

    @property
    def compiled_step(self) -> bool:
        """Whether generation forwards run compiled (:meth:`compile_step`)."""
        return self._compiled

    @torch.no_grad()
    def precompile(self, batch_sizes, frames) -> None:
        """Compile the step for a full cache (``context_frames`` past frames) at each batch size and
        each number of frames per forward in ``frames`` (with that many, less the new ones, written:
        pass (shown, new) pairs), announcing each compile once."""
        if not self._compiled:
            raise RuntimeError("precompile() compiles the compiled step: call compile_step() first")
        cfg, device = self.config, self.x_embed.weight.device
        self._precompiling = True
        try:
            for batch in batch_sizes:
                for shown, new in frames:
                    caches = [self._full_cache(device) for _ in range(batch)]
                    cache = caches[0] if batch == 1 else FrameCache.stack(caches)  # as a session passes them
                    shape = (batch, shown + new, cfg.latent_channels, cfg.latent_size, cfg.latent_size)
                    self(torch.zeros(shape, device=device), torch.zeros(batch, shown + new, device=device),
                         torch.zeros(batch, shown + new, dtype=torch.long, device=device), cache=cache, write=shown)
        finally:
            self._precompiling = False

    def _full_cache(self, device) -> FrameCache:
        """A cache of batch 1 holding ``context_frames`` frames (zeros): the shape of a playing world."""
        cfg = self.config
        cache = self.new_cache()
        shape = (1, cfg.num_heads, cfg.context_frames * self.tokens_per_frame, cfg.dim // cfg.num_heads)
        dtype = self.x_embed.weight.dtype
        cache.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.blocks]
        cache.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.blocks]
        cache.frames, cache.next_frame = cfg.context_frames, cfg.context_frames
        return cache


def _dense_args(args):
    """The trunk's arguments with row-major strides (tensors, and the tuples of past keys and
    values): cache slices keep their parent's strides, and a compiled graph guards on strides."""
    return tuple(tuple(t if t is None else dense(t) for t in a) if isinstance(a, tuple) else dense(a) for a in args)


def _describe_bucket(key) -> str:
    batch, frames, past, write, *_ = key
    return f"{batch} world(s), {frames} frames a forward ({write} shown), {past} past frames"
