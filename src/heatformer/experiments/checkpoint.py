"""Atomic files: checkpoints and JSON results that are either complete or absent.

Every file is written to a temporary name in the same folder (``.NAME.tmp-PID``), flushed
to disk, then moved over the final name with :func:`os.replace`, which is atomic on POSIX
and Windows. A crash or Ctrl-C at any moment therefore leaves either the previous
complete file or the new complete file, plus at worst a leftover temporary file, which
readers never look at (:func:`remove_stale_temporaries` tidies them up).

The checkpoint of a run is one ``torch.save`` dict (see :func:`save_checkpoint`) read
back with ``weights_only=True``: tensors, numbers, strings, lists and dicts only.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from heatformer._atomic import atomic_write, atomic_write_text

__all__ = [
    "CHECKPOINT_FORMAT",
    "atomic_write_json",
    "atomic_write_text",
    "load_checkpoint",
    "read_json",
    "remove_stale_temporaries",
    "save_checkpoint",
]

#: Value of the ``"format"`` key of every checkpoint this module writes.
CHECKPOINT_FORMAT = "heatformer-run-checkpoint-v1"


def _json_safe(value: Any) -> Any:
    """Replace non-finite floats by ``None`` so the file is standard JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented, standard JSON (NaN/inf become ``null``), atomically.

    Args:
        path: the final file name.
        data: JSON-serializable data.
    """
    text = json.dumps(_json_safe(data), indent=2, allow_nan=False)
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
    if not target.is_file():
        return None
    restart = (
        f"delete the run folder {target.parent} and continue the comparison with --resume: "
        "that run starts again from step 0, the finished runs are kept"
    )
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


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete temporary files left in ``folder`` by interrupted atomic writes.

    Args:
        folder: a run folder.

    Returns:
        The removed paths.
    """
    removed: list[Path] = []
    base = Path(folder)
    if not base.is_dir():
        return removed
    for candidate in base.glob(".*.tmp-*"):
        if candidate.is_file():
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed
