"""Output paths checked before any work: a command that would find out only when it writes, after
minutes or hours of generating or training, says what is wrong first. Imports nothing heavy."""

from __future__ import annotations

import os
from pathlib import Path


def _file_above(path: Path) -> Path | None:
    """The nearest existing folder-or-file above ``path`` if it is a file, else None."""
    for part in path.parents:
        if part.exists():
            return None if part.is_dir() else part
    return None


def check_output_folder(path: str | os.PathLike, what: str = "the output folder") -> Path:
    """``path`` as a folder to write into: missing (it is made) or a folder. A ValueError names
    ``what`` when it is a file, or sits inside one."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a file, not a folder")
    above = None if path.exists() else _file_above(path)
    if above is not None:
        raise ValueError(f"{what} {str(path)!r} is inside {str(above)!r}, which is a file, not a folder")
    return path


def check_output_file(path: str | os.PathLike, what: str = "the output file") -> Path:
    """``path`` as a file to write: missing or a file, in a folder that exists or can be made. A
    ValueError names ``what`` when it is a folder, or sits inside a file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a folder; give a file name")
    above = _file_above(path)
    if above is not None:
        raise ValueError(f"{what} {str(path)!r} is inside {str(above)!r}, which is a file, not a folder")
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` under a hidden temporary name in its folder, then rename it into
    place: a reader never sees half a file, and an interrupted write leaves the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
