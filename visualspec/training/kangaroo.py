"""Train a Kangaroo adapter for a text pair's target (arXiv 2404.18911).

    visualspec --threads 1 train-drafter --kind kangaroo --pair assets/text-pair --out assets/text-pair/kangaroo

The target stays frozen, and so do the parts of the draft that are the target's own modules (the
embedding, the first E layers, the head; :func:`visualspec.models.kangaroo.kangaroo_lm`). Only
the adapter (:class:`visualspec.models.kangaroo.KangarooAdapter`: input RMSNorm, one attention,
final RMSNorm) learns, started from the target's layer E attention and final norm. On random
``context``-token windows of the target's own training stream (the standard library's training
files, as ``train-text`` encodes them), the loss at every position is Kangaroo's: the soft
cross-entropy from the target's whole next-token distribution p to the draft's q,

    H(p, q) = - sum_x p(x) log q(x)        (= KL(p || q) + the target's entropy, a constant),

averaged over positions. Logged beside it: KL(p || q), the exact rule's acceptance of a sampled
draft sum_x min(p(x), q(x)), and how often the draft's argmax is the target's (greedy acceptance).
The adapter is saved in float16 with the target's weight hash and the default exit threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..models.kangaroo import KangarooAdapter, kangaroo_lm


@dataclass
class KangarooConfig:
    """The Kangaroo recipe for a text pair's target."""

    seed: int = 0
    exit_layer: int = 1  # E: the target layers the draft runs before the adapter
    batch: int = 8
    context: int = 256
    steps: int = 1000
    lr: float = 1e-3
    warmup_steps: int = 50
    stop_below: float = 0.6  # the saved default exit threshold (Kangaroo's script default)
    max_files: int = 0  # 0: every training file of the pair (tests use a few)
    checkpoint_seconds: float = 300.0


def kangaroo_losses(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> dict:
    """Kangaroo's loss from logits (..., V) of the draft (q) and the target (p), averaged over
    positions: ``loss`` = H(p, q) = -sum_x p(x) log q(x); ``kl`` = KL(p || q); ``accept`` =
    sum_x min(p(x), q(x)); ``top1`` = P(argmax q = argmax p)."""
    log_q = draft_logits.float().log_softmax(-1)
    with torch.no_grad():
        log_p = target_logits.float().log_softmax(-1)
        p = log_p.exp()
    loss = -(p * log_q).sum(-1).mean()
    with torch.no_grad():
        kl = (p * (log_p - log_q)).sum(-1).mean()
        accept = torch.minimum(p, log_q.exp()).sum(-1).mean()
        top1 = (log_q.argmax(-1) == log_p.argmax(-1)).float().mean()
    return {"loss": loss, "kl": kl.item(), "accept": accept.item(), "top1": top1.item()}


def train_kangaroo(pair: str | None, out: str, work_dir: str, cfg: KangarooConfig | None = None,
                   progress: bool = True) -> Path:
    """Run (or resume) the adapter's training against the target of text pair ``pair``; write it to ``out``."""
    from .feature_drafter import _train, text_target_run

    cfg = cfg or KangarooConfig()
    folder, work, device, t0, target, stream = text_target_run(pair, work_dir, cfg)
    torch.manual_seed(cfg.seed)
    adapter = KangarooAdapter.for_target(target, cfg.exit_layer, cfg.stop_below).train().requires_grad_(True)
    draft = kangaroo_lm(adapter, target)

    def batch_losses(step):
        rng = np.random.default_rng([cfg.seed, 11, step])
        starts = rng.integers(0, len(stream) - cfg.context, size=cfg.batch)
        x = torch.stack([stream[s:s + cfg.context] for s in starts]).long().to(device)
        with torch.no_grad():
            p = target(input_ids=x).logits
        return kangaroo_losses(draft(input_ids=x).logits, p)

    return _train(adapter, cfg, batch_losses, f"Kangaroo adapter (E={cfg.exit_layer})", work, out, device, t0,
                  "visualspec train-drafter --kind kangaroo", progress, pair=str(folder), training_tokens=len(stream))
