"""Experiments: built-in tasks with embedded data, the trainer and the compare runner.

Public names from :mod:`heatformer.experiments.data`:

- :func:`load_task` -- a task from its name, one of :data:`TASK_NAMES`
  (``"chars"``, ``"digits"``, ``"recall"``).
- :class:`CharsTask` / :func:`load_chars` -- byte-level language modelling, split by file.
- :class:`DigitsTask` / :func:`load_digits_task` -- 8×8 digit images, stratified split.
- :class:`RecallTask` -- synthetic associative recall over long sequences.
- :func:`bits_per_char` -- nats per byte to bits per character.

The runner (``heatformer train`` / ``compare`` / ``analyze`` on the command line):

- :class:`CompareSpec` -- everything that determines a comparison's numbers;
  :data:`PRESETS` holds named specs (``"demo"``).
- :func:`run_compare` -- train every (head schedule, seed) pair, resumably, and write
  ``results.json``, ``results.csv`` and plots; returns a :class:`CompareReport`.
- :func:`analyze` -- recompute the per-layer token-geometry analysis from checkpoints.
- :func:`train_run` -- one run; :class:`StopSignal` / :class:`TrainingInterrupted` for
  cooperative Ctrl-C handling; :class:`TrainingDiverged` when the loss stops being finite.

The names are imported on first use (PEP 562), so importing a submodule such as
:mod:`heatformer.experiments.spec` does not load torch and the trainer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heatformer.experiments.compare import CompareReport, analyze, run_compare
    from heatformer.experiments.data import (
        TASK_NAMES,
        CharsTask,
        DigitsTask,
        RecallTask,
        Task,
        bits_per_char,
        load_chars,
        load_digits_task,
        load_task,
        stdlib_source_root,
    )
    from heatformer.experiments.spec import PRESETS, CompareSpec
    from heatformer.experiments.trainer import (
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
    "TASK_NAMES": "data",
    "CharsTask": "data",
    "DigitsTask": "data",
    "RecallTask": "data",
    "Task": "data",
    "bits_per_char": "data",
    "load_chars": "data",
    "load_digits_task": "data",
    "load_task": "data",
    "stdlib_source_root": "data",
    "PRESETS": "spec",
    "CompareSpec": "spec",
    "StopSignal": "trainer",
    "TrainingDiverged": "trainer",
    "TrainingInterrupted": "trainer",
    "train_run": "trainer",
}

__all__ = [
    "PRESETS",
    "TASK_NAMES",
    "CharsTask",
    "CompareReport",
    "CompareSpec",
    "DigitsTask",
    "RecallTask",
    "StopSignal",
    "Task",
    "TrainingDiverged",
    "TrainingInterrupted",
    "analyze",
    "bits_per_char",
    "load_chars",
    "load_digits_task",
    "load_task",
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
