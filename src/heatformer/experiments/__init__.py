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
"""

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
