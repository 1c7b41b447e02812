"""Frames per second a real browser displays in the app's video tab, with one or several players.

    python benchmarks/browser_fps.py --sessions 1,3 --seconds 10
    python benchmarks/browser_fps.py --sessions 3 --speculate 1,2,3,4
    python benchmarks/browser_fps.py --sessions 1,3 --compile off,on
    python benchmarks/browser_fps.py --sessions 3 --dtype float32,bfloat16
    python benchmarks/browser_fps.py --sessions 3 --guard on,off,on,off

Starts the app (``app.py``) on a free local port, opens ``sessions`` pages in headless Chromium
(Playwright; each page has its own browser context, hence its own world), presses Play and holds
keys the way a person does (each page switches to a random arrow key about twice a second), and
counts the frames each page actually drew during ``seconds`` seconds. Timings on shared machines are
noisy, so this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from visualspec.core.precision import dtype_name  # noqa: E402
from visualspec.tools import app  # noqa: E402
from visualspec.tools.serve import find_chromium, serve  # noqa: E402


def open_video_tab(page, url: str, timeout_ms: int = 60_000) -> None:
    page.goto(url)
    page.get_by_role("tab", name="Video").click(timeout=timeout_ms)
    page.click("#arena-play", timeout=timeout_ms)
    page.wait_for_function("() => window.visualspecArena && window.visualspecArena.framesShown() > 2",
                           timeout=timeout_ms)


def run_browser_benchmark(sessions=(1, 3), seconds: float = 10.0, model=None, world=None, seed: int = 0,
                          threads: int = 1, speculate: int = 3, compiled: bool = False, dtype: str = "auto",
                          guard: bool = True) -> dict:
    import random

    import torch
    from playwright.sync_api import sync_playwright

    from visualspec.tools.loading import load_pipeline

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium found (Debian: apt-get install chromium)")
    world_pipe = app.load_world(world, dtype)
    if world_pipe is None:
        raise SystemExit("no world model found (assets/arena-nfd or --world)")
    torch.set_num_threads(threads)  # as `python app.py` does by default
    if compiled:  # as `python app.py` does unless --no-compile
        world_pipe.compile_worlds(speculate)
    application = app.build_app(load_pipeline(model), world_pipe, speculate=speculate, guard=guard)
    rng = random.Random(seed)
    results = {}
    with serve(application) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for n in sessions:
            contexts = [browser.new_context() for _ in range(n)]
            pages = [c.new_page() for c in contexts]
            for page in pages:
                open_video_tab(page, url)
            start = [page.evaluate("() => window.visualspecArena.framesShown()") for page in pages]
            t0 = time.time()
            while time.time() - t0 < seconds:
                for page in pages:
                    page.evaluate(f"() => window.visualspecArena.send('{rng.choice(['up', 'down', 'left', 'right'])}')")
                time.sleep(0.5)
            elapsed = time.time() - t0
            counts = [page.evaluate("() => window.visualspecArena.framesShown()") - s for page, s in zip(pages, start)]
            results[f"{n} session{'s' if n > 1 else ''}"] = {
                "fps_per_session": [round(c / elapsed, 1) for c in counts],
                "mean_fps": round(sum(counts) / elapsed / n, 1),
                # what each page says at the end ("Playing: ...", or "Stopped..." with the server's reason)
                "status_per_session": [page.evaluate("() => document.getElementById('arena-status').textContent")
                                       for page in pages],
            }
            for c in contexts:
                c.close()
            time.sleep(1.0)
        browser.close()
    return {"seconds": seconds, "torch_threads": threads, "speculate": speculate, "compiled": compiled, "guard": guard,
            "dtype": dtype_name(world_pipe.transformer.dtype), "results": results}


def one_process(args, dtype: str, speculate: str, compile: str, guard: str) -> dict:
    """One setting's run, in a new process with the other options as given."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [sys.executable, __file__, "--sessions", args.sessions, "--seconds", str(args.seconds),
                   "--threads", str(args.threads), "--speculate", speculate, "--compile", compile, "--dtype", dtype,
                   "--guard", guard, "--json", str(out)]
        for option in ("model", "world"):
            if getattr(args, option):
                command += [f"--{option}", getattr(args, option)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default="1,3", help="comma-separated numbers of players")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--model", help="image pipeline folder (default: the shipped shapes model)")
    parser.add_argument("--world", help="video pipeline folder (default: assets/arena-nfd)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per frame generation (the app's default)")
    parser.add_argument("--speculate", default="3", help="comma-separated: frames the app speculates ahead (its "
                                                          "default: 3), one run each")
    parser.add_argument("--compile", default="on", help="comma-separated: on (the app's default), off; one run each")
    parser.add_argument("--dtype", default="auto", help="comma-separated: the world's float type (auto, the app's "
                                                       "default; float32; bfloat16); one run each")
    parser.add_argument("--guard", default="on", help="comma-separated: on (the app's default: frames generated "
                                                       "ahead that lost the ball refused), off; one run each")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    settings = [(d, k, c, g) for d in args.dtype.split(",") for k in args.speculate.split(",")
                for c in args.compile.split(",") for g in args.guard.split(",")]
    if len(settings) == 1:
        d, k, c, g = settings[0]
        result = run_browser_benchmark([int(n) for n in args.sessions.split(",")], args.seconds, args.model,
                                       args.world, threads=args.threads, speculate=int(k), compiled=c == "on", dtype=d,
                                       guard=g == "on")
    else:  # each setting in a process of its own: a server's worlds may still step, in its threads, after it
        result = [one_process(args, d, k, c, g) for d, k, c, g in settings]
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
