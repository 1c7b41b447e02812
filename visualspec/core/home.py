"""Where visualspec keeps what it makes on this machine: measured window costs, compile-time
measurements, the tiny random model, training work folders."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """``$VISUALSPEC_HOME``, else ``~/.cache/visualspec``."""
    return Path(os.environ.get("VISUALSPEC_HOME") or Path.home() / ".cache" / "visualspec")
