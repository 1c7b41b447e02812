"""Train a small target and draft language-model pair on the Python standard library's source.

    visualspec train-text --out assets/text-pair

Every machine with Python has the corpus: the ``.py`` files of the standard library (without
``site-packages`` and tests), read in sorted order. Files whose path hashes to 0 mod ``held_out_every`` (20)
are held out for the benchmark's prompts. Both models are transformers ``LlamaForCausalLM`` with one
byte-level BPE tokenizer trained on the same files, so the pair works with transformers' own
assisted generation as well as with :func:`visualspec.generate_text`:

- the target: 6 layers of width 256 (about 6 M parameters);
- the draft: 2 layers of width 96 (about 1 M parameters), trained on the same stream.

Both train on random 256-token windows of the concatenated training files (the window positions
come from the seed and the step, so the stream is reproducible and resumable), with AdamW, warmup
and cosine decay, in bfloat16 autocast where the hardware runs it fast (else float32). Checkpoints
go to ``--work-dir`` every few minutes. The folder written to ``--out`` holds ``tokenizer/``,
``target/`` and ``draft/`` (transformers ``save_pretrained`` folders, safetensors in float16).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .common import claim_work_dir, optimizer_step, run_stage, training_autocast, write_training_record


@dataclass
class TextPairConfig:
    seed: int = 0
    vocab_size: int = 4096
    context: int = 256
    target_dim: int = 256
    target_layers: int = 6
    draft_dim: int = 96
    draft_layers: int = 2
    target_steps: int = 1500
    draft_steps: int = 1500
    batch: int = 16
    lr: float = 1e-3
    warmup_steps: int = 100
    max_files: int = 0  # 0: every stdlib file (tests use a few)
    held_out_every: int = 20  # one file in this many (by path hash) is held out
    checkpoint_seconds: float = 300.0


def stdlib_files(max_files: int = 0, held_out_every: int = 20) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) of the standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in skip]
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    files.sort()
    if max_files:
        files = files[:max_files]
    held = [p for p in files if int(hashlib.sha1(str(p.relative_to(root)).encode()).hexdigest(), 16) % held_out_every == 0]
    return [p for p in files if p not in held], held


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], vocab_size: int):
    """A byte-level BPE tokenizer (transformers ``PreTrainedTokenizerFast``) trained on ``files``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((_read(p) for p in files), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")


def text_pair_folder(pair, parts=("tokenizer", "target", "draft")) -> Path:
    """The text pair folder ``pair`` (None: the shipped ``assets/text-pair``), checked to hold
    ``parts``: a FileNotFoundError names the first missing one."""
    from ..assets import TEXT_PAIR

    folder = Path(pair) if pair is not None else TEXT_PAIR
    for part in parts:
        if not (folder / part).is_dir():
            raise FileNotFoundError(f"{str(folder)!r} is not a text pair folder: it has no {part}/ (train-text writes it)")
    return folder


def encode_corpus(tokenizer, files: list[Path]) -> torch.Tensor:
    """All files as one stream of token ids, each file followed by the end-of-text token."""
    ids = []
    for p in files:
        ids += tokenizer(_read(p)).input_ids + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.int32)


def build_model(cfg: TextPairConfig, dim: int, layers: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=dim, intermediate_size=3 * dim, num_hidden_layers=layers,
        num_attention_heads=max(dim // 64, 1), num_key_value_heads=max(dim // 64, 1),
        max_position_embeddings=4 * cfg.context, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        tie_word_embeddings=True))


def _batch(stream: torch.Tensor, cfg: TextPairConfig, step: int, salt: int) -> torch.Tensor:
    rng = np.random.default_rng([cfg.seed, salt, step])
    starts = rng.integers(0, len(stream) - cfg.context - 1, size=cfg.batch)
    return torch.stack([stream[s:s + cfg.context + 1] for s in starts]).long()


def train_lm(cfg: TextPairConfig, name: str, model, stream, steps: int, work: Path, device, progress=True):
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.05)
    salt = 1 if name == "target" else 2
    autocast = training_autocast(device)

    def step_fn(step):
        x = _batch(stream, cfg, step, salt).to(device)
        with torch.autocast(**autocast):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        optimizer_step(opt, loss, model.parameters())
        return {"loss": loss.item()}

    run_stage(name, work / name, {name: model}, opt, steps, step_fn, lr=cfg.lr, warmup=cfg.warmup_steps,
              checkpoint_seconds=cfg.checkpoint_seconds, progress=progress)
    return model.eval()


def train_text_pair(out: str, work_dir: str, cfg: TextPairConfig | None = None, progress: bool = True) -> Path:
    """Run (or resume) the tokenizer, target and draft stages; write the pair to ``out``."""
    cfg = cfg or TextPairConfig()
    work = claim_work_dir(work_dir, {k: v for k, v in asdict(cfg).items() if k != "checkpoint_seconds"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    train_files, held_out = stdlib_files(cfg.max_files, cfg.held_out_every)
    if (work / "tokenizer" / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(work / "tokenizer")
    else:
        tokenizer = train_tokenizer(train_files, cfg.vocab_size)
        tokenizer.save_pretrained(work / "tokenizer")
    stream = encode_corpus(tokenizer, train_files)
    target = train_lm(cfg, "target", build_model(cfg, cfg.target_dim, cfg.target_layers, cfg.seed + 1), stream,
                      cfg.target_steps, work, device, progress)
    draft = train_lm(cfg, "draft", build_model(cfg, cfg.draft_dim, cfg.draft_layers, cfg.seed + 2), stream,
                     cfg.draft_steps, work, device, progress)
    out = Path(out)
    tokenizer.save_pretrained(out / "tokenizer")
    target.cpu().half().save_pretrained(out / "target")
    draft.cpu().half().save_pretrained(out / "draft")
    root = Path(sysconfig.get_paths()["stdlib"])
    write_training_record(out, "visualspec train-text", asdict(cfg), t0, device,
                          python=sysconfig.get_python_version(), training_tokens=len(stream),
                          held_out_files=[str(p.relative_to(root)) for p in held_out])
    return out
