"""Train the shipped shapes-world text-to-image model, reproducibly and resumably.

    visualspec train-shapes --out assets/shapes-t2i

Three parts, trained from scratch on images drawn fresh from the shapes world every step (so there
is no dataset to store, and step s always sees the same batch):

1. a VQ tokenizer in LlamaGen's architecture, scaled down: 64x64 images -> 16x16 codes of a
   512-entry, L2-normalised codebook (reconstruction + codebook + commitment losses, with dead
   codes restarted from encoder outputs). Dead-code restarts spread the codebook over tiny
   variations of flat colour (uniform background alone used 191 codes), which the GPT would have
   to model as noise, so the codebook is then pruned: codes are taken by usage and a code within
   ``codebook_merge_distance`` of a more used one is dropped (about 100 codes remain; GenEval-shapes
   of reconstructed ground truth is unchanged);
2. a small T5 text encoder over the world's words, trained first on its own to predict the words
   around each word (so its features carry word order and bind a colour to its noun), then frozen,
   as LlamaGen's T5 is;
3. a text-conditional LlamaGen GPT over the 256 image tokens, reading the caption features plus a
   learned embedding per caption slot (next-token cross-entropy; 10% of captions are replaced by
   the null caption for classifier-free guidance). With ``ema_decay`` > 0 the pipeline gets an
   exponential moving average of the weights, checkpointed with them.

Checkpoints (safetensors + JSON) are written to ``--work-dir`` every few minutes; rerunning the
same command resumes where it stopped. A GPU is used when present. The GPT trains in bfloat16
autocast where the hardware runs bfloat16 fast, else in float32 (:func:`training_autocast`). The
final pipeline stores the GPT in float16 to keep the asset small (it is loaded back in float32).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..worlds import shapes
from .common import (claim_work_dir, ema_update, optimizer_step, run_stage, training_autocast,
                     warmup_cosine_lr, write_training_record)


@dataclass
class ShapesTrainingConfig:
    """The recipe of ``visualspec train-shapes``. Each field says what it sets; why each value was
    chosen, and what it scored, is in the model card (assets/shapes-t2i/README.md) and
    docs/experiments/."""

    seed: int = 0  # seeds every stage; fixes a run's weights only on one kind of CPU
    # VQ tokenizer
    codebook_size: int = 512  # codes before pruning
    vq_channels: int = 16  # width of the tokenizer's first convolution
    vq_steps: int = 3000
    vq_batch: int = 16
    vq_lr: float = 2e-3
    codebook_merge_distance: float = 0.2  # a code this close to a more used one is dropped (pruning)
    # text encoder + GPT
    text_dim: int = 128
    text_layers: int = 2
    caption_tokens: int = 16  # caption length in tokens (the GPT's prefix)
    gpt_dim: int = 192
    gpt_layers: int = 8
    gpt_heads: int = 3
    gpt_steps: int = 3000
    gpt_batch: int = 32
    gpt_lr: float = 6e-4
    warmup_steps: int = 100
    caption_dropout: float = 0.1  # share of captions replaced by the null caption (classifier-free guidance)
    ema_decay: float = 0.0  # > 0: the pipeline gets an exponential moving average of the weights; 0: the last weights
    # what the GPT sees: tasks drawn with these weights, and scenes captioned in more detail than
    # GenEval's prompt with probability ``caption_detail`` (see ``training_caption``)
    task_weights: dict = field(default_factory=lambda: {
        "single_object": 1.0, "two_object": 2.0, "counting": 2.0, "colors": 1.0, "position": 2.0, "color_attr": 2.0})
    caption_detail: float = 0.5
    caption_order: str = "raster"  # "raster": two objects named in the order the GPT draws them; "random": either order
    prefix_rope: str = "identity"  # rotary angle of the caption prefix: "identity" (turned by 0) or LlamaGen's "zeros"
    caption_positions: bool = True  # a learned embedding per caption slot (False: the caption features alone, as LlamaGen)
    # steps of a text stage before the GPT's: the encoder learns to predict the words around each
    # word (offsets -3..3, :func:`pretrain_text_encoder`) and is then frozen; 0 = no text stage
    # (the encoder trains with the GPT)
    text_steps: int = 500
    text_batch: int = 128
    text_lr: float = 2e-3
    checkpoint_seconds: float = 300.0  # how often a stage writes its checkpoint
    compile: bool = True  # torch.compile the GPT's training forward
    # sampling defaults written into the pipeline folder; they do not change training, so a work
    # folder may be resumed with other values
    guidance_scale: float = 3.0  # classifier-free guidance scale
    top_k: int = 0  # 0 = off
    epsilon_cutoff: float = 3e-3  # tokens below this conditional probability are left out before guidance
    lantern_k: int = 16  # LANTERN's neighbourhood: the k nearest codes of the (pruned) codebook
    lantern_delta: float = 0.05  # LANTERN's total-variation budget per token
    jacobi_init: str = "repeat_above"  # how SJD and LANTERN fill fresh draft positions
    gsd_group_size: int = 1  # GSD's group half-width in the target's ranking

# fields that do not change the trained weights (a work folder may be resumed with other values)
NON_TRAINING_FIELDS = ("guidance_scale", "top_k", "epsilon_cutoff", "lantern_k", "lantern_delta", "jacobi_init",
                       "gsd_group_size", "checkpoint_seconds", "compile")


# ------------------------------------------------------------------------------------ data


def world_batch(seed: int, step: int, batch: int):
    """Batch ``step`` of the training stream: images (B, 3, 64, 64) in [-1, 1] and prompts."""
    rng = np.random.default_rng([seed, step])
    images, prompts = [], []
    for _ in range(batch):
        image, metadata, _ = shapes.sample(rng)
        images.append(image)
        prompts.append(metadata["prompt"])
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1
    return x, prompts


def raster_index(obj, patch: int = 4) -> int:
    """Index of the first image token (raster order, ``patch``-pixel tokens) that ``obj`` covers."""
    ys, xs = np.nonzero((shapes.render([obj]) != shapes.BACKGROUND).any(-1))
    return int(((ys // patch) * (shapes.CANVAS // patch) + xs // patch).min())


def training_caption(metadata: dict, objects, rng: np.random.Generator, detail: float, order: str = "raster") -> str:
    """A caption of a world scene for training, in the words of the world's prompts.

    Scenes of one or two objects are also captioned with what GenEval's prompt left open: with
    probability ``detail`` the colours ("a photo of a red circle and a blue square"), and for two
    objects, with probability ``detail`` their relation when it holds clearly ("a photo of a circle
    left of a square"). Every such caption is still true of its image, and the scenes a GenEval
    prompt describes are unchanged, so the model learns the same conditional distribution for
    evaluation prompts while seeing colour and position words about three times as often.

    With ``order="raster"`` two objects joined by "and" (or by a detail relation) are named in the
    order the GPT draws them: the object whose first token comes first in raster order is named
    first. Binding then has a simple rule to learn (the n-th object drawn is the n-th named), and an
    evaluation prompt, which leaves placement open, is drawn with its first-named object first.
    Position prompts keep their own order, which their relation word fixes.
    """
    if order not in ("raster", "random"):
        raise ValueError(f"caption order must be 'raster' or 'random', got {order!r}")
    if metadata["tag"] == "counting" or len(objects) > 2:
        return metadata["prompt"]
    name_colors = "color" in metadata["include"][0] or rng.random() < detail
    noun = lambda o: shapes.with_article(f"{o.color} {o.shape}" if name_colors else o.shape)  # noqa: E731
    if len(objects) == 1:
        return f"a photo of {noun(objects[0])}"
    a, b = objects if rng.random() < 0.5 else objects[::-1]
    if order == "raster":
        a, b = sorted(objects, key=raster_index)
    relation = None
    if metadata["tag"] == "position":
        b, a = objects  # the position clause is the second object, relative to the first
        relation = metadata["include"][1]["position"][0]
    elif rng.random() < detail:
        relations = shapes.relative_position(a.box, b.box)
        if len(relations) == 1 and shapes.clear_relation(a.box, b.box, next(iter(relations))):
            relation = next(iter(relations))
    return f"a photo of {noun(a)} {relation or 'and'} {noun(b)}"


def caption_batch(seed: int, step: int, batch: int, task_weights: dict, detail: float, order: str = "raster"):
    """Batch ``step`` of the GPT's training stream: images (B, 3, 64, 64) in [-1, 1] and captions."""
    rng = np.random.default_rng([seed, step])
    tasks = list(task_weights)
    weights = np.array([task_weights[t] for t in tasks], dtype=np.float64)
    images, captions = [], []
    for _ in range(batch):
        image, metadata, objects = shapes.sample(rng, str(rng.choice(tasks, p=weights / weights.sum())))
        images.append(image)
        captions.append(training_caption(metadata, objects, rng, detail, order))
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1
    return x, captions



def build_vq(cfg: ShapesTrainingConfig):
    from ..models.llamagen_vq import LlamaGenVQModel

    torch.manual_seed(cfg.seed)
    return LlamaGenVQModel(codebook_size=cfg.codebook_size, codebook_embed_dim=8, ch=cfg.vq_channels,
                           ch_mult=(1, 2, 4), z_channels=32, num_res_blocks=1, norm_groups=8,
                           codebook_usage_window=cfg.vq_batch * 256 * 4)


def train_vq(cfg: ShapesTrainingConfig, work: Path, device, progress=True):
    vq = build_vq(cfg).to(device)
    opt = torch.optim.Adam(vq.parameters(), lr=cfg.vq_lr, betas=(0.9, 0.99))

    def step_fn(step):
        x, _ = world_batch(cfg.seed, step, cfg.vq_batch)
        x = x.to(device)
        recon, indices, losses = vq(x)
        rec = F.mse_loss(recon, x) + F.l1_loss(recon, x)
        loss = rec + losses["codebook_loss"] + losses["commitment_loss"]
        optimizer_step(opt, loss)
        if step % 50 == 49 and step < cfg.vq_steps * 0.8:
            restart_dead_codes(vq, x)
        return {"rec": rec.item(), "usage": vq.codebook_usage()}

    run_stage("VQ tokenizer", work / "vq", {"vq": vq}, opt, cfg.vq_steps, step_fn, lr=cfg.vq_lr, warmup=50,
              checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return vq.eval()


@torch.no_grad()
def restart_dead_codes(vq, images) -> int:
    """Move codebook entries unused in the recent window onto random current encoder outputs."""
    used = vq.quantize.codebook_used.long()
    counts = torch.bincount(used[used >= 0], minlength=vq.config.codebook_size)
    dead = (counts == 0).nonzero().flatten()
    if len(dead) == 0:
        return 0
    z = vq.encode_latents(images).permute(0, 2, 3, 1).reshape(-1, vq.config.codebook_embed_dim)
    pick = torch.randint(0, z.shape[0], (len(dead),), device=z.device)
    vq.quantize.embedding.weight[dead] = z[pick] + 0.01 * torch.randn_like(z[pick])
    return len(dead)


@torch.no_grad()
def prune_codebook(vq, images: torch.Tensor, min_distance: float):
    """A copy of ``vq`` whose codebook keeps, in order of usage on ``images``, each used code that
    is farther than ``min_distance`` (L2-normalised) from every code kept before it."""
    from ..models.llamagen_vq import LlamaGenVQModel

    counts = torch.bincount(vq.encode(images)[1].flatten(), minlength=vq.config.codebook_size)
    vectors = F.normalize(vq.quantize.embedding.weight, dim=-1) if vq.config.codebook_l2_norm \
        else vq.quantize.embedding.weight
    kept: list[int] = []
    for code in torch.argsort(counts, descending=True, stable=True).tolist():
        if counts[code] == 0:
            break
        if not kept or torch.cdist(vectors[code][None], vectors[kept]).min() > min_distance:
            kept.append(code)
    pruned = LlamaGenVQModel.from_config({**vq.config, "codebook_size": len(kept)})
    state = vq.state_dict()
    state["quantize.embedding.weight"] = state["quantize.embedding.weight"][torch.tensor(kept)]
    pruned.load_state_dict(state)
    return pruned.eval()


# ------------------------------------------------------------------------------------ stage 2: text + GPT


def build_text_and_gpt(cfg: ShapesTrainingConfig, vocab_size: int):
    from transformers import T5Config, T5EncoderModel

    from ..models.llamagen import LlamaGenGPT
    from ..pipelines.tiny import word_tokenizer

    torch.manual_seed(cfg.seed + 1)
    tokenizer = word_tokenizer(shapes.vocabulary(), model_max_length=cfg.caption_tokens)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=cfg.text_dim, d_kv=32, d_ff=2 * cfg.text_dim,
                                      num_layers=cfg.text_layers, num_heads=cfg.text_dim // 32, dropout_rate=0.0,
                                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    gpt = LlamaGenGPT(vocab_size=vocab_size, dim=cfg.gpt_dim, n_layer=cfg.gpt_layers, n_head=cfg.gpt_heads,
                      multiple_of=64, model_type="t2i", caption_dim=cfg.text_dim, cls_token_num=cfg.caption_tokens,
                      block_size=256, class_dropout_prob=cfg.caption_dropout, prefix_rope=cfg.prefix_rope,
                      caption_positions=cfg.caption_positions)
    return tokenizer, encoder, gpt


NEIGHBOUR_OFFSETS = (-3, -2, -1, 0, 1, 2, 3)


def neighbour_targets(ids: torch.Tensor, mask: torch.Tensor, offsets=NEIGHBOUR_OFFSETS) -> torch.Tensor:
    """Targets (B, T, len(offsets)) of the text stage: the token ``offsets[j]`` places from each
    token, or -100 (ignored) where either token is padding or off the caption."""
    B, T = ids.shape
    targets = torch.full((B, T, len(offsets)), -100, dtype=torch.long, device=ids.device)
    for j, o in enumerate(offsets):
        src = slice(max(0, -o), min(T, T - o))  # positions t with 0 <= t + o < T
        dst = slice(max(0, o), min(T, T + o))
        both = mask[:, src].bool() & mask[:, dst].bool()
        targets[:, src, j] = torch.where(both, ids[:, dst], torch.full_like(ids[:, dst], -100))
    return targets


def pretrain_text_encoder(cfg: ShapesTrainingConfig, encoder, tokenizer, work: Path, device, progress=True):
    """The text stage: teach the encoder word order before the GPT reads it.

    T5 learns word order only through its relative position bias, and trained jointly with the
    GPT from scratch that bias stays at its initial spread: "a red circle and a blue square" and "a
    blue circle and a red square" reach the GPT as the same set of features (docs/experiments/2026-11-23-word-order.md). Here a linear
    head predicts, from each word's output feature, the words 3, 2 and 1 places before it, itself,
    and the words 1, 2 and 3 places after it, on captions drawn as the GPT stage draws them. A word's
    feature then carries its neighbours: "circle" knows it follows "red", "square" that it follows
    "left of". The head is discarded, and the GPT stage keeps the encoder frozen: trained on with
    the GPT, it lost most of that order within 160 steps (0.90 -> 0.35 in the measure of docs/experiments/2026-11-23-word-order.md).
    """
    head = torch.nn.Linear(cfg.text_dim, len(tokenizer) * len(NEIGHBOUR_OFFSETS)).to(device)
    opt = torch.optim.AdamW(list(encoder.parameters()) + list(head.parameters()), lr=cfg.text_lr,
                            weight_decay=0.01)
    encoder.train()

    def step_fn(step):
        _, captions = caption_batch(cfg.seed + 3, step, cfg.text_batch, cfg.task_weights, cfg.caption_detail,
                                    cfg.caption_order)
        enc = tokenizer(captions, padding="max_length", max_length=cfg.caption_tokens, truncation=True,
                        return_tensors="pt")
        ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)
        feats = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = head(feats).unflatten(-1, (len(NEIGHBOUR_OFFSETS), len(tokenizer)))
        targets = neighbour_targets(ids, mask)
        loss = F.cross_entropy(logits.reshape(-1, len(tokenizer)), targets.reshape(-1), ignore_index=-100)
        optimizer_step(opt, loss)
        right = (logits.argmax(-1) == targets)[targets >= 0]
        return {"loss": loss.item(), "acc": right.float().mean().item()}

    run_stage("text encoder", work / "text", {"encoder": encoder, "head": head}, opt, cfg.text_steps, step_fn,
              lr=cfg.text_lr, warmup=50, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return encoder


def caption_training_batch(vq, helper, seed: int, step: int, batch: int, task_weights: dict, detail: float,
                           order: str, dropout: float, drop_seed: int, autocast: dict, device):
    """A GPT stage's batch ``step``: the image tokens (B, N) of :func:`caption_batch`'s images,
    their captions through the pipeline ``helper``'s own prompt encoding (features, mask; under
    ``autocast``), and ``drop`` (B,): the captions replaced by the null one (a share ``dropout``,
    drawn from ``drop_seed``; their mask all ones), for classifier-free guidance."""
    x, prompts = caption_batch(seed, step, batch, task_weights, detail, order)
    with torch.no_grad():
        _, tokens = vq.encode(x.to(device))
    drop = torch.rand(len(prompts), generator=torch.Generator().manual_seed(drop_seed))
    drop = (drop < dropout).to(device)
    with torch.autocast(**autocast):
        captions, mask = helper.encode_prompt(prompts)
        mask = torch.where(drop[:, None], torch.ones_like(mask), mask)
    return tokens.flatten(1), captions, mask, drop


def train_gpt(cfg: ShapesTrainingConfig, vq, work: Path, device, progress=True):
    from ..pipelines.llamagen import LlamaGenPipeline

    tokenizer, encoder, gpt = build_text_and_gpt(cfg, vq.config.codebook_size)
    encoder, gpt = encoder.to(device), gpt.to(device)
    trained = {"encoder": encoder, "gpt": gpt}
    if cfg.text_steps > 0:  # a text stage first, then the encoder stays as it left it (as LlamaGen's T5)
        pretrain_text_encoder(cfg, encoder, tokenizer, work, device, progress)
        encoder.eval().requires_grad_(False)
        del trained["encoder"]
    params = [p for m in trained.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.gpt_lr, betas=(0.9, 0.95), weight_decay=0.05)
    # the pipeline's own prompt encoding (tokenise, encode, left-pad) is what training uses
    helper = LlamaGenPipeline(transformer=gpt, vq_model=vq, text_encoder=encoder, tokenizer=tokenizer)
    autocast = training_autocast(device)
    forward = torch.compile(gpt) if cfg.compile else gpt
    for m in trained.values():
        m.train()
    modules = {"encoder": encoder, **trained}
    if cfg.ema_decay > 0:
        ema = {f"ema_{name}": copy.deepcopy(m).eval().requires_grad_(False) for name, m in trained.items()}
        ema_params = [p for m in ema.values() for p in m.parameters()]
        modules.update(ema)

    def step_fn(step):
        tokens, captions, mask, drop = caption_training_batch(
            vq, helper, cfg.seed + 1, step, cfg.gpt_batch, cfg.task_weights, cfg.caption_detail, cfg.caption_order,
            cfg.caption_dropout, cfg.seed * 1_000_003 + step, autocast, device)
        with torch.autocast(**autocast):
            logits = forward(captions, tokens, cond_mask=mask, drop_condition=drop)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens.reshape(-1))
        optimizer_step(opt, loss, params)
        if cfg.ema_decay > 0:  # warmed up so early weights do not linger: decay (1 + s) / (10 + s) at first
            ema_update(ema_params, params, min(cfg.ema_decay, (1 + step) / (10 + step)))
        return {"loss": loss.item()}

    run_stage("text encoder + GPT", work / "gpt", modules, opt, cfg.gpt_steps, step_fn,
              lr=cfg.gpt_lr, warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    if cfg.ema_decay > 0:
        encoder, gpt = modules.get("ema_encoder", encoder), modules["ema_gpt"]
    return tokenizer, encoder.eval(), gpt.eval()


# ------------------------------------------------------------------------------------ the command


def train_shapes(out: str, work_dir: str, cfg: ShapesTrainingConfig | None = None, progress: bool = True):
    """Run (or resume) all stages and save the pipeline folder to ``out``."""
    from ..pipelines.llamagen import LlamaGenPipeline

    cfg = cfg or ShapesTrainingConfig()
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k not in NON_TRAINING_FIELDS})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    vq = train_vq(cfg, work, device, progress)
    if cfg.codebook_merge_distance > 0:
        vq = prune_codebook(vq.cpu(), world_batch(cfg.seed + 2, 0, 256)[0], cfg.codebook_merge_distance).to(device)
    for p in vq.parameters():
        p.requires_grad_(False)
    tokenizer, encoder, gpt = train_gpt(cfg, vq, work, device, progress)
    pipe = LlamaGenPipeline(transformer=gpt.cpu().half(), vq_model=vq.to("cpu"),
                            text_encoder=encoder.to("cpu"), tokenizer=tokenizer,
                            default_guidance_scale=cfg.guidance_scale, default_top_k=cfg.top_k,
                            default_epsilon_cutoff=cfg.epsilon_cutoff,
                            default_lantern_k=cfg.lantern_k, default_lantern_delta=cfg.lantern_delta,
                            default_jacobi_init=cfg.jacobi_init, default_gsd_group_size=cfg.gsd_group_size)
    pipe.save_pretrained(out)
    write_training_record(out, "visualspec train-shapes", asdict(cfg), t0, device)
    return LlamaGenPipeline.from_pretrained(out)  # float32 again, as users load it


# ------------------------------------------------------------------------------------ FID-shapes features


def scene_targets(objects) -> np.ndarray:
    """What the FID-shapes network learns to see: per shape x colour counts, per-shape mean centre,
    object count and mean size (32 numbers, roughly unit scale)."""
    t = np.zeros(32, dtype=np.float32)
    colors = list(shapes.COLORS)
    for obj in objects:
        t[shapes.SHAPES.index(obj.shape) * 8 + colors.index(obj.color)] += 1
    for i, s in enumerate(shapes.SHAPES):
        centres = [o.center for o in objects if o.shape == s]
        if centres:
            t[24 + 2 * i: 26 + 2 * i] = np.mean(centres, axis=0) / shapes.CANVAS
    t[30] = len(objects) / 4
    t[31] = np.mean([o.box[2] - o.box[0] for o in objects]) / shapes.MAX_SIZE
    return t


def world_feature_batch(seed: int, step: int, batch: int):
    rng = np.random.default_rng([seed, 7, step])
    images, targets = [], []
    for _ in range(batch):
        image, _, objects = shapes.sample(rng)
        images.append(image)
        targets.append(scene_targets(objects))
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255, torch.from_numpy(np.stack(targets))


def train_feature_net(out: str, steps: int = 800, batch: int = 64, seed: int = 0, reference_images: int = 5000,
                      progress: bool = True):
    """Train the FID-shapes network and write it with the world's reference statistics to ``out``."""
    from tqdm.auto import tqdm

    from ..eval.fid import compute_statistics, save_statistics
    from ..models.shapes_features import ShapesFeatureNet

    torch.manual_seed(seed)
    net = ShapesFeatureNet()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.01)
    for step in tqdm(range(steps), desc="FID-shapes features", disable=not progress):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(step, steps, 2e-3, 50)
        x, y = world_feature_batch(seed, step, batch)
        loss = F.mse_loss(net.predict_targets(x), y)
        optimizer_step(opt, loss)
    net.eval().save_pretrained(out)
    feats = []
    with torch.no_grad():
        for start in range(0, reference_images, 250):
            x, _ = world_feature_batch(seed + 1, start, min(250, reference_images - start))
            feats.append(net(x).double().numpy())
    mu, sigma = compute_statistics(np.concatenate(feats))
    save_statistics(Path(out) / "reference_stats.npz", mu, sigma)
    return net
