"""DistillSpec for a text pair's draft model (#50): distil the draft toward the target, on policy.

    visualspec train-drafter --kind distill --pair assets/text-pair --out assets/text-pair/draft-distilled

A draft token drafted from q is accepted by the exact rule with probability sum_x min(p(x), q(x))
= 1 - TVD(p, q), at every position a draft is made. DistillSpec (Zhou et al., ICLR 2024) therefore
trains the draft on the contexts it will draft from, its own samples (on-policy data), with a
divergence chosen for the decoding: each step, ``batch`` prompts are cut from the target's training
stream, the draft continues ``on_policy`` of them by sampling ``new_tokens`` tokens from itself
(the rest keep the stream's own continuation), and its distributions on those continuations are
pulled toward the frozen target's by :func:`distill_divergence`. The divergence is chosen before
measuring: total variation, the quantity acceptance is one minus of, so the loss is the expected
rejection rate of a draft at those contexts (the paper finds it among the best for greedy and
sampled decoding alike). The draft starts from the pair's own ``draft/``.

The loss is this module's own (twenty lines); TRL's ``GKDTrainer`` (experimental in TRL 1.x) brings
the Hugging Face ``Trainer``, ``datasets`` and ``pandas`` for what is here one loop over one stream.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .common import claim_work_dir, optimizer_step, run_stage, training_autocast, write_training_record

DIVERGENCES = ("tvd", "fkl", "rkl", "jsd")


@dataclass
class DistillConfig:
    """The DistillSpec recipe for a text pair's draft."""

    seed: int = 0
    batch: int = 16
    steps: int = 800
    lr: float = 3e-4
    warmup_steps: int = 50
    prompt_tokens: int = 64
    new_tokens: int = 64
    on_policy: float = 1.0  # the share of rows whose continuation the draft samples (the rest: the stream's)
    divergence: str = "tvd"
    beta: float = 0.5  # jsd's mixture weight
    max_files: int = 0  # 0: every training file of the pair (tests use a few)
    checkpoint_seconds: float = 300.0


def distill_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, kind: str = "tvd",
                       beta: float = 0.5) -> torch.Tensor:
    """The divergence between the target's distribution p = softmax(teacher) and the draft's
    q = softmax(student) at each position, (...,) from logits (..., V):

    - ``tvd``: 1/2 sum_x |p(x) - q(x)| (one minus the exact rule's acceptance of a draft from q);
    - ``fkl``: KL(p || q) = sum_x p(x) (log p(x) - log q(x));
    - ``rkl``: KL(q || p);
    - ``jsd``: beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q (GKD's form).
    """
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; choose one of {DIVERGENCES}")
    log_q, log_p = student_logits.float().log_softmax(-1), teacher_logits.float().log_softmax(-1)
    p, q = log_p.exp(), log_q.exp()
    if kind == "tvd":
        return 0.5 * (p - q).abs().sum(-1)
    if kind == "fkl":
        return (p * (log_p - log_q)).sum(-1)
    if kind == "rkl":
        return (q * (log_q - log_p)).sum(-1)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"jsd's beta must lie in (0, 1), got {beta}")
    log_m = torch.logsumexp(torch.stack([log_p + np.log(beta), log_q + np.log(1 - beta)]), 0)
    return beta * (p * (log_p - log_m)).sum(-1) + (1 - beta) * (q * (log_q - log_m)).sum(-1)


@torch.no_grad()
def on_policy_batch(draft, tokens: torch.Tensor, prompt_tokens: int, sampled_rows: int) -> torch.Tensor:
    """``tokens`` (B, P + G) from the stream with the continuations of the first ``sampled_rows``
    rows replaced by the draft's own samples (temperature 1, no truncation) after their P-token
    prompts."""
    if sampled_rows == 0:
        return tokens
    prompts, G = tokens[:sampled_rows, :prompt_tokens], tokens.shape[1] - prompt_tokens
    sampled = draft.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0, top_p=1.0,
                             temperature=1.0, max_new_tokens=G, min_new_tokens=G, pad_token_id=0)
    return torch.cat([sampled, tokens[sampled_rows:]])


def distill_loss(draft, target, tokens: torch.Tensor, prompt_tokens: int, kind: str, beta: float) -> dict:
    """Mean :func:`distill_divergence` over the positions that predict the continuation of
    ``tokens`` (B, P + G): columns P - 1 .. P + G - 2."""
    inputs = tokens[:, :-1]
    with torch.no_grad():
        teacher = target(input_ids=inputs).logits[:, prompt_tokens - 1:]
    student = draft(input_ids=inputs).logits[:, prompt_tokens - 1:]
    d = distill_divergence(student, teacher, kind, beta).mean()
    with torch.no_grad():  # the exact rule's acceptance of a draft from q, whatever the loss
        accept = 1.0 - distill_divergence(student.detach(), teacher, "tvd").mean()
    return {"loss": d, "acceptance": accept.item()}


def train_distilled_draft(pair: str | None, out: str, work_dir: str, cfg: DistillConfig | None = None,
                          progress: bool = True) -> Path:
    """Run (or resume) DistillSpec on the draft of text pair ``pair`` (default: the shipped one)
    against its target; write the distilled draft (a transformers folder, float16) to ``out``."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from .text import encode_corpus, stdlib_files, text_pair_folder

    cfg = cfg or DistillConfig()
    if cfg.divergence not in DIVERGENCES:
        raise ValueError(f"unknown divergence {cfg.divergence!r}; choose one of {DIVERGENCES}")
    if not 0.0 <= cfg.on_policy <= 1.0:
        raise ValueError(f"on_policy is a share of the rows in [0, 1], got {cfg.on_policy}")
    folder = text_pair_folder(pair)
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k != "checkpoint_seconds"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder / "tokenizer")
    load = dict(dtype=torch.float32, use_safetensors=True)
    target = AutoModelForCausalLM.from_pretrained(folder / "target", **load).to(device).eval().requires_grad_(False)
    draft = AutoModelForCausalLM.from_pretrained(folder / "draft", **load).to(device)
    train_files, _ = stdlib_files(cfg.max_files)
    stream = encode_corpus(tokenizer, train_files)
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    autocast = training_autocast(device)
    length, sampled = cfg.prompt_tokens + cfg.new_tokens, round(cfg.on_policy * cfg.batch)

    def step_fn(step):
        rng = np.random.default_rng([cfg.seed, 13, step])
        starts = rng.integers(0, len(stream) - length - 1, size=cfg.batch)
        x = torch.stack([stream[s:s + length] for s in starts]).long().to(device)
        torch.manual_seed(cfg.seed * 100_003 + step)  # the draft's samples: reproducible on resume
        draft.eval()
        x = on_policy_batch(draft, x, cfg.prompt_tokens, sampled)
        draft.train()
        with torch.autocast(**autocast):
            losses = distill_loss(draft, target, x, cfg.prompt_tokens, cfg.divergence, cfg.beta)
        optimizer_step(opt, losses["loss"], draft.parameters())
        return {"loss": losses["loss"].item(), "acceptance": losses["acceptance"]}

    run_stage("distilled draft", work / "draft", {"draft": draft}, opt, cfg.steps, step_fn, lr=cfg.lr,
              warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    out = Path(out)
    draft.eval().cpu().half().save_pretrained(out)
    write_training_record(out, "visualspec train-drafter --kind distill", asdict(cfg), t0, device,
                          pair=str(pair) if pair is not None else "assets/text-pair (shipped)",
                          training_tokens=len(stream))
    return out
