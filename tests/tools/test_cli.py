"""The command line on the default model (built offline into a temporary VISUALSPEC_HOME)."""

import json
import subprocess

import pytest
from PIL import Image

from visualspec.tools.cli import main


@pytest.fixture(scope="module")
def module_home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture
def home(tmp_path, module_home, monkeypatch):
    """A folder for the test's outputs, with one VISUALSPEC_HOME for the module: the shipped
    model's window tables are measured once for all its commands, as on a user's machine."""
    monkeypatch.setenv("VISUALSPEC_HOME", str(module_home))
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
    assert main(["generate", "a photo of a blue square", "--negative-prompt", "a red circle", "-o", str(a)]) == 2
    assert "--negative-prompt is not an option of LlamaGen" in capsys.readouterr().err


def test_bench_runs_every_mode_side_by_side(home):
    report = home / "bench.json"
    assert main(["bench", "--images", "1", "--json", str(report), "--lantern-k", "8", "--device", "cpu",
                 "--window", "8"]) == 0  # a fixed window: the window costs have their own test below
    report = json.loads(report.read_text())
    assert "device" not in report["machine"]  # on a CPU the CPU is the machine; an accelerator is named
    result = report["results"]
    assert set(result) == {"ar", "ar+compiled", "sjd", "sjd+coupling", "lantern", "gsd"}
    assert report["baseline"] in ("ar", "ar+compiled")  # the fastest AR of the run
    assert result[report["baseline"]]["speedup_vs_ar"] == 1
    assert result["ar"]["target_forwards_per_image"] == 256 and result["ar"]["forwards_ratio_to_ar"] == 1
    assert result["sjd"]["target_forwards_per_image"] < 256


def test_device_defaults_to_cuda_only_where_there_is_one(monkeypatch):
    import torch

    from visualspec.tools.loading import device_name as _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device(None) == "cpu" and _device("cpu") == "cpu"
    with pytest.raises(ValueError, match="--device cuda:1: CUDA is not available here"):
        _device("cuda:1")  # named before any model loads, not torch's assertion deep inside a forward
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _device(None) == "cuda:3" and _device("cuda:1") == "cuda:1"


def test_generate_and_video_take_a_device(home, tmp_path):
    out = tmp_path / "x.png"
    assert main(["generate", "a photo of a red circle", "--device", "cpu", "-o", str(out)]) == 0 and out.is_file()
    clip = tmp_path / "v.gif"
    assert main(["video", "--device", "cpu", "--frames", "2", "-o", str(clip)]) == 0 and clip.is_file()


def test_choice_lists_match_the_pipeline():
    from visualspec.tools.commands.options import JACOBI_INITS
    from visualspec.drafters import INIT_SCHEMES

    assert JACOBI_INITS == INIT_SCHEMES
    from visualspec.models.quantized import QUANTIZE_SCHEMES
    from visualspec.tools.commands.options import QUANTIZE_CHOICES

    assert QUANTIZE_CHOICES == tuple(sorted(QUANTIZE_SCHEMES))


def test_console_script_is_installed():
    """The README installs the package, so the ``visualspec`` command must exist."""
    result = subprocess.run(["visualspec", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "generate" in result.stdout


def test_bench_quality_scores_the_timed_images(home, tmp_path):
    """The plumbing, on the tiny random model (the shipped model's quality has its own tests)."""
    from visualspec.tools.loading import tiny_random_folder

    report = tmp_path / "q.json"
    assert main(["bench", "--quality", "--per-task", "1", "--json", str(report), "--lantern-k", "8",
                 "--model", tiny_random_folder(), "--keep-images", str(tmp_path / "imgs"),
                 "--modes", "ar,sjd,lantern", "--window", "4"]) == 0
    result = json.loads(report.read_text())
    assert result["images_per_mode"] == 6
    for mode in ("ar", "sjd", "lantern"):
        r = result["results"][mode]
        assert 0 <= r["geneval_overall"] <= 1 and r["fid_shapes"] >= 0 and len(r["geneval_tasks"]) == 6
        assert len(list((tmp_path / "imgs" / "batch1" / mode).glob("*/samples/0000.png"))) == 6


def test_a_missing_shipped_model_is_an_error_never_a_random_model(tmp_path, monkeypatch, capsys):
    """An installation without its shipped models says so; no command draws noise from a random
    model in their place, or suggests training into the installation."""
    import visualspec.assets
    import visualspec.eval.shapes_quality as quality
    from visualspec.worlds import shapes

    empty = tmp_path / "empty"
    for name in ("SHAPES_T2I", "ARENA_NFD"):
        monkeypatch.setattr(visualspec.assets, name, empty / name)
    monkeypatch.setattr(quality, "FEATURES_DIR", empty / "fid")
    out = tmp_path / "out.png"
    assert main(["generate", "a photo of a red circle", "-o", str(out)]) == 2
    assert "shipped model is missing from this installation" in capsys.readouterr().err
    assert not out.exists()
    assert main(["video", "--frames", "2", "-o", str(tmp_path / "v.gif")]) == 2
    assert "shipped world model is missing from this installation" in capsys.readouterr().err
    images = tmp_path / "images"
    shapes.write_geneval_folder(images, shapes.evaluation_prompts(per_task=1, seed=0), samples_per_prompt=1)
    assert main(["eval", "fid", str(images)]) == 2
    assert "missing from this installation" in capsys.readouterr().err


def test_bad_command_lines_are_named_before_any_work(home, tmp_path, capsys):
    from visualspec.assets import ARENA_NFD

    assert main(["eval", "--help"]) == 0 and "eval geneval FOLDER" in capsys.readouterr().out
    out = tmp_path / "x.png"
    assert main(["generate", "a photo of a red circle", "--model", str(ARENA_NFD), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "NextFramePipeline, not an image pipeline" in err and "use `visualspec video --model`" in err
    for argv, message in (
            (["-o", str(tmp_path / "x.jpg2")], "unknown extension '.jpg2'"),
            (["--decoding", "speculative", "-o", str(out)], "needs --draft-model"),
            (["-o", str(tmp_path)], f"-o {str(tmp_path)!r} is a folder; give a file name"),
            (["-o", str(out), "--acceptance-map", str(home)], "--acceptance-map"),
    ):
        assert main(["generate", "a photo of a red circle", *argv]) == 2
        assert message in capsys.readouterr().err
    assert main(["generate", "", "-o", str(out)]) == 2 and "give a prompt" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse refuses a count below 1, naming the option
        main(["video", "--steps", "0", "--frames", "2", "-o", str(tmp_path / "v.gif")])
    assert exit_.value.code == 2 and "argument --steps: must be an integer >= 1, got '0'" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "v.gif").exists()


def test_the_python_api_refuses_an_empty_prompt_as_the_command_line_does():
    from visualspec import VisualSpecPipeline
    from visualspec.assets import SHAPES_T2I

    pipe = VisualSpecPipeline.from_pretrained(SHAPES_T2I)
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        pipe(["a photo of a red circle", "  "], output_type="latent")


def test_speculative_decoding_takes_a_draft_model_folder(home, tmp_path, capsys):
    from visualspec.assets import SHAPES_T2I

    out = tmp_path / "spec.png"
    assert main(["generate", "a photo of a red circle", "--decoding", "speculative", "--draft-model", str(SHAPES_T2I),
                 "--window", "4", "-o", str(out), "--stats"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["mode"] == "speculative" and stats["draft_forwards"] > 0 and out.is_file()


@pytest.mark.parametrize("text, frames, expected", [
    ("right,up", 60, ["right"] * 30 + ["up"] * 30),
    ("right,up,left", 7, ["right"] * 3 + ["up"] * 2 + ["left"] * 2),
    ("right:10,up", 60, ["right"] * 10 + ["up"] * 50),
    ("right:2,up:3", None, ["right"] * 2 + ["up"] * 3),
    ("right,up", None, ["right", "up"]),
])
def test_video_actions_share_the_frames_as_the_readme_says(text, frames, expected):
    from visualspec.tools.commands.video import action_script

    assert action_script(text, frames) == expected


def test_video_action_scripts_that_cannot_fill_the_frames_are_named():
    from visualspec.tools.commands.video import action_script

    with pytest.raises(ValueError, match="leaves 0 frames for 1 keys"):
        action_script("right:60,up", 60)
    with pytest.raises(ValueError, match="gives 5 frames but --frames is 4"):
        action_script("right:2,up:3", 4)
    with pytest.raises(ValueError, match="frame count must be an integer"):
        action_script("right:x", None)


def test_the_command_line_starts_without_torch_diffusers_or_transformers():
    """Parsing (and --help) imports none of the heavy libraries; a command imports what it needs."""
    import sys

    code = ("import sys; from visualspec.tools.cli import build_parser; build_parser().parse_args(['generate', 'x']); "
            "print(sorted({'torch', 'diffusers', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_command_takes_a_thread_count(home, tmp_path, monkeypatch):
    import torch

    from visualspec.tools.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, command in commands.items():
        assert any("--threads" in action.option_strings for action in command._actions), name
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "x", "--threads", "0"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    calls = []
    assert main(["generate", "a photo of a red circle", "--threads", "1", "-o", str(tmp_path / "t.png")]) == 0
    assert calls == [1]


def test_bench_quality_reports_progress_while_generating_and_scoring(home, capsys):
    assert main(["bench", "--quality", "--per-task", "1", "--modes", "ar", "--batch-sizes", "4"]) == 0
    err = capsys.readouterr().err
    assert "bench (batch 4)" in err and "scoring ar's 6 images" in err


def test_bench_text_finds_the_shipped_pair_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench-text", "--prompts", "1", "--new-tokens", "8", "--compile", "off"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompts"] == 1 and result["results"]["generate"]["target_forwards"] == 8
    assert result["best_ar"] in ("generate", "visualspec AR") and "visualspec AR, compiled" not in result["results"]


def test_bench_text_compile_choices_pick_the_rows():
    from visualspec.tools.bench_text import is_ar, methods

    class Tokenizer:
        def __len__(self):
            return 64

    rows = {c: set(methods(None, None, Tokenizer(), compile=c)) for c in ("off", "on", "both")}
    assert rows["on"] == {"generate", "transformers generate, static compiled", "visualspec AR, compiled",
                          "visualspec draft model, compiled", "visualspec n-gram, compiled",
                          "visualspec STAND, compiled", "visualspec draft model, compiled, auto window",
                          "visualspec n-gram, compiled, auto window", "visualspec STAND, compiled, auto window"}
    assert rows["both"] == rows["on"] | rows["off"] and not rows["on"] & rows["off"] - {"generate"}
    with pytest.raises(ValueError, match="compile must be one of"):
        methods(None, None, Tokenizer(), compile="yes")
    quantized = set(methods(None, None, Tokenizer(), compile="on", quantized=("int8", None))) - rows["on"]
    assert quantized == {"visualspec AR, compiled, int8", "visualspec STAND, compiled, int8"}
    assert [is_ar(name) for name in sorted(quantized)] == [True, False]


def test_bench_measures_window_costs_only_before_it_times(home, monkeypatch):
    """One-time work stays out of the timed calls: with a last call smaller than the others
    (19 images at batch 4: calls of 16 and 3), every window cost is measured in the warm-up."""
    import visualspec.core.window_costs as costs
    from visualspec.pipelines.tiny import tiny_unified_pipeline
    from visualspec.tools.bench import run_benchmark

    monkeypatch.setenv("VISUALSPEC_HOME", str(home / "fresh"))  # nothing measured yet
    pipe = tiny_unified_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    calls, measured_after = [], []

    class Counting:  # the pipeline, recording each call's output type (the timed calls make images)
        bench_mode = type(pipe).bench_mode

        def __getattr__(self, name):
            return getattr(pipe, name)

        def __call__(self, *args, **kwargs):
            calls.append(kwargs["output_type"])
            return pipe(*args, **kwargs)

    real = costs._store_tables  # every measurement (whole decode steps, forwards) is stored once made
    monkeypatch.setattr(costs, "_store_tables", lambda *a, **k: measured_after.append(len(calls)) or real(*a, **k))
    run_benchmark(Counting(), prompts=["a photo of a red circle"], modes=["ar", "sjd"], images=19, batch_size=4)
    assert measured_after and max(measured_after) <= calls.index("pil"), "a window cost was measured in a timed call"


def test_bench_video_quality_sets_guarded_rows_beside_unguarded_ones_on_the_episodes_asked(monkeypatch, capsys):
    """What ``bench-video --quality --unguarded --rollout-seed`` asks of the measures (they are
    stubbed: the shipped world's rollouts take minutes)."""
    from visualspec.eval import video as quality
    from visualspec.tools import bench
    from visualspec.tools.commands import video

    calls = []
    monkeypatch.setattr(video, "world_model", lambda *args: "the world")
    monkeypatch.setattr(bench, "run_video_benchmark", lambda pipe, **kw: {"table": "the table"})
    monkeypatch.setattr(quality, "one_step_psnr", lambda pipe, *args, **kw: {})
    monkeypatch.setattr(quality, "rollout_player_error", lambda pipe, **kw: calls.append(kw) or {})
    assert main(["bench-video", "--quality", "--episodes", "3", "--speculate", "2", "4", "--unguarded",
                 "--rollout-seed", "990000"]) == 0
    assert all(c["episodes"] == 3 and c["seed"] == 990000 for c in calls)
    assert [(c.get("speculate"), c.get("guard"), c.get("use_teacher")) for c in calls] == [
        (None, None, None), (2, True, None), (2, False, None), (4, True, None), (4, False, None), (None, None, True)]
    calls.clear()
    assert main(["bench-video", "--quality", "--episodes", "3", "--speculate", "4"]) == 0  # guarded only, held out
    assert [c.get("guard") for c in calls] == [None, True, None] and all("seed" not in c for c in calls)
