"""The parser of the ``heatformer`` command, which keeps a table of its own options.

:class:`OptionParser` records, while arguments are added to it (or to its groups, made with
:meth:`OptionParser.group`), which option sets each destination: the command line names the
option a user typed when the library names an argument (``err.argument`` -> ``--embd``), and
suggests the closest option for a mistyped one, without reading argparse's private state.

Under ``torchrun`` every rank runs the command: :func:`speaks` is true on rank 0 alone, and
the parser's messages (usage, errors, help: the same on every rank, which parse the same
arguments) are printed there only, so a wrong argument reads once; every rank still exits
with the same status.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["OptionGroup", "OptionParser", "speaks"]


def speaks() -> bool:
    """Whether this process prints the command's messages: not a ``torchrun`` rank other than
    0 (``RANK`` and ``WORLD_SIZE`` in the environment, set before the command starts)."""
    return os.environ.get("RANK", "0") == "0" or os.environ.get("WORLD_SIZE", "1") == "1"


class OptionParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` that keeps ``dest -> option`` of what it parses.

    Attributes:
        option_of: argparse ``dest`` -> the first long option that sets it (``"n_embd"`` ->
            ``"--embd"``).
        long_options: every long option, aliases included (``--n-head``,
            ``--heads-per-layer``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.option_of: dict[str, str] = {}  # set first: argparse adds --help while it starts
        self.long_options: list[str] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action:
        return self.keep(super().add_argument(*name_or_flags, **kwargs))

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if speaks():  # argparse prints usage, errors and help through here
            super()._print_message(message, file)

    def group(self, title: str, description: str | None = None) -> OptionGroup:
        """An argument group (a section of ``--help``) whose options this parser records."""
        return OptionGroup(self, self.add_argument_group(title, description))

    def keep(self, action: argparse.Action) -> argparse.Action:
        """Record ``action``'s long options; return it."""
        longs = [flag for flag in action.option_strings if flag.startswith("--")]
        if longs:
            self.option_of.setdefault(action.dest, longs[0])
            self.long_options.extend(longs)
        return action


class OptionGroup:
    """A section of an :class:`OptionParser`'s help; options added here are recorded."""

    def __init__(self, parser: OptionParser, group: argparse._ArgumentGroup) -> None:
        self._parser = parser
        self._group = group

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action:
        """:meth:`argparse.ArgumentParser.add_argument`, in this section."""
        return self._parser.keep(self._group.add_argument(*name_or_flags, **kwargs))
