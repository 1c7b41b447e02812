"""Ordinary mistakes end in one line that names the problem, never a traceback, and nothing is
written or lost (#53): the four a new user hit, each run as a user runs it (a subprocess), then a
sweep of every command's arguments (empty, zero, a file where a folder belongs and the reverse, a
folder of the wrong kind), in process."""

import os
import subprocess
import sys

import pytest

from visualspec.tools.cli import main


def visualspec(*args, cwd):
    """The command as a user runs it: its exit code and standard error."""
    result = subprocess.run([sys.executable, "-m", "visualspec.tools.cli", *args], cwd=cwd, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return result.returncode, result.stderr


def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("text", ["", "# only a comment\n\n   \n"], ids=["empty", "comments-only"])
def test_a_prompt_file_without_prompts_is_named_and_nothing_is_written(tmp_path, text):
    (tmp_path / "prompts.txt").write_text(text)
    before = files(tmp_path)
    code, err = visualspec("batch", "--prompts", "prompts.txt", "--out", "images", cwd=tmp_path)
    assert code == 2 and "Traceback" not in err
    assert "error: prompts.txt has no prompts" in err
    assert files(tmp_path) == before  # no output folder, nothing else


def test_an_output_folder_that_is_a_file_is_named_and_the_file_is_kept(tmp_path):
    (tmp_path / "prompts.txt").write_text("a photo of a red circle\n")
    (tmp_path / "notafolder.txt").write_text("keep me")
    code, err = visualspec("batch", "--prompts", "prompts.txt", "--out", "notafolder.txt", cwd=tmp_path)
    assert code == 2 and "Traceback" not in err
    assert "error: --out 'notafolder.txt' is a file, not a folder" in err
    assert (tmp_path / "notafolder.txt").read_text() == "keep me"


def test_a_count_below_one_is_refused_by_name(tmp_path):
    code, err = visualspec("bench", "--images", "0", cwd=tmp_path)
    assert code == 2 and "Traceback" not in err
    assert "argument --images: must be an integer >= 1, got '0'" in err
    assert files(tmp_path) == []


def test_the_shipped_text_pair_loads_from_any_folder_and_a_missing_one_is_named(tmp_path):
    script = ("from visualspec.tools.bench_text import load_pair\n"
              "tokenizer, target, draft = load_pair('assets/text-pair')\n"  # the README's line, from elsewhere
              "print(type(target).__name__, type(draft).__name__)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["LlamaForCausalLM", "LlamaForCausalLM"]

    from visualspec.tools.bench_text import load_pair

    with pytest.raises(FileNotFoundError, match="no text pair folder 'nowhere/pair'"):
        load_pair("nowhere/pair")
    with pytest.raises(FileNotFoundError, match="it has no tokenizer, target, draft folder"):
        load_pair(tmp_path)


def test_shipped_models_load_by_their_docs_path_from_any_folder(tmp_path, monkeypatch):
    from visualspec.assets import SHAPES_LUMINA
    from visualspec.tools.loading import shipped_or_path

    monkeypatch.chdir(tmp_path)
    for name in ("shapes-lumina", "assets/shapes-lumina"):
        assert shipped_or_path(name) == str(SHAPES_LUMINA)
    (tmp_path / "assets" / "shapes-lumina").mkdir(parents=True)  # a folder here of that path is the user's
    assert shipped_or_path("assets/shapes-lumina") == "assets/shapes-lumina"
    with pytest.raises(ValueError, match="--model other/shapes-lumina: neither a folder here nor a shipped model"):
        shipped_or_path("other/shapes-lumina")  # not the docs' path: never a download


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder with a file, an empty folder and a prompt file, as the sweep's mistakes use."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "prompts.txt").write_text("a photo of a red circle\n")
    return tmp_path


SWEEP = [  # (arguments, what the one-line message must say); every case must fail before any work
    (["generate", "a photo of a red circle", "-o", "folder"], "-o 'folder' is a folder; give a file name"),
    (["generate", "a photo of a red circle", "-o", "file.txt/x.png"], "inside 'file.txt', which is a file"),
    (["generate", "a photo of a red circle", "--acceptance-map", "folder"], "--acceptance-map 'folder' is a folder"),
    (["generate", "a photo of a red circle", "--model", "file.txt"], "file.txt is a file, not a visualspec pipeline"),
    (["generate", "a photo of a red circle", "--model", "folder"], "folder is not a visualspec pipeline folder"),
    (["generate", "", "-o", "x.png"], "give a prompt"),
    (["bench", "--json", "folder"], "--json 'folder' is a folder; give a file name"),
    (["bench", "--keep-images", "file.txt"], "--keep-images 'file.txt' is a file, not a folder"),
    (["bench", "--modes", ","], "--modes names no mode"),
    (["batch", "--prompts", "folder", "--out", "o"], "prompt file 'folder' is not a file"),
    (["batch", "--prompts", "missing.txt", "--out", "o"], "prompt file 'missing.txt' does not exist"),
    (["batch", "--prompts", "prompts.txt", "--out", "file.txt/o"], "inside 'file.txt', which is a file"),
    (["eval", "geneval", "folder"], "no numeric subfolders"),
    (["eval", "geneval", "file.txt"], "not a directory"),
    (["eval", "geneval", "folder", "--json", "folder"], "--json 'folder' is a folder"),
    (["eval", "fid", "missing"], "image folder not found"),
    (["eval", "fid", "folder", "--ref", "file.txt"], "--ref 'file.txt' is neither statistics .npz nor an image"),
    (["eval", "fid", "folder", "--ref", "missing.npz"], "--ref 'missing.npz' does not exist"),
    (["prompts", "-o", "folder"], "-o 'folder' is a folder; give a file name"),
    (["video", "-o", "folder"], "-o 'folder' is a folder; give a file name"),
    (["video", "-o", "play.avi"], "export to .mp4 or .gif"),
    (["bench-video", "--json", "folder"], "--json 'folder' is a folder"),
    (["bench-text", "--json", "folder"], "--json 'folder' is a folder"),
    (["bench-text", "--pair", "folder"], "'folder' is not a text pair folder"),
    (["train-shapes"], "train-shapes needs --out FOLDER"),
    (["train-shapes", "--out", "file.txt"], "--out 'file.txt' is a file, not a folder"),
    (["train-text", "--out", "o", "--work-dir", "file.txt"], "--work-dir 'file.txt' is a file, not a folder"),
    (["train-arena", "--out", "file.txt/o"], "inside 'file.txt', which is a file"),
    (["train-arena", "--out", "o", "--from", "folder"], "--from folder: not a pipeline folder"),
    # a mistyped name is not sent to the Hub: it is named, with the names that exist
    (["generate", "x", "--model", "shapes-t2"], "--model shapes-t2: neither a folder here nor a shipped model "
                                                "(shipped: arena-nfd, shapes-any-order, shapes-lumina, shapes-t2i)"),
    (["video", "--model", "arena"], "--model arena: neither a folder here nor a shipped model"),
    (["batch", "--prompts", "prompts.txt", "--out", "o", "--model", "shapes"], "--model shapes: neither"),
    (["generate", "x", "--device", "gpu0"], "--device gpu0: not a device name torch knows"),
    (["video", "--device", "gpu0"], "--device gpu0: not a device name torch knows"),
    (["bench-video", "--device", "gpu0"], "--device gpu0: not a device name torch knows"),
    (["bench", "--device", "gpu0"], "--device gpu0: not a device name torch knows"),
]


@pytest.mark.parametrize("argv, message", SWEEP, ids=[" ".join(a)[:60] for a, _ in SWEEP])
def test_every_command_names_its_mistakes_before_any_work(place, argv, message, capsys):
    before = files(place)
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after at most a line naming the model
    assert last.startswith("error: ") and message in last, last
    assert files(place) == before


@pytest.mark.parametrize("argv", [["bench", "--batch-sizes", "1", "0"], ["batch", "--prompts", "p", "--out", "o",
                                  "--images-per-prompt", "0"], ["generate", "x", "--num-images", "-1"],
                                  ["bench-text", "--new-tokens", "0"], ["video", "--frames", "0"],
                                  ["bench-video", "--episodes", "0"], ["bench-video", "--speculate", "2", "0"],
                                  ["prompts", "--per-task", "zero"]])
def test_counts_below_one_are_refused_by_argparse_naming_the_option(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    option = next(a for a in argv if a.startswith("--") and a not in ("--prompts", "--out"))
    assert exit_.value.code == 2 and f"argument {option}: must be an integer >= 1" in capsys.readouterr().err
