"""An image file that does not decode (a truncated copy) ends `eval geneval` and `eval fid` with one
error line naming it, exit code 2: the same check for both."""

import pytest

from visualspec.eval.detectors import get_detector
from visualspec.eval.geneval import evaluate_folder
from visualspec.eval.images import read_image
from visualspec.tools.cli import main
from visualspec.worlds import shapes


@pytest.fixture
def folder_with_a_truncated_image(tmp_path):
    folder = tmp_path / "images"
    shapes.write_geneval_folder(folder, shapes.evaluation_prompts(per_task=1, seed=3), samples_per_prompt=2, seed=4)
    bad = folder / "00002" / "samples" / "0001.png"
    data = bad.read_bytes()
    bad.write_bytes(data[:len(data) // 2])
    return folder, bad


def test_read_image_refuses_a_truncated_png_by_name(folder_with_a_truncated_image):
    folder, bad = folder_with_a_truncated_image
    assert read_image(folder / "00000" / "samples" / "0000.png").size == (64, 64)
    with pytest.raises(ValueError, match=f"could not read image file {bad}: .*truncated"):
        read_image(bad)


def test_geneval_and_fid_name_a_truncated_image_in_the_same_one_line(folder_with_a_truncated_image, capsys):
    folder, bad = folder_with_a_truncated_image
    errors = {}
    for metric in ("geneval", "fid"):
        assert main(["eval", metric, str(folder)]) == 2
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err and not captured.out  # no score printed
        errors[metric] = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors["geneval"]) == 1 and errors["geneval"] == errors["fid"]
    assert errors["geneval"][0].startswith(f"error: could not read image file {bad}: ")


def test_evaluate_folder_raises_a_value_error_naming_the_file(folder_with_a_truncated_image):
    folder, bad = folder_with_a_truncated_image
    with pytest.raises(ValueError, match=f"could not read image file {bad}"):
        evaluate_folder(folder, get_detector("shapes"))
