"""Experiments: built-in tasks with embedded data, the trainer and the compare runner.

Public names from :mod:`heatformer.experiments.data`:

- :func:`load_task` -- a task from its name, one of :data:`TASK_NAMES`
  (``"chars"``, ``"digits"``, ``"recall"``).
- :class:`CharsTask` / :func:`load_chars` -- byte-level language modelling, split by file.
- :class:`DigitsTask` / :func:`load_digits_task` -- 8×8 digit images, stratified split.
- :class:`RecallTask` -- synthetic associative recall over long sequences.
- :func:`bits_per_char` -- nats per byte to bits per character.
"""

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

__all__ = [
    "TASK_NAMES",
    "CharsTask",
    "DigitsTask",
    "RecallTask",
    "Task",
    "bits_per_char",
    "load_chars",
    "load_digits_task",
    "load_task",
    "stdlib_source_root",
]
