"""MAR: masked autoregressive image generation over continuous tokens (Li et al. 2024).

An image is a 16 x 16 grid of KL-16 latents (16 numbers each). MAR generates it in ``num_iter``
steps, in a random order per image: at each step a bidirectional encoder reads the known tokens
(after ``buffer_size`` copies of the class embedding), a decoder fills the unknown positions with a
learned mask token and predicts a condition z for every position, and the diffusion head
(:class:`visualspec.models.diffusion_head.DiffusionHead`) draws the tokens chosen for this step. The
number still unknown after step k is ``floor(256 cos(pi/2 (k + 1) / num_iter))`` (at least one less
than before, never below one until the last step): few tokens early, many late.

Classifier-free guidance runs the class and the "fake latent" (null class) rows together and
guides the head's eps, with scale ``1 + (cfg - 1) (256 - unknown) / 256`` ("linear", MAR's
evaluation) or ``cfg`` ("constant", its demo).

Parameter names are the official ones (``mar_base``, ``mar_large``, ``mar_huge`` with the README's
heads), so ``checkpoint-last.pth`` loads strictly (:meth:`MAR.from_mar_checkpoint`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from visualspec.core.checks import check_int
from visualspec.core.continuous import head_noise
from visualspec.core.sampling import normal

from .checkpoints import load_state_dict_strict, read_checkpoint
from .diffusion_head import DiffusionHead

# the official sizes, with the diffusion heads of MAR's README evaluation
MAR_CONFIGS = {
    "mar_base": dict(encoder_embed_dim=768, encoder_depth=12, encoder_num_heads=12, decoder_embed_dim=768,
                     decoder_depth=12, decoder_num_heads=12, diffloss_d=6, diffloss_w=1024),
    "mar_large": dict(encoder_embed_dim=1024, encoder_depth=16, encoder_num_heads=16, decoder_embed_dim=1024,
                      decoder_depth=16, decoder_num_heads=16, diffloss_d=8, diffloss_w=1280),
    "mar_huge": dict(encoder_embed_dim=1280, encoder_depth=20, encoder_num_heads=16, decoder_embed_dim=1280,
                     decoder_depth=20, decoder_num_heads=16, diffloss_d=12, diffloss_w=1536),
}


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, L, dim = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, dim))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm ViT block: x + attn(norm1(x)), then x + mlp(norm2(x)) (no dropout at inference)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def unknown_after(step: int, num_iter: int, seq_len: int, unknown_now: int) -> int:
    """How many tokens are still unknown after ``step`` (0-based) of ``num_iter``: MAR's cosine
    schedule ``floor(seq_len cos(pi/2 (step + 1) / num_iter))``, kept in [1, unknown_now - 1]
    before the last step, 0 after it."""
    if step >= num_iter - 1:
        return 0
    target = math.floor(seq_len * math.cos(math.pi / 2 * (step + 1) / num_iter))
    return max(1, min(unknown_now - 1, target))


class MAR(ModelMixin, ConfigMixin):
    """MAR's masked encoder-decoder with its diffusion head (``diffloss``)."""

    @register_to_config
    def __init__(
        self,
        img_size: int = 256,
        vae_stride: int = 16,
        patch_size: int = 1,
        encoder_embed_dim: int = 1024,
        encoder_depth: int = 16,
        encoder_num_heads: int = 16,
        decoder_embed_dim: int = 1024,
        decoder_depth: int = 16,
        decoder_num_heads: int = 16,
        mlp_ratio: float = 4.0,
        vae_embed_dim: int = 16,
        class_num: int = 1000,
        buffer_size: int = 64,
        diffloss_d: int = 3,
        diffloss_w: int = 1024,
        num_sampling_steps: int = 100,
    ):
        super().__init__()
        grid = img_size // vae_stride // patch_size
        self.seq_len = grid * grid
        self.token_dim = vae_embed_dim * patch_size ** 2
        enc, dec = encoder_embed_dim, decoder_embed_dim
        self.class_emb = nn.Embedding(class_num, enc)
        self.fake_latent = nn.Parameter(torch.zeros(1, enc))  # the null class of guidance
        self.z_proj = nn.Linear(self.token_dim, enc)
        self.z_proj_ln = nn.LayerNorm(enc, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len + buffer_size, enc))
        self.encoder_blocks = nn.ModuleList(Block(enc, encoder_num_heads, mlp_ratio) for _ in range(encoder_depth))
        self.encoder_norm = nn.LayerNorm(enc, eps=1e-6)
        self.decoder_embed = nn.Linear(enc, dec)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len + buffer_size, dec))
        self.decoder_blocks = nn.ModuleList(Block(dec, decoder_num_heads, mlp_ratio) for _ in range(decoder_depth))
        self.decoder_norm = nn.LayerNorm(dec, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len, dec))
        self.diffloss = DiffusionHead(self.token_dim, dec, diffloss_d, diffloss_w, num_sampling_steps)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "MAR":
        if name not in MAR_CONFIGS:
            raise ValueError(f"unknown MAR size {name!r}; choose one of {sorted(MAR_CONFIGS)}")
        return cls(**{**MAR_CONFIGS[name], **overrides})

    @classmethod
    def from_mar_checkpoint(cls, path: str, name: str, key: str = "model_ema", **overrides) -> "MAR":
        """Load an official ``checkpoint-last.pth`` strictly: its EMA weights by default (as MAR's
        demos), or ``key="model"``."""
        model = cls.from_name(name, **overrides)
        load_state_dict_strict(model, read_checkpoint(path, key), f"{path} (loaded as {name})")
        return model.eval()

    # ------------------------------------------------------------------ one step

    def conditions(self, tokens: torch.Tensor, known: torch.Tensor, class_embedding: torch.Tensor) -> torch.Tensor:
        """z (B, seq_len, decoder dim) for every position, given the tokens (B, seq_len, D) at the
        ``known`` positions (B, seq_len) bool, the same count in every row."""
        B = tokens.shape[0]
        buffer = self.config.buffer_size
        x = self.z_proj(tokens)
        x = torch.cat([class_embedding[:, None].expand(B, buffer, -1), x], dim=1)
        x = self.z_proj_ln(x + self.encoder_pos_embed_learned)
        keep = torch.cat([known.new_ones(B, buffer), known], dim=1)
        x = x[keep].view(B, -1, x.shape[-1])  # the buffer and the known tokens only
        for block in self.encoder_blocks:
            x = block(x)
        x = self.decoder_embed(self.encoder_norm(x))
        full = self.mask_token.to(x.dtype).expand(B, keep.shape[1], -1).clone()
        full[keep] = x.flatten(0, 1)
        x = full + self.decoder_pos_embed_learned
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_norm(x)[:, buffer:] + self.diffusion_pos_embed_learned

    # ------------------------------------------------------------------ generation

    def random_orders(self, batch: int, generator=None) -> torch.Tensor:
        """One random permutation of the positions per row (B, seq_len), from each row's generator."""
        gens = generator if isinstance(generator, (list, tuple)) else [generator] * batch
        return torch.stack([torch.randperm(self.seq_len, generator=g) for g in gens]).to(self.device)

    @torch.no_grad()
    def generate(self, labels: torch.Tensor | None, num_iter: int = 64, cfg: float = 1.0, cfg_schedule: str = "linear",
                 temperature: float = 1.0, generator=None, batch_size: int | None = None,
                 last_step_noise: bool = False) -> torch.Tensor:
        """Latent tokens (B, seq_len, D) by MAR's sampler. ``labels`` (B,) or None (unconditional,
        ``batch_size`` rows). ``last_step_noise=False`` is MAR's head exactly; True draws the head's
        last step too (the law CSpD verifies)."""
        if cfg_schedule not in ("linear", "constant"):
            raise ValueError(f"cfg_schedule must be 'linear' or 'constant', got {cfg_schedule!r}")
        check_int("num_iter", num_iter, 1, high=self.seq_len)
        B = len(labels) if labels is not None else batch_size
        cls = self.class_emb(labels) if labels is not None else self.fake_latent.expand(B, -1)
        guided = cfg != 1.0
        if guided:
            cls = torch.cat([cls, self.fake_latent.expand(B, -1)])
        tokens = torch.zeros(B, self.seq_len, self.token_dim, device=self.device, dtype=self.dtype)
        orders = self.random_orders(B, generator)
        rank = torch.empty_like(orders).scatter_(1, orders, torch.arange(self.seq_len, device=self.device).expand(B, -1))
        unknown = self.seq_len
        steps = len(self.diffloss.schedule)
        for step in range(num_iter):
            known = rank >= unknown  # as MAR: the first `unknown` positions of each order are still masked
            z = self.conditions(torch.cat([tokens, tokens]) if guided else tokens,
                                torch.cat([known, known]) if guided else known, cls)
            left = unknown_after(step, num_iter, self.seq_len, unknown)
            now = (rank >= left) & (rank < unknown)  # (B, seq_len): drawn this step
            scale = 1 + (cfg - 1) * (self.seq_len - left) / self.seq_len if cfg_schedule == "linear" else cfg
            count = unknown - left
            draws = normal((B, count, steps + 1, self.token_dim), generator, self.device)
            noise = head_noise(draws.flatten(0, 1))
            zs = z[torch.cat([now, now])] if guided else z[now]
            drawn, _ = self.diffloss.sample(zs, noise, temperature=temperature, guidance=scale if guided else 1.0,
                                            last_step_noise=last_step_noise)
            tokens[now] = drawn.to(tokens.dtype)
            unknown = left
        return tokens

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, seq_len, D) -> latents (B, vae_embed_dim, h, w) for the VAE's decoder."""
        B, p, c = tokens.shape[0], self.config.patch_size, self.config.vae_embed_dim
        h = math.isqrt(self.seq_len)
        x = tokens.view(B, h, h, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(B, c, h * p, h * p)
