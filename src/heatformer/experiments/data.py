"""Deprecated: the data of the built-in tasks moved to :mod:`heatformer.experiments.tasks`.

Each task now has one module (``tasks/chars.py``, ``tasks/digits.py``, ``tasks/recall.py``)
holding its data, options, model, batches and metrics. The names below still work here, with
one :class:`DeprecationWarning` each; import them from :mod:`heatformer.experiments` (or from
:mod:`heatformer.experiments.tasks`) instead.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: old name -> (module under heatformer.experiments.tasks, new name)
_MOVED = {
    "CharsTask": ("chars", "CharsTask"),
    "bits_per_char": ("chars", "bits_per_char"),
    "load_chars": ("chars", "load_chars"),
    "stdlib_source_root": ("chars", "stdlib_source_root"),
    "DigitsTask": ("digits", "DigitsTask"),
    "load_digits_task": ("digits", "load_digits_task"),
    "RecallTask": ("recall", "RecallTask"),
    "TASK_NAMES": ("__init__", "TASK_NAMES"),
    "load_task": ("__init__", "load_task"),
    "Task": ("base", "Task"),
}

__all__: list[str] = []  # nothing new is defined here


def __getattr__(name: str) -> Any:
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new = moved
    where = "heatformer.experiments.tasks" + ("" if module == "__init__" else f".{module}")
    warnings.warn(
        f"heatformer.experiments.data.{name} moved: import {new} from heatformer.experiments "
        f"(defined in {where})",
        DeprecationWarning,
        stacklevel=2,
    )
    value = getattr(importlib.import_module(where), new)
    globals()[name] = value  # warned once: later look-ups find it here
    return value
