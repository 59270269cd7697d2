"""Experiments: the tasks, the trainer and the compare runner.

Tasks (:mod:`heatformer.lab.tasks`, one module per task):

- :data:`TASKS` -- name -> :class:`Task`; :func:`register_task` adds one (checked at once),
  :func:`resolve_task` turns a ``--task`` name into it. :data:`TASK_NAMES` are the built-in
  ones (``"chars"``, ``"digits"``, ``"recall"``, ``"stdlib"``, ``"masked"``).
- :class:`Task` -- the protocol: options with defaults (a :class:`TaskOptions` dataclass of
  :func:`option` fields), data, model, one batch interface, metrics, analysis batch.
- :func:`load_task` -- a built-in task's data from its name and the data factory's arguments.
- :class:`CharsTask` / :func:`load_chars` -- byte-level language modelling, split by file.
- :class:`DigitsTask` / :func:`load_digits_task` -- 8×8 digit images, stratified split.
- :class:`RecallTask` -- synthetic associative recall over long sequences.
- :class:`StdlibTask` / :func:`load_stdlib_task` -- which standard-library package a snippet of
  Python source comes from, split by file.
- :func:`bits_per_char` -- nats per byte to bits per character.

The runner (``heatformer train`` / ``compare`` / ``analyze`` on the command line):

- :class:`CompareSpec` -- everything that determines a comparison's numbers (the shared
  fields, the graph kinds, the task's options); :data:`PRESETS` holds named specs
  (``"demo"``).
- :func:`run_compare` -- train every (head schedule, seed) pair, resumably, and write
  ``results.json``, ``results.csv`` and plots; returns a :class:`CompareReport`.
- :func:`analyze` -- recompute the per-layer token-geometry analysis from checkpoints.
- :func:`train_run` -- one run; :class:`StopSignal` / :class:`TrainingInterrupted` for
  Ctrl-C and SIGTERM (honoured within seconds, the last completed step saved);
  :class:`TrainingDiverged` when the loss stops being finite.

The names are imported on first use (PEP 562), so importing a submodule such as
:mod:`heatformer.lab.spec` does not load torch and the trainer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heatformer.lab.compare import CompareReport, analyze, run_compare
    from heatformer.lab.spec import PRESETS, CompareSpec
    from heatformer.lab.tasks import (
        TASK_NAMES,
        TASKS,
        CharsTask,
        DigitsTask,
        RecallTask,
        StdlibTask,
        Task,
        TaskOptions,
        bits_per_char,
        load_chars,
        load_digits_task,
        load_stdlib_task,
        load_task,
        option,
        register_task,
        resolve_task,
        stdlib_source_root,
    )
    from heatformer.lab.trainer import (
        StopSignal,
        TrainingDiverged,
        TrainingInterrupted,
        train_run,
    )

#: public name -> the submodule that defines it.
_SOURCES = {
    "CompareReport": "compare",
    "analyze": "compare",
    "run_compare": "compare",
    "TASKS": "tasks",
    "TASK_NAMES": "tasks",
    "CharsTask": "tasks",
    "DigitsTask": "tasks",
    "RecallTask": "tasks",
    "StdlibTask": "tasks",
    "Task": "tasks",
    "TaskOptions": "tasks",
    "bits_per_char": "tasks",
    "load_chars": "tasks",
    "load_digits_task": "tasks",
    "load_stdlib_task": "tasks",
    "load_task": "tasks",
    "option": "tasks",
    "register_task": "tasks",
    "resolve_task": "tasks",
    "stdlib_source_root": "tasks",
    "PRESETS": "spec",
    "CompareSpec": "spec",
    "StopSignal": "trainer",
    "TrainingDiverged": "trainer",
    "TrainingInterrupted": "trainer",
    "train_run": "trainer",
}

__all__ = [
    "PRESETS",
    "TASKS",
    "TASK_NAMES",
    "CharsTask",
    "CompareReport",
    "CompareSpec",
    "DigitsTask",
    "RecallTask",
    "StdlibTask",
    "StopSignal",
    "Task",
    "TaskOptions",
    "TrainingDiverged",
    "TrainingInterrupted",
    "analyze",
    "bits_per_char",
    "load_chars",
    "load_digits_task",
    "load_stdlib_task",
    "load_task",
    "option",
    "register_task",
    "resolve_task",
    "run_compare",
    "stdlib_source_root",
    "train_run",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
