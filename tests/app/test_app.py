"""The Gradio app's image tab, driven through its functions (no browser needed), and how it starts:
``visualspec app`` and ``python app.py``."""

import argparse
import json
import re
import subprocess
import sys
import urllib.request

import gradio as gr
import pytest
import torch
from PIL import Image

from conftest import ROOT
from visualspec.tools import app


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


class Recording:
    """A pipeline that keeps the decode statistics of each call, by decoding mode."""

    def __init__(self, pipe):
        self.pipe, self.stats = pipe, {}

    def __call__(self, prompt, **kw):
        out = self.pipe(prompt, **kw)
        self.stats[kw["decoding"]] = out.stats
        return out

    def __getattr__(self, name):
        return getattr(self.pipe, name)


def test_compare_puts_each_value_under_its_heading(demo_fns):
    """Each row of the AR versus SJD table is read by heading against the two runs' statistics."""
    recording = Recording(demo_fns.pipe)
    ar_image, sjd_image, rows = app.ImageDemo(recording).compare("a photo of a red circle", 4.0, 0)
    assert ar_image.size == sjd_image.size == (384, 384)
    ar, sjd = recording.stats["ar"], recording.stats["sjd"]
    assert ar.mode == "ar" and sjd.mode == "sjd"
    table = {row[0]: dict(zip(app.COMPARE_HEADERS[1:], row[1:])) for row in rows}
    assert len(rows[0]) == len(app.COMPARE_HEADERS)
    assert table["target forwards"] == {"AR": ar.target_forwards, "SJD": sjd.target_forwards,
                                        "AR / SJD": round(ar.target_forwards / sjd.target_forwards, 2)}
    assert table["target forwards"]["AR"] == 256 and table["target forwards"]["SJD"] < 256
    assert table["accepted tokens per step"] == {"AR": round(ar.mean_accepted, 2), "SJD": round(sjd.mean_accepted, 2),
                                                 "AR / SJD": round(ar.mean_accepted / sjd.mean_accepted, 2)}
    assert table["accepted tokens per step"]["AR"] == 1 and table["accepted tokens per step"]["SJD"] > 1
    assert table["seconds"] == {"AR": round(ar.wall_time_s, 3), "SJD": round(sjd.wall_time_s, 3),
                                "AR / SJD": round(ar.wall_time_s / sjd.wall_time_s, 2)}


def test_the_compare_note_says_why_the_images_differ(demo_fns):
    """Next to the two images: SJD keeps AR's distribution, but a seed is not the same draw in both."""
    components = app.build_demo(demo_fns.pipe).config["components"]
    values = [c["props"].get("value") for c in components]
    labels = [c["props"].get("label") for c in components]
    note = labels.index("SJD") + 1
    assert values[note] == app.COMPARE_NOTE and "lossless" in values[note] and "seed" in values[note]
    assert labels[note + 1] == "Side by side"


@pytest.mark.parametrize("prompt, message", [("", "the prompt is empty"), ("   ", "the prompt is empty"),
                                             ("a photo of a zebra", "does not know: ['zebra']")])
def test_bad_input_raises_the_pipelines_message_for_the_page(demo_fns, prompt, message):
    with pytest.raises(gr.Error, match=re.escape(message)):
        demo_fns.generate(prompt, "sjd", 4.0, 0)
    with pytest.raises(gr.Error, match=re.escape(message)):
        demo_fns.compare(prompt, 4.0, 0)


def test_a_bad_decoding_or_an_empty_seed_is_a_message_too(demo_fns):
    with pytest.raises(gr.Error, match="unknown decoding mode 'fast'"):
        demo_fns.generate("a photo of a red circle", "fast", 4.0, 0)
    with pytest.raises(gr.Error, match="give a seed"):
        demo_fns.generate("a photo of a red circle", "sjd", 4.0, None)


def test_examples_and_vocabulary_come_from_the_model(demo_fns):
    """The example prompts are shapes-world prompts the model accepts, in the words the page lists;
    a model whose words they are not gets none."""
    pipe = demo_fns.pipe
    examples, words = app.example_prompts(pipe), app.prompt_words(pipe)
    assert len(examples) == 6 and len(set(examples)) == 6  # one of each task
    for prompt in examples:
        pipe.check_prompt(prompt)
        assert set(prompt.split()) <= set(words)
    assert {"circle", "red", "left", "photo"} <= set(words) and not any("<" in w for w in words)
    assert "zebra" not in words

    class NoCircles:
        tokenizer = pipe.tokenizer

        def check_prompt(self, prompt):
            if "circle" in prompt:
                raise ValueError("no circles")

    kept = app.example_prompts(NoCircles())
    assert kept == [p for p in examples if "circle" not in p] and len(kept) < len(examples)
    components = app.build_demo(pipe).config["components"]
    dataset = next(c for c in components if c["type"] == "dataset")
    assert [row[0] for row in dataset["props"]["samples"]] == examples
    accordion = next(c for c in components if c["type"] == "accordion")
    assert accordion["props"]["open"] is False
    listed = components[components.index(accordion) + 1]["props"]["value"]
    assert all(word in listed for word in words)


@pytest.fixture
def torch_threads():
    """The app sets torch's threads (1 by default): put them back afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_app_binds_to_localhost_by_default(monkeypatch, torch_threads):
    import uvicorn

    served = {}
    monkeypatch.setattr(app, "build_app", lambda pipe, world, speculate, guard: served.update(guard=guard) or "the app")
    monkeypatch.setattr(app, "load_pipeline", lambda model: None)
    monkeypatch.setattr(app, "load_world", lambda folder, dtype: None)
    monkeypatch.setattr(uvicorn, "run", lambda application, **kw: served.update(kw, app=application))
    app.main([])
    assert served["host"] == "127.0.0.1" and served["app"] == "the app" and served["guard"] is True
    assert served["ws_per_message_deflate"] is False  # frames go uncompressed (UVICORN_OPTIONS)
    app.main(["--host", "0.0.0.0", "--port", "9000"])
    assert served["host"] == "0.0.0.0" and served["port"] == 9000
    app.main(["--no-guard"])  # the worlds' speculation unguarded, as NFD's
    assert served["guard"] is False


def test_visualspec_app_has_the_options_of_python_app_py(capsys, torch_threads):
    from visualspec.tools.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["app", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: visualspec app")
    launcher = subprocess.run([sys.executable, "app.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    for option in ("--model", "--world", "--host", "--port", "--speculate", "--threads"):
        assert option in text and option in launcher
    assert "default 127.0.0.1" in text and "default 127.0.0.1" in launcher
    assert main(["app", "--world", str(ROOT / "tests")]) == 2  # not a pipeline folder: refused before serving
    assert "is not a pipeline folder" in capsys.readouterr().err


def test_visualspec_app_builds_and_serves_the_app(monkeypatch, torch_threads):
    """``visualspec app --port P`` builds the app and serves it on P: the page loads there."""
    import uvicorn

    from visualspec.tools.cli import main
    from visualspec.tools.serve import free_port, serve

    pages = {}

    def run(application, host, port, **kw):  # serve it for one request instead of forever
        with serve(application, port=port) as url:
            with urllib.request.urlopen(url + "/", timeout=60) as response:
                pages[(host, port)] = response.status, response.read().decode()
            with urllib.request.urlopen(url + "/config", timeout=60) as response:
                pages["config"] = json.loads(response.read())

    monkeypatch.setattr(uvicorn, "run", run)
    port = free_port()
    assert main(["app", "--port", str(port), "--no-compile"]) == 0  # compile_worlds: tests/video/test_nfd.py
    status, html = pages[("127.0.0.1", port)]
    assert status == 200 and "window.visualspecArena" in html  # the page and the arena's script
    values = [str(c["props"].get("value")) for c in pages["config"]["components"]]
    assert "Generate" in values and app.COMPARE_NOTE in values  # the image tab
    assert any('<canvas id="arena-canvas"' in v for v in values)  # the video tab, with the shipped world


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


def test_an_app_whose_world_cannot_compile_plays_eagerly_and_says_so(monkeypatch, capsys, torch_threads):
    """A machine where torch cannot compile (no C++ compiler) still serves the world, eagerly."""
    from visualspec.tools.commands.app import add_options

    calls = []

    class World:
        transformer = argparse.Namespace(dtype=torch.bfloat16)  # what the app reports of a loaded world

        def compile_worlds(self, speculate, enabled=True):
            calls.append((speculate, enabled))
            if enabled:
                raise RuntimeError("the NextFrameDiT step: torch could not compile the step on this machine "
                                   "(OSError: no C++ compiler found); use compile=False")

    dtypes = []
    monkeypatch.setattr(app, "load_world", lambda folder, dtype: dtypes.append(dtype) or World())
    monkeypatch.setattr(app, "load_pipeline", lambda model: None)
    monkeypatch.setattr(app, "build_app", lambda pipe, world, speculate, guard: world)
    parser = argparse.ArgumentParser()
    add_options(parser)
    assert isinstance(app.app_from_options(parser.parse_args(["--speculate", "2"])), World)
    assert calls == [(2, True), (2, False)]
    err = capsys.readouterr().err
    assert "warning: the world plays eagerly" in err and "no C++ compiler found" in err
    assert dtypes == ["auto"] and "the world model runs in bfloat16 (--dtype auto)" in err  # the app's default


class _BrokenWorld:
    """A world whose first step fails (after its first frame was shown)."""

    def interactive(self, **kwargs):
        import numpy as np

        class Session:
            last_frame = np.zeros((64, 64, 3), dtype=np.uint8)

            def step(self, action):
                raise RuntimeError("boom")
        return Session()


def _within(seconds: float, talk) -> dict:
    """``talk(out)`` in a thread that must end within ``seconds`` (a server that neither answers nor
    closes would otherwise hang the suite); what it put in ``out``."""
    import threading

    out = {}
    thread = threading.Thread(target=talk, args=(out,), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the connection neither answered nor closed within {seconds} s"
    return out


def test_a_world_that_fails_closes_its_connection_with_the_reason_and_logs_it(caplog):
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    server = app.ArenaServer(_BrokenWorld())
    application = FastAPI()
    application.add_api_websocket_route("/arena/ws", server.play)

    def talk(out):
        with TestClient(application) as client, client.websocket_connect("/arena/ws") as ws:
            out["first"] = ws.receive_bytes()
            try:
                ws.receive_bytes()
            except WebSocketDisconnect as closed:
                out["code"], out["reason"] = closed.code, closed.reason
    out = _within(30, talk)
    assert len(out["first"]) == 64 * 64 * 4  # the first frame, then the close
    assert out["code"] == 1011 and out["reason"] == app.WORLD_FAILED
    assert "failed to step" in caplog.text and "boom" in caplog.text
    assert server.active == 0


def test_messages_that_are_not_actions_leave_the_world_running(world):
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    server = app.ArenaServer(world, fps=200)
    application = FastAPI()
    application.add_api_websocket_route("/arena/ws", server.play)

    def talk(out):
        with TestClient(application) as client, client.websocket_connect("/arena/ws") as ws:
            for bad in (b"\x00", "not json", "[1, 2]", json.dumps({"action": 3})):
                ws.send_bytes(bad) if isinstance(bad, bytes) else ws.send_text(bad)
            ws.send_text(json.dumps({"action": "left"}))
            out["frames"] = _receive(ws, 12)[0]
    assert len(_within(60, talk)["frames"]) == 12
