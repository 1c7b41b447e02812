"""The command line on the default model (built offline into a temporary VISUALSPEC_HOME)."""

import json
import subprocess

import pytest
from PIL import Image

from visualspec.tools.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VISUALSPEC_HOME", str(tmp_path / "home"))
    return tmp_path


def test_generate_writes_image_stats_and_acceptance_map(home, capsys):
    out, amap = home / "out.png", home / "map.png"
    assert main(["generate", "a photo of two red circles", "--decoding", "sjd", "--seed", "0", "-o", str(out),
                 "--stats", "--acceptance-map", str(amap)]) == 0
    printed = capsys.readouterr().out
    stats = json.loads(printed.strip().splitlines()[-1])
    assert stats["mode"] == "sjd" and stats["num_tokens"] == 256 and stats["target_forwards"] < 256
    assert Image.open(out).size == (64, 64) and Image.open(amap).size == (128, 128)
    assert not list(home.glob(".*.tmp"))  # written atomically, nothing left behind


def test_generate_is_repeatable_and_reports_bad_input(home, capsys):
    a, b = home / "a.png", home / "b.png"
    main(["generate", "a photo of a blue square", "--seed", "5", "-o", str(a)])
    main(["generate", "a photo of a blue square", "--seed", "5", "-o", str(b)])
    assert a.read_bytes() == b.read_bytes()
    assert main(["generate", "a photo of a blue square", "--window", "0", "-o", str(a)]) == 2
    assert "window" in capsys.readouterr().err


def test_bench_runs_every_mode_side_by_side(home):
    report = home / "bench.json"
    assert main(["bench", "--images", "1", "--json", str(report), "--lantern-k", "8"]) == 0
    result = json.loads(report.read_text())["results"]
    assert set(result) == {"ar", "sjd", "sjd+coupling", "lantern", "gsd"}
    assert result["ar"]["target_forwards_per_image"] == 256 and result["ar"]["forwards_ratio_to_ar"] == 1
    assert result["sjd"]["target_forwards_per_image"] < 256


def test_choice_lists_match_the_pipeline():
    from visualspec.tools.cli import JACOBI_INITS, MODES
    from visualspec.drafters import INIT_SCHEMES
    from visualspec.pipelines.llamagen import DECODING_MODES

    assert MODES == DECODING_MODES
    assert JACOBI_INITS == INIT_SCHEMES


def test_console_script_is_installed():
    """The README installs the package, so the ``visualspec`` command must exist."""
    result = subprocess.run(["visualspec", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "generate" in result.stdout


def test_bench_quality_scores_the_timed_images(home, tmp_path):
    """The plumbing, on the tiny random model (the shipped model's quality has its own tests)."""
    from visualspec.tools.cli import tiny_random_folder

    report = tmp_path / "q.json"
    assert main(["bench", "--quality", "--per-task", "1", "--json", str(report), "--lantern-k", "8",
                 "--model", tiny_random_folder(), "--keep-images", str(tmp_path / "imgs")]) == 0
    result = json.loads(report.read_text())
    assert result["images_per_mode"] == 6
    for mode in ("ar", "sjd", "lantern"):
        r = result["results"][mode]
        assert 0 <= r["geneval_overall"] <= 1 and r["fid_shapes"] >= 0 and len(r["geneval_tasks"]) == 6
        assert len(list((tmp_path / "imgs" / "batch1" / mode).glob("*/samples/0000.png"))) == 6
