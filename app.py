"""The visualspec demo app from a clone: the same server as ``visualspec app``
(``visualspec/tools/app.py``), with the same options.

    python app.py                 # http://127.0.0.1:7860
    python app.py --model FOLDER --world FOLDER --host 0.0.0.0 --port 8080
"""

from visualspec.tools.app import ArenaServer, ImageDemo, build_app, build_demo, load_world, main

__all__ = ["ArenaServer", "ImageDemo", "build_app", "build_demo", "load_world", "main"]

if __name__ == "__main__":
    main()
