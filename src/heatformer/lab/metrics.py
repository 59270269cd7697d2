"""A run's metrics as it trains: ``metrics.jsonl``, and TensorBoard event files on request.

Every training step and every evaluation of a run is appended to ``RUN/metrics.jsonl`` the
moment it is known, one JSON object per line (standard JSON: a non-finite number is ``null``,
as in ``result.json``)::

    {"step": 3, "split": "train", "train_loss": 2.71, "lr": 0.0009, "time_s": 0.41}
    {"step": 4, "split": "eval", "val_loss": 2.65, "val_acc": 0.31}

- ``split: "train"``: after optimizer step ``step`` (1-based): ``train_loss``, the step's
  global-batch mean loss (the record's ``train_loss[step - 1]``); ``lr``, the learning rate
  the step used; ``time_s``, the run's training time so far in seconds (summed over the
  invocations that trained it, evaluations not included: the record's ``train_time_s``).
- ``split: "eval"``: the evaluation after step ``step``, with the task's metrics, exactly
  the entry of the record's ``evals`` (``{"step": s, metric: value}``) plus ``split``.

Lines come in training order: a step's line, then its evaluation (if one is due). Each line
is flushed as it is written, so ``tail -f RUN/metrics.jsonl`` follows a run, and the file is
synced to disk before each checkpoint is saved, so that a checkpoint never holds steps the
file lost. A power loss can leave a torn last line; :func:`read_metrics` skips it. A run that
resumes from its checkpoint at step ``s`` first drops the lines written after that checkpoint
(steps ``> s``, a torn line, an evaluation the checkpoint does not hold), rewriting the file
atomically, then appends: a finished run's file holds every step ``1..steps`` once and its
evaluations equal ``result.json``'s ``evals``. Under DDP rank 0 writes.

With ``log="tensorboard"`` (``heatformer train --log tensorboard``) the same numbers also go
to TensorBoard event files in ``RUN/tensorboard/`` (:class:`torch.utils.tensorboard.SummaryWriter`,
flushed after every record): scalars ``train/loss`` and ``train/lr`` per step and
``eval/<metric>`` per evaluation, at the same steps (TensorBoard stores float32). A resume
opens the writer with ``purge_step = s + 1``, so TensorBoard drops what was written after the
checkpoint and shows each step once. ``tensorboard --logdir OUT/runs`` shows every run of a
comparison. The ``tensorboard`` package is the extra ``heatformer[tensorboard]``.

A line costs about 9 µs (one ``json.dumps``, one ``write`` and a flush; measured on a 2-core
CPU), and with TensorBoard about 0.1 ms (its event file is flushed each time), against 3 to
8 ms for a step of the tests' tiny model; the fsync before a checkpoint is a fraction of the
checkpoint's own. A line per step is about 120 bytes: 12 MB per 100 000 steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from heatformer._atomic import atomic_write_text
from heatformer._optional import require
from heatformer.checks import check_choice
from heatformer.lab.checkpoint import json_safe

__all__ = [
    "LOGS",
    "METRICS_NAME",
    "TENSORBOARD_DIR",
    "MetricsLog",
    "read_metrics",
    "require_log",
]

#: The metrics file's name inside a run folder.
METRICS_NAME = "metrics.jsonl"
#: The folder of the TensorBoard event files inside a run folder (``log="tensorboard"``).
TENSORBOARD_DIR = "tensorboard"
#: What a run logs: ``"jsonl"``, ``metrics.jsonl`` only (the default); ``"tensorboard"``,
#: ``metrics.jsonl`` and TensorBoard event files.
LOGS = ("jsonl", "tensorboard")


def require_log(log: str) -> str:
    """``log`` checked: one of :data:`LOGS`, with its package installed.

    Raises:
        ValueError: ``log`` is not one of :data:`LOGS` (naming ``log``).
        ImportError: ``log="tensorboard"`` without the ``tensorboard`` package (naming
            ``--log tensorboard`` and ``pip install 'heatformer[tensorboard]'``).
    """
    check_choice("log", log, LOGS)
    if log == "tensorboard":
        require("tensorboard", feature="--log tensorboard")
    return log


def _decode(line: bytes) -> dict[str, Any] | None:
    """One line's record, or ``None`` for a line that is not a complete JSON object."""
    try:
        value = json.loads(line)
    except ValueError:  # a torn line (power loss), or bytes cut inside a character
        return None
    return value if isinstance(value, dict) and isinstance(value.get("step"), int) else None


def _records(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The records of ``path`` (none if it is missing), and whether the file is clean: every
    line a record ending in a newline. A bad line other than the last raises."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], True
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records, clean = [], tail == b""
    for number, line in enumerate(lines, start=1):
        record = _decode(line)
        if record is None:
            raise ValueError(
                f"{path}:{number}: expected one JSON object with an integer 'step' per line, "
                f"got {line[:80]!r}"
            )
        records.append(record)
    if tail and (record := _decode(tail)) is not None:  # complete, but for its newline
        records.append(record)
    return records, clean


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a run folder or the file), in file order.

    A torn last line (a write cut by a power loss or a kill) is skipped; a missing file is
    no records.

    Args:
        path: a run folder or its ``metrics.jsonl``.

    Returns:
        One dict per line: ``{"step", "split": "train", "train_loss", "lr", "time_s"}`` or
        ``{"step", "split": "eval", metric: value, ...}`` (see the module docstring).

    Raises:
        ValueError: a line other than the last is not a JSON object with an integer
            ``step`` (the message names the file and the line).
    """
    target = Path(path)
    if target.is_dir():
        target = target / METRICS_NAME
    return _records(target)[0]


class MetricsLog:
    """The writer of one run's ``metrics.jsonl`` (and TensorBoard files), open for a stretch
    of training; a context manager. Writes nothing unless ``enabled`` (DDP ranks but 0).

    Args:
        run_dir: the run folder (exists).
        step: the step the run continues from (its checkpoint's; 0 for a fresh start).
        evals: the evaluations the run holds at ``step`` (its checkpoint's ``evals``).
        log: one of :data:`LOGS`.
        enabled: whether this process writes (rank 0).

    Raises:
        ValueError: ``log`` is not one of :data:`LOGS`, or the file has a bad line before
            its last.
        ImportError: ``log="tensorboard"`` without the ``tensorboard`` package.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        step: int,
        evals: Sequence[Mapping[str, Any]],
        log: str = "jsonl",
        enabled: bool = True,
    ) -> None:
        require_log(log)
        self.path = Path(run_dir) / METRICS_NAME
        self._file: IO[bytes] | None = None
        self._writer: Any = None
        if not enabled:
            return
        self._truncate(step, {int(e["step"]) for e in evals})
        self._file = open(self.path, "ab")  # closed by close()
        if log == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            folder = Path(run_dir) / TENSORBOARD_DIR
            purge = step + 1 if folder.is_dir() else None  # drops what came after the checkpoint
            self._writer = SummaryWriter(log_dir=str(folder), purge_step=purge)

    def _truncate(self, step: int, evaluated: set[int]) -> None:
        """Drop the lines the checkpoint at ``step`` does not hold (atomically; only when
        there are any)."""
        records, clean = _records(self.path)
        kept = [
            r
            for r in records
            if r["step"] <= step and (r.get("split") != "eval" or r["step"] in evaluated)
        ]
        if len(kept) != len(records) or not clean:
            atomic_write_text(self.path, "".join(_line(r) for r in kept))

    def step(self, step: int, train_loss: float, lr: float, time_s: float) -> None:
        """Append training step ``step``: its loss, learning rate and the training time so far."""
        if self._file is None:
            return
        record = {"step": step, "split": "train", "train_loss": train_loss, "lr": lr}
        self._file.write(_line({**record, "time_s": time_s}).encode("utf-8"))
        self._file.flush()  # visible at once (tail -f); fsync'd by sync()
        if self._writer is not None:
            self._writer.add_scalar("train/loss", train_loss, step)
            self._writer.add_scalar("train/lr", lr, step)
            self._writer.flush()

    def evaluation(self, metrics: Mapping[str, Any]) -> None:
        """Append an evaluation: a run's ``evals`` entry, ``{"step": s, metric: value}``."""
        if self._file is None:
            return
        step = int(metrics["step"])
        values = {k: v for k, v in metrics.items() if k != "step"}
        self._file.write(_line({"step": step, "split": "eval", **values}).encode("utf-8"))
        self._file.flush()
        if self._writer is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    self._writer.add_scalar(f"eval/{name}", value, step)
            self._writer.flush()

    def sync(self) -> None:
        """Force the lines so far to disk (before a checkpoint is saved)."""
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the files (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _line(record: Mapping[str, Any]) -> str:
    """One record as a line of standard JSON (a non-finite number as ``null``)."""
    return json.dumps(json_safe(record), allow_nan=False) + "\n"
