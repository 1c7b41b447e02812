"""Train a continuous-token target and draft on the shapes world, reproducibly and resumably.

    visualspec train-continuous --out continuous-shapes

Three parts, on images drawn fresh from the shapes world every step (step s always sees the same
batch, so a resumed stage ends with the same weights):

1. a KL autoencoder (:class:`visualspec.models.kl_vae.KLAutoencoder`, scaled down): 64x64 images
   <-> a 16x16 grid of ``token_dim``-dimensional latents (L1 + squared error + a small KL term);
   its ``scale`` is then set so that the latents have unit standard deviation, as MAR's 0.2325 does
   for KL-16;
2. a target and 3. a smaller draft: causal continuous-token models
   (:class:`visualspec.models.continuous_ar.ContinuousARTransformer`) over the 256 latents in
   raster order, each with MAR's diffusion head trained by the noise-prediction loss
   (:meth:`visualspec.models.diffusion_head.DiffusionHead.loss`, ``head_batch_mul`` noisings per
   token), reading the captions through the shipped shapes model's frozen text encoder (10% replaced
   by its null caption for classifier-free guidance).

Checkpoints go to ``--work-dir`` every few minutes; rerunning the command resumes. A GPU is used
when present. The output is a :class:`visualspec.pipelines.ContinuousARPipeline` folder (the
target as ``transformer``, ``draft_model``, ``vae``, the shapes model's text encoder and tokenizer)
with ``training.json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import claim_work_dir, optimizer_step, run_stage, write_training_record
from .shapes import caption_batch, world_batch


@dataclass
class ContinuousShapesConfig:
    """The recipe of ``visualspec train-continuous``; each field says what it sets."""

    seed: int = 0  # seeds every stage
    token_dim: int = 8  # numbers per continuous token (latent channels)
    # KL autoencoder
    kl_channels: int = 32  # width of its first convolution (a multiple of 32, for GroupNorm)
    kl_steps: int = 1200
    kl_batch: int = 8
    kl_lr: float = 2e-3
    kl_weight: float = 1e-5  # weight of the KL term against the reconstruction losses
    # the two AR models: width, depth, heads; their diffusion heads' depth and width
    # where the target's transformer starts: "token_model" copies the shipped shapes token model's
    # (its width, depth and heads must be target_dim, target_layers, target_heads; tokens go in
    # through a soft lookup of its codes, fitted to them), "scratch" starts from random weights
    target_init: str = "scratch"
    # with target_init="token_model": "frozen" keeps the copied transformer and trains the head
    # alone, "trained" trains both
    target_trunk: str = "frozen"
    input_fit_images: int = 256  # world images whose latents fit the token-model start's input lookup
    input_fit_steps: int = 300  # Adam steps of that fit
    target_dim: int = 160  # 192 with target_init="token_model" (the token model's)
    target_layers: int = 6  # 8 with target_init="token_model"
    target_heads: int = 2  # 3 with target_init="token_model"
    target_head_depth: int = 3
    target_head_width: int = 160
    target_steps: int = 1100
    draft_dim: int = 96
    draft_layers: int = 3
    draft_heads: int = 2
    draft_head_depth: int = 2
    draft_head_width: int = 96
    draft_steps: int = 900
    ar_batch: int = 32
    ar_lr: float = 6e-4
    warmup_steps: int = 100
    prediction_type: str = "v_prediction"  # what the heads predict (see visualspec.models.diffusion_head)
    head_batch_mul: int = 2  # noisings per token per step (MAR's diffusion_batch_mul)
    caption_dropout: float = 0.1  # share of captions replaced by the null caption (guidance)
    caption_detail: float = 0.5  # as the shapes recipe (see visualspec.training.shapes.training_caption)
    num_sampling_steps: int = 50  # the heads' sampling steps, written into the folder
    checkpoint_seconds: float = 300.0  # how often a stage writes its checkpoint


NON_TRAINING_FIELDS = ("num_sampling_steps", "checkpoint_seconds")
TASK_WEIGHTS = {"single_object": 1.0, "two_object": 2.0, "counting": 2.0, "colors": 1.0, "position": 2.0,
                "color_attr": 2.0}  # the shapes recipe's


def train_autoencoder(cfg: ContinuousShapesConfig, work: Path, device, progress: bool = True):
    from ..models.kl_vae import KLAutoencoder

    torch.manual_seed(cfg.seed)
    kl = KLAutoencoder(embed_dim=cfg.token_dim, ch=cfg.kl_channels, ch_mult=(1, 2, 2), num_res_blocks=1,
                       scale=1.0).to(device)
    opt = torch.optim.AdamW(kl.parameters(), lr=cfg.kl_lr, betas=(0.5, 0.9))
    kl.train()

    def step_fn(step):
        x = world_batch(cfg.seed, step, cfg.kl_batch)[0].to(device)
        posterior = kl.encode(x)
        g = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step)
        latents = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=g, device=device)
        recon = kl.decode(latents)
        kl_term = 0.5 * (posterior.mean.pow(2) + posterior.std.pow(2) - 1 - 2 * posterior.std.log()).mean()
        loss = F.l1_loss(recon, x) + F.mse_loss(recon, x) + cfg.kl_weight * kl_term
        optimizer_step(opt, loss)
        return {"loss": loss.item()}

    run_stage("KL autoencoder", work / "autoencoder", {"kl": kl}, opt, cfg.kl_steps, step_fn, lr=cfg.kl_lr,
              warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    kl.eval().requires_grad_(False)
    with torch.no_grad():  # unit-variance latents for the transformers, as MAR's scale does for KL-16
        std = kl.encode(world_batch(cfg.seed + 5, 0, 256)[0].to(device)).mean.std()
    kl.register_to_config(scale=float(1.0 / std))
    return kl


@torch.no_grad()
def latent_tokens(kl, images: torch.Tensor) -> torch.Tensor:
    """Images (B, 3, 64, 64) -> the posterior means as raster-order tokens (B, 256, token_dim)."""
    return kl.encode(images).mean.flatten(2).transpose(1, 2)


def build_ar(cfg: ContinuousShapesConfig, which: str, caption_dim: int, cls_token_num: int, input_codes: int = 0):
    from ..models.continuous_ar import ContinuousARTransformer

    torch.manual_seed(cfg.seed + (1 if which == "target" else 2))
    get = lambda name: getattr(cfg, f"{which}_{name}")  # noqa: E731
    return ContinuousARTransformer(
        token_dim=cfg.token_dim, dim=get("dim"), n_layer=get("layers"), n_head=get("heads"), multiple_of=64,
        model_type="t2i", caption_dim=caption_dim, cls_token_num=cls_token_num, block_size=256,
        head_depth=get("head_depth"), head_width=get("head_width"), num_sampling_steps=cfg.num_sampling_steps,
        prediction_type=cfg.prediction_type, input_codes=input_codes)


def start_from_token_model(model, token_pipe, kl, seed: int, images: int = 256, fit_steps: int = 300) -> float:
    """Copy the token model's transformer (``token_pipe.transformer``: layers, caption pathway, null
    caption, final norm) into ``model.backbone`` and fit its token input to the token model's.

    The input is a soft code lookup (:class:`visualspec.models.continuous_ar.SoftCodeInput`): its
    embedding is the token model's table, and its MLP is fitted (``fit_steps`` of Adam on the
    cross-entropy) to classify each latent of ``images`` world images into the token model's VQ
    code for the same grid cell. The copied layers then see the inputs they were trained on.
    Returns the classifier's accuracy on those cells.
    """
    gpt = token_pipe.transformer
    for name in ("dim", "n_layer", "n_head", "caption_dim", "cls_token_num", "block_size"):
        if gpt.config[name] != model.backbone.config[name]:
            raise ValueError(f"the target's {name} is {model.backbone.config[name]}, the token model's "
                             f"{gpt.config[name]}; a target started from it must have the same")
    if model.config.input_codes != gpt.config.vocab_size:
        raise ValueError(f"the target's input_codes is {model.config.input_codes}; the token model has "
                         f"{gpt.config.vocab_size} codes")
    state = {k: v for k, v in gpt.state_dict().items() if not k.startswith(("tok_embeddings.", "output."))}
    missing, unexpected = model.backbone.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("tok_embeddings.") for k in missing):
        raise ValueError(f"the token model's layout differs: missing {missing}, unexpected {unexpected}")
    lookup = model.backbone.tok_embeddings
    with torch.no_grad():
        lookup.embedding.copy_(gpt.tok_embeddings.weight)
        x = world_batch(seed, 0, images)[0].to(model.device)
        z = latent_tokens(kl, x).flatten(0, 1).float()  # (N, D)
        codes = token_pipe.vq_model.encode(x)[1].flatten().to(z.device)  # (N,)
    opt = torch.optim.Adam(lookup.mlp.parameters(), lr=1e-2)
    for _ in range(fit_steps):
        loss = F.cross_entropy(lookup.mlp(z), codes)
        optimizer_step(opt, loss)
    with torch.no_grad():
        return float((lookup.mlp(z).argmax(-1) == codes).float().mean())


def train_ar(cfg: ContinuousShapesConfig, which: str, kl, text, work: Path, device, progress: bool = True):
    """Train the target or the draft; ``text`` is the shapes pipeline whose encoder reads captions
    (and, with ``target_init="token_model"``, whose transformer the target starts from)."""
    codes = text.transformer.config.vocab_size if which == "target" and cfg.target_init == "token_model" else 0
    model = build_ar(cfg, which, text.transformer.config.caption_dim, text.transformer.config.cls_token_num,
                     codes).to(device)
    if which == "target" and cfg.target_init == "token_model" and not (work / which / "meta.json").is_file():
        accuracy = start_from_token_model(model, text, kl, cfg.seed + 9, cfg.input_fit_images, cfg.input_fit_steps)
        print(f"target starts from the token model; its input classifies latents into codes with accuracy "
              f"{accuracy:.3f}")
    frozen = which == "target" and cfg.target_init == "token_model" and cfg.target_trunk == "frozen"
    trained = model.diffloss if frozen else model
    opt = torch.optim.AdamW(trained.parameters(), lr=cfg.ar_lr, betas=(0.9, 0.95), weight_decay=0.05)
    model.train()

    def step_fn(step):
        x, captions = caption_batch(cfg.seed + 1, step, cfg.ar_batch, TASK_WEIGHTS, cfg.caption_detail)
        with torch.no_grad():
            tokens = latent_tokens(kl, x.to(device))
            features, mask = text.encode_prompt(captions)
        drop = torch.rand(len(captions), generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        drop = (drop < cfg.caption_dropout).to(device)  # these rows see the model's own null caption
        mask = torch.where(drop[:, None], torch.ones_like(mask), mask)
        with torch.set_grad_enabled(not frozen):  # a frozen transformer: only the head learns
            z = model(features, tokens, cond_mask=mask, drop_condition=drop)  # (B, 256, dim): row i -> token i
        m = cfg.head_batch_mul
        g = torch.Generator(device=device).manual_seed(cfg.seed * 7_919 + step)
        loss = model.diffloss.loss(tokens.flatten(0, 1).repeat(m, 1), z.flatten(0, 1).repeat(m, 1), g)
        optimizer_step(opt, loss, trained.parameters())
        return {"loss": loss.item()}

    run_stage(f"{which} (continuous AR)", work / which, {which: model}, opt, getattr(cfg, f"{which}_steps"), step_fn,
              lr=cfg.ar_lr, warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return model.eval()


def train_continuous_shapes(out: str, work_dir: str, cfg: ContinuousShapesConfig | None = None,
                            progress: bool = True) -> None:
    """Run (or resume) every stage and write the folder ``out``."""
    from ..assets import SHAPES_T2I
    from ..pipelines import VisualSpecPipeline

    cfg = cfg or ContinuousShapesConfig()
    if cfg.target_init not in ("token_model", "scratch"):
        raise ValueError(f"target_init must be 'token_model' or 'scratch', got {cfg.target_init!r}")
    if cfg.target_trunk not in ("frozen", "trained"):
        raise ValueError(f"target_trunk must be 'frozen' or 'trained', got {cfg.target_trunk!r}")
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k not in NON_TRAINING_FIELDS})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    text = VisualSpecPipeline.from_pretrained(SHAPES_T2I).to(device)  # its frozen text encoder reads the captions
    text.text_encoder.requires_grad_(False)
    kl = train_autoencoder(cfg, work, device, progress)
    target = train_ar(cfg, "target", kl, text, work, device, progress)
    draft = train_ar(cfg, "draft", kl, text, work, device, progress)
    from ..pipelines import ContinuousARPipeline

    pipe = ContinuousARPipeline(transformer=target.cpu(), vae=kl.cpu(), text_encoder=text.text_encoder.cpu(),
                                tokenizer=text.tokenizer, draft_model=draft.cpu())
    pipe.save_pretrained(out)
    write_training_record(out, "visualspec train-continuous", asdict(cfg), t0, device)
