"""What every training recipe shares: checkpoints in safetensors + JSON with resume, a work
folder claimed for one configuration, mixed precision where the hardware runs it fast, an
exponential moving average of weights, and a resumable stage loop with a learning-rate schedule."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..core.precision import resolve_dtype


def save_checkpoint(path: Path, modules: dict, optimizer, step: int, extra: dict | None = None) -> None:
    """Weights and optimizer state as safetensors, the rest as JSON; written atomically."""
    path.mkdir(parents=True, exist_ok=True)
    # clone: tied weights (T5 shares its embeddings) must be separate tensors in safetensors
    tensors = {f"{name}/{k}": v.detach().cpu().clone() for name, m in modules.items()
               for k, v in m.state_dict().items()}
    opt = optimizer.state_dict()
    for pid, state in opt["state"].items():
        for k, v in state.items():
            tensors[f"optimizer/{pid}/{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).contiguous().cpu()
    tmp = path / "state.safetensors.tmp"
    save_file(tensors, str(tmp))
    meta = {"step": step, "param_groups": opt["param_groups"], **(extra or {})}
    (path / "meta.json.tmp").write_text(json.dumps(meta))
    os.replace(tmp, path / "state.safetensors")
    os.replace(path / "meta.json.tmp", path / "meta.json")


def load_checkpoint(path: Path, modules: dict, optimizer) -> dict | None:
    if not (path / "meta.json").is_file():
        return None
    meta = json.loads((path / "meta.json").read_text())
    tensors = load_file(str(path / "state.safetensors"))
    for name, m in modules.items():
        m.load_state_dict({k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(f"{name}/")})
    state = {}
    for key, v in tensors.items():
        if key.startswith("optimizer/"):
            _, pid, k = key.split("/", 2)
            state.setdefault(int(pid), {})[k] = v
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta


def write_training_record(folder, command: str, config: dict, started: float, device: torch.device,
                          **extra) -> None:
    """``folder/training.json``: the recipe's configuration, the command, this run's seconds and the
    machine that ran it (the device's name, torch's version), plus ``extra``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
    record = {"config": config, "command": command, "seconds_this_run": round(time.time() - started),
              "device": name, "torch": torch.__version__, **extra}
    (Path(folder) / "training.json").write_text(json.dumps(record, indent=1) + "\n")


def warmup_cosine_lr(step: int, cfg_steps: int, base: float, warmup: int) -> float:
    """``base * (step + 1) / warmup`` during warm-up, then a cosine from ``base`` down to
    ``0.1 * base`` at ``cfg_steps``."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(cfg_steps - warmup, 1)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def claim_work_dir(work_dir, config: dict) -> Path:
    """Create ``work_dir`` for a run of ``config`` (JSON-able), or accept it back to resume the same
    run; a folder holding another configuration is refused."""
    work = Path(work_dir).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "config.json"
    config = json.loads(json.dumps(config))  # tuples become lists, as they read back
    if saved.is_file() and json.loads(saved.read_text()) != config:
        raise ValueError(f"{work} holds a run with another configuration; use a new --work-dir")
    saved.write_text(json.dumps(config, indent=1))
    return work


def training_autocast(device: torch.device) -> dict:
    """``torch.autocast`` arguments for a training forward on ``device``: bfloat16 where the hardware
    runs it fast (a CUDA GPU that supports it, a CPU with bfloat16 instructions), else disabled
    (float32). ``VISUALSPEC_TRAIN_PRECISION=bf16`` or ``fp32`` overrides the choice."""
    forced = os.environ.get("VISUALSPEC_TRAIN_PRECISION", "auto")
    if forced not in ("auto", "bf16", "fp32"):
        raise ValueError(f"VISUALSPEC_TRAIN_PRECISION must be auto, bf16 or fp32, got {forced!r}")
    if forced == "auto":  # the world model's rule, with a CPU's bfloat16 at least half float32's speed
        use = resolve_dtype("auto", device, fast=0.5) == torch.bfloat16
    else:
        use = forced == "bf16"
    return dict(device_type=device.type, dtype=torch.bfloat16, enabled=use)


def optimizer_step(optimizer, loss: torch.Tensor, clip_parameters=None, max_norm: float = 1.0) -> None:
    """One optimisation step on ``loss``: clear the gradients, backpropagate, clip the gradient norm
    of ``clip_parameters`` to ``max_norm`` (when given), step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_parameters is not None:
        torch.nn.utils.clip_grad_norm_(clip_parameters, max_norm)
    optimizer.step()


@torch.no_grad()
def ema_update(averaged, current, decay: float) -> None:
    """One step of an exponential moving average: ``a <- decay * a + (1 - decay) * c`` for each
    pair of parameters of the two (equally ordered) iterables."""
    torch._foreach_lerp_(list(averaged), list(current), 1 - decay)


FIRST_CHECKPOINT_SECONDS = 60.0  # a run stopped in its first minutes keeps its work too


@contextlib.contextmanager
def stop_between_steps():
    """Ctrl-C (SIGINT) asks the loop inside to stop after the step it is in, instead of stopping
    the step halfway: yields a list that holds True once asked. A second Ctrl-C stops at once.
    Outside the main thread, where no signal handler can be set, Ctrl-C stops at once as usual."""
    asked: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield asked
        return

    def ask(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(True)

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, previous)


def run_stage(desc: str, folder: Path, modules: dict, optimizer, steps: int, step_fn, *, lr: float | None = None,
              warmup: int = 0, checkpoint_seconds: float = 300.0, progress: bool = True) -> None:
    """Run (or resume) one training stage of ``steps`` optimisation steps.

    Resumes from the checkpoint in ``folder`` if there is one; before each step sets the learning
    rate (linear warmup over ``warmup`` steps, then cosine decay to a tenth) when ``lr`` is given;
    calls ``step_fn(step)``, which does the whole step and returns what the progress bar shows
    (``{"loss": float, ...}``); checkpoints ``modules`` and ``optimizer`` after the first
    ``FIRST_CHECKPOINT_SECONDS`` (or ``checkpoint_seconds``, if shorter), then every
    ``checkpoint_seconds``, and at the end. Step s always sees the same data, so a resumed stage
    ends with the same weights as an uninterrupted one.

    Ctrl-C finishes the step under way, checkpoints it and raises a ``KeyboardInterrupt`` whose
    message says what was saved and how to resume (a second Ctrl-C stops at once, and the message
    names the last checkpoint).
    """
    from tqdm.auto import tqdm

    meta = load_checkpoint(folder, modules, optimizer)
    saved = start = meta["step"] if meta else 0
    last_save, wait = time.time(), min(FIRST_CHECKPOINT_SECONDS, checkpoint_seconds)
    resume = "run the same command again to resume"
    bar = tqdm(range(start, steps), desc=desc, disable=not progress, initial=start, total=steps)
    with stop_between_steps() as asked:
        try:
            for step in bar:
                if lr is not None:
                    for group in optimizer.param_groups:
                        group["lr"] = warmup_cosine_lr(step, steps, lr, warmup)
                bar.set_postfix({k: f"{v:.4g}" for k, v in step_fn(step).items()})
                if asked or time.time() - last_save > wait:
                    save_checkpoint(folder, modules, optimizer, step + 1)
                    saved, last_save, wait = step + 1, time.time(), checkpoint_seconds
                if asked:
                    raise KeyboardInterrupt(f"{desc}: saved at step {saved} of {steps} in {folder}; {resume}")
        except KeyboardInterrupt as err:
            bar.close()
            if err.args:
                raise
            kept = f"the last checkpoint, step {saved} of {steps}, is in {folder}" if saved else "nothing saved yet"
            raise KeyboardInterrupt(f"{desc}: stopped at once; {kept}; {resume}") from None
    save_checkpoint(folder, modules, optimizer, steps)


# ------------------------------------------------------------------------------------ stage 1: VQ
