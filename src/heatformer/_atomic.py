"""The one atomic-write helper, and the lock that makes one process the writer of a folder.

A file is written to a temporary name in the same folder (``.NAME.tmp-PID``), flushed to disk,
then moved over the final name with :func:`os.replace`, which is atomic on POSIX and Windows.
A crash or Ctrl-C at any moment leaves the previous complete file or the new one, plus at
worst a leftover temporary file, which readers never look at. Torch-free: checkpoints pass a
writer (``lambda f: torch.save(obj, f)``).

A leftover temporary is stale only if no process is still writing it, and only the writer of
a folder can know that. :class:`FolderLock` makes one process that writer: an advisory
``fcntl.flock`` on ``FOLDER/.lock``, which holds the holder's pid, host and start time (so
a refused process can say who has the folder) and is released by the kernel when the holder
exits, however it exits (``kill -9`` too). The lock file itself stays; an unheld one means
nothing. The lock is advisory: it keeps out heatformer processes, not other programs; it
works on local file systems and on NFS (Linux emulates ``flock`` there with ``fcntl`` byte
locks). Without :mod:`fcntl` (Windows) :meth:`FolderLock.acquire` locks nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_NAME",
    "FolderInUse",
    "FolderLock",
    "atomic_write",
    "atomic_write_text",
    "holds_lock",
    "is_temporary",
    "remove_temporaries",
    "temporary_name",
]

#: The lock file of a folder (see :class:`FolderLock`).
LOCK_NAME = ".lock"


def temporary_name(path: Path) -> Path:
    """Where :func:`atomic_write` writes before the rename (``.NAME.tmp-PID``)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def is_temporary(path: Path) -> bool:
    """Whether ``path`` is named as a temporary of :func:`atomic_write` (``.NAME.tmp-PID``)."""
    name, _, pid = path.name.rpartition(".tmp-")
    return name.startswith(".") and len(name) > 1 and pid.isdigit()


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


class FolderInUse(RuntimeError):
    """Another process holds the lock of a folder (:class:`FolderLock`).

    Attributes:
        folder: the folder.
        pid: the holder's process id, or ``None`` if its lock file could not be read.
        host: the holder's host name, or ``None``.
        started: when the holder took the lock (ISO 8601, local time), or ``None``.
    """

    def __init__(
        self,
        folder: Path,
        pid: int | None = None,
        host: str | None = None,
        started: str | None = None,
    ) -> None:
        who = f"pid {pid} on {host}" if pid is not None else "another process"
        since = f" since {started}" if started else ""
        super().__init__(
            f"{folder} is in use by {who}{since} (its lock {folder / LOCK_NAME}); one process "
            "writes a run folder at a time: wait for that one to finish, or stop it, then try "
            "again"
        )
        self.folder, self.pid, self.host, self.started = folder, pid, host, started


#: The folders whose lock is held here: resolved path -> (pid, thread id) that took it.
_HELD: dict[Path, tuple[int, int]] = {}


def _holder_id() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


def holds_lock(path: str | os.PathLike[str]) -> bool:
    """Whether this thread (of this process) holds the :class:`FolderLock` of ``path`` or of a
    folder above it."""
    target = Path(path).resolve()
    me = _holder_id()
    return any(
        owner == me and (folder == target or folder in target.parents)
        for folder, owner in _HELD.items()
    )


def remove_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that interrupted atomic writes left in ``folder`` and below.

    Only the holder of the folder's lock may (:class:`FolderLock` calls this when it takes
    it): a temporary in a folder that another process writes may be that process's file in
    flight. Only regular files named ``.NAME.tmp-PID`` are removed.

    Args:
        folder: a folder whose lock this thread holds (or a folder inside it).

    Returns:
        The removed paths.

    Raises:
        ValueError: this thread does not hold the lock of ``folder`` or of a folder above it.
    """
    base = Path(folder)
    if not holds_lock(base):
        from heatformer.checks import bad_value  # imports torch: only when refusing

        raise bad_value(
            "folder",
            f"expected a folder whose lock this process holds (FolderLock), got {str(base)!r}: "
            "a temporary in a folder another process writes may be that process's file",
        )
    removed: list[Path] = []
    for candidate in sorted(base.rglob(".*.tmp-*")):  # does not follow links to folders
        if is_temporary(candidate) and candidate.is_file() and not candidate.is_symlink():
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


class FolderLock:
    """The advisory lock that makes this process the one writer of ``folder``.

    :meth:`acquire` takes ``flock(LOCK_EX | LOCK_NB)`` on ``folder/.lock``, writes the
    holder's ``{"pid", "host", "started"}`` into it and removes the temporaries that killed
    writers left in the folder (:func:`remove_temporaries`); :meth:`release` (or the end of the
    process, however it ends) frees it. A process that finds the lock taken gets
    :class:`FolderInUse`, naming the holder. Locks are per open file: a second
    :class:`FolderLock` on the same folder in the same process is refused as well.
    :func:`holds_lock` tells the thread that took it (and only that one) that it holds it.

    Args:
        folder: an existing folder.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> lock = FolderLock(folder).acquire()
        >>> holds_lock(folder / "runs")
        True
        >>> FolderLock(folder).acquire()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        heatformer._atomic.FolderInUse: ... is in use by pid ...
        >>> lock.release()
        >>> holds_lock(folder)
        False
    """

    #: Seconds a refused process waits for the holder to write its name into the lock file.
    read_timeout_s = 2.0

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock.

        Returns:
            ``self``.

        Raises:
            FolderInUse: another process (or another :class:`FolderLock` of this one) holds it.
            OSError: the lock file cannot be created (e.g. a read-only folder), or a stale
                temporary cannot be removed (the lock is not held then).
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUse(self.folder, *self._holder()) from None
        except BaseException:
            os.close(fd)
            raise
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(holder) + "\n").encode("utf-8"))
        os.fsync(fd)
        self._fd = fd
        _HELD[self.folder.resolve()] = _holder_id()
        try:
            remove_temporaries(self.folder)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Free the lock (the lock file stays, emptied); nothing if it is not held."""
        if self._fd is None:
            return
        _HELD.pop(self.folder.resolve(), None)
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # before the unlock: nobody reads a name that is no longer true
        except OSError:  # pragma: no cover - e.g. the disk is full: the lock goes all the same
            pass
        finally:
            os.close(fd)  # closing frees the flock

    def _holder(self) -> tuple[int | None, str | None, str | None]:
        """``(pid, host, started)`` read from the lock file of the holder, else ``None``s."""
        deadline = time.monotonic() + self.read_timeout_s
        while True:  # the holder writes its name right after it takes the lock
            try:
                data: Any = json.loads(self.path.read_text(encoding="utf-8"))
                return int(data["pid"]), str(data["host"]), str(data.get("started") or "")
            except (OSError, ValueError, KeyError, TypeError):
                if time.monotonic() > deadline:
                    return None, None, None
                time.sleep(0.05)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
