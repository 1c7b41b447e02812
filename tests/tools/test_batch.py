"""Batch generation (visualspec.tools.batch): GenEval layout, resume, interrupts, determinism, sharding, torchrun."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from visualspec.tools.batch import chunks, distributed_context, generate_batch, image_generator, image_seed, read_prompts
from visualspec.tools.cli import main
from visualspec.tools.loading import load_pipeline

GENEVAL = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {"tag": "counting", "include": [{"class": "circle", "count": 2}], "exclude": [{"class": "circle", "count": 3}],
     "prompt": "a photo of two circles"},
    {"tag": "colors", "include": [{"class": "square", "count": 1, "color": "blue"}],
     "prompt": "a photo of a blue square"},
]
PROMPTS = [m["prompt"] for m in GENEVAL]
# what the command line passes to the pipeline by default (so in-process runs match CLI runs exactly)
CLI_KWARGS = dict(window=16)  # what `visualspec batch --window 16` passes: the options given, no others


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VISUALSPEC_HOME", str(home))
        yield home


# One torch thread, like every torchrun worker (OMP_NUM_THREADS=1): the VQ decoder's float
# rounding (not the tokens) can move a pixel value by 1 with the thread count, and the torchrun
# test compares bytes with the one-process reference.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(home):
    """The tiny random model, built into the temporary home (batching is plumbing; a trained model
    would only make it slower)."""
    from visualspec.tools.loading import tiny_random_folder

    return tiny_random_folder()


@pytest.fixture(scope="module")
def pipe(tiny):
    return load_pipeline(tiny)


@pytest.fixture(scope="module")
def reference(pipe, tmp_path_factory):
    """One complete one-process run (3 prompts x 2 images, seed 7): (folder, summary, snapshot)."""
    out = tmp_path_factory.mktemp("reference") / "images"
    summary = run(pipe, out)
    return out, summary, snapshot(out)


class Counting:
    """A pipeline wrapper that counts calls and images, and can fail on a chosen call."""

    def __init__(self, pipe, fail_on_call=None, fail=None):
        self.pipe, self.calls, self.images, self.fail_on_call, self.fail = pipe, 0, 0, fail_on_call, fail

    def __call__(self, prompts, **kw):
        self.calls += 1
        self.images += len(prompts)
        out = self.pipe(prompts, **kw)
        if self.calls == self.fail_on_call:
            self.fail(out)
        return out


def snapshot(folder) -> dict:
    """Every file's bytes, except the per-run statistics."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith("batch_stats_rank")}


def write_jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def run(pipe, out, prompts=GENEVAL, **kw):
    """3 prompts x 2 images in chunks of one prompt (2 images, decoding together) unless told."""
    kw = {"images_per_prompt": 2, "seed": 7, "progress": False, **CLI_KWARGS, **kw}
    kw["batch_size"] = kw.get("batch_size") or 2
    kw.setdefault("chunk_size", kw["batch_size"])
    return generate_batch(pipe, prompts, out, **kw)


# ---------------------------------------------------------------------------------------- prompt files


def test_read_prompts_plain_text_and_geneval_jsonl(tmp_path):
    txt = tmp_path / "prompts.txt"
    txt.write_text("# GenEval-style prompts\na photo of a cat\n\n   \n  a photo of two circles  \n#skip\n")
    assert read_prompts(txt) == [{"prompt": "a photo of a cat"}, {"prompt": "a photo of two circles"}]
    jsonl = write_jsonl(tmp_path / "evaluation_metadata.jsonl", GENEVAL)
    jsonl.write_text("\ufeff" + jsonl.read_text() + "\n", encoding="utf-8")  # a BOM and a trailing blank line
    assert read_prompts(jsonl) == GENEVAL  # every field kept


@pytest.mark.parametrize("bad, message", [
    ('{"prompt": "a cat"', "not valid JSON"),
    ('{"tag": "colors", "include": []}', "no 'prompt'"),
    ('{"prompt": 3}', "must be a non-empty string"),
    ('["a photo of a cat"]', "expected a JSON object"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, bad, message, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(GENEVAL[0]) + "\n\n" + bad + "\n")
    with pytest.raises(ValueError, match=re.escape(str(path)) + ", line 3: .*" + message):
        read_prompts(path)
    assert main(["batch", "--prompts", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "line 3" in err and "p.jsonl" in err
    assert not (tmp_path / "o").exists()


def test_missing_prompt_file(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_prompts(tmp_path / "nope.txt")
    assert main(["batch", "--prompts", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.txt" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- layout, determinism


def test_geneval_layout_and_metadata_round_trip(reference):
    out, summary, _ = reference
    assert summary["generated"] == 6 and summary["skipped"] == 0 and summary["prompts"] == 3
    for i, meta in enumerate(GENEVAL):
        folder = out / f"{i:05d}"
        lines = (folder / "metadata.jsonl").read_text().splitlines()
        assert len(lines) == 1 and json.loads(lines[0]) == meta
        assert sorted(p.name for p in (folder / "samples").iterdir()) == ["0000.png", "0001.png"]
        for k in range(2):
            image = Image.open(folder / "samples" / f"{k:04d}.png")
            assert image.format == "PNG" and image.size == (64, 64)
    # what GenEval's evaluator lists, and nothing hidden left behind
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name.isdigit()) == ["00000", "00001", "00002"]
    assert not [p for p in out.rglob(".*")]
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "00000/samples/0000.png").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0o600
    stats = json.loads((out / "batch_stats_rank0.json").read_text())
    assert stats["decode"]["calls"] == 3 and 0 < stats["decode"]["forwards_per_sequence"] < 256
    assert stats["decode"]["tokens_per_forward"] >= 1  # every forward commits a token of each row at least
    config = json.loads((out / "batch_config.json").read_text())
    assert config["seed"] == 7 and config["images_per_prompt"] == 2 and config["batch_size"] == 2


def test_each_image_uses_its_own_generator(pipe, tmp_path):
    """With batch_size=1, sample k of prompt i is exactly one pipeline call with its own seed."""
    # 3 prompts x 2 images in chunks of 1: chunk 3 is (prompt 1, sample 1), the only one of rank 3 of 6
    assert run(pipe, tmp_path / "a", batch_size=1, rank=3, world_size=6)["generated"] == 1
    direct = pipe([PROMPTS[1]], decoding="sjd", generator=[image_generator(7, 1, 1)], **CLI_KWARGS).images[0]
    direct.save(tmp_path / "direct.png", format="PNG")
    assert (tmp_path / "a/00001/samples/0001.png").read_bytes() == (tmp_path / "direct.png").read_bytes()
    seeds = {image_seed(7, i, k) for i in range(100) for k in range(8)}
    assert len(seeds) == 800 and image_seed(7, 1, 1) == image_seed(7, 1, 1) != image_seed(8, 1, 1)


def test_resume_regenerates_only_what_is_missing_byte_identically(pipe, reference, tmp_path):
    out = tmp_path / "images"
    shutil.copytree(reference[0], out)
    reference = reference[2]
    os.remove(out / "00000/samples/0001.png")
    shutil.rmtree(out / "00002")
    kept = {p: p.stat().st_mtime_ns for p in out.rglob("*.png")}

    counting = Counting(pipe)
    summary = run(counting, out)
    assert counting.calls == 2  # prompt 0's chunk (to rebuild the missing sample) and prompt 2
    assert summary["generated"] == 3 and summary["skipped"] == 3
    assert all(p.stat().st_mtime_ns == t for p, t in kept.items())  # nothing that existed was rewritten
    assert snapshot(out) == reference  # and the regenerated files are the same bytes

    counting = Counting(pipe)
    assert run(counting, out)["generated"] == 0 and counting.calls == 0  # complete: nothing to do


def test_interrupt_leaves_no_partial_files_and_rerun_completes(pipe, reference, tmp_path):
    reference = reference[2]

    class Torn:
        """An image whose PNG write is interrupted half way."""

        def save(self, f, format=None):
            f.write(b"\x89PNG\r\n\x1a\n half an image")
            raise KeyboardInterrupt

    def tear_second_image(out):
        out.images[1] = Torn()

    out = tmp_path / "images"
    with pytest.raises(KeyboardInterrupt):
        run(Counting(pipe, fail_on_call=2, fail=tear_second_image), out)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*.png"))
    assert written == ["00000/samples/0000.png", "00000/samples/0001.png", "00001/samples/0000.png"]
    assert all(reference[name] == (out / name).read_bytes() for name in written)  # complete, correct files only
    assert not [p for p in out.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]

    counting = Counting(pipe)
    summary = run(counting, out)
    assert summary["generated"] == 3 and counting.calls == 2
    assert snapshot(out) == reference


# ---------------------------------------------------------------------------------------- sharding


@pytest.mark.parametrize("batch_size", [None, 3])
def test_shards_in_process_equal_one_process(pipe, reference, tmp_path, batch_size):
    """batch_size=3 with 2 images per prompt makes chunks that span prompts (and split them)."""
    one = reference[2]
    if batch_size is not None:  # other chunks, so other pixels: its own one-process run
        run(pipe, tmp_path / "one", batch_size=batch_size)
        one = snapshot(tmp_path / "one")
    s0 = run(pipe, tmp_path / "two", batch_size=batch_size, rank=0, world_size=2)
    s1 = run(pipe, tmp_path / "two", batch_size=batch_size, rank=1, world_size=2)
    assert s0["generated"] + s1["generated"] == 6
    if batch_size is None:  # one prompt per chunk: prompt i belongs to rank i % world_size
        assert (s0["prompts"], s1["prompts"]) == (2, 1)
    assert chunks(3, 2, 3) == [[(0, 0), (0, 1), (1, 0)], [(1, 1), (2, 0), (2, 1)]]
    assert snapshot(tmp_path / "two") == one


def test_cli_explicit_shards_equal_one_process(reference, tiny, tmp_path, capsys):
    prompts = write_jsonl(tmp_path / "p.jsonl", GENEVAL)
    for rank in (1, 0):
        assert main(["batch", "--model", tiny, "--prompts", str(prompts), "--out", str(tmp_path / "two"),
                     "--images-per-prompt", "2", "--seed", "7", "--rank", str(rank), "--world-size", "2",
                     "--batch-size", "2", "--chunk-size", "2", "--window", "16",
                     "--no-progress"]) == 0
    assert snapshot(tmp_path / "two") == reference[2]
    assert main(["batch", "--model", tiny, "--prompts", str(prompts), "--out", str(tmp_path / "x"), "--rank", "0"]) == 2
    assert "--world-size" in capsys.readouterr().err


def test_resume_refuses_other_settings_or_other_prompts(pipe, tmp_path):
    out = tmp_path / "images"
    run(pipe, out, prompts=GENEVAL[:1], images_per_prompt=1)
    with pytest.raises(ValueError, match="seed: 7 there, 8 now"):
        run(pipe, out, prompts=GENEVAL[:1], images_per_prompt=1, seed=8)
    with pytest.raises(ValueError, match="00000.*different prompt"):
        run(pipe, out, prompts=GENEVAL[1:2], images_per_prompt=1)
    with pytest.raises(ValueError, match="sets \\['generator'\\] itself"):
        run(pipe, tmp_path / "x", generator=torch.Generator())
    with pytest.raises(ValueError, match="rank"):
        run(pipe, tmp_path / "x", rank=2, world_size=2)


def test_torchrun_two_processes_equal_one_process(reference, home, tiny, tmp_path):
    """A real 2-process gloo run (torchrun, CPU workers) writes the same folder as one process."""
    prompts = write_jsonl(tmp_path / "p.jsonl", GENEVAL)
    out = tmp_path / "torchrun"
    env = {**os.environ, "VISUALSPEC_HOME": str(home), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run(torchrun + ["-m", "visualspec.tools.cli", "batch", "--model", tiny, "--prompts", str(prompts),
                                        "--out", str(out), "--images-per-prompt", "2", "--seed", "7", "--no-progress",
                                        "--batch-size", "2", "--chunk-size", "2", "--window", "16"],
                            env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    total = json.loads(result.stdout.strip().splitlines()[-1])
    assert total["generated"] == 6 and total["world_size"] == 2
    assert {p.name for p in out.glob("batch_stats_rank*.json")} == {"batch_stats_rank0.json", "batch_stats_rank1.json"}
    assert snapshot(out) == reference[2]


def test_distributed_context_without_a_launcher(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with distributed_context() as (rank, world_size):
        assert (rank, world_size) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        with distributed_context():
            pass


def test_auto_windows_resume_byte_identically_from_the_recorded_costs(pipe, tmp_path):
    """With window="auto" the chunk of 6 images decodes 2 at a time (continuous batching), the
    measured window costs are recorded on the first run, and a resume decodes with those very
    costs (it measures nothing), so the rebuilt files are the same bytes."""
    kw = {**CLI_KWARGS, "window": "auto"}
    out = tmp_path / "auto"
    run(pipe, out, batch_size=2, chunk_size=6, **kw)
    config = json.loads((out / "batch_config.json").read_text())
    assert config["batch_size"] == 2 and config["chunk_size"] == 6
    recorded = config["window_costs"]  # whole decode steps at 2 images' model rows, and their tokens
    assert set(recorded) == {"tables", "tokens", "as_ar", "fixed"} and set(recorded["tables"]) == {"4"}
    assert recorded["tokens"]["1"] == 1 and recorded["as_ar"] is False and recorded["fixed"] is True
    reference = snapshot(out)
    os.remove(out / "00001/samples/0000.png")

    class NoMeasuring(Counting):
        def window_tables(self, *args, **kwargs):
            raise AssertionError("a resume must reuse the recorded window costs")

        def __call__(self, prompts, **kw):
            assert kw["batch_size"] == 2 and len(prompts) == 6
            return super().__call__(prompts, **kw)

    counting = NoMeasuring(pipe)
    assert run(counting, out, batch_size=2, chunk_size=6, **kw)["generated"] == 1 and counting.calls == 1
    assert snapshot(out) == reference


def test_a_bad_prompt_is_named_by_file_and_line_before_anything_is_written(tiny, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a red circle\n\n# a comment\na photo of a blue zeppelin\n")
    out = tmp_path / "images"
    assert main(["batch", "--prompts", str(prompts), "--out", str(out), "--model", tiny, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{prompts}, line 4: " in err and "zeppelin" in err
    assert not out.exists()
    with pytest.raises(ValueError, match="^prompt 2: .*zeppelin"):
        run(load_pipeline(tiny), out, prompts=["a photo of a red circle", "a photo of a blue zeppelin"])
    assert not out.exists()


def test_a_corrected_prompt_file_resumes(pipe, reference, tmp_path):
    """A prompt whose images were never drawn may change (an earlier run left its metadata); one
    whose images exist may not."""
    folder, _, expected = reference
    out = tmp_path / "images"
    shutil.copytree(folder, out)
    for png in (out / "00002" / "samples").glob("*.png"):
        png.unlink()
    (out / "00002" / "metadata.jsonl").write_text(json.dumps({"prompt": "a photo of a blue zeppelin"}) + "\n")
    summary = run(pipe, out)
    assert summary["generated"] == 2 and snapshot(out) == expected


def test_window_costs_recorded_by_an_earlier_version_still_resume():
    """Earlier runs recorded the bare tables, without the tokens each window committed."""
    from visualspec.tools.batch import recorded_policy

    old = recorded_policy({"4": {"1": 1.0, "2": 1.5}})
    new = recorded_policy({"tables": {"4": {"1": 1.0, "2": 1.5}}, "tokens": {"1": 1.0, "2": 1.8}})
    assert old.tables == new.tables == {4: {1: 1.0, 2: 1.5}}
    assert old.tokens == {} and new.tokens == {1: 1.0, 2: 1.8}
    ar = recorded_policy({"tables": {"4": {"1": 1.0, "2": 1.5}}, "tokens": {"1": 1.0, "2": 1.2}, "as_ar": True})
    assert ar.as_ar and not new.as_ar and not old.as_ar  # a run that decoded as AR resumes as AR
    fixed = recorded_policy({"tables": {"4": {"1": 1.0, "2": 1.5}}, "tokens": {"1": 1.0, "2": 1.8}, "fixed": True})
    assert fixed.fixed and not new.fixed and not old.fixed  # and one at the best fixed window at it
