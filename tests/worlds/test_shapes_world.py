"""The shapes world follows its fixed specification."""

import json

import numpy as np
import pytest

from visualspec.worlds import shapes


@pytest.mark.parametrize("task", shapes.TASKS)
def test_scenes_satisfy_their_prompts_and_the_spec(task):
    rng = np.random.default_rng(0)
    for _ in range(50):
        image, metadata, objects = shapes.sample(rng, task)
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        assert metadata["tag"] == task and metadata["prompt"].startswith("a photo of ")
        wanted = sorted((c["class"], c.get("color")) for c in metadata["include"] for _ in range(c["count"]))
        got = sorted((o.shape, o.color if any("color" in c for c in metadata["include"]) else None) for o in objects)
        assert wanted == got
        for i, obj in enumerate(objects):
            x0, y0, x1, y1 = obj.box
            assert 12 <= x1 - x0 == y1 - y0 <= 22 and 0 <= x0 and 0 <= y0 and x1 <= 64 and y1 <= 64
            for other in objects[i + 1:]:  # apart by at least GAP pixels
                assert shapes.apart(obj.box, [other.box])
            # the object is drawn in its colour inside its box
            patch = image[y0:y1, x0:x1].reshape(-1, 3)
            assert (patch == shapes.COLORS[obj.color]).all(1).mean() > 0.4
        for clause in metadata["include"]:
            if "position" in clause:
                relation, target = clause["position"]
                a = next(o for o in objects if o.shape == clause["class"])
                b = next(o for o in objects if o.shape == metadata["include"][target]["class"])
                assert shapes.relative_position(a.box, b.box) == {relation}


def test_palette_background_and_prompts_are_the_specified_ones():
    assert shapes.COLORS["red"] == (220, 40, 40) and shapes.COLORS["white"] == (240, 240, 240) and len(shapes.COLORS) == 8
    assert (shapes.render([]) == 128).all()
    rng = np.random.default_rng(1)
    prompts = {shapes.prompt_metadata(t, rng)["prompt"] for t in shapes.TASKS for _ in range(30)}
    assert "a photo of a circle" in prompts or "a photo of a square" in prompts
    words = set(shapes.vocabulary())
    assert all(set(p.split()) <= words for p in prompts)


def test_relative_position_follows_box_centres():
    left, right = (0, 20, 14, 34), (40, 22, 54, 36)
    assert shapes.relative_position(left, right) == {"left of"}
    assert shapes.relative_position(right, left) == {"right of"}
    assert shapes.relative_position((20, 0, 34, 14), (22, 40, 36, 54)) == {"above"}
    assert shapes.relative_position(left, (2, 22, 16, 36)) == set()  # too close to call


def test_geneval_folder_and_prompt_file_are_seeded(tmp_path):
    prompts = shapes.evaluation_prompts(per_task=2, seed=3)
    assert [p["tag"] for p in prompts] == [t for t in shapes.TASKS for _ in range(2)]
    shapes.write_prompt_file(tmp_path / "prompts.jsonl", prompts)
    assert [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()] == prompts
    for name in ("a", "b"):
        shapes.write_geneval_folder(tmp_path / name, prompts, samples_per_prompt=2, seed=5)
    first = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert len(first) == 24 and first[0].as_posix() == "00000/samples/0000.png"
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in first)
    assert json.loads((tmp_path / "a" / "00003" / "metadata.jsonl").read_text()) == prompts[3]
