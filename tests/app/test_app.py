"""The Gradio app's image tab, driven through its functions (no browser needed)."""

import json

import pytest
from PIL import Image

import app  # noqa: E402


@pytest.fixture(scope="module")
def demo_fns(tmp_path_factory):
    from visualspec.pipelines.tiny import tiny_random_pipeline

    pipe = tiny_random_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return app.ImageDemo(pipe)


def test_generate_returns_image_map_and_stats(demo_fns):
    image, amap, stats = demo_fns.generate("a photo of a red circle", "sjd", 4.0, 0)
    assert image.size == (384, 384) and amap.size == (384, 384)  # shown large: 64 x 64 and 16 x 16, pixel for pixel
    small = image.resize((64, 64), Image.NEAREST)
    assert small.resize((384, 384), Image.NEAREST).tobytes() == image.tobytes()
    assert json.loads(stats)["mode"] == "sjd"


def test_compare_runs_ar_and_sjd_side_by_side(demo_fns):
    ar, sjd, rows = demo_fns.compare("a photo of a red circle", 4.0, 0)
    assert rows[0][0] == "ar" and rows[0][1] == 256 and rows[1][0] == "sjd" and rows[1][1] < 256


def test_app_binds_to_localhost_by_default(monkeypatch):
    import uvicorn

    served = {}
    monkeypatch.setattr(app, "build_app", lambda pipe, world, speculate: "the app")
    monkeypatch.setattr(app, "load_pipeline", lambda model: None)
    monkeypatch.setattr(uvicorn, "run", lambda application, **kw: served.update(kw, app=application))
    app.main([])
    assert served["host"] == "127.0.0.1" and served["app"] == "the app"
    app.main(["--host", "0.0.0.0", "--port", "9000"])
    assert served["host"] == "0.0.0.0" and served["port"] == 9000


def test_the_blocks_build(demo_fns):
    demo = app.build_demo(demo_fns.pipe)
    assert demo is not None and "visualspec" in demo.title


@pytest.fixture(scope="module")
def world():
    import torch

    from visualspec.models.frame_autoencoder import FrameAutoencoder
    from visualspec.models.nfd import NextFrameDiT
    from visualspec.pipelines import NextFramePipeline

    torch.manual_seed(0)
    pipe = NextFramePipeline(
        transformer=NextFrameDiT(latent_channels=4, latent_size=8, dim=32, depth=1, num_heads=2).eval(),
        autoencoder=FrameAutoencoder(channels=(8, 8, 8), latent_channels=4).eval())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _receive(ws, frames: int):
    """The next ``frames`` binary frames, and the last statistics message seen meanwhile."""
    got, stats = [], None
    while len(got) < frames:
        message = ws.receive()
        if message.get("bytes") is not None:
            got.append(message["bytes"])
        elif message.get("text") is not None:
            stats = json.loads(message["text"])
    return got, stats


def test_each_websocket_client_gets_its_own_world_and_frees_it(demo_fns, world):
    from starlette.testclient import TestClient

    application = app.build_app(demo_fns.pipe, world, fps=200)
    server = application.state.arena
    with TestClient(application) as client:
        with client.websocket_connect("/arena/ws") as a, client.websocket_connect("/arena/ws") as b:
            a.send_text(json.dumps({"action": "right"}))
            b.send_text(json.dumps({"action": "bogus"}))  # ignored, the world keeps going
            frames_a, stats = _receive(a, 3)
            frames_b, _ = _receive(b, 1)
            assert all(len(f) == 64 * 64 * 4 for f in frames_a + frames_b)
            assert server.active == 2
            while stats is None:
                stats = _receive(a, 1)[1]
            assert stats["frames"] >= 1 and stats["worlds"] == 2
        import time

        for _ in range(100):  # the server notices the disconnects within a frame or two
            if server.active == 0:
                break
            time.sleep(0.05)
        assert server.active == 0
        assert client.get("/").status_code == 200


def test_a_world_folder_that_is_not_a_video_pipeline_is_refused(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "LlamaGenPipeline"}))
    with pytest.raises(ValueError, match="not a NextFramePipeline"):
        app.load_world(tmp_path)


def test_the_image_tab_takes_a_unified_vocabulary_model():
    """A Lumina-layout model: its image, and an acceptance map over its generated rows (the codes
    and the row-end column)."""
    from visualspec.pipelines.tiny import tiny_unified_pipeline

    pipe = tiny_unified_pipeline()
    pipe.set_progress_bar_config(disable=True)
    image, amap, stats = app.ImageDemo(pipe).generate("a photo of a red circle", "sjd", 3.0, 0)
    assert image.size == (384, 384) and amap.size == (5 * 76, 4 * 76)  # 4 rows of 4 codes and a row end
    assert json.loads(stats)["structural_tokens"] == 5
