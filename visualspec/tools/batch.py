"""Batch generation into GenEval's folder layout: resumable, deterministic, shardable.

    visualspec batch --prompts evaluation_metadata.jsonl --out geneval-images --images-per-prompt 4
    torchrun --nproc_per_node 8 -m visualspec.tools.cli batch --prompts prompts.jsonl --out images
    visualspec batch --prompts prompts.txt --out images --rank 3 --world-size 16   # job arrays, no network

Layout (what GenEval's ``evaluate_images.py`` reads)::

    out_dir/00000/metadata.jsonl      the prompt's metadata object, one JSON line
    out_dir/00000/samples/0000.png    sample k of prompt 0, k < images_per_prompt
    out_dir/batch_config.json         the settings that determine the pixels (checked on resume)
    out_dir/batch_stats_rank0.json    decode statistics of the last run of rank 0 that generated images

Guarantees:

- **Continuous batching.** ``batch_size`` images decode at once; each commits its own accepted
  tokens every step, and a finished image's place goes to the next image of its chunk.
- **Determinism.** Image k of prompt i is drawn with its own generator seeded by
  :func:`image_seed` ``(seed, i, k)``, and always inside the same *chunk*: the flattened list of
  images (prompt-major) is cut into fixed chunks of ``chunk_size`` images, and a chunk is always
  generated whole. Its pixels therefore depend only on the model, the prompt, the settings,
  ``batch_size`` and ``chunk_size``, never on sharding, on which other images were already done, or
  on interruptions. (An image's law depends on its prompt and generator alone; fixed chunks also
  pin what the law leaves open: float kernels may round differently with the batch's make-up, and
  ``window="auto"`` picks windows from the batch's acceptance so far. The measured window costs
  that ``"auto"`` uses are recorded in ``batch_config.json`` on the first run and reused on resume.)
- **Resume.** A sample that exists is never rewritten; a chunk whose samples all exist is skipped; a
  chunk with some samples missing is generated again and only the missing files are written (they
  are byte-identical to what the first run would have written). Samples are written atomically,
  so an existing file that does not decode as a whole image (a truncated copy, say) is foreign: it
  counts as missing, is written again, and the run names it on stderr. ``batch_config.json``
  refuses a resume with different settings, and each prompt's ``metadata.jsonl`` refuses a
  different prompt file. A run with nothing left to do leaves the statistics file as it was.
- **Atomic files.** Every file is written under a hidden temporary name (``.0000.png.<random>.tmp``,
  which neither GenEval's ``\\d+\\.png`` filter nor a shell glob sees) in its final folder, then
  renamed with ``os.replace``; an interrupted write removes its temporary file.
- **Sharding.** Chunk j belongs to rank ``j % world_size``. With the default
  ``batch_size = images_per_prompt`` a chunk is one prompt, so prompt i belongs to rank
  ``i % world_size``. Ranks share nothing but the output folder, so shards can run at the same time
  (``torchrun``, ``accelerate launch``) or separately (``--rank/--world-size``, e.g. job arrays on
  machines that cannot reach each other).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..core.checks import check_int, check_positive_int
from ..core.stats import merge_decode_stats
from ..eval.images import read_image
from .paths import atomic_write, check_output_folder

CONFIG_NAME = "batch_config.json"
_MASK64 = (1 << 64) - 1
_RESERVED_KWARGS = ("prompt", "class_labels", "generator", "seed", "num_images_per_prompt", "output_type",
                    "return_dict")


# ----------------------------------------------------------------------------------------------
# Prompt files
# ----------------------------------------------------------------------------------------------


def read_prompts(path) -> list[dict]:
    """Read a prompt file into a list of metadata dicts, each with at least a string ``prompt``
    (:func:`read_prompt_lines` without the line numbers).
    """
    return [meta for _, meta in read_prompt_lines(path)]


def read_prompt_lines(path) -> list[tuple[int, dict]]:
    """Read a prompt file into ``(line number from 1, metadata dict)`` pairs, each dict with at
    least a string ``prompt``.

    - ``*.jsonl``: GenEval's format, one JSON object per line with ``prompt`` (and usually ``tag``,
      ``include``, ``exclude``); every field is kept. Blank lines are skipped.
    - anything else: plain text, one prompt per line; blank lines and lines starting with ``#``
      are skipped; each line becomes ``{"prompt": line}``.

    A malformed line raises ``ValueError`` naming the file and the (1-based) line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist" if not path.exists()
                                else f"prompt file {str(path)!r} is not a file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first prompt
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err})") from None
    prompts: list[tuple[int, dict]] = []
    jsonl = path.suffix.lower() == ".jsonl"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or (not jsonl and line.startswith("#")):
            continue
        if not jsonl:
            prompts.append((number, {"prompt": line}))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(obj).__name__}")
        if "prompt" not in obj:
            raise ValueError(f"{path}, line {number}: the object has no 'prompt' field")
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise ValueError(f"{path}, line {number}: 'prompt' must be a non-empty string, got {obj['prompt']!r}")
        prompts.append((number, obj))
    return prompts


# ----------------------------------------------------------------------------------------------
# Seeds, chunks, files
# ----------------------------------------------------------------------------------------------


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def image_seed(seed: int, index: int, sample: int) -> int:
    """The generator seed of sample ``sample`` of prompt ``index``: a fixed 64-bit mix of the three
    integers (SplitMix64, no ``hash()``), so it is the same in every process and on every machine."""
    x = _splitmix64(int(seed) & _MASK64)
    x = _splitmix64((x + int(index)) & _MASK64)
    return _splitmix64((x + int(sample)) & _MASK64)


def image_generator(seed: int, index: int, sample: int) -> torch.Generator:
    """A CPU generator for one image (CPU, so the random stream is the same whatever the device)."""
    return torch.Generator(device="cpu").manual_seed(image_seed(seed, index, sample))


def chunks(num_prompts: int, images_per_prompt: int, batch_size: int) -> list[list[tuple[int, int]]]:
    """The fixed chunks: the (prompt index, sample) pairs in prompt-major order, cut every
    ``batch_size`` images. Chunk j belongs to rank ``j % world_size``."""
    flat = [(i, k) for i in range(num_prompts) for k in range(images_per_prompt)]
    return [flat[s:s + batch_size] for s in range(0, len(flat), batch_size)]


def prompt_dir(out_dir, index: int) -> Path:
    return Path(out_dir) / f"{index:05d}"


def sample_path(out_dir, index: int, sample: int) -> Path:
    return prompt_dir(out_dir, index) / "samples" / f"{sample:04d}.png"


def _write_json(path, obj, indent=None) -> None:
    data = (json.dumps(obj, indent=indent) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def _not_an_image(path: Path) -> str | None:
    """Why the existing file ``path`` is not a whole image (what decoding it said), or None when
    it is one."""
    try:
        read_image(path)
    except ValueError as err:
        cause = err.__cause__
        return f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
    return None


def saved_images(out_dir, num_prompts: int, images_per_prompt: int) -> int:
    """How many of the ``num_prompts * images_per_prompt`` sample files exist in ``out_dir``."""
    return sum(1 for i in range(num_prompts) for k in range(images_per_prompt)
               if sample_path(out_dir, i, k).is_file())


def check_prompts(pipe, labelled: list[tuple[str, dict]]) -> None:
    """Check every prompt with the pipeline's ``check_prompt`` before anything is drawn or
    written; the first bad one raises a ValueError that starts with its label (``"prompts.jsonl,
    line 7"``, ``"prompt 7"``)."""
    check = getattr(pipe, "check_prompt", None)
    if check is None:
        return
    for label, meta in labelled:
        try:
            check(meta["prompt"])
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None


def _check_metadata(out_dir, index: int, meta: dict) -> None:
    """Write ``metadata.jsonl`` of prompt ``index``, or check that the one there is the same prompt.
    A different prompt is refused only once images of it exist: a prompt corrected before any of
    its images was drawn simply replaces the old one, so a fixed prompt file resumes."""
    path = prompt_dir(out_dir, index) / "metadata.jsonl"
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = None
        drawn = any((prompt_dir(out_dir, index) / "samples").glob("*.png"))
        if old != meta and drawn:
            raise ValueError(f"{path} holds a different prompt ({old!r}) than prompt {index + 1} of this prompt "
                             f"list ({meta!r}), and its images exist; write to a fresh --out folder or use the "
                             f"same prompt file")
        if old == meta:
            return
    line = (json.dumps(meta, ensure_ascii=False) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(line))


def _window_costs(pipe, decoding: str, metas: list, batch_size: int, pipe_kwargs: dict) -> dict | None:
    """The window policy ``window="auto"`` decodes with (``{"tables": ..., "tokens": ...}``, see
    the pipelines' ``window_tables``), found once with the run's own settings on a batch of its
    first prompt; None when not needed: AR, a fixed window (or k: the pipeline's
    ``window_argument``), or a pipeline without token windows."""
    if decoding == "ar" or pipe_kwargs.get(getattr(pipe, "window_argument", "window"), "auto") != "auto":
        return None
    kw = {k: v for k, v in pipe_kwargs.items() if k != "window"}
    policy = pipe.window_tables([metas[0]["prompt"]], batch_size=batch_size, decoding=decoding, **kw)
    if not policy:
        return None
    tables = {str(rows): {str(w): c for w, c in sorted(t.items())} for rows, t in sorted(policy["tables"].items())}
    return {"tables": tables, "tokens": {str(w): t for w, t in sorted(policy["tokens"].items())},
            "as_ar": policy.get("as_ar", False), "fixed": policy.get("fixed", False)}


def recorded_policy(window_costs: dict):
    """The :class:`visualspec.core.window.WindowPolicy` of a batch's recorded ``window_costs``:
    ``{"tables": ..., "tokens": ..., "as_ar": ..., "fixed": ...}`` (so every shard and resumed run
    decodes as the first did: as AR, at the best fixed window or by the search), or the bare
    tables an earlier version recorded."""
    from ..core.window import WindowPolicy

    if "tables" in window_costs:
        return WindowPolicy(window_costs["tables"], tokens=window_costs.get("tokens"),
                            as_ar=window_costs.get("as_ar", False), fixed=window_costs.get("fixed", False))
    return WindowPolicy(window_costs)


def _check_config(out_dir, config: dict, window_costs: Callable[[], dict | None] = lambda: None) -> dict:
    """Record the pixel-determining settings on the first run; refuse to resume with others.
    Returns the recorded settings, with the window costs measured on the first run."""
    path = Path(out_dir) / CONFIG_NAME
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path} is not valid JSON; remove it or write to a fresh folder") from None
        differ = {k: (old.get(k), v) for k, v in config.items() if old.get(k) != v}
        if differ:
            text = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in differ.items())
            raise ValueError(f"{out_dir} was generated with other settings ({text}); resuming would mix images. "
                             f"Use the same settings or a fresh output folder")
        return old
    config = {**config, "window_costs": window_costs()}
    _write_json(path, config, indent=2)
    return config


def _jsonable(value):
    return json.loads(json.dumps(value, default=repr))


# ----------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------


def generate_batch(
    pipe,
    prompts: Iterable[dict | str],
    out_dir,
    *,
    images_per_prompt: int = 4,
    decoding: str = "sjd",
    seed: int = 0,
    batch_size: int = 16,
    chunk_size: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    **pipe_kwargs,
) -> dict:
    """Generate ``images_per_prompt`` images for every prompt of this rank into GenEval's layout.

    ``pipe`` is called as ``pipe([prompt] * n, decoding=..., num_images_per_prompt=1,
    generator=[one per image], batch_size=batch_size, output_type="pil", **pipe_kwargs)`` once per
    chunk of ``chunk_size`` images (default ``4 * batch_size``). ``prompts`` are metadata dicts with a ``prompt``
    (see :func:`read_prompts`) or plain strings. See the module docstring for determinism, resume
    and sharding.

    Returns ``{"generated", "skipped", "prompts", "chunks", "calls", "seconds", "rank",
    "world_size"}`` for this rank (``generated``: image files written; ``skipped``: images that
    already existed as whole images; ``prompts``: prompts this rank is responsible for;
    ``calls``: pipeline calls, 0 when nothing was left to do). When it generated something it
    writes the summary, with the decode statistics of all its calls merged
    (:func:`visualspec.core.stats.merge_decode_stats`), to ``out_dir/batch_stats_rank{rank}.json``;
    a run with nothing left to do leaves that file as it was. There ``decode.tokens_per_forward``
    is the tokens committed per target forward per image: all images' tokens over the target
    forwards each image took part in (its prefill included), summed over images, as ``visualspec
    generate --stats`` reports it at batch 1; a forward shared by the rows of a batch counts once
    for each of them. ``decode.target_forwards`` counts the batched forwards themselves.

    An existing sample that does not decode as a whole image is written again and named on
    stderr. The progress bar (``progress``, rank 0) counts images as they finish (see
    :func:`_image_progress`).
    """
    t0 = time.perf_counter()
    metas = [{"prompt": p} if isinstance(p, str) else p for p in prompts]
    if not metas:
        raise ValueError("no prompts to generate: the prompt list is empty")
    check_output_folder(out_dir)
    for n, meta in enumerate(metas, start=1):
        if not isinstance(meta, dict) or not isinstance(meta.get("prompt"), str):
            raise ValueError(f"prompt {n} must be a string or a dict with a string 'prompt', got {meta!r}")
    check_prompts(pipe, [(f"prompt {n}", meta) for n, meta in enumerate(metas, start=1)])
    for name, value, low in (("images_per_prompt", images_per_prompt, 1), ("world_size", world_size, 1),
                             ("seed", seed, None), ("rank", rank, 0)):
        check_int(name, value, low)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if chunk_size is None:
        chunk_size = 4 * batch_size if isinstance(batch_size, int) else batch_size
    check_positive_int("batch_size", batch_size)
    check_positive_int("chunk_size", chunk_size)
    reserved = sorted(set(pipe_kwargs) & set(_RESERVED_KWARGS))
    if reserved:
        raise ValueError(f"generate_batch sets {reserved} itself; pass seed= and images_per_prompt= instead")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _check_config(out_dir, _jsonable({
        "format": "visualspec-batch-2", "seed": seed, "decoding": decoding, "images_per_prompt": images_per_prompt,
        "batch_size": batch_size, "chunk_size": chunk_size, "num_prompts": len(metas),
        "pipe_kwargs": dict(sorted(pipe_kwargs.items())),
    }), lambda: _window_costs(pipe, decoding, metas, batch_size, pipe_kwargs))
    if config.get("window_costs"):
        policy = recorded_policy(config["window_costs"])
        pipe_kwargs = {**pipe_kwargs, getattr(pipe, "window_argument", "window"): policy}

    mine = [c for j, c in enumerate(chunks(len(metas), images_per_prompt, chunk_size)) if j % world_size == rank]
    my_prompts = sorted({i for c in mine for i, _ in c})
    for i in my_prompts:
        _check_metadata(out_dir, i, metas[i])
    present = [(i, k) for c in mine for i, k in c if sample_path(out_dir, i, k).is_file()]
    foreign = {(i, k): why for i, k in present if (why := _not_an_image(sample_path(out_dir, i, k))) is not None}
    done = {ik for ik in present if ik not in foreign}  # whole images: never rewritten
    todo = [c for c in mine if not all(ik in done for ik in c)]

    from tqdm.auto import tqdm

    generated, all_stats = 0, []
    bar = tqdm(total=sum(len(c) for c in todo), unit="img", desc=f"batch (rank {rank}/{world_size})",
               disable=not progress or rank != 0)
    try:
        for chunk in todo:
            with _image_progress(pipe, bar, len(chunk)):
                out = pipe([metas[i]["prompt"] for i, _ in chunk], decoding=decoding, num_images_per_prompt=1,
                           generator=[image_generator(seed, i, k) for i, k in chunk], batch_size=batch_size,
                           output_type="pil", **pipe_kwargs)
            images = out.images if hasattr(out, "images") else out[0]
            if len(images) != len(chunk):
                raise RuntimeError(f"the pipeline returned {len(images)} images for a chunk of {len(chunk)}")
            if getattr(out, "stats", None) is not None:
                all_stats.append(out.stats)
            for (i, k), image in zip(chunk, images):
                if (i, k) in done:  # written by an earlier run: the same bytes, leave it alone
                    continue
                path = sample_path(out_dir, i, k)
                atomic_write(path, lambda f, image=image: image.save(f, format="PNG"))
                generated += 1
                if (i, k) in foreign:
                    tqdm.write(f"{path} was not a whole image ({foreign[i, k]}); regenerated it", file=sys.stderr)
    finally:
        bar.close()

    summary = {"generated": generated, "skipped": len(done), "prompts": len(my_prompts), "chunks": len(mine),
               "calls": len(todo), "seconds": round(time.perf_counter() - t0, 3), "rank": rank,
               "world_size": world_size}
    if todo:  # a run with nothing left to do keeps the statistics of the run that made the images
        _write_json(out_dir / f"batch_stats_rank{rank}.json",
                    {**summary, "decoding": decoding,
                     "decode": {"calls": len(all_stats),
                                **(merge_decode_stats(all_stats).to_dict() if all_stats else {})}},
                    indent=2)
    return summary


class _TokenCounter:
    """What :func:`_image_progress` puts in place of the pipeline's own progress bar for one call:
    the pipeline reports every token it commits to it; ``on_images(n)`` hears each whole image's
    worth of tokens (``total`` tokens make ``images`` images)."""

    def __init__(self, total: int, images: int, on_images: Callable[[int], None]):
        self.per_image, self.images, self.on_images = max(int(total) // images, 1), images, on_images
        self.tokens = self.reported = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int = 1) -> None:
        self.tokens += int(n)
        whole = min(self.tokens // self.per_image, self.images)
        if whole > self.reported:
            self.on_images(whole - self.reported)
            self.reported = whole


@contextlib.contextmanager
def _image_progress(pipe, bar, images: int) -> Iterator[None]:
    """Advance ``bar`` by the ``images`` images of one pipeline call as they finish, not at once
    at the end. An image is ``num_tokens`` committed tokens, and every token a row commits is
    reported through the pipeline's progress bar, which this stands in for during the call; so the
    bar advances one image for every ``num_tokens`` tokens committed (with continuous batching,
    roughly as each image finishes), and by whatever is left when the call returns (all of it for a
    pipeline that reports no tokens)."""
    advanced = 0

    def on_images(n: int) -> None:
        nonlocal advanced
        advanced += n
        bar.update(n)

    def progress_bar(iterable=None, total=None):
        if iterable is not None or not total:  # not a count of tokens: nothing to show
            return iterable if iterable is not None else _TokenCounter(images, images, lambda n: None)
        return _TokenCounter(total, images, on_images)

    hooked = hasattr(pipe, "progress_bar") and "progress_bar" not in vars(pipe)
    if hooked:
        pipe.progress_bar = progress_bar
    try:
        yield
    finally:
        if hooked:
            del pipe.progress_bar
    if advanced < images:
        bar.update(images - advanced)


# ----------------------------------------------------------------------------------------------
# Several processes: torchrun / accelerate launch
# ----------------------------------------------------------------------------------------------


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


@contextlib.contextmanager
def distributed_context(timeout_s: float = 24 * 3600) -> Iterator[tuple[int, int]]:
    """``with distributed_context() as (rank, world_size):`` for ``torchrun`` and ``accelerate launch``.

    Reads ``RANK`` (else ``LOCAL_RANK``) and ``WORLD_SIZE`` as both launchers set them; with no such
    variables it is ``(0, 1)`` and does nothing. With ``WORLD_SIZE > 1`` it initialises
    ``torch.distributed`` (nccl on the ``LOCAL_RANK`` GPU when CUDA is available, else gloo) unless
    a process group already exists, and on a normal exit waits for every rank (a barrier, with a
    long ``timeout_s`` because resumed shards can be very uneven) and destroys the group it made.
    On an exception it skips the barrier (the launcher stops the other ranks).
    """
    import torch.distributed as dist

    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", _env_int("LOCAL_RANK", 0))
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} / WORLD_SIZE={world_size} from the environment are inconsistent")
    if world_size == 1:
        yield 0, 1
        return
    owned = False
    if not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise ValueError(f"WORLD_SIZE={world_size} but {' and '.join(missing)} not set: launch with torchrun "
                             f"or accelerate launch, or pass an explicit rank and world size instead")
        use_cuda = torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        owned = True
    rank, world_size = dist.get_rank(), dist.get_world_size()
    ok = False
    try:
        yield rank, world_size
        ok = True
    finally:
        if ok:
            dist.barrier()
        if owned:
            dist.destroy_process_group()


@contextlib.contextmanager
def rank_zero_first() -> Iterator[None]:
    """Run the body on rank 0 first, then on the other ranks (e.g. building a model cache once).
    Without a process group it just runs the body."""
    import torch.distributed as dist

    active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if active and dist.get_rank() != 0:
        dist.barrier()
    yield
    if active and dist.get_rank() == 0:
        dist.barrier()


def gather_summaries(summary: dict) -> list[dict]:
    """Every rank's summary (on every rank) when a process group exists, else ``[summary]``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [summary]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, summary)
    return gathered


def combine_summaries(summaries: list[dict], num_prompts: int) -> dict:
    """One summary for the whole run from every rank's."""
    return {"generated": sum(s["generated"] for s in summaries), "skipped": sum(s["skipped"] for s in summaries),
            "prompts": num_prompts, "calls": sum(s["calls"] for s in summaries),
            "seconds": max(s["seconds"] for s in summaries), "world_size": len(summaries)}
