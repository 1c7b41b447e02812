"""``visualspec app``: the demo app (``visualspec/tools/app.py``) served on a local port."""

from __future__ import annotations

from .options import add_dtype_option, count_arg


def register(sub, common) -> None:
    # not ``parents=[common]``: the app's --threads means threads per frame generation, default 1
    a = sub.add_parser("app", help="serve the demo app: images with speculative decoding and a playable world "
                                   "(http://127.0.0.1:7860)")
    add_options(a)
    a.set_defaults(func=run)


def add_options(p) -> None:
    """The app's options, shared with ``python app.py``."""
    p.add_argument("--model", help="image pipeline folder (default: the shipped shapes model)")
    p.add_argument("--world", help="video pipeline folder (default: assets/arena-nfd)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, local only)")
    p.add_argument("--port", type=int, default=7860)
    # 3: the browser rule's choice once speculation was guarded (docs/experiments/2026-11-29-arena-speculation-guard.md)
    p.add_argument("--speculate", type=count_arg, default=3, help="frames generated ahead while a key is held")
    p.add_argument("--no-guard", dest="guard", action="store_false",
                   help="show frames generated ahead even where they lost the ball (by default such a frame is "
                        "refused and generated again: docs/experiments/2026-11-29-arena-speculation-guard.md)")
    p.add_argument("--threads", type=count_arg, default=1,
                   help="torch threads per frame generation (default 1: each player's world gets a core, "
                        "and the rest stay free for more players and for the browser)")
    add_dtype_option(p, default="auto")  # 30 FPS for three players (docs/experiments/2026-11-29-world-in-bfloat16.md)
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="keep the world's step eager (by default it is compiled at start-up, announced: about "
                        "a minute the first time on a 2-core CPU, seconds once torch's disk cache holds it)")


def run(args) -> int:
    """Build the app the options ask for and serve it until interrupted."""
    from ..app import app_from_options, serve_forever

    serve_forever(app_from_options(args), args.host, args.port)
    return 0
