"""The one atomic-write helper: a file is either complete or absent.

A file is written to a temporary name in the same folder (``.NAME.tmp-PID``), flushed to disk,
then moved over the final name with :func:`os.replace`, which is atomic on POSIX and Windows.
A crash or Ctrl-C at any moment leaves the previous complete file or the new one, plus at
worst a leftover temporary file, which readers never look at. Torch-free: checkpoints pass a
writer (``lambda f: torch.save(obj, f)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "atomic_write_text", "temporary_name"]


def temporary_name(path: Path) -> Path:
    """Where :func:`atomic_write` writes before the rename (``.NAME.tmp-PID``)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` atomically: ``write(handle)`` fills a temporary file, then it replaces
    ``path``. The folder must exist.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
        >>> atomic_write(target, lambda f: f.write(b"done"))
        >>> target.read_bytes()
        b'done'
    """
    target = Path(path)
    tmp = temporary_name(target)
    try:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(target.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))
