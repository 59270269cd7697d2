"""The checks of :mod:`heatformer.checks`, imported only when one runs.

:mod:`heatformer.checks` imports torch; the modules that define the command line's options
(the spec, the tasks) must not, so that ``heatformer --help`` answers at once. These wrappers
have the same signatures and raise the same errors (:class:`~heatformer.checks.ArgumentValueError`,
:class:`~heatformer.checks.ArgumentTypeError`, which carry ``.argument``); a missing file is an
:class:`ArgumentFileNotFoundError`, which carries ``.argument`` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from heatformer.checks import ArgumentTypeError, ArgumentValueError

__all__ = [
    "ArgumentFileNotFoundError",
    "bad_type",
    "bad_value",
    "check_fraction",
    "check_generator",
    "check_int",
    "check_positive_int",
]


class ArgumentFileNotFoundError(FileNotFoundError):
    """A path argument that does not exist: ``str(err)`` is ``"argument: detail"``.

    Attributes:
        argument: the name of the argument.
        detail: what was expected and what came.
    """

    def __init__(self, argument: str, detail: str) -> None:
        super().__init__(f"{argument}: {detail}")
        self.argument = argument
        self.detail = detail


def bad_value(argument: str, detail: str) -> ArgumentValueError:
    """:func:`heatformer.checks.bad_value`."""
    from heatformer import checks

    return checks.bad_value(argument, detail)


def bad_type(argument: str, detail: str) -> ArgumentTypeError:
    """:func:`heatformer.checks.bad_type`."""
    from heatformer import checks

    return checks.bad_type(argument, detail)


def check_positive_int(
    name: str, value: object, *, upper: int | None = None, optional: bool = False
) -> int:
    """:func:`heatformer.checks.check_positive_int`."""
    from heatformer import checks

    return checks.check_positive_int(name, value, upper=upper, optional=optional)


def check_int(name: str, value: object, *, minimum: int) -> int:
    """An int ``>= minimum`` (not a bool); anything else is a ``ValueError`` naming ``name``.

    The data classes of the built-in tasks check their sizes with this (one kind of error for
    every bad size, as they always did).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_value(name, f"expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise bad_value(name, f"expected an int >= {minimum}, got {value}")
    return value


def check_fraction(name: str, value: object) -> float:
    """A number in the open interval (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_value(name, f"expected a float in (0, 1), got {value!r}")
    if not 0.0 < float(value) < 1.0:
        raise bad_value(name, f"expected a float in (0, 1), got {value}")
    return float(value)


def check_generator(generator: object) -> torch.Generator:
    """A CPU :class:`torch.Generator`."""
    import torch

    if not isinstance(generator, torch.Generator):
        raise bad_type("generator", f"expected a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise bad_value("generator", f"expected a CPU torch.Generator, got {generator.device}")
    return generator
