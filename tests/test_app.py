"""The Gradio app's image tab, driven through its functions (no browser needed)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import app  # noqa: E402


@pytest.fixture(scope="module")
def demo_fns(tmp_path_factory):
    from visualspec.pipelines.tiny import tiny_random_pipeline

    pipe = tiny_random_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return app.ImageDemo(pipe)


def test_generate_returns_image_map_and_stats(demo_fns):
    image, amap, stats = demo_fns.generate("a photo of a red circle", "sjd", 4.0, 0)
    assert image.size == (64, 64) and amap.size == (128, 128)
    assert json.loads(stats)["mode"] == "sjd"


def test_compare_runs_ar_and_sjd_side_by_side(demo_fns):
    ar, sjd, rows = demo_fns.compare("a photo of a red circle", 4.0, 0)
    assert rows[0][0] == "ar" and rows[0][1] == 256 and rows[1][0] == "sjd" and rows[1][1] < 256


def test_app_binds_to_localhost_by_default(monkeypatch):
    launched = {}

    class FakeDemo:
        def launch(self, **kw):
            launched.update(kw)

    monkeypatch.setattr(app, "build_demo", lambda pipe: FakeDemo())
    monkeypatch.setattr(app, "load_pipeline", lambda model: None)
    app.main([])
    assert launched["server_name"] == "127.0.0.1"
    app.main(["--host", "0.0.0.0", "--port", "9000"])
    assert launched == {"server_name": "0.0.0.0", "server_port": 9000}


def test_the_blocks_build(demo_fns):
    demo = app.build_demo(demo_fns.pipe)
    assert demo is not None and "visualspec" in demo.title
