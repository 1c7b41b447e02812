"""The visualspec demo app (Gradio): prompt to image with speculative decoding, and a playable world.

    visualspec app                # http://127.0.0.1:7860
    visualspec app --model FOLDER --world FOLDER --host 0.0.0.0 --port 8080
    python app.py                 # the same server, from a clone

- Image tab: the shipped shapes model; decoding mode, guidance and seed; example prompts and the words
  the model knows; the decode statistics, the acceptance map, and AR versus SJD side by side. A
  prompt the model cannot draw (empty, an unknown word) shows the pipeline's message in the page.
- Video tab: the shipped arena world model. Each browser tab that presses Play gets its own world
  over a WebSocket (``/arena/ws``): the server steps the world at up to 30 frames per second under
  the action held (arrow keys or the on-screen buttons) and sends raw RGBA frames; the page draws
  them and shows the frames per second it actually displays and the speculation hit rate. Closing
  the tab (or Stop) ends the connection and frees that world.

The app binds to 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..assets import ARENA_NFD
from ..core.precision import dtype_name
from .loading import load_pipeline, world_model
from .serve import UVICORN_OPTIONS

logger = logging.getLogger(__name__)

WORLD_DIR = ARENA_NFD


SHOWN = 384  # pixels a side: small images are shown this large, pixel for pixel, as the video tab does



def compare_headers(name: str = "SJD") -> list[str]:
    """The AR versus NAME table's headers: one row per measure, one column per mode, and their ratio."""
    return ["measure", "AR", name, f"AR / {name}"]


def compare_note(name: str = "SJD") -> str:
    return (f"{name} is lossless in distribution (its images follow the same law as AR's), but a seed does not "
            f"give the same draw in both modes, so the two pictures differ.")


COMPARE_HEADERS, COMPARE_NOTE = compare_headers(), compare_note()


def shown(image):
    """``image`` enlarged by a whole factor to about ``SHOWN`` pixels a side, each pixel a square
    (nearest neighbour), so a 64 x 64 image is not drawn tiny or blurred."""
    from PIL import Image

    factor = max(1, SHOWN // max(image.size))
    return image.resize((image.width * factor, image.height * factor), Image.NEAREST)


@contextmanager
def errors_in_page():
    """Turn a ValueError (the pipeline's input checks: an empty prompt, an unknown word, ...) into a
    Gradio error: the page shows its message until the user closes it (the user's mistake, so no
    traceback on the server's console)."""
    import gradio as gr

    try:
        yield
    except ValueError as err:
        raise gr.Error(str(err), duration=None, print_exception=False) from None


def example_prompts(pipe, seed: int = 0) -> list[str]:
    """One prompt of each shapes-world task that ``pipe`` accepts (none for a model that reads no
    prompt, or whose words differ)."""
    from ..worlds.shapes import TASKS, prompt_metadata

    check = getattr(pipe, "check_prompt", None)
    if check is None:
        return []
    rng = np.random.default_rng(seed)
    kept = []
    for prompt in (prompt_metadata(task, rng)["prompt"] for task in TASKS):
        try:
            check(prompt)
        except ValueError:
            continue
        kept.append(prompt)
    return kept


def prompt_words(pipe, most: int = 1000) -> list[str]:
    """The words the model's tokenizer knows, sorted (special tokens and word pieces left out); none
    for a model without a tokenizer or with more than ``most`` words, too many to list."""
    tokenizer = getattr(pipe, "tokenizer", None)
    if tokenizer is None:
        return []
    words = sorted(token for token in tokenizer.get_vocab() if token.isalpha())
    return words if len(words) <= most else []


def seed_value(seed) -> int:
    """The seed box's value as an int (a ValueError for an empty box)."""
    if seed is None:
        raise ValueError("give a seed (a whole number)")
    return int(seed)


def comparison_rows(ar, sjd) -> list[list]:
    """The AR versus SJD table (``COMPARE_HEADERS``) from the two runs' decode statistics: target
    forwards, accepted tokens per step and seconds, each with its AR / SJD ratio."""
    rows = []
    for name, value, digits in (("target forwards", lambda s: s.target_forwards, None),
                                ("accepted tokens per step", lambda s: s.mean_accepted, 2),
                                ("seconds", lambda s: s.wall_time_s, 3)):
        a, b = value(ar), value(sjd)
        rows.append([name, round(a, digits), round(b, digits), round(a / b, 2) if b else None])
    return rows


class ImageDemo:
    """The functions behind the image tab (plain Python, so they can be tested without a browser).
    Bad input raises a Gradio error carrying the pipeline's message."""

    def __init__(self, pipe):
        self.pipe = pipe
        # what the side-by-side compares with AR: the folder's lossless speculative decoding
        # (SJD for LlamaGen, ASSD for an any-order model)
        self.speculative = "assd" if "assd" in pipe.available_decodings() else "sjd"

    def acceptance_map(self, stats):
        """Which forward fixed each token of the first image (None for a pipeline that does not draw
        its tokens in raster order)."""
        return None if self.pipe.acceptance_grid() is None else self.pipe.acceptance_map(stats, scale=1)

    def check(self, prompt) -> None:
        """The pipeline's own prompt check where it has one (cheap: nothing is generated)."""
        check = getattr(self.pipe, "check_prompt", None)
        if check is not None:
            check(prompt)

    def generate(self, prompt: str, decoding: str, guidance_scale: float, seed: int):
        with errors_in_page():
            self.check(prompt)
            out = self.pipe(prompt, decoding=decoding, guidance_scale=guidance_scale, seed=seed_value(seed))
        stats = out.stats
        amap = self.acceptance_map(stats)
        return shown(out.images[0]), amap and shown(amap), json.dumps(stats.to_dict(), indent=1)

    def compare(self, prompt: str, guidance_scale: float, seed: int):
        """AR and :attr:`speculative` (SJD, or ASSD) on the same prompt and seed, one after the other: the
        two images and the table."""
        with errors_in_page():
            self.check(prompt)
            ar, sjd = [self.pipe(prompt, decoding=mode, guidance_scale=guidance_scale, seed=seed_value(seed))
                       for mode in ("ar", self.speculative)]
        return shown(ar.images[0]), shown(sjd.images[0]), comparison_rows(ar.stats, sjd.stats)


class ArenaServer:
    """Worlds for WebSocket clients: one :meth:`NextFramePipeline.interactive` session each.

    Protocol: the client sends JSON text messages ``{"action": "left"}`` (the action now held;
    ``"none"`` when released). The server sends each frame as binary RGBA bytes (64 * 64 * 4) and,
    twice a second, a JSON text message with the session's statistics. Messages that are not an
    action are ignored. If the world fails to step, the server logs why and closes the connection
    with code 1011 and :data:`WORLD_FAILED` as its reason, which the page shows.
    """

    def __init__(self, pipe, fps: float = 30.0, speculate: int = 3, workers: int | None = None, guard: bool = True):
        from visualspec.worlds import arena

        self.pipe, self.fps, self.speculate, self.guard = pipe, fps, speculate, guard
        self.actions = set(arena.ACTIONS)
        self.executor = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
        self.active = 0  # open worlds

    async def play(self, websocket: WebSocket) -> None:
        await websocket.accept()
        loop = asyncio.get_running_loop()
        session = self.pipe.interactive(seed=int.from_bytes(os.urandom(4), "little"), speculate=self.speculate,
                                        guard=self.guard)
        held = {"action": "none"}
        self.active += 1

        async def receive():
            while True:
                try:
                    message = json.loads(await websocket.receive_text())
                except (json.JSONDecodeError, KeyError):  # not JSON, or a binary message (no text)
                    continue  # ignored, as an unknown action is: the world keeps going
                if isinstance(message, dict) and message.get("action") in self.actions:
                    held["action"] = message["action"]

        receiver = asyncio.create_task(receive())
        try:
            await websocket.send_bytes(_rgba(session.last_frame))
            next_tick, last_report = time.perf_counter(), 0.0
            while not receiver.done():
                try:
                    frame = await loop.run_in_executor(self.executor, session.step, held["action"])
                except Exception:  # the player is told and the server logs why, not a silent freeze
                    logger.exception("a player's world failed to step; its connection is closed")
                    await websocket.close(code=1011, reason=WORLD_FAILED)
                    break
                await websocket.send_bytes(_rgba(frame))
                now = time.perf_counter()
                if now - last_report > 0.5:
                    stats = session.stats
                    await websocket.send_text(json.dumps({
                        "frames": stats.frames, "hit_rate": None if np.isnan(stats.hit_rate) else stats.hit_rate,
                        "generation_fps": stats.fps, "worlds": self.active}))
                    last_report = now
                # a frame that took long (a speculative batch) is made up for by showing the next ones
                # sooner, up to a batch behind, rather than dropped
                next_tick = max(next_tick + 1 / self.fps, now - self.speculate / self.fps)
                await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            receiver.cancel()
            self.active -= 1
            del session  # the world (its cache and buffers) goes with the connection


WORLD_FAILED = "the world model failed (the server's log says why)"  # the close reason a page shows


def _rgba(frame: np.ndarray) -> bytes:
    alpha = np.full(frame.shape[:2] + (1,), 255, dtype=np.uint8)
    return np.concatenate([frame, alpha], axis=-1).tobytes()


ARENA_HTML = """
<div id="arena" style="display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap">
  <canvas id="arena-canvas" width="64" height="64" tabindex="0"
          style="width:384px;height:384px;image-rendering:pixelated;background:#101018;outline:none"></canvas>
  <div style="display:flex;flex-direction:column;gap:8px;min-width:220px">
    <div><button id="arena-play" class="lg primary">Play</button> <button id="arena-stop" class="lg">Stop</button></div>
    <div style="display:grid;grid-template-columns:repeat(3,56px);gap:4px">
      <span></span><button class="arena-key" data-action="up">&#9650;</button><span></span>
      <button class="arena-key" data-action="left">&#9664;</button><span></span>
      <button class="arena-key" data-action="right">&#9654;</button>
      <span></span><button class="arena-key" data-action="down">&#9660;</button><span></span>
    </div>
    <div>Displayed FPS: <b id="arena-fps">-</b></div>
    <div>Speculation hit rate: <b id="arena-hit">-</b></div>
    <div>Frames: <b id="arena-frames">0</b> &middot; worlds open: <b id="arena-worlds">-</b></div>
    <div id="arena-status" style="opacity:0.7">Press Play, then hold the arrow keys.</div>
  </div>
</div>
"""

ARENA_JS = """
<script>
(() => {
  const KEYS = {ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right"};
  let ws = null, held = "none", shown = [], total = 0;
  const $ = (id) => document.getElementById(id);
  function send(action) {
    held = action;
    if (ws && ws.readyState === 1) ws.send(JSON.stringify({action}));
  }
  function draw(buffer) {
    const ctx = $("arena-canvas").getContext("2d");
    ctx.putImageData(new ImageData(new Uint8ClampedArray(buffer), 64, 64), 0, 0);
    const now = performance.now();
    shown.push(now); total += 1;
    while (shown.length && now - shown[0] > 1000) shown.shift();
  }
  function play() {
    if (ws) return;
    ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/arena/ws");
    ws.binaryType = "arraybuffer";
    ws.onopen = () => { $("arena-status").textContent = "Playing: hold the arrow keys."; send(held); };
    ws.onmessage = (e) => {
      if (typeof e.data === "string") {
        const s = JSON.parse(e.data);
        $("arena-hit").textContent = s.hit_rate === null ? "-" : (100 * s.hit_rate).toFixed(0) + "%";
        $("arena-worlds").textContent = s.worlds;
      } else draw(e.data);
    };
    ws.onclose = (e) => { ws = null; $("arena-status").textContent = e.reason ? "Stopped: " + e.reason : "Stopped."; };
    $("arena-canvas").focus();
  }
  function stop() { if (ws) ws.close(); }
  // the counters change four times a second, not with every frame: a text change makes the page lay out again
  setInterval(() => {
    if (!ws) return;
    const fps = $("arena-fps"), frames = $("arena-frames");
    if (fps) fps.textContent = shown.length;
    if (frames) frames.textContent = total;
  }, 250);
  document.addEventListener("keydown", (e) => {
    if (!ws || !(e.key in KEYS)) return;
    e.preventDefault(); if (held !== KEYS[e.key]) send(KEYS[e.key]);
  });
  document.addEventListener("keyup", (e) => {
    if (ws && e.key in KEYS && held === KEYS[e.key]) { e.preventDefault(); send("none"); }
  });
  document.addEventListener("click", (e) => {
    if (e.target.id === "arena-play") play();
    if (e.target.id === "arena-stop") stop();
  });
  for (const type of ["pointerdown", "pointerup", "pointerleave"]) {
    document.addEventListener(type, (e) => {
      const key = e.target.closest && e.target.closest(".arena-key");
      if (key) send(type === "pointerdown" ? key.dataset.action : "none");
    }, true);
  }
  window.visualspecArena = {play, stop, send, displayedFps: () => shown.length, framesShown: () => total};
})();
</script>
"""


def build_demo(pipe, world=None):
    import gradio as gr

    demo_fns = ImageDemo(pipe)
    fast = demo_fns.speculative.upper()
    guidance = float(pipe.config.default_guidance_scale)
    examples, words = example_prompts(pipe), prompt_words(pipe)
    with gr.Blocks(title="visualspec") as demo:
        gr.Markdown("# visualspec\nAutoregressive image and video generation with speculative decoding.")
        with gr.Tab("Image"):
            with gr.Row():
                with gr.Column():
                    prompt = gr.Textbox(label="Prompt", value="a photo of a red circle", elem_id="prompt")
                    if examples:
                        gr.Examples([[text] for text in examples], [prompt], label="Example prompts")
                    if words:
                        with gr.Accordion("Words the model knows", open=False, elem_id="vocabulary"):
                            gr.Markdown("Prompts may use only these words: " + ", ".join(words) + ".")
                    modes = pipe.available_decodings()
                    decoding = gr.Radio(list(modes), value=pipe.default_decoding(), label="Decoding")
                    scale = gr.Slider(0, 10, value=guidance, step=0.5, label="Guidance scale")
                    seed = gr.Number(value=0, precision=0, label="Seed")
                    run = gr.Button("Generate", variant="primary", elem_id="generate")
                    compare = gr.Button(f"AR vs {fast}", elem_id="compare")
                with gr.Column():
                    image = gr.Image(label="Image", type="pil", elem_id="image")
                    amap = gr.Image(label="Acceptance map (dark: fixed early; red: kept by the judge)", type="pil")
                    stats = gr.Code(label="Decode statistics", language="json", elem_id="stats")
            with gr.Row():
                ar_image = gr.Image(label="AR", type="pil", elem_id="ar-image")
                sjd_image = gr.Image(label=fast, type="pil", elem_id="sjd-image")
            gr.Markdown(compare_note(fast), elem_id="compare-note")
            table = gr.Dataframe(headers=compare_headers(fast), label="Side by side", interactive=False,
                                 elem_id="compare-table")
            run.click(demo_fns.generate, [prompt, decoding, scale, seed], [image, amap, stats])
            compare.click(demo_fns.compare, [prompt, scale, seed], [ar_image, sjd_image, table])
        with gr.Tab("Video", elem_id="video-tab"):
            if world is None:
                gr.Markdown("No world model found (expected one in assets/arena-nfd; pass --world FOLDER).")
            else:
                gr.Markdown("Play the arena world: the model draws every frame. Hold the arrow keys (or the "
                            "buttons). While a key stays held the model speculates the next frames ahead.")
                gr.HTML(ARENA_HTML)
    return demo


def build_app(pipe, world=None, fps: float = 30.0, speculate: int = 3, guard: bool = True):
    """The FastAPI app: Gradio at ``/`` plus the world's WebSocket at ``/arena/ws`` (``speculate``,
    ``guard``: its worlds', :meth:`~visualspec.pipelines.NextFramePipeline.interactive`)."""
    import gradio as gr
    from fastapi import FastAPI

    app = FastAPI()
    if world is not None:
        server = ArenaServer(world, fps=fps, speculate=speculate, guard=guard)
        app.add_api_websocket_route("/arena/ws", server.play)
        app.state.arena = server
    return gr.mount_gradio_app(app, build_demo(pipe, world), path="/", head=ARENA_JS)


def load_world(folder, dtype: str = "float32"):
    """The video pipeline in ``folder`` (default: the shipped world) as the commands load it, in
    ``dtype`` (:func:`~visualspec.tools.loading.world_model`), or None where there is no pipeline
    folder."""
    folder = Path(folder) if folder else WORLD_DIR
    return world_model(str(folder), dtype) if (folder / "model_index.json").is_file() else None


def app_from_options(args):
    """The app the options of :func:`visualspec.tools.commands.app.add_options` ask for, after
    setting torch's threads; a ValueError names a ``--world`` that is not a pipeline folder."""
    import torch

    torch.set_num_threads(args.threads)
    world = load_world(args.world, args.dtype)
    if args.world and world is None:
        raise ValueError(f"{args.world} is not a pipeline folder (no model_index.json)")
    if world is not None:
        print(f"the world model runs in {dtype_name(world.transformer.dtype)} (--dtype {args.dtype})", file=sys.stderr)
    if world is not None and getattr(args, "compile", False):
        try:  # each world's frames 1.2-1.4x faster (docs/benchmarks.md)
            world.compile_worlds(args.speculate)
        except RuntimeError as e:  # no C++ compiler, an unsupported device: play eagerly, and say so
            world.compile_worlds(args.speculate, enabled=False)
            print(f"warning: the world plays eagerly: {e}", file=sys.stderr)
    return build_app(load_pipeline(args.model), world, speculate=args.speculate, guard=args.guard)


def serve_forever(application, host: str, port: int) -> None:
    """Serve ``application`` on ``host:port`` until interrupted."""
    import uvicorn

    print(f"visualspec app on http://{host}:{port}")
    uvicorn.run(application, host=host, port=port, log_level="warning", **UVICORN_OPTIONS)


def main(argv=None):
    """``python app.py``: the options and the server of ``visualspec app``."""
    from .commands.app import add_options

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(parser)
    args = parser.parse_args(argv)
    try:
        application = app_from_options(args)
    except ValueError as err:
        parser.error(str(err))
    serve_forever(application, args.host, args.port)
