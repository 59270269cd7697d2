"""The tasks of ``heatformer compare``: one module per task, one entry of :data:`TASKS` each.

======== ================================== =========================== ======================
task     data                               model                       metrics
======== ================================== =========================== ======================
chars    bytes of text, split by file       causal GPT                  ``val_bpc``, ``val_loss``
digits   8×8 digit images (or an ``.npz``)  ViT                         ``test_acc``, ``test_loss``
recall   synthetic key/value recall         causal sequence classifier  ``val_acc``, ``val_loss``
stdlib   source snippets labelled by        bidirectional sequence      ``test_acc``, ``test_loss``
         package, split by file             classifier (mean pooling)
masked   the bytes of ``chars``, 15 % of    bidirectional GPT encoder   ``val_bpc``, ``val_acc``,
         each window hidden (self-                                      ``val_loss`` (masked
         supervised)                                                    bytes only)
mqar     Zoology's multi-query associative  causal GPT                  ``val_acc``, ``val_loss``
         recall (:mod:`heatformer.datasets`                             (scored positions only)
         generates each synthetic task)
induction  induction heads (H3)             causal GPT                  ``val_acc``, ``val_loss``
selective_copy  selective copying (MAD-Lab) causal GPT                  ``val_acc``, ``val_loss``
parity   parity of a bit string             causal GPT, scored at ``=`` ``val_acc``, ``val_loss``
listops  ListOps (Long Range Arena)         causal GPT, scored at the   ``val_acc``, ``val_loss``
                                            expression's last token
passkey  passkey retrieval, trained short,  causal GPT                  ``val_acc``, ``grid_acc``,
         evaluated on a length x depth                                  ``val_loss``, a cell
         grid                                                           each ``acc_L*_d*``
======== ================================== =========================== ======================

A task is a :class:`Task` subclass (its options with their defaults, data, model, batches,
metrics; see :mod:`heatformer.lab.tasks.base`) registered with :func:`register_task`,
which checks the entry at once. A spec names it (``CompareSpec(task="chars")``, ``--task
chars``) and :func:`resolve_task` turns the name into the class, listing the valid names when
it is wrong. The command line makes one flag per option of the registered tasks and refuses
a flag the chosen task does not take. A task from outside the library is one subclass and one
:func:`register_task` call (see ``examples/custom_task.py``).

Nothing here imports torch at import time: the command line reads the options of every task
for its help pages before torch is loaded.

Examples:
    >>> resolve_task("recall").Options().seq_len
    128
    >>> sorted(options_by_name()["num_kv_pairs"])
    ['mqar']
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from heatformer.checks import bad_type, bad_value
from heatformer.lab.tasks._corpus import stdlib_source_root
from heatformer.lab.tasks.base import Task, autocast
from heatformer.lab.tasks.chars import (
    Chars,
    CharsOptions,
    CharsTask,
    bits_per_char,
    load_chars,
)
from heatformer.lab.tasks.digits import Digits, DigitsOptions, DigitsTask, load_digits_task
from heatformer.lab.tasks.induction import Induction, InductionOptions, induction_score
from heatformer.lab.tasks.listops import ListOps, ListOpsOptions
from heatformer.lab.tasks.masked import MaskedChars, MaskedCharsOptions
from heatformer.lab.tasks.mqar import Mqar, MqarOptions
from heatformer.lab.tasks.options import RunSpec, TaskOptions, option
from heatformer.lab.tasks.parity import Parity, ParityOptions
from heatformer.lab.tasks.passkey import Passkey, PasskeyOptions
from heatformer.lab.tasks.recall import Recall, RecallOptions, RecallTask
from heatformer.lab.tasks.selective_copy import SelectiveCopy, SelectiveCopyOptions
from heatformer.lab.tasks.stdlib import (
    Stdlib,
    StdlibOptions,
    StdlibTask,
    load_stdlib_task,
)
from heatformer.registry import Registry

__all__ = [
    "TASKS",
    "TASK_NAMES",
    "Chars",
    "CharsOptions",
    "CharsTask",
    "Digits",
    "DigitsOptions",
    "DigitsTask",
    "Induction",
    "InductionOptions",
    "ListOps",
    "ListOpsOptions",
    "MaskedChars",
    "MaskedCharsOptions",
    "Mqar",
    "MqarOptions",
    "Parity",
    "ParityOptions",
    "Passkey",
    "PasskeyOptions",
    "Recall",
    "RecallOptions",
    "RecallTask",
    "RunSpec",
    "SelectiveCopy",
    "SelectiveCopyOptions",
    "Stdlib",
    "StdlibOptions",
    "StdlibTask",
    "Task",
    "TaskOptions",
    "autocast",
    "bits_per_char",
    "induction_score",
    "load_chars",
    "load_digits_task",
    "load_stdlib_task",
    "load_task",
    "option",
    "options_by_name",
    "register_task",
    "resolve_task",
    "stdlib_source_root",
]


def check_task(cls: type[Task]) -> type[Task]:
    """What a task entry must hold beyond a name (:data:`TASKS` runs this at registration);
    returns ``cls``.

    Raises:
        TypeError: its ``Options`` is not a frozen :class:`TaskOptions` dataclass.
        ValueError: a missing method, metric or default, an option field not made with
            :func:`option`, or an option that another task parses otherwise (one flag serves
            both); the message says which.
    """
    where = f"task {cls.__name__}"
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        raise bad_value("task", f"{where}: expected the methods {missing}, got none")
    options = cls.Options
    if not (
        isinstance(options, type)
        and issubclass(options, TaskOptions)
        and options is not TaskOptions
        and dataclasses.is_dataclass(options)
        and options.__dataclass_params__.frozen  # type: ignore[attr-defined]
    ):
        raise bad_type(
            "task", f"{where}: expected Options, a frozen TaskOptions dataclass, got {options!r}"
        )
    for f in dataclasses.fields(options):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise bad_value("task", f"{where}: expected a default for option {f.name!r}")
        if "help" not in f.metadata:
            raise bad_value(
                "task", f"{where}: expected option {f.name!r} made with option(default, help)"
            )
        for other, field in options_by_name().get(f.name, {}).items():
            if other != cls.name and field.metadata["parse"] is not f.metadata["parse"]:
                raise bad_value(
                    "task",
                    f"{where}: option {f.name!r} is parsed by {f.metadata['parse']!r}, but "
                    f"task {other!r} parses its {f.name!r} with {field.metadata['parse']!r} "
                    "(one flag serves both)",
                )
    metrics = cls.metric_names
    if not (isinstance(metrics, tuple) and metrics and all(isinstance(m, str) for m in metrics)):
        raise bad_value(
            "task", f"{where}: expected metric_names, a tuple of names, got {metrics!r}"
        )
    if len(cls.higher_is_better) != len(metrics):
        raise bad_value(
            "task",
            f"{where}: expected one higher_is_better flag per metric {list(metrics)}, "
            f"got {cls.higher_is_better!r}",
        )
    if cls.eval_loss_name not in metrics:
        raise bad_value(
            "task",
            f"{where}: expected eval_loss_name to be one of {list(metrics)}, "
            f"got {cls.eval_loss_name!r}",
        )
    return cls


#: name -> task; the one place a ``--task`` name becomes a task
#: (:class:`~heatformer.registry.Registry`: :func:`register_task` adds one, checked once).
TASKS: Registry[type[Task]] = Registry("task", argument="task", base=Task, check=check_task)


def register_task(cls: type[Task], *, replace: bool = False) -> type[Task]:
    """Add the task ``cls`` to :data:`TASKS` under ``cls.name``, after checking it.

    Usable as a class decorator. Registering is the whole of adding a task: specs, the
    runner and the command line (``--task NAME`` and a flag per option) take it from here.

    Args:
        cls: a :class:`Task` subclass.
        replace: allow replacing another task of the same name.

    Returns:
        ``cls``.

    Raises:
        TypeError, ValueError: an incomplete entry (see :func:`check_task`), or a name that is
            taken by another task (without ``replace``).
    """
    return TASKS.register(cls, replace=replace)


def resolve_task(name: object) -> type[Task]:
    """The task registered as ``name`` (:meth:`TASKS.lookup <heatformer.registry.Registry.lookup>`).

    Raises:
        ValueError: an unknown name (the registered names are listed, the closest suggested).
        TypeError: ``name`` is not a string.
    """
    cls: type[Task] = TASKS.lookup(name)
    return cls


def options_by_name() -> dict[str, dict[str, dataclasses.Field[Any]]]:
    """Option name -> {task name: its field}, over every registered task, in registry order."""
    table: dict[str, dict[str, dataclasses.Field[Any]]] = {}
    for task_name, cls in TASKS.items():
        for f in dataclasses.fields(cls.Options):
            table.setdefault(f.name, {})[task_name] = f
    return table


def load_task(name: str, **kwargs: Any) -> Any:
    """Build the data of a task from its name and the data factory's keyword arguments.

    Args:
        name: ``"chars"`` (:func:`load_chars`), ``"digits"`` (:func:`load_digits_task`),
            ``"recall"`` (:class:`RecallTask`), ``"stdlib"`` (:func:`load_stdlib_task`),
            ``"masked"`` (:func:`load_chars`, its data are ``chars``'s), or another registered
            task with a ``data_factory``.
        **kwargs: keyword arguments of that factory.

    Returns:
        The task's data object.

    Raises:
        ValueError: unknown ``name`` (the valid names are listed), or a task whose data come
            from its options only.
    """
    cls = resolve_task(name)
    if cls.data_factory is None:
        raise bad_value("task", f"{name!r} builds its data from its options only")
    return cls.data_factory(**kwargs)


for _task in (
    Chars, Digits, Recall, Stdlib, MaskedChars,
    Mqar, Induction, SelectiveCopy, Parity, ListOps, Passkey,
):  # fmt: skip
    register_task(_task)

#: The built-in tasks (:data:`TASKS` also holds the ones registered since).
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
