"""GenEval-protocol scoring: folder / prompt-file reading, GenEval's rule, summary, both detector backends."""

import json

import numpy as np
import pytest
from PIL import Image

from visualspec.eval import detectors as D
from visualspec.eval import geneval as G
from visualspec.worlds import shapes as W
from visualspec.worlds.shapes import ShapeObject, render


def obj(shape, color, x, y, size=16):
    return ShapeObject(shape, color, (x, y, x + size, y + size))


def verdict(objects, metadata):
    result = G.evaluate_image(render(objects), metadata, D.ShapesDetector())
    return result["correct"], result["reason"]


def write_folder(root, items):
    """items: list of (metadata, [uint8 images]) -> GenEval layout under root."""
    for index, (metadata, images) in enumerate(items):
        sub = root / f"{index:05d}"
        (sub / "samples").mkdir(parents=True)
        (sub / "metadata.jsonl").write_text(json.dumps(metadata) + "\n")
        for k, image in enumerate(images):
            Image.fromarray(image).save(sub / "samples" / f"{k:04d}.png")
    return root


# ------------------------------------------------------------------------------------ ground truth


def test_ground_truth_world_images_score_perfectly(tmp_path):
    prompts = W.evaluation_prompts(per_task=50)
    W.write_geneval_folder(tmp_path / "gt", prompts, samples_per_prompt=4)
    out = tmp_path / "res" / "results.jsonl"
    summary = G.evaluate_folder(tmp_path / "gt", D.ShapesDetector(), outfile=out)
    assert list(summary["tasks"]) == list(W.TASKS) and summary["missing_tasks"] == []
    assert summary["images"] == 1200 and summary["prompts"] == 300
    assert all(t["total"] == 200 for t in summary["tasks"].values())
    assert summary["overall"] >= 0.98, G.format_summary(summary)
    assert summary["overall"] == 1.0  # the analytic detector is exact on clean world images
    lines = out.read_text().splitlines()
    assert len(lines) == 1200 and [p.name for p in out.parent.iterdir()] == ["results.jsonl"]  # atomic, no temp
    record = json.loads(lines[0])
    # GenEval's keys, and the shapes detector's flaws of each kept object (none on a clean render)
    assert set(record) == {"filename", "tag", "prompt", "correct", "reason", "metadata", "details", "flaws"}
    assert json.loads(record["metadata"]) == prompts[0] and record["filename"].endswith("00000/samples/0000.png")
    (name, boxes), = json.loads(record["details"]).items()
    assert name == prompts[0]["include"][0]["class"] and len(boxes) == 1 and boxes[0][4] > 0.999
    assert json.loads(record["flaws"]) == {name: [[]]}
    assert G.summarize(out) == summary  # the written file summarises the same


def test_shapes_detector_recovers_objects_exactly():
    rng = np.random.default_rng(3)
    for _ in range(30):
        image, metadata, objects = W.sample(rng)
        dets = D.ShapesDetector().detect(image)
        got = sorted((d.class_name, d.color, tuple(int(v) for v in d.box)) for d in dets)
        assert got == sorted((o.shape, o.color, o.box) for o in objects)
        assert all(d.score > 0.999 and not d.broken for d in dets)


# ------------------------------------------------------------------------------------ each branch can fail


def test_two_object_fails_when_an_object_is_missing():
    meta = {"tag": "two_object", "include": [{"class": "circle", "count": 1}, {"class": "square", "count": 1}],
            "prompt": "a photo of a circle and a square"}
    assert verdict([obj("circle", "red", 5, 5), obj("square", "blue", 40, 40)], meta) == (True, "")
    ok, reason = verdict([obj("circle", "red", 5, 5), obj("triangle", "blue", 40, 40)], meta)
    assert not ok and reason == "expected square>=1, found 0"


def test_counting_fails_on_too_few_and_too_many():
    meta = {"tag": "counting", "include": [{"class": "circle", "count": 2}],
            "exclude": [{"class": "circle", "count": 3}], "prompt": "a photo of two circles"}
    two = [obj("circle", "red", 2, 2), obj("circle", "green", 30, 2)]
    assert verdict(two, meta)[0]
    assert verdict(two + [obj("square", "blue", 20, 40)], meta)[0]  # other classes do not count
    ok, reason = verdict(two + [obj("circle", "blue", 20, 40)], meta)
    assert not ok and reason == "expected circle<3, found 3"  # the exclude clause
    ok, reason = verdict(two[:1], meta)
    assert not ok and reason == "expected circle>=2, found 1"


def test_colors_fails_on_the_wrong_colour():
    meta = {"tag": "colors", "include": [{"class": "triangle", "count": 1, "color": "red"}],
            "prompt": "a photo of a red triangle"}
    assert verdict([obj("triangle", "red", 20, 20)], meta)[0]
    ok, reason = verdict([obj("triangle", "blue", 20, 20)], meta)
    assert not ok and reason.startswith("expected red triangle>=1, found 0 red; and 1 blue")


def test_colour_is_judged_on_the_most_confident_objects_only():
    # GenEval checks the colour of the `count` best detections: a second, red square does not help
    meta = {"tag": "colors", "include": [{"class": "square", "count": 1, "color": "red"}], "prompt": "p"}
    dets = [G.Detection("square", 0.95, (0, 0, 16, 16), "blue"), G.Detection("square", 0.9, (30, 30, 46, 46), "red")]
    correct, _ = G.judge(G.select_objects(dets, 0.3), meta)
    assert not correct
    assert G.judge(G.select_objects(dets[1:], 0.3), meta)[0]


def test_position_fails_when_swapped():
    meta = {"tag": "position", "include": [{"class": "square", "count": 1},
                                           {"class": "circle", "count": 1, "position": ["left of", 0]}],
            "prompt": "a photo of a circle left of a square"}
    assert verdict([obj("circle", "red", 4, 24), obj("square", "blue", 40, 24)], meta) == (True, "")
    ok, reason = verdict([obj("circle", "red", 40, 24), obj("square", "blue", 4, 24)], meta)
    assert not ok and reason == "expected circle left of target, found right of target"
    ok, reason = verdict([obj("circle", "red", 40, 24)], meta)  # no target: both clauses fail
    assert not ok and reason.splitlines() == ["expected square>=1, found 0", "no target for circle to be left of"]


def test_color_attr_fails_when_colours_are_swapped():
    meta = {"tag": "color_attr", "include": [{"class": "circle", "count": 1, "color": "red"},
                                             {"class": "square", "count": 1, "color": "blue"}],
            "prompt": "a photo of a red circle and a blue square"}
    assert verdict([obj("circle", "red", 4, 4), obj("square", "blue", 40, 40)], meta)[0]
    ok, reason = verdict([obj("circle", "blue", 4, 4), obj("square", "red", 40, 40)], meta)
    assert not ok and len(reason.splitlines()) == 2


def test_thresholds_and_max_objects():
    dets = [G.Detection("circle", s, (0, 0, 1, 1)) for s in (0.95, 0.9, 0.5, 0.3, 0.1)]
    assert [d.score for d in G.select_objects(dets, 0.3)["circle"]] == [0.95, 0.9, 0.5]  # strictly above
    assert [d.score for d in G.select_objects(dets, 0.9)["circle"]] == [0.95]
    many = [G.Detection("square", 0.5, (i, 0, i + 1, 1)) for i in range(20)]
    assert len(G.select_objects(many, 0.3)["square"]) == 16
    boxes = [G.Detection("square", 0.9, (0, 0, 10, 10)), G.Detection("square", 0.8, (1, 1, 11, 11))]
    assert len(G.select_objects(boxes, 0.3)["square"]) == 2  # max_overlap 1.0: NMS off
    assert len(G.select_objects(boxes, 0.3, max_overlap=0.5)["square"]) == 1
    with pytest.raises(ValueError, match="unknown GenEval option"):
        G.evaluate_image(np.zeros((8, 8, 3), np.uint8), {"tag": "colors", "include": [], "prompt": "p"},
                         D.ShapesDetector(), treshold=0.5)


# ------------------------------------------------------------------------------------ summary


def test_summary_math():
    def rec(tag, ok, folder, k=0):
        return {"filename": f"imgs/{folder:05d}/samples/{k:04d}.png", "tag": tag, "prompt": tag, "correct": ok,
                "reason": "", "metadata": json.dumps({"tag": tag, "prompt": tag}), "details": "{}"}

    results = [rec("single_object", True, 0), rec("single_object", True, 0, 1),
               rec("two_object", True, 1), rec("two_object", False, 1, 1),
               rec("counting", False, 2),
               rec("colors", True, 3),
               rec("position", False, 4), rec("position", False, 4, 1), rec("position", False, 5),
               rec("position", True, 5, 1),
               rec("color_attr", False, 6), rec("color_attr", False, 7)]
    s = G.summarize(results)
    assert s["images"] == 12 and s["prompts"] == 8
    assert s["correct_images"] == pytest.approx(5 / 12)
    assert s["correct_prompts"] == pytest.approx(4 / 8)  # folders 0, 1, 3, 5 have a correct image
    assert {t: v["accuracy"] for t, v in s["tasks"].items()} == {
        "single_object": 1.0, "two_object": 0.5, "counting": 0.0, "colors": 1.0, "position": 0.25, "color_attr": 0.0}
    assert s["overall"] == pytest.approx((1 + 0.5 + 0 + 1 + 0.25 + 0) / 6)
    assert "Overall score (avg. over tasks): 0.45833" in G.format_summary(s)
    partial = G.summarize([r for r in results if r["tag"] != "counting"])
    assert partial["missing_tasks"] == ["counting"] and partial["overall"] == pytest.approx(2.75 / 5)


# ------------------------------------------------------------------------------------ file errors


def test_folder_layout_errors_name_the_file(tmp_path):
    meta = W.evaluation_prompts(per_task=1)[0]
    image = render([obj("circle", "red", 10, 10)])
    with pytest.raises(ValueError, match="not a directory"):
        G.read_geneval_folder(tmp_path / "nope")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "images").mkdir()
    with pytest.raises(ValueError, match=r"a: no numeric subfolders"):
        G.read_geneval_folder(tmp_path / "a")
    root = write_folder(tmp_path / "b", [(meta, [image])])
    (root / "00001" / "samples").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"00001: no metadata\.jsonl"):
        G.read_geneval_folder(root)
    (root / "00001" / "metadata.jsonl").write_text('{"tag": "colors", "include": [}\n')
    with pytest.raises(ValueError, match=r"00001/metadata\.jsonl:1: malformed JSON"):
        G.read_geneval_folder(root)
    (root / "00001" / "metadata.jsonl").write_text("\n" + json.dumps({"tag": "colors", "prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"00001/metadata\.jsonl:2: missing 'include'"):
        G.read_geneval_folder(root)
    (root / "00001" / "metadata.jsonl").write_text(json.dumps(meta) + "\n")
    (root / "00001" / "samples" / "grid.png").write_bytes(b"")  # not a sample name: ignored, like GenEval
    with pytest.raises(ValueError, match=r"00001/samples: no samples"):
        G.read_geneval_folder(root)
    Image.fromarray(image).save(root / "00001" / "samples" / "0000.png")
    (root / "notes").mkdir()  # non-numeric folders are skipped
    entries = G.read_geneval_folder(root)
    assert [e.index for e in entries] == ["00000", "00001"] and [len(e.images) for e in entries] == [1, 1]


def test_prompt_file_errors_name_file_and_line(tmp_path):
    good = W.evaluation_prompts(per_task=1)
    path = tmp_path / "prompts.jsonl"
    W.write_prompt_file(path, good)
    assert G.read_prompt_file(path) == good
    cases = [
        ("{not json", r"malformed JSON"),
        (json.dumps({"tag": "colors", "include": [{"class": "circle", "count": 1}]}), r"missing 'prompt'"),
        (json.dumps({"tag": "colors", "prompt": "p"}), r"missing 'include'"),
        (json.dumps({"include": [{"class": "circle", "count": 1}], "prompt": "p"}), r"missing 'tag'"),
        (json.dumps({"tag": "shapes", "include": [{"class": "circle", "count": 1}], "prompt": "p"}), r"unknown tag"),
        (json.dumps({"tag": "colors", "include": [{"class": "circle", "count": 0}], "prompt": "p"}), r"'count'"),
        (json.dumps({"tag": "colors", "include": [{"class": "circle", "count": 1, "color": "teal"}],
                     "prompt": "p"}), r"unknown color"),
        (json.dumps({"tag": "position", "include": [{"class": "circle", "count": 1, "position": ["left of", 0]}],
                     "prompt": "p"}), r"earlier include clause"),
        ("", r"empty line"),
    ]
    for bad, message in cases:
        lines = [json.dumps(p) for p in good[:2]] + [bad] + [json.dumps(good[2])]
        path.write_text("\n".join(lines) + "\n\n")
        with pytest.raises(ValueError, match=rf"prompts\.jsonl:3: .*{message}"):
            G.read_prompt_file(path)


# ------------------------------------------------------------------------------------ robustness


def test_noisy_ground_truth_still_scores_correct():
    rng = np.random.default_rng(0)
    detector = D.ShapesDetector()
    for i in range(24):
        image, metadata, _ = W.sample(rng, W.TASKS[i % 6])
        noisy = image.astype(np.float64) + rng.normal(0, 6, image.shape)
        for y, x in rng.integers(0, W.CANVAS, size=(15, 2)):  # stray pixels of palette colours
            noisy[y, x] = list(W.COLORS.values())[rng.integers(len(W.COLORS))]
        noisy = np.clip(np.round(noisy), 0, 255).astype(np.uint8)
        result = G.evaluate_image(noisy, metadata, detector)
        assert result["correct"], (metadata["prompt"], result["reason"], result["details"])


def test_blank_and_garbage_images_detect_nothing():
    detector = D.ShapesDetector()
    assert detector.detect(np.full((64, 64, 3), 128, np.uint8)) == []
    assert detector.detect(Image.new("RGB", (64, 64), (130, 126, 128))) == []
    blob = render([obj("square", "red", 10, 10, 16), obj("square", "red", 26, 10, 16)])  # merged 32x16 blob
    assert all(d.score < 0.3 for d in detector.detect(blob))
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)  # one image-sized blob
    assert all(d.score < 0.3 for d in detector.detect(noise))


def test_detectors_by_name_and_what_each_needs():
    assert isinstance(D.get_detector("shapes"), D.ShapesDetector)
    with pytest.raises(ValueError, match="unknown detector"):
        D.get_detector("mask2former")
    with pytest.raises(ValueError, match="clip_path"):
        D.get_detector("transformers", detector_path="x")


# ------------------------------------------------------------------------------------ transformers backend


LABELS = {0: "circle", 1: "square", 2: "mouse"}


def _tiny_clip(folder):
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, PreTrainedTokenizerFast

    words = ("a photo of colored object computer mouse circle square " + " ".join(G.GENEVAL_COLORS)).split()
    vocab = {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3}
    for w in words + ["-"]:
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>",
                                                      special_tokens=[("<bos>", 2), ("<eos>", 3)])
    PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>",
                            eos_token="<eos>", model_max_length=16).save_pretrained(folder)
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=2, eos_token_id=3,
                         pad_token_id=0),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=8)
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)


def _tiny_yolos(folder):
    import torch
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    config = YolosConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                         image_size=[64, 64], patch_size=16, num_detection_tokens=6, id2label=LABELS,
                         label2id={v: k for k, v in LABELS.items()})
    YolosForObjectDetection(config).save_pretrained(folder)
    YolosImageProcessor(size={"shortest_edge": 64, "longest_edge": 64}).save_pretrained(folder)


def _tiny_mask2former(folder):
    import torch
    from transformers import (Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor,
                              SwinConfig)

    torch.manual_seed(0)
    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                          window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(backbone_config=backbone, hidden_dim=32, feature_size=32, mask_feature_size=32,
                               encoder_feedforward_dim=32, dim_feedforward=32, decoder_layers=2, encoder_layers=1,
                               num_attention_heads=2, num_queries=6, id2label=LABELS, common_stride=4)
    Mask2FormerForUniversalSegmentation(config).save_pretrained(folder)
    Mask2FormerImageProcessor(size={"shortest_edge": 64, "longest_edge": 64}).save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("tiny-ckpts")
    _tiny_clip(root / "clip")
    _tiny_yolos(root / "yolos")
    _tiny_mask2former(root / "m2f")
    return root


@pytest.mark.parametrize("kind", ["yolos", "m2f"])
def test_transformers_backend_plumbing(tiny_checkpoints, tmp_path, kind):
    detector = D.get_detector("transformers", detector_path=str(tiny_checkpoints / kind),
                              clip_path=str(tiny_checkpoints / "clip"), min_score=0.0)
    assert detector.segmentation == (kind == "m2f")
    assert set(detector.labels.values()) == {"circle", "square", "computer mouse"}  # COCO alias applied
    scene = render([obj("circle", "red", 4, 4), obj("square", "blue", 40, 30)])
    image = np.asarray(Image.fromarray(scene).resize((80, 64)))  # not square, not the model's size
    dets = detector.detect(image)
    assert dets and all(isinstance(d, G.Detection) for d in dets)
    for d in dets:
        assert d.class_name in detector.labels.values() and 0.0 <= d.score <= 1.0
        x0, y0, x1, y1 = d.box
        assert 0 <= x0 <= x1 <= 80 and 0 <= y0 <= y1 <= 64
        assert (d.mask is not None) == (kind == "m2f") and (d.mask is None or d.mask.shape == (64, 80))
    assert [d.score for d in dets] == sorted((d.score for d in dets), reverse=True)
    colors = detector.classify_colors(image, dets[:3], "circle")
    assert len(colors) == len(dets[:3]) and set(colors) <= set(G.GENEVAL_COLORS)
    assert all(c.size[0] >= 1 and c.size[1] >= 1 for c in detector.crops(image, dets[:3]))
    if kind == "m2f":
        with pytest.raises(ValueError, match="mask"):
            detector.classify_colors(image[:32], dets[:1], "circle")

    # the whole evaluation runs through it; threshold 0 keeps the random model's detections
    metas = [{"tag": "colors", "include": [{"class": "circle", "count": 1, "color": "red"}], "prompt": "a red circle"},
             {"tag": "position", "include": [{"class": "square", "count": 1},
                                             {"class": "circle", "count": 1, "position": ["left of", 0]}],
              "prompt": "a circle left of a square"}]
    root = write_folder(tmp_path / "imgs", [(m, [image, image]) for m in metas])
    summary = G.evaluate_folder(root, detector, outfile=tmp_path / "r.jsonl", threshold=0.0, counting_threshold=0.0)
    assert summary["images"] == 4 and set(summary["tasks"]) == {"colors", "position"}
    records = G.read_results(tmp_path / "r.jsonl")
    assert len(records) == 4 and all(isinstance(r["correct"], bool) for r in records)
    for r in records:
        for name, boxes in json.loads(r["details"]).items():
            assert all(len(b) == 5 for b in boxes)
