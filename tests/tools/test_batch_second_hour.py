"""`visualspec batch` as a new user's second hour meets it: a damaged image left in the folder, Ctrl-C,
the statistics file, and the progress bar."""

import functools
import json
from pathlib import Path

import pytest
from PIL import Image

from visualspec.tools.batch import generate_batch, image_generator
from visualspec.tools.cli import main
from visualspec.tools.loading import load_pipeline

PROMPTS = ["a photo of a cat", "a photo of two circles", "a photo of a blue square"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny random model in a temporary home (batching is plumbing; a trained model would only be slower)."""
    from visualspec.tools.loading import tiny_random_folder

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VISUALSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        yield tiny_random_folder()


@pytest.fixture(scope="module")
def pipe(tiny):
    return load_pipeline(tiny)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("".join(p + "\n" for p in PROMPTS))
    return path


def batch(tiny, prompt_file, out, *extra):
    """`visualspec batch` on the tiny model: 3 prompts x 2 images, 2 decoding at once, chunks of 2."""
    return main(["batch", "--model", tiny, "--prompts", str(prompt_file), "--out", str(out), "--images-per-prompt",
                 "2", "--seed", "7", "--batch-size", "2", "--chunk-size", "2", "--window", "16", "--no-progress",
                 *extra])


def pngs(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*.png"))}


@pytest.fixture(scope="module")
def clean(tiny, prompt_file, tmp_path_factory):
    """A clean run's folder and its images' bytes."""
    out = tmp_path_factory.mktemp("clean") / "images"
    assert batch(tiny, prompt_file, out) == 0
    return out, pngs(out)


# ---------------------------------------------------------------------------------------- a damaged image


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_resume_regenerates_a_damaged_image_and_names_it(tiny, prompt_file, clean, tmp_path, capsys, damage):
    out = tmp_path / "images"
    assert batch(tiny, prompt_file, out) == 0
    bad = out / "00001" / "samples" / "0001.png"
    data = bad.read_bytes()
    bad.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"")
    with pytest.raises(OSError):
        with Image.open(bad) as im:
            im.load()
    others = {p: p.stat().st_mtime_ns for p in out.rglob("*.png") if p != bad}
    capsys.readouterr()

    assert batch(tiny, prompt_file, out) == 0
    captured = capsys.readouterr()
    with Image.open(bad) as im:
        im.load()  # a whole image again
    assert pngs(out) == clean[1]  # the very bytes of a clean run
    assert all(p.stat().st_mtime_ns == t for p, t in others.items())  # the whole ones were left alone
    named = [line for line in captured.err.splitlines() if str(bad) in line]
    assert len(named) == 1 and "regenerated" in named[0] and "not a whole image" in named[0]
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["generated"] == 1 and summary["skipped"] == 5 and summary["calls"] == 1


# ---------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_says_what_is_saved_and_how_to_resume(tiny, pipe, prompt_file, clean, tmp_path, monkeypatch, capsys):
    cls = type(pipe)
    original = cls.__call__
    calls = []

    @functools.wraps(original)
    def interrupted_in_the_second_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", interrupted_in_the_second_chunk)
    out = tmp_path / "images"
    try:
        code = batch(tiny, prompt_file, out)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left the batch command as a traceback")
    assert code == 130
    err = capsys.readouterr().err
    saved = len(list(out.rglob("*.png")))
    assert saved == 2 and len(calls) == 2
    assert err.strip().splitlines()[-1] == (f"interrupted: {saved} of 6 images are saved in {out}; run the same "
                                            f"command again to resume")
    assert "Traceback" not in err

    monkeypatch.setattr(cls, "__call__", original)
    assert batch(tiny, prompt_file, out) == 0  # the same command resumes
    assert pngs(out) == clean[1]


# ---------------------------------------------------------------------------------------- statistics


def test_tokens_per_forward_at_batch_2_counts_per_image(pipe, tmp_path):
    """The batch file's tokens per forward at batch 2 (continuous batching, two calls) against the
    same images generated one by one, where it is simply tokens / target forwards."""
    out = tmp_path / "images"
    generate_batch(pipe, PROMPTS, out, images_per_prompt=2, seed=7, batch_size=2, chunk_size=4, progress=False,
                   window=16)
    decode = json.loads((out / "batch_stats_rank0.json").read_text())["decode"]
    assert decode["calls"] == 2 and decode["batch_size"] == 6 and decode["slots"] == 2
    tokens = forwards = 0
    for i, prompt in enumerate(PROMPTS):
        for k in range(2):
            stats = pipe([prompt], decoding="sjd", generator=[image_generator(7, i, k)], window=16).stats
            assert stats.batch_size == 1 and stats.tokens_per_forward == stats.num_tokens / stats.target_forwards
            tokens, forwards = tokens + stats.num_tokens, forwards + stats.target_forwards
    assert decode["tokens_per_forward"] == pytest.approx(tokens / forwards, rel=0.01)
    assert decode["tokens_per_forward"] > 2  # random drafts of the tiny model are often accepted


def test_a_rerun_with_nothing_to_do_keeps_the_statistics(tiny, prompt_file, tmp_path, capsys):
    out = tmp_path / "images"
    assert batch(tiny, prompt_file, out) == 0
    stats = (out / "batch_stats_rank0.json").read_bytes()
    assert json.loads(stats)["decode"]["calls"] == 3
    capsys.readouterr()
    assert batch(tiny, prompt_file, out) == 0
    captured = capsys.readouterr()
    assert (out / "batch_stats_rank0.json").read_bytes() == stats
    assert f"nothing left to do: all 6 images are already in {out}" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["calls"] == 0


# ---------------------------------------------------------------------------------------- progress


class RecordingBar:
    """Stands in for tqdm: records every update."""

    made = []

    def __init__(self, *args, total=None, disable=False, **kwargs):
        self.total, self.disable, self.updates = total, disable, []
        RecordingBar.made.append(self)

    def update(self, n=1):
        self.updates.append(n)

    def close(self):
        pass

    @staticmethod
    def write(text, file=None):
        print(text, file=file)


def test_the_progress_bar_advances_once_per_image(pipe, tmp_path, monkeypatch):
    """One chunk of 6 images, 2 decoding at once: the bar moves image by image, not once for the chunk."""
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    RecordingBar.made = []
    generate_batch(pipe, PROMPTS, tmp_path / "images", images_per_prompt=2, seed=7, batch_size=2, chunk_size=6,
                   progress=True, window=16)
    (bar,) = RecordingBar.made
    assert bar.total == 6 and not bar.disable
    assert bar.updates == [1] * 6
    assert "progress_bar" not in vars(pipe)  # the pipeline's own bar is back
