"""Atomic files: checkpoints and JSON results that are either complete or absent.

Every file is written to a temporary name in the same folder (``.NAME.tmp-PID``), flushed
to disk, then moved over the final name with :func:`os.replace`, which is atomic on POSIX
and Windows. A crash or Ctrl-C at any moment therefore leaves either the previous
complete file or the new complete file, plus at worst a leftover temporary file, which
readers never look at.

One process writes a run folder at a time: :func:`hold_folder` takes the folder's lock
(:class:`heatformer._atomic.FolderLock`, on rank 0 under DDP) for a ``with`` block, and the
process that takes it removes the temporaries left in the folder
(:func:`remove_stale_temporaries`, the same function as
:func:`heatformer._atomic.remove_temporaries`), which no other process can be writing then.

The checkpoint of a run is one ``torch.save`` dict (see :func:`save_checkpoint`) read
back with ``weights_only=True``: tensors, numbers, strings, lists and dicts only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from heatformer._atomic import (
    FolderInUse,
    FolderLock,
    atomic_write,
    atomic_write_text,
    holds_lock,
)
from heatformer._atomic import remove_temporaries as remove_stale_temporaries
from heatformer.checks import bad_value
from heatformer.lab.distributed import DistContext

__all__ = [
    "CHECKPOINT_FORMAT",
    "atomic_write_json",
    "atomic_write_text",
    "hold_folder",
    "json_safe",
    "load_checkpoint",
    "read_json",
    "remove_stale_temporaries",
    "save_checkpoint",
]

#: Value of the ``"format"`` key of every checkpoint this module writes.
CHECKPOINT_FORMAT = "heatformer-run-checkpoint-v1"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float, in nested dicts, lists and tuples too, replaced
    by ``None``: what standard JSON can hold (``result.json``, ``metrics.jsonl``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented, standard JSON (NaN/inf become ``null``), atomically.

    Args:
        path: the final file name.
        data: JSON-serializable data.
    """
    text = json.dumps(json_safe(data), indent=2, allow_nan=False)
    atomic_write_text(path, text + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file written by :func:`atomic_write_json`.

    Args:
        path: the file.

    Returns:
        The decoded data.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not valid JSON (the message names it).
    """
    target = Path(path)
    try:
        return json.loads(target.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{target}: expected a JSON file, got a decode error ({err})") from None


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Save a checkpoint dict atomically (``torch.save`` to a temporary, then replace).

    Args:
        path: the final checkpoint file name.
        state: tensors, numbers, strings, lists and dicts; a ``"format"`` key with
            :data:`CHECKPOINT_FORMAT` is added.
    """
    atomic_write(path, lambda handle: torch.save({"format": CHECKPOINT_FORMAT, **state}, handle))


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Load a checkpoint written by :func:`save_checkpoint`, or ``None`` if there is none.

    Only the final file name is read; temporary files from an interrupted save are
    ignored.

    Args:
        path: the checkpoint file name.

    Returns:
        The checkpoint dict (tensors on the CPU), or ``None`` when ``path`` does not exist.

    Raises:
        ValueError: the file exists but is not a checkpoint of this format. The message
            names the file and how to start its run again (torch's own advice, to load
            with ``weights_only=False``, is not for files that this module wrote).
    """
    target = Path(path)
    restart = (
        f"delete the run folder {target.parent} and continue the comparison with --resume: "
        "that run starts again from step 0, the finished runs are kept"
    )
    if not target.is_file():
        if target.is_symlink():  # dangling or looping: not "no checkpoint yet"
            raise ValueError(
                f"{target}: expected a heatformer checkpoint, got a symbolic link to "
                f"{os.readlink(target)!r}, which does not lead to a file (missing, or a loop); "
                f"point it at the checkpoint, or {restart}"
            )
        if target.exists():
            raise ValueError(
                f"{target}: expected a heatformer checkpoint, got something that is not a "
                f"file; {restart}"
            )
        return None
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4" for a foreign file
            warnings.simplefilter("ignore")
            state = torch.load(target, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors come in many types
        raise ValueError(
            f"{target}: expected a heatformer checkpoint, got a file torch.load cannot read "
            f"({type(err).__name__}); {restart}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{target}: expected a checkpoint of format {CHECKPOINT_FORMAT!r}, got "
            f"{'another format' if isinstance(state, dict) else type(state).__name__}; {restart}"
        )
    return state


@contextlib.contextmanager
def hold_folder(
    folder: str | os.PathLike[str],
    ctx: DistContext | None = None,
    *,
    create: bool = False,
    argument: str = "out_dir",
) -> Iterator[None]:
    """Be the one writer of ``folder`` for a ``with`` block: hold its lock, tidy it up first.

    Rank 0 takes the :class:`~heatformer._atomic.FolderLock` of ``folder`` (which removes
    the temporaries left in it), unless it already holds the lock of ``folder`` or of a folder
    above it (then nothing is done: a run folder inside the comparison folder this process
    writes, or a folder the command line locked before torch was imported). Every rank
    raises if rank 0 could not take the lock (call it on every rank).

    Args:
        folder: the folder.
        ctx: the DDP context; default one process.
        create: create ``folder`` (and its parents) first.
        argument: the name a folder that cannot be written is refused under.

    Raises:
        FolderInUse: another process holds the lock (the message names its pid and host).
        ValueError: ``folder`` cannot be created, or the lock file cannot be written.
    """
    target = Path(folder)
    ctx = ctx or DistContext()
    lock: FolderLock | None = None
    failure: Exception | None = None
    if ctx.is_main and not holds_lock(target):
        try:
            if create:
                target.mkdir(parents=True, exist_ok=True)
            lock = FolderLock(target).acquire()
        except FolderInUse as err:
            failure = err
        except OSError as err:
            failure = bad_value(
                argument,
                f"expected a folder that can be created and written, got {target} "
                f"({err.strerror or err})",
            )
    if ctx.any(failure is not None):  # every rank raises, none waits for the others
        raise failure or FolderInUse(target)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
