"""What the byte-corpus tasks share: ``chars`` and ``stdlib`` read files of text as bytes.

- :func:`stdlib_source_root` -- the running Python's standard library, their default corpus;
  :data:`STDLIB_EXCLUDED_DIRS` -- the folders neither enters (installed packages, caches,
  tests);
- :func:`walk_files` -- the files below a folder in sorted order of their relative POSIX
  paths, hidden entries skipped; :func:`read_text_prefix` -- a file's first bytes if it is
  UTF-8 text;
- :func:`hash_fraction` -- the stable number in ``[0, 1)`` of a relative path that decides a
  file's split (so a split never depends on a seed, and is stable as a corpus grows);
- :func:`to_uint8` -- byte strings as one ``uint8`` stream; :func:`check_byte_stream` refuses
  anything else.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from heatformer.checks import bad_value

if TYPE_CHECKING:
    import torch

__all__ = [
    "STDLIB_EXCLUDED_DIRS",
    "check_byte_stream",
    "hash_fraction",
    "read_text_prefix",
    "stdlib_source_root",
    "to_uint8",
    "walk_files",
]

#: Directory names never entered when collecting the default stdlib corpus.
STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


def check_byte_stream(name: str, data: object) -> None:
    """Refuse ``data`` (the field ``name``) unless it is a 1-D ``torch.uint8`` tensor."""
    import torch

    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.ndim != 1:
        got = (
            f"{data.dtype} tensor of shape {tuple(data.shape)}"
            if isinstance(data, torch.Tensor)
            else type(data).__name__
        )
        raise bad_value(name, f"expected a 1-D uint8 tensor, got {got}")


def stdlib_source_root() -> Path:
    """Directory of the running Python's standard library (the default ``chars`` corpus).

    Returns:
        ``sysconfig.get_paths()["stdlib"]`` as a :class:`~pathlib.Path`.

    Raises:
        FileNotFoundError: the directory does not exist (e.g. a zipped stdlib).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"standard library source directory not found: {root}")
    return root


def walk_files(root: Path, *, suffix: str | None, excluded_dirs: frozenset[str]) -> list[Path]:
    """All files under ``root``, sorted by POSIX relative path; hidden entries skipped."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in excluded_dirs and not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or (suffix is not None and not name.endswith(suffix)):
                continue
            path = Path(dirpath, name)
            if path.is_file():
                found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


def read_text_prefix(path: Path, limit: int) -> bytes | None:
    """Read at most ``limit`` bytes of ``path``; ``None`` if it is not UTF-8 text.

    A file counts as text when it has no NUL byte and its bytes decode as UTF-8 (a
    multi-byte character cut by ``limit`` is accepted).
    """
    with path.open("rb") as handle:
        data = handle.read(limit)
        complete = handle.read(1) == b""
    if b"\x00" in data:
        return None
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=complete)
    except UnicodeDecodeError:
        return None
    return data


def hash_fraction(relpath: str) -> float:
    """A stable number in [0, 1) from a relative path (SHA-256, platform independent)."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def to_uint8(chunks: list[bytes]) -> torch.Tensor:
    """Concatenate byte strings into a 1-D uint8 tensor (which owns its memory)."""
    import torch

    data = bytearray(b"".join(chunks))
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8)
