"""Output paths checked before any work: a command that would find out only when it writes, after
minutes or hours of generating or training, says what is wrong first. Imports nothing heavy."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any, Callable


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


def atomic_write(path, write: Callable[[Any], None]) -> None:
    """Write ``path`` through ``write(binary_file)`` under a hidden temporary name in the same
    folder, then ``os.replace`` it into place. On any failure (an interrupt included) the temporary
    file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # like tempfile.mkstemp, but with the usual 0o666 & ~umask permissions, not 0o600
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(text.encode()))
