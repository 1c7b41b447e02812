"""`visualspec eval` on the shapes world, and the benchmark's quality columns."""

import json

import pytest

from visualspec.tools.cli import main
from visualspec.eval.shapes_quality import REFERENCE_STATS, score_shapes_folder
from visualspec.worlds import shapes


@pytest.fixture(scope="module")
def ground_truth(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gt")
    shapes.write_geneval_folder(folder, shapes.evaluation_prompts(per_task=10, seed=1), samples_per_prompt=2, seed=2)
    return folder


def test_eval_geneval_scores_ground_truth_perfectly(ground_truth, tmp_path, capsys):
    assert main(["eval", "geneval", str(ground_truth), "--json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["overall"] >= 0.98 and set(summary["tasks"]) == set(shapes.TASKS)


def test_eval_geneval_names_a_wrong_layout(tmp_path, capsys):
    (tmp_path / "00000").mkdir()
    assert main(["eval", "geneval", str(tmp_path)]) == 2
    assert "metadata.jsonl" in capsys.readouterr().err


def test_fid_shapes_separates_ground_truth_from_noise(ground_truth, tmp_path, capsys):
    assert main(["eval", "fid", str(ground_truth)]) == 0
    fid_truth = json.loads(capsys.readouterr().out)["fid"]
    noise = tmp_path / "noise"
    noise.mkdir()
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(60):  # world images with their colours shuffled into blocks: wrong statistics
        image = shapes.sample(rng)[0]
        Image.fromarray(np.roll(image, 16 * (i % 4), axis=1)[:, ::-1]).save(noise / f"{i}.png")
        Image.fromarray((rng.random((64, 64, 3)) * 255).astype("uint8")).save(noise / f"n{i}.png")
    assert main(["eval", "fid", str(noise)]) == 0
    fid_noise = json.loads(capsys.readouterr().out)["fid"]
    assert fid_noise > 5 * fid_truth


def test_eval_fid_reports_a_missing_reference(ground_truth, tmp_path, capsys):
    assert main(["eval", "fid", str(ground_truth), "--ref", str(tmp_path / "missing.npz")]) == 2
    assert "missing.npz" in capsys.readouterr().err


def test_shipped_reference_statistics_exist():
    assert REFERENCE_STATS.is_file()


def test_score_shapes_folder_reports_both_metrics(ground_truth):
    result = score_shapes_folder(ground_truth)
    assert result["geneval"]["overall"] >= 0.98 and result["fid_shapes"] >= 0


def test_eval_geneval_takes_geneval_options_and_names_a_folder_without_prompts(tmp_path, capsys):
    prompts = shapes.evaluation_prompts(per_task=1)
    shapes.write_geneval_folder(tmp_path / "imgs", prompts, samples_per_prompt=1)
    assert main(["eval", "geneval", str(tmp_path / "imgs"), "--outfile", str(tmp_path / "r.jsonl"), "--options", "threshold=0.5"]) == 0
    assert "Overall score (avg. over tasks): 1.00000" in capsys.readouterr().out
    assert main(["eval", "geneval", str(tmp_path)]) == 2 and "no numeric subfolders" in capsys.readouterr().err


def test_the_prompts_command_writes_files_that_batch_and_geneval_read(tmp_path, capsys):
    from visualspec.tools.batch import read_prompts

    out = tmp_path / "p.jsonl"
    assert main(["prompts", "--per-task", "3", "--seed", "4", "-o", str(out)]) == 0
    prompts = read_prompts(out)
    assert prompts == shapes.evaluation_prompts(per_task=3, seed=4) and len(prompts) == 18
    assert {p["tag"] for p in prompts} == set(shapes.TASKS)


def test_eval_fid_reads_a_batch_folder_of_plain_prompts_and_warns_when_it_is_small(ground_truth, tmp_path, capsys):
    """A batch run from a plain prompt list writes metadata without GenEval's tags; FID needs none."""
    plain = tmp_path / "plain"
    for i, entry in enumerate(sorted(p for p in ground_truth.iterdir() if p.is_dir())):
        (plain / f"{i:05d}" / "samples").mkdir(parents=True)
        (plain / f"{i:05d}" / "metadata.jsonl").write_text(json.dumps({"prompt": f"prompt {i}"}) + "\n")
        for png in (entry / "samples").glob("*.png"):
            (plain / f"{i:05d}" / "samples" / png.name).write_bytes(png.read_bytes())
    assert main(["eval", "fid", str(plain)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["fid"] >= 0
    assert "FID of only 120 images" in err
