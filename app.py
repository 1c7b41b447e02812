"""visualspec demo app (Gradio): prompt to image with speculative decoding, and a playable world.

    python app.py                 # http://127.0.0.1:7860
    python app.py --model FOLDER --world FOLDER --host 0.0.0.0 --port 8080

- Image tab: the shipped shapes model; decoding mode, guidance and seed; the decode statistics, the
  acceptance map, and AR versus SJD side by side.
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
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from visualspec.assets import ARENA_NFD
from visualspec.tools.loading import load_pipeline

WORLD_DIR = ARENA_NFD


SHOWN = 384  # pixels a side: small images are shown this large, pixel for pixel, as the video tab does


def shown(image):
    """``image`` enlarged by a whole factor to about ``SHOWN`` pixels a side, each pixel a square
    (nearest neighbour), so a 64 x 64 image is not drawn tiny or blurred."""
    from PIL import Image

    factor = max(1, SHOWN // max(image.size))
    return image.resize((image.width * factor, image.height * factor), Image.NEAREST)


class ImageDemo:
    """The functions behind the image tab (plain Python, so they can be tested without a browser)."""

    def __init__(self, pipe):
        self.pipe = pipe

    def acceptance_map(self, stats):
        """Which forward fixed each token of the first image (None for a pipeline that does not draw
        its tokens in raster order)."""
        return None if self.pipe.acceptance_grid() is None else self.pipe.acceptance_map(stats, scale=1)

    def generate(self, prompt: str, decoding: str, guidance_scale: float, seed: int):
        out = self.pipe(prompt, decoding=decoding, guidance_scale=guidance_scale, seed=int(seed))
        stats = out.stats
        amap = self.acceptance_map(stats)
        return shown(out.images[0]), amap and shown(amap), json.dumps(stats.to_dict(), indent=1)

    def compare(self, prompt: str, guidance_scale: float, seed: int):
        """AR and SJD on the same prompt and seed, one after the other."""
        rows = []
        images = []
        for mode in ("ar", "sjd"):
            out = self.pipe(prompt, decoding=mode, guidance_scale=guidance_scale, seed=int(seed))
            images.append(shown(out.images[0]))
            rows.append([mode, out.stats.target_forwards, round(out.stats.mean_accepted, 2),
                         round(out.stats.wall_time_s, 3)])
        rows.append(["AR / SJD", round(rows[0][1] / rows[1][1], 2), "", round(rows[0][3] / rows[1][3], 2)])
        return images[0], images[1], rows


class ArenaServer:
    """Worlds for WebSocket clients: one :meth:`NextFramePipeline.interactive` session each.

    Protocol: the client sends JSON text messages ``{"action": "left"}`` (the action now held;
    ``"none"`` when released). The server sends each frame as binary RGBA bytes (64 * 64 * 4) and,
    twice a second, a JSON text message with the session's statistics.
    """

    def __init__(self, pipe, fps: float = 30.0, speculate: int = 4, workers: int | None = None):
        from visualspec.worlds import arena

        self.pipe, self.fps, self.speculate = pipe, fps, speculate
        self.actions = set(arena.ACTIONS)
        self.executor = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
        self.active = 0  # open worlds

    async def play(self, websocket: WebSocket) -> None:
        await websocket.accept()
        loop = asyncio.get_running_loop()
        session = self.pipe.interactive(seed=int.from_bytes(os.urandom(4), "little"), speculate=self.speculate)
        held = {"action": "none"}
        self.active += 1

        async def receive():
            while True:
                message = json.loads(await websocket.receive_text())
                if message.get("action") in self.actions:
                    held["action"] = message["action"]

        receiver = asyncio.create_task(receive())
        try:
            await websocket.send_bytes(_rgba(session.last_frame))
            next_tick, last_report = time.perf_counter(), 0.0
            while not receiver.done():
                frame = await loop.run_in_executor(self.executor, session.step, held["action"])
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
    $("arena-frames").textContent = total;
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
    ws.onclose = () => { ws = null; $("arena-status").textContent = "Stopped."; };
    $("arena-canvas").focus();
  }
  function stop() { if (ws) ws.close(); }
  setInterval(() => { const el = $("arena-fps"); if (el && ws) el.textContent = shown.length; }, 250);
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
    guidance = float(pipe.config.default_guidance_scale)
    with gr.Blocks(title="visualspec") as demo:
        gr.Markdown("# visualspec\nAutoregressive image and video generation with speculative decoding.")
        with gr.Tab("Image"):
            with gr.Row():
                with gr.Column():
                    prompt = gr.Textbox(label="Prompt", value="a photo of a red circle", elem_id="prompt")
                    modes = pipe.available_decodings()
                    decoding = gr.Radio(list(modes), value=pipe.default_decoding(), label="Decoding")
                    scale = gr.Slider(0, 10, value=guidance, step=0.5, label="Guidance scale")
                    seed = gr.Number(value=0, precision=0, label="Seed")
                    run = gr.Button("Generate", variant="primary", elem_id="generate")
                    compare = gr.Button("AR vs SJD")
                with gr.Column():
                    image = gr.Image(label="Image", type="pil", elem_id="image")
                    amap = gr.Image(label="Acceptance map (dark: fixed early)", type="pil")
                    stats = gr.Code(label="Decode statistics", language="json", elem_id="stats")
            with gr.Row():
                ar_image = gr.Image(label="AR", type="pil")
                sjd_image = gr.Image(label="SJD", type="pil")
            table = gr.Dataframe(headers=["mode", "target forwards", "accepted/step", "seconds"], label="Side by side")
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


def build_app(pipe, world=None, fps: float = 30.0, speculate: int = 4):
    """The FastAPI app: Gradio at ``/`` plus the world's WebSocket at ``/arena/ws``."""
    import gradio as gr
    from fastapi import FastAPI

    app = FastAPI()
    if world is not None:
        server = ArenaServer(world, fps=fps, speculate=speculate)
        app.add_api_websocket_route("/arena/ws", server.play)
        app.state.arena = server
    return gr.mount_gradio_app(app, build_demo(pipe, world), path="/", head=ARENA_JS)


def load_world(folder):
    from visualspec.pipelines import NextFramePipeline

    folder = Path(folder) if folder else WORLD_DIR
    if not (folder / "model_index.json").is_file():
        return None
    world = NextFramePipeline.from_pretrained(folder)
    world.set_progress_bar_config(disable=True)
    return world


def main(argv=None):
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="image pipeline folder (default: the shipped shapes model)")
    parser.add_argument("--world", help="video pipeline folder (default: assets/arena-nfd)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, local only)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--speculate", type=int, default=4, help="frames generated ahead while a key is held")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per frame generation (default 1: each player's world gets a core, "
                             "and the rest stay free for more players and for the browser)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)
    if args.world and load_world(args.world) is None:
        parser.error(f"{args.world} is not a pipeline folder (no model_index.json)")
    app = build_app(load_pipeline(args.model), load_world(args.world), speculate=args.speculate)
    print(f"visualspec app on http://{args.host}:{args.port}")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
