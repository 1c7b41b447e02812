"""Train a Lumina-layout model on the shapes world: text and image codes in one sequence.

    visualspec train-unified --out unified-shapes

The model is transformers' ``ChameleonForConditionalGeneration`` at a small size, the class
Lumina-mGPT runs on. Its vocabulary holds the world's words, the shipped shapes tokenizer's codes
(named ``IMGIMG<digits as A-J>Z``, as Chameleon names them) and Lumina's layout tokens. Each
training sequence is what the pipeline feeds and generates
(:class:`visualspec.pipelines.UnifiedARPipeline`):

    caption words, <reserved08706>, <racm3:break>, size, size, 16 x (16 codes, <reserved08799>), <eoss>

The size tokens count 32-pixel cells, here of 8 x 8 codes (4 pixels each). The loss is next-token
cross-entropy on the generated part (the rows and the end), read from the LM head directly:
transformers' Chameleon masks image tokens out of its own logits. 10 % of captions are dropped
with their separator, so the sequence starts at the image opening: Lumina-mGPT's unconditional
context for classifier-free guidance. The image tokenizer is the shipped shapes model's VQ
(frozen), so this model's images are comparable with the LlamaGen model's.

Images are drawn fresh from the world every step (step s always sees the same batch), checkpoints
go to ``--work-dir`` every few minutes, and rerunning the command resumes. A GPU is used when
present. The output is a pipeline folder with ``training.json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..worlds import shapes
from .common import claim_work_dir, optimizer_step, run_stage, training_autocast, write_training_record
from .shapes import caption_batch

LAYOUT_TOKENS = ("<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>")
TASK_WEIGHTS = {"single_object": 1.0, "two_object": 2.0, "counting": 2.0, "colors": 1.0, "position": 2.0,
                "color_attr": 2.0}  # the shapes recipe's


@dataclass
class UnifiedShapesConfig:
    """The recipe of ``visualspec train-unified``; each field says what it sets."""

    seed: int = 0  # seeds the weights and the data stream
    hidden: int = 192  # the transformer's width
    layers: int = 8
    heads: int = 3
    intermediate: int = 512  # the MLP's width
    steps: int = 1500
    batch: int = 32
    lr: float = 6e-4
    warmup_steps: int = 100
    caption_dropout: float = 0.1  # share of sequences without their caption (guidance)
    caption_detail: float = 0.5  # as the shapes recipe (see visualspec.training.shapes.training_caption)
    checkpoint_seconds: float = 300.0  # how often the run writes its checkpoint


def code_name(code: int) -> str:
    """Chameleon's name of image code ``code``: its digits as letters A-J between IMGIMG and Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def build_vocabulary(codebook_size: int, grid_cells: int):
    """The word tokenizer of the world's words and the model's ``vocabulary_map``: the words, then
    the codes, then the layout tokens and the size tokens up to ``grid_cells`` cells."""
    from ..pipelines.tiny import word_tokenizer

    tokenizer = word_tokenizer(shapes.vocabulary(), model_max_length=32)
    vocab = dict(tokenizer.get_vocab())
    names = [code_name(c) for c in range(codebook_size)] + list(LAYOUT_TOKENS)
    names += [f"<reserved{8800 + n:05d}>" for n in range(1, grid_cells + 1)]
    vocab.update({name: len(tokenizer) + i for i, name in enumerate(names)})
    return tokenizer, vocab


def build_model(cfg: UnifiedShapesConfig, vocab: dict, pad: int, eos: int):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    torch.manual_seed(cfg.seed)
    config = ChameleonConfig(
        vocab_size=len(vocab), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        max_position_embeddings=512, vocabulary_map=vocab, pad_token_id=pad, bos_token_id=eos, eos_token_id=eos,
        # transformers builds Chameleon's VQ encoder inside the model; it is never used here, so it is tiny
        vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1, resolution=32, attn_resolutions=[]))
    return ChameleonForConditionalGeneration(config)


def training_sequences(prompt_ids: list[list[int]], layout, codes: torch.Tensor, drop: torch.Tensor, pad: int):
    """Left-padded ``(input_ids, attention_mask, labels)`` (B, T): each caption's ids (none where
    ``drop``), the separator, the layout's opening, then the image's rows and ending; labels are
    -100 but on the generated part."""
    grid = torch.tensor(layout.code_tokens)[codes.flatten(1).cpu()]  # (B, h*w) token ids
    forced = layout.forced()
    generated = forced.repeat(len(grid), 1)
    generated[:, forced < 0] = grid
    rows = []
    for ids, dropped, image in zip(prompt_ids, drop.tolist(), generated.tolist()):
        rows.append(([] if dropped else ids) + list(layout.opening) + image)
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    labels = input_ids.clone()
    labels[:, :width - layout.num_tokens] = -100
    return input_ids, mask, labels


def train_unified_shapes(out: str, work_dir: str, cfg: UnifiedShapesConfig | None = None,
                         progress: bool = True) -> None:
    """Run (or resume) the training and write the pipeline folder ``out``."""
    from ..assets import SHAPES_T2I
    from ..models.llamagen_vq import LlamaGenVQModel
    from ..pipelines import UnifiedARPipeline

    cfg = cfg or UnifiedShapesConfig()
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k != "checkpoint_seconds"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    vq = LlamaGenVQModel.from_pretrained(SHAPES_T2I / "vq_model", use_safetensors=True)
    vq = vq.to(device).eval().requires_grad_(False)
    grid = shapes.CANVAS // vq.downsample_factor
    cell = 32 // vq.downsample_factor  # codes per side of Lumina's 32-pixel cell
    tokenizer, vocab = build_vocabulary(vq.config.codebook_size, grid // cell)
    model = build_model(cfg, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id).to(device)
    pipe = UnifiedARPipeline(transformer=model, tokenizer=tokenizer, vq_model=vq, image_height=grid,
                             image_width=grid, grid_cell_codes=cell, default_guidance_scale=3.0)
    layout = pipe.layout
    separator = [vocab["<reserved08706>"]]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)
    autocast = training_autocast(device)
    model.train()

    def step_fn(step):
        x, captions = caption_batch(cfg.seed + 1, step, cfg.batch, TASK_WEIGHTS, cfg.caption_detail)
        with torch.no_grad():
            codes = vq.encode(x.to(device))[1]
        drop = torch.rand(len(captions), generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        prompt_ids = [tokenizer(c).input_ids + separator for c in captions]
        ids, mask, labels = (t.to(device) for t in training_sequences(prompt_ids, layout, codes,
                                                                      drop < cfg.caption_dropout,
                                                                      tokenizer.pad_token_id))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.autocast(**autocast):
            hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
            logits = model.lm_head(hidden[:, :-1]).float()  # the raw head: Chameleon masks image logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer_step(opt, loss, model.parameters())
        return {"loss": loss.item()}

    run_stage("unified (Lumina layout)", work / "model", {"model": model}, opt, cfg.steps, step_fn, lr=cfg.lr,
              warmup=cfg.warmup_steps, checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    pipe.transformer.eval()
    pipe.to("cpu").save_pretrained(out)
    write_training_record(out, "visualspec train-unified", asdict(cfg), t0, device)
