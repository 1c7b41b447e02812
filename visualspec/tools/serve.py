"""Run the app without a browser window: an ASGI app served from a background thread, and the
Chromium a headless browser test or benchmark drives (tests/app, benchmarks/browser_fps.py)."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from contextlib import contextmanager

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")

#: uvicorn's options for the app, wherever it is served. No per-message deflate on the video tab's
#: WebSocket: compressing every 16 KB frame took the server's event loop about a twelfth of a core
#: with three players on the 2-core CPU, and each page then inflated it; uncompressed, a player's
#: frames are 0.5 MB/s (docs/experiments/2026-11-29-world-in-bfloat16.md).
UVICORN_OPTIONS = {"ws_per_message_deflate": False}


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(application, port: int | None = None):
    """Run an ASGI app with uvicorn in a background thread; yields its URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning",
                                           **UVICORN_OPTIONS))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the app server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
