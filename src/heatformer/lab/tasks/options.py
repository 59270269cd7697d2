"""What a task declares and what it reads of its run: :func:`option`, :class:`TaskOptions`,
:class:`RunSpec`.

A task's options are a frozen :class:`TaskOptions` dataclass whose fields are made with
:func:`option` (its default, its help line, how the command line parses it, whether it changes
the numbers of a run); the command line makes one flag per field. :class:`RunSpec` is what a
task bound to a run reads of it (the lab's :class:`~heatformer.lab.spec.CompareSpec` is one):
the tasks read it without importing the spec, which imports the tasks.

This module imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from heatformer.models.heads import HeadSchedule

__all__ = ["RunSpec", "TaskOptions", "option"]


def option(
    default: Any,
    help: str,
    *,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    path: bool = False,
    numbers: bool = True,
) -> Any:
    """A field of a task's :class:`TaskOptions` dataclass: its default and its flag.

    Args:
        default: the default value (declared here only).
        help: one line for ``--help`` (the default is appended).
        parse: turns the flag's text into the value (default: the type of ``default``, or
            ``str`` when ``default`` is ``None``).
        metavar: the placeholder in ``--help`` (default ``N`` for ints, ``X`` for floats,
            ``PATH`` for paths).
        path: the value is a file or folder (the command line makes it absolute).
        numbers: whether the value changes the numbers of a run (``False`` for the size of
            the analysis batch: a checkpoint can be resumed and re-analyzed with another).

    Returns:
        A :func:`dataclasses.field`.
    """
    if parse is None:
        parse = str if default is None or path else type(default)
    if metavar is None:
        metavar = "PATH" if path else "N" if parse is int else "X" if parse is float else "VALUE"
    metadata = {"help": help, "parse": parse, "metavar": metavar, "path": path, "numbers": numbers}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TaskOptions:
    """Base of every task's options: a frozen dataclass, one :func:`option` field per option.

    Subclasses check their values in ``__post_init__`` (raising errors that name the field).
    """

    def max_tokens(self) -> int | None:
        """The longest sequence a model of this task reads, when the options alone say it.

        ``None`` (the default): only the data tell (e.g. the number of patches of an image).
        A comparison checks its graph kinds against this number before loading any data.
        """
        return None

    def fingerprint(self) -> dict[str, Any]:
        """The options that change the numbers of a run (see :func:`option`'s ``numbers``)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata.get("numbers", True)
        }


class RunSpec(Protocol):
    """What a task reads of the run it is bound to: the lab's
    :class:`~heatformer.lab.spec.CompareSpec` is one (the tasks do not import it).

    The model fields (layers, width, graph kinds, dropout, checkpointing) and each head
    schedule, parsed once (:meth:`schedule`), build the task's model; the batch size, the
    selection metric and the analysis options shape its evaluation and analysis.
    """

    @property
    def task(self) -> str: ...
    @property
    def heads(self) -> tuple[str, ...]: ...
    @property
    def options(self) -> Any: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def mlp_ratio(self) -> int: ...
    @property
    def zero_init_proj(self) -> bool: ...
    @property
    def graph(self) -> str: ...
    @property
    def dropout(self) -> float: ...
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def select_by(self) -> str | None: ...
    @property
    def analysis_split(self) -> str: ...
    @property
    def analysis_point(self) -> str: ...
    @property
    def analysis_cls(self) -> bool: ...

    def schedule(self, heads: str) -> HeadSchedule:
        """The parsed schedule ``heads`` (one of :attr:`heads`)."""
        ...

    def resolved(self) -> Any:
        """The spec with its derived fields filled in."""
        ...
