"""Deprecated: the task harnesses became the tasks of :mod:`heatformer.experiments.tasks`.

A task (:class:`~heatformer.experiments.Task`) is now one class per task module, registered in
:data:`~heatformer.experiments.TASKS`. The old names still work here, with one
:class:`DeprecationWarning` each:

- ``TaskHarness`` -> :class:`heatformer.experiments.Task`
- ``CharsHarness`` / ``DigitsHarness`` / ``RecallHarness`` -> ``Chars`` / ``Digits`` /
  ``Recall`` in :mod:`heatformer.experiments.tasks`
- ``make_harness(spec, task)`` -> ``resolve_task(spec.task)(spec, data)``
- ``autocast`` -> :func:`heatformer.experiments.tasks.autocast`
"""

from __future__ import annotations

import warnings
from typing import Any

__all__: list[str] = []  # nothing new is defined here

_MOVED = {
    "TaskHarness": "Task",
    "CharsHarness": "Chars",
    "DigitsHarness": "Digits",
    "RecallHarness": "Recall",
    "make_harness": "make_task",
    "autocast": "autocast",
}


def make_task(spec: Any, task: Any = None) -> Any:
    """The task of ``spec.task`` bound to ``spec``, with ``task`` as its data if given."""
    from heatformer.experiments.tasks import resolve_task

    return resolve_task(spec.task)(spec, task)


def __getattr__(name: str) -> Any:
    new = _MOVED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"heatformer.experiments.harness.{name} is deprecated: use "
        + (
            "resolve_task(spec.task)(spec, data) from heatformer.experiments.tasks"
            if new == "make_task"
            else f"heatformer.experiments.tasks.{new}"
        ),
        DeprecationWarning,
        stacklevel=2,
    )
    if new == "make_task":
        value: Any = make_task
    else:
        from heatformer.experiments import tasks

        value = getattr(tasks, new)
    globals()[name] = value  # warned once: later look-ups find it here
    return value
