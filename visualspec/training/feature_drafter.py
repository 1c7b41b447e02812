"""Train an EAGLE-style feature drafter for a text target (#50).

    visualspec train-drafter --pair assets/text-pair --out assets/text-pair/feature-drafter

The target stays frozen. On random 256-token windows of the target's own training stream (the
standard library's training files, as ``train-text`` encodes them), the target gives its feature
f_c (last hidden state) and its distribution p_c = softmax(head(f_c)) at every column. The drafter
(:class:`visualspec.models.feature_drafter.FeatureDraftModel`) reads (embedding of x_c, f_{c-1})
and predicts g_c; its loss at each column is EAGLE's: a smooth-L1 regression of g_c on f_c plus
``kl_weight`` x the KL divergence KL(p_c || softmax(head(g_c))), here against the target's whole
distribution (distillation, as DistillSpec argues, rather than the sampled token).

**Its own features (training-time test).** When it drafts several tokens, the drafter reads
back features it predicted, not the target's. So each step also runs ``unroll`` more passes in
which every column's input feature is the previous pass's prediction for the column before, with
the same loss against the target. Without this the second and later drafts see inputs unlike any
seen in training. By default a pass attends its own columns (a whole pass at a time, simplified);
with ``step_wise`` it attends what a chain's draft attends, the real columns before the chain and
the chain's drafts so far (EAGLE-3's training-time test,
:meth:`~visualspec.models.feature_drafter.FeatureDraftModel.unrolled_passes`). EAGLE-3 also weights
pass j by 0.8^j and drops the feature loss: ``pass_decay`` and ``regression_weight``.

**Several of its layers (EAGLE-3's fusion).** With ``feature_layers`` the drafter reads the
target's hidden states at those indices side by side, fused by its ``reduce`` layer, instead of
the last one alone; the teacher-forced pass reads them, the unrolled passes its own predictions as
before, and the loss is unchanged (the regression still aims at the last hidden state, the head's
input, so that the only change is what the drafter reads). Text targets and the shapes GPT alike.

The drafter is saved with a hash of the target's weights (``target_hash``), so a drafter is not
loaded against another target by mistake.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import claim_work_dir, optimizer_step, run_stage, training_autocast, write_training_record


@dataclass
class DrafterRecipe:
    """What every feature drafter recipe sets."""

    seed: int = 0
    batch: int = 16
    steps: int = 1500
    lr: float = 1e-3
    warmup_steps: int = 100
    n_head: int = 4
    ffn_multiple: int = 3  # the MLP is this many times the feature width
    kl_weight: float = 1.0
    unroll: int = 1  # extra passes on the drafter's own predicted features
    step_wise: bool = False  # the passes attend as a decode chain's drafts do (EAGLE-3), not their own columns
    pass_decay: float = 1.0  # pass j's share of the loss is pass_decay ** j, normalised (EAGLE-3: 0.8)
    regression_weight: float = 1.0  # the smooth-L1 feature loss's weight (EAGLE-3: 0, the KL alone)
    checkpoint_seconds: float = 300.0
    # the target's hidden states the drafter fuses (EAGLE-3), indices of transformers' hidden_states;
    # None: the last one alone (EAGLE)
    feature_layers: list[int] | None = field(default=None)

    def loss_options(self) -> dict:
        """The keyword arguments of :func:`feature_losses` this recipe sets."""
        return dict(unroll=self.unroll, kl_weight=self.kl_weight, step_wise=self.step_wise, decay=self.pass_decay,
                    regression_weight=self.regression_weight)


@dataclass
class FeatureDrafterConfig(DrafterRecipe):
    """The text recipe."""

    context: int = 256
    max_files: int = 0  # 0: every training file of the pair (tests use a few)


def pass_weights(passes: int, decay: float) -> list[float]:
    """Each pass's share of the loss: w_j = decay^j / sum_i decay^i, j = 0..passes-1 (decay 1: the mean)."""
    raw = [decay ** j for j in range(passes)]
    return [w / sum(raw) for w in raw]


def feature_losses(net, feats: torch.Tensor, emb: torch.Tensor, head, unroll: int, kl_weight: float,
                   fused: torch.Tensor | None = None, step_wise: bool = False, decay: float = 1.0,
                   regression_weight: float = 1.0) -> dict:
    """EAGLE's loss for a drafter ``net`` over L pairs: ``emb`` (B, L, D) the target's embeddings of
    the pairs' tokens, ``feats`` (B, L + 1, D) the target's features, pair c reading ``feats[:, c]``
    and predicting ``feats[:, c + 1]`` (and its distribution under ``head``), ``regression_weight``
    x smooth L1 + ``kl_weight`` x KL; over the teacher-forced pass and ``unroll`` passes on
    predicted features (see the module), weighted by :func:`pass_weights` with ``decay``. ``fused``
    (B, L + 1, nD): the hidden states a drafter with ``feature_layers`` reads instead of ``feats``
    (through its ``intake``), column for column. The passes are the network's
    :meth:`~visualspec.models.feature_drafter.FeatureDraftModel.unrolled_passes` (``step_wise``:
    attending as a decode chain's drafts do)."""
    feats, emb = feats.float().detach(), emb.float().detach()
    with torch.no_grad():
        log_p = head(feats[:, 1:]).float().log_softmax(-1)
    read = feats if fused is None else net.intake(fused.float().detach())
    total, parts = 0.0, {}
    passes = net.unrolled_passes(emb, read[:, :-1], unroll, step_wise)
    for i, (g, weight) in enumerate(zip(passes, pass_weights(1 + unroll, decay))):
        regression = F.smooth_l1_loss(g, feats[:, 1:])
        kl = F.kl_div(head(g).float().log_softmax(-1), log_p, log_target=True, reduction="batchmean") / g.shape[1]
        total = total + weight * (regression_weight * regression + kl_weight * kl)
        parts[f"kl{i}"] = kl.item()
    return {"loss": total, **parts}


def text_losses(net, target, tokens: torch.Tensor, **options) -> dict:
    """:func:`feature_losses` (with its keyword ``options``) on token windows (B, T+1) of a
    transformers causal LM ``target``: pair c = (x_c, f_{c-1}), c = 1..T."""
    layers = net.config.feature_layers
    with torch.no_grad():
        out = target.base_model(input_ids=tokens, output_hidden_states=bool(layers))
        feats = out.last_hidden_state  # f_0..f_T
        fused = torch.cat([out.hidden_states[i] for i in layers], -1) if layers else None
        emb = target.get_input_embeddings()(tokens[:, 1:])
    return feature_losses(net, feats, emb, target.get_output_embeddings(), fused=fused, **options)


def chimera_losses(net, target, tokens: torch.Tensor, kl_weight: float) -> dict:
    """A Chimera drafter's loss on token windows (B, T+1) of a transformers causal LM ``target``
    (the pairs c = 1..T read the trigram x_{c-2..c} and f_{c-1}): the fast layer's output o_c
    regressed on f_c (smooth L1, Chimera's feature loss), plus ``kl_weight`` x the mean over heads i
    of KL(p_{c+i} || law of head i at column c), the target's distribution of token c + 1 + i
    where the window has it."""
    from ..models.chimera import trigrams

    head = target.get_output_embeddings()
    with torch.no_grad():
        feats = target.base_model(input_ids=tokens).last_hidden_state.float()  # f_0..f_T
        emb = target.get_input_embeddings()(trigrams(tokens)[:, 1:]).flatten(-2).float()
        log_p = head(feats[:, 1:]).float().log_softmax(-1)  # p_1..p_T
    out = net(emb, feats[:, :-1])
    predicted = net.head_features(feats[:, :-1], out)  # (B, T, K, D): head i at column c -> token c + 1 + i
    T, parts, kls = out.shape[1], {}, []
    for i in range(predicted.shape[2]):
        q = head(predicted[:, :T - i, i]).float().log_softmax(-1)
        kls.append(F.kl_div(q, log_p[:, i:], log_target=True, reduction="batchmean") / (T - i))
        parts[f"kl{i}"] = kls[-1].item()
    regression = F.smooth_l1_loss(out, feats[:, 1:])
    return {"loss": regression + kl_weight * torch.stack(kls).mean(), "regression": regression.item(), **parts}


def text_target_run(pair: str | None, work_dir: str, cfg) -> tuple:
    """What a drafter trained against a text pair's target starts from: ``(folder, work, device,
    t0, target, stream)``, the pair's folder, the claimed work directory (``cfg`` without
    ``checkpoint_seconds``), the device, the start time, the frozen float32 target and the token
    stream of ``cfg.max_files`` training files."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from .text import encode_corpus, stdlib_files, text_pair_folder

    folder = text_pair_folder(pair, ("tokenizer", "target"))
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k != "checkpoint_seconds"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder / "tokenizer")
    target = AutoModelForCausalLM.from_pretrained(folder / "target", dtype=torch.float32, use_safetensors=True)
    target = target.to(device).eval().requires_grad_(False)
    train_files, _ = stdlib_files(cfg.max_files)
    return folder, work, device, t0, target, encode_corpus(tokenizer, train_files)


def train_text_feature_drafter(pair: str | None, out: str, work_dir: str, cfg: FeatureDrafterConfig | None = None,
                               progress: bool = True) -> Path:
    """Run (or resume) the drafter's training against the target of text pair ``pair``; write it to ``out``."""
    from ..models.feature_drafter import FeatureDraftModel

    cfg = cfg or FeatureDrafterConfig()
    return _train_text_drafter(pair, out, work_dir, cfg, FeatureDraftModel,
                               lambda net, target, x: text_losses(net, target, x, **cfg.loss_options()),
                               "feature drafter", "visualspec train-drafter", progress,
                               feature_layers=cfg.feature_layers)


@dataclass
class ChimeraConfig(FeatureDrafterConfig):
    """The text recipe of a Chimera drafter: the feature drafter's, with ``heads`` residual heads
    (no unrolled passes: it never reads its own predicted features), on half the batch, since each
    head scores the whole vocabulary at every column (at the feature drafter's batch of 16 a step
    took 3.5 s on the 2-core AVX2 CPU, at 8 one second)."""

    heads: int = 4
    unroll: int = 0
    batch: int = 8
    steps: int = 2000


def train_text_chimera(pair: str | None, out: str, work_dir: str, cfg: ChimeraConfig | None = None,
                       progress: bool = True) -> Path:
    """Run (or resume) a Chimera drafter's training against the target of text pair ``pair``;
    write it to ``out``."""
    from ..models.chimera import ChimeraDraftModel

    cfg = cfg or ChimeraConfig()
    return _train_text_drafter(pair, out, work_dir, cfg, ChimeraDraftModel,
                               lambda net, target, x: chimera_losses(net, target, x, cfg.kl_weight),
                               "Chimera drafter", "visualspec train-drafter --kind chimera", progress, heads=cfg.heads)


def _train_text_drafter(pair, out, work_dir: str, cfg, model_class, losses, desc: str, command: str, progress: bool,
                        **net_kwargs) -> Path:
    """A ``model_class`` drafter (the feature drafter's network or a subclass, with ``net_kwargs``)
    trained against text pair ``pair``'s target on random ``cfg.context + 1``-token windows of its
    stream, ``losses(net, target, windows)`` each step (:func:`_train`)."""
    from ..models.feature_drafter import check_trained_for, weights_hash
    from .text import _batch

    folder, work, device, t0, target, stream = text_target_run(pair, work_dir, cfg)
    dim = target.get_output_embeddings().weight.shape[1]
    torch.manual_seed(cfg.seed)
    net = model_class(feature_size=dim, n_head=cfg.n_head, ffn_hidden=cfg.ffn_multiple * dim,
                      max_len=max(4 * cfg.context, target.config.max_position_embeddings),
                      target_hash=weights_hash(target), **net_kwargs).to(device).train()
    check_trained_for("drafter", net, target, dim, command)  # the hidden states it fuses exist

    def batch_losses(step):  # the text pair's own window sampling (salt 7)
        return losses(net, target, _batch(stream, cfg, step, 7).to(device))

    return _train(net, cfg, batch_losses, desc, work, out, device, t0, command, progress, pair=str(folder),
                  training_tokens=len(stream))


def _train(net, cfg, batch_losses, desc: str, work: Path, out, device, t0: float, command: str, progress: bool,
           **record) -> Path:
    """The drafter's optimisation (AdamW, warmup and cosine, autocast where it pays) over
    ``batch_losses(step)`` (:func:`feature_losses`' dict), resumable in ``work``; then ``net`` in
    float16 to ``out`` with its training record."""
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    autocast = training_autocast(device)

    def step_fn(step):
        with torch.autocast(**autocast):
            losses = batch_losses(step)
        optimizer_step(opt, losses["loss"], net.parameters())
        return {k: float(v.detach()) if torch.is_tensor(v) else v for k, v in losses.items()}

    run_stage(desc, work / "drafter", {"drafter": net}, opt, cfg.steps, step_fn, lr=cfg.lr,
              warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    out = Path(out)
    net.eval().cpu().half().save_pretrained(out)
    write_training_record(out, command, asdict(cfg), t0, device, **record)
    return out


@dataclass
class ImageFeatureDrafterConfig(DrafterRecipe):
    """The shapes-world image recipe."""

    batch: int = 32
    unconditional: float = 0.5  # the share of rows without their caption: guidance drafts both halves


def train_image_feature_drafter(model: str | None, out: str, work_dir: str,
                                cfg: ImageFeatureDrafterConfig | None = None, progress: bool = True) -> Path:
    """Run (or resume) a feature drafter's training for a shapes-world LlamaGen pipeline ``model``
    (default: the shipped ``assets/shapes-t2i``); write it to ``out``.

    The data is the shapes world's (captions and rendered images, tokenised by the pipeline's own
    VQ, the GPT's training stream with another seed); the pairs are the image tokens x_c with the
    target's feature that predicted x_c; ``unconditional`` of the rows drop their caption (the null
    condition), since under guidance the drafter drafts the unconditional rows too."""
    from ..assets import SHAPES_T2I
    from ..models.feature_drafter import FeatureDraftModel, check_trained_for, weights_hash
    from ..pipelines.llamagen import LlamaGenPipeline
    from .shapes import ShapesTrainingConfig, caption_batch

    cfg = cfg or ImageFeatureDrafterConfig()
    folder = Path(model) if model is not None else SHAPES_T2I
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k != "checkpoint_seconds"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    pipe = LlamaGenPipeline.from_pretrained(folder).to(device)
    gpt, vq = pipe.transformer.eval().requires_grad_(False), pipe.vq_model.eval().requires_grad_(False)
    world = ShapesTrainingConfig()
    dim = gpt.config.dim
    torch.manual_seed(cfg.seed)
    net = FeatureDraftModel(feature_size=dim, n_head=cfg.n_head, ffn_hidden=cfg.ffn_multiple * dim,
                            max_len=gpt.config.block_size + 16, target_hash=weights_hash(gpt),
                            feature_layers=cfg.feature_layers).to(device).train()
    check_trained_for("drafter", net, gpt, dim, "visualspec train-drafter --model")  # the states it fuses exist
    # a fusing drafter's states, then the head's input (its loss's target) after them
    request = (*cfg.feature_layers, gpt.config.n_layer) if cfg.feature_layers else True

    def batch_losses(step):
        x, prompts = caption_batch(cfg.seed + 7, step, cfg.batch, world.task_weights, world.caption_detail,
                                   world.caption_order)
        drop = torch.rand(len(prompts), generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        drop = (drop < cfg.unconditional).to(device)
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            _, tokens = vq.encode(x.to(device))
            tokens = tokens.flatten(1)
            captions, mask = pipe.encode_prompt(prompts)
            mask = torch.where(drop[:, None], torch.ones_like(mask), mask)
            feats = gpt(captions, tokens, cond_mask=mask, drop_condition=drop, features=request)  # row c predicts x_c
            fused, feats = (feats[..., :-dim], feats[..., -dim:]) if cfg.feature_layers else (None, feats)
            emb = gpt.tok_embeddings(tokens[:, :-1])
        return feature_losses(net, feats, emb, gpt.head, fused=fused, **cfg.loss_options())

    return _train(net, cfg, batch_losses, "image feature drafter", work, out, device, t0,
                  "visualspec train-drafter --model", progress, model=str(folder))
