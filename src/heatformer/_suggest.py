"""Did-you-mean suggestions for mistyped names (operators, graph kinds, tasks, options).

One place decides what is close (:func:`difflib.get_close_matches` with its default cutoff,
0.6), so every registry and the command line suggest alike. Imports nothing of torch: the
command line's option tables use it before torch is loaded.

Example:
    >>> closest("laplacain", ["attention", "heat", "laplacian"])
    'laplacian'
    >>> did_you_mean("laplacain", ["attention", "heat", "laplacian"])
    " (did you mean 'laplacian'?)"
    >>> did_you_mean("diffusion", ["attention", "heat", "laplacian"])
    ''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``name`` if one is close enough, else ``None``.

    Args:
        name: what was given.
        choices: the valid names.

    Returns:
        The best match by :func:`difflib.get_close_matches` (cutoff 0.6), or ``None``.
    """
    matches = difflib.get_close_matches(name, list(choices), n=1)
    return matches[0] if matches else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'laplacian'?)"`` for the closest choice, or ``""`` when none is close.

    Args:
        name: what was given.
        choices: the valid names.

    Returns:
        The suggestion, to append to an error message.
    """
    match = closest(name, choices)
    return "" if match is None else f" (did you mean {match!r}?)"
