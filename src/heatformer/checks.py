"""The one set of argument checks, and the errors they raise.

Policy: a wrong *kind* of object (type, dtype) is a :class:`TypeError`, a wrong *value*
(shape, range) a :class:`ValueError`; the message reads "``name``: expected X, got Y". The
errors raised here are :class:`ArgumentTypeError` / :class:`ArgumentValueError`, subclasses of
those two that also carry the argument's name in :attr:`ArgumentError.argument`, so a caller
(the command line) can tell which option was wrong without reading the message; a missing file
is an :class:`ArgumentFileNotFoundError`, which carries ``.argument`` too. Checks run at public
boundaries, once; hot loops trust what they get. Nothing here uses ``assert``. A check told
the argument's name takes it first, then the value (``check_positive_int("k", k)``); a check of
one fixed argument names it itself (``check_tol(tol)``), and :func:`check_signal` /
:func:`check_time` take it as the keyword ``name``.

This module imports torch only inside the checks that need it: the modules that define the
command line's options (the spec, the tasks) use it too, and ``heatformer --help`` answers
before torch is loaded.

Example:
    >>> try:
    ...     check_positive_int("n_layer", 0)
    ... except ValueError as err:
    ...     print(err.argument, "|", err.detail)
    n_layer | expected a positive int, got 0
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from heatformer._suggest import did_you_mean

if TYPE_CHECKING:
    import torch
    from torch import Tensor


__all__ = [
    "NORMALIZATIONS",
    "ArgumentError",
    "ArgumentFileNotFoundError",
    "ArgumentTypeError",
    "ArgumentValueError",
    "bad_type",
    "bad_value",
    "check_bool",
    "check_choice",
    "check_coeffs",
    "check_float_tensor",
    "check_folder",
    "check_fraction",
    "check_generator",
    "check_int",
    "check_int_tensor",
    "check_mask",
    "check_normalization",
    "check_open_unit",
    "check_positive_int",
    "check_signal",
    "check_square",
    "check_threshold",
    "check_time",
    "check_times",
    "check_tol",
    "topk_and_graph",
]


class ArgumentError(Exception):
    """A bad argument: ``str(err)`` is ``"argument: detail"``.

    Attributes:
        argument: the name of the argument (or config field) that was wrong.
        detail: what was expected and what came.
    """

    def __init__(self, argument: str, detail: str) -> None:
        super().__init__(argument, detail)
        self.argument = argument
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.argument}: {self.detail}"


class ArgumentTypeError(ArgumentError, TypeError):
    """A wrong kind of argument (type or dtype)."""


class ArgumentValueError(ArgumentError, ValueError):
    """A wrong value (shape, range, name)."""


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


def bad_type(argument: str, detail: str) -> ArgumentTypeError:
    """The error for an argument of the wrong kind: ``raise bad_type("x", "expected ...")``."""
    return ArgumentTypeError(argument, detail)


def bad_value(argument: str, detail: str) -> ArgumentValueError:
    """The error for an argument with a wrong value: ``raise bad_value("k", "expected ...")``."""
    return ArgumentValueError(argument, detail)


def check_choice(argument: str, value: object, choices: Iterable[str], *, context: str = "") -> str:
    """``value`` when it is one of ``choices``, else one :class:`ValueError` naming ``argument``.

    The one lookup of a name in a registry or a fixed set (graph kinds, tasks, methods,
    normalizations, layouts, recipes): the message lists the choices in the order given and
    suggests the closest (:func:`~heatformer._suggest.did_you_mean`).

    Args:
        argument: the argument's name, for the error.
        value: what was given.
        choices: the valid names, in the order the message lists them.
        context: text after the given value, e.g. ``" in 'windw[w=4]'"``.

    Example:
        >>> try:
        ...     check_choice("normalization", "sim", ["rw", "sym"])
        ... except ValueError as err:
        ...     print(err)
        normalization: expected one of ['rw', 'sym'], got 'sim' (did you mean 'sym'?)
    """
    listed = list(choices)
    if isinstance(value, str) and value in listed:
        return value
    hint = did_you_mean(value, listed) if isinstance(value, str) else ""
    raise bad_value(argument, f"expected one of {listed}, got {value!r}{context}{hint}")


NORMALIZATIONS: tuple[str, ...] = ("rw", "sym", "combinatorial")


def check_float_tensor(
    name: str, value: object, *, min_dim: int = 0, shape: str | None = None
) -> Tensor:
    """Check that ``value`` is a floating-point tensor with at least ``min_dim`` dims.

    ``shape`` is the expected shape as the messages show it (``"(B, N, D)"``); without it,
    they name the dtypes and the number of dims.
    """
    import torch

    if not isinstance(value, torch.Tensor):
        expected = "a torch.Tensor" if shape is None else f"a torch.Tensor of shape {shape}"
        raise bad_type(name, f"expected {expected}, got {type(value).__name__}")
    if not (value.is_floating_point()):
        dtypes = " (float16/bfloat16/float32/float64)" if shape is None else ""
        raise bad_type(name, f"expected a floating-point tensor{dtypes}, got dtype {value.dtype}")
    if value.dim() < min_dim:
        expected = f"at least {min_dim} dimensions" if shape is None else f"shape {shape}"
        got = "shape " if shape is None else ""
        raise bad_value(name, f"expected {expected}, got {got}{tuple(value.shape)}")
    return value


def check_int_tensor(
    name: str, value: object, shape: tuple[int, ...], device: torch.device
) -> Tensor:
    """Check an integer (or bool) tensor of exactly ``shape`` on ``device``."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise bad_type(
            name, f"expected a torch.Tensor of shape {shape}, got {type(value).__name__}"
        )
    if value.is_floating_point() or value.is_complex():
        raise bad_type(name, f"expected an integer (or bool) tensor, got dtype {value.dtype}")
    if tuple(value.shape) != shape:
        raise bad_value(name, f"expected shape {shape}, got {tuple(value.shape)}")
    if value.device != device:
        raise bad_value(name, f"expected a tensor on {device}, got one on {value.device}")
    return value


def check_square(name: str, weight: Tensor) -> int:
    """Check that the last two dims of ``weight`` are equal; return N."""
    if weight.shape[-1] != weight.shape[-2]:
        raise bad_value(
            name, f"expected a square (..., N, N) weight matrix, got shape {tuple(weight.shape)}"
        )
    return int(weight.shape[-1])


def check_normalization(normalization: object) -> str:
    """Check that ``normalization`` is one of ``"rw"``, ``"sym"``, ``"combinatorial"``."""
    return check_choice("normalization", normalization, NORMALIZATIONS)


def check_signal(
    x: object,
    num_nodes: int,
    batch_shape: torch.Size,
    dtype: torch.dtype | None = None,
    *,
    name: str = "x",
) -> Tensor:
    """Check a signal ``x`` of shape ``(..., N, C)`` against a graph with ``num_nodes`` nodes.

    The leading dims of ``x`` must broadcast with the graph's ``batch_shape``; its dtype must
    be the graph's ``dtype`` when given.
    """
    import torch

    x = check_float_tensor(name, x, min_dim=2)
    if dtype is not None and x.dtype != dtype:
        raise bad_type(name, f"expected the graph's dtype {dtype}, got {x.dtype}")
    if x.shape[-2] != num_nodes:
        raise bad_value(
            name,
            f"expected shape (..., N={num_nodes}, C), got {tuple(x.shape)} "
            f"(dim -2 must equal the graph's num_nodes)",
        )
    try:
        torch.broadcast_shapes(x.shape[:-2], batch_shape)
    except RuntimeError:
        raise bad_value(
            name,
            f"leading dims {tuple(x.shape[:-2])} do not broadcast with the graph's "
            f"batch shape {tuple(batch_shape)}",
        ) from None
    return x


def check_mask(mask: object, batch_shape: torch.Size, num_nodes: int) -> Tensor:
    """Check a boolean attention mask broadcastable to ``(*batch_shape, N, N)``."""
    import torch

    if not isinstance(mask, torch.Tensor):
        raise bad_type("mask", f"expected a bool torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise bad_type(
            "mask",
            f"expected dtype torch.bool (True = may attend, as in "
            f"scaled_dot_product_attention), got {mask.dtype}",
        )
    target = (*batch_shape, num_nodes, num_nodes)
    try:
        shape = torch.broadcast_shapes(mask.shape, target)
    except RuntimeError:
        shape = None
    if shape is None or tuple(shape) != target:
        raise bad_value(
            "mask", f"expected a shape broadcastable to {target}, got {tuple(mask.shape)}"
        )
    return mask


def check_positive_int(
    name: str, value: object, *, upper: int | None = None, optional: bool = False
) -> int:
    """Check an int ``value >= 1`` (and ``<= upper``); with ``optional``, None passes too.

    Messages: "expected a positive int, got 0", or with ``upper`` "expected 1 <= k <= 8, got 9".
    """
    if optional and value is None:
        return value  # type: ignore[return-value]
    what = "None or a positive int" if optional else "a positive int"
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_type(name, f"expected {what}, got {type(value).__name__}")
    if upper is not None and not 1 <= value <= upper:
        raise bad_value(name, f"expected 1 <= {name} <= {upper}, got {value}")
    if value < 1:
        raise bad_value(name, f"expected {what}, got {value!r}")
    return value


def check_threshold(eps: object) -> float:
    """Check an edge-weight threshold: a float ``> 0``."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise bad_type("eps", f"expected a float threshold > 0, got {type(eps).__name__}")
    if not eps > 0:
        raise bad_value("eps", f"expected a threshold > 0, got {eps!r}")
    return float(eps)


def check_time(t: object, *, name: str = "t") -> Tensor | float:
    """Check a diffusion time: a finite, non-negative float or floating tensor."""
    import torch

    if isinstance(t, bool):
        raise bad_type(name, "expected a float or a floating-point tensor, got bool")
    if isinstance(t, (int, float)):
        if not math.isfinite(t) or t < 0:
            raise bad_value(name, f"expected a finite value >= 0, got {t}")
        return float(t)
    if isinstance(t, torch.Tensor):
        if not t.is_floating_point():
            raise bad_type(name, f"expected a floating-point tensor, got dtype {t.dtype}")
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            shown = t.detach().cpu().flatten()[:8].tolist()
            raise bad_value(name, f"expected finite values >= 0, got {shown}")
        return t
    raise bad_type(name, f"expected a float or a floating-point tensor, got {type(t).__name__}")


def check_times(times: Sequence[float] | Tensor) -> list[float]:
    """Check the diffusion times of a picture or a table: at least one, each ``>= 0``.

    Args:
        times: a sequence of numbers or a 1-D tensor.

    Returns:
        The times as a list of floats, in the given order.

    Example:
        >>> check_times((0, 0.5, 2))
        [0.0, 0.5, 2.0]
    """
    import torch

    values = [float(t) for t in (times.tolist() if isinstance(times, torch.Tensor) else times)]
    if not values:
        raise bad_value("times", "expected at least one diffusion time, got none")
    if any(not t >= 0 for t in values):
        raise bad_value("times", f"expected diffusion times >= 0, got {values}")
    return values


def check_open_unit(name: str, value: object) -> float:
    """Check ``0 < value < 1``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_type(name, f"expected a float in (0, 1), got {type(value).__name__}")
    if not (0.0 < float(value) < 1.0):
        raise bad_value(name, f"expected a value in the open interval (0, 1), got {value}")
    return float(value)


def check_tol(tol: object) -> float:
    """Check a tolerance ``0 < tol < 1``."""
    return check_open_unit("tol", tol)


def check_coeffs(coeffs: object) -> list[float] | Tensor:
    """Check polynomial coefficients: a non-empty 1-D float sequence or tensor.

    A sequence is checked as Python numbers and returned as a list of floats, so no tensor is
    made here (the check also works while modules are built on the meta device).
    """
    import torch

    if isinstance(coeffs, torch.Tensor):
        if not coeffs.is_floating_point():
            raise bad_type("coeffs", f"expected a floating-point tensor, got dtype {coeffs.dtype}")
        if coeffs.dim() != 1 or coeffs.numel() == 0:
            raise bad_value(
                "coeffs", f"expected a non-empty 1-D sequence, got shape {tuple(coeffs.shape)}"
            )
        if coeffs.device.type != "meta" and not bool(torch.isfinite(coeffs).all()):
            raise bad_value("coeffs", "expected finite values, got NaN or inf")
        return coeffs
    if not isinstance(coeffs, Sequence) or isinstance(coeffs, str):
        raise bad_type("coeffs", f"expected a sequence of floats or a tensor, got {coeffs!r}")
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in coeffs):
        raise bad_type("coeffs", f"expected a sequence of numbers, got {coeffs!r}")
    if len(coeffs) == 0:
        raise bad_value("coeffs", "expected a non-empty 1-D sequence, got an empty one")
    values = [float(c) for c in coeffs]
    if not all(math.isfinite(c) for c in values):
        raise bad_value("coeffs", f"expected finite values, got {values}")
    return values


def check_bool(name: str, value: object) -> bool:
    """Check a flag: ``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise bad_type(name, f"expected a bool, got {type(value).__name__}")
    return value


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
    """A number in the open interval (0, 1); anything else is a ``ValueError`` (the tasks'
    split fractions, as they always did; :func:`check_open_unit` tells kind from value)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_value(name, f"expected a float in (0, 1), got {value!r}")
    if not 0.0 < float(value) < 1.0:
        raise bad_value(name, f"expected a float in (0, 1), got {value}")
    return float(value)


def check_folder(
    argument: str, folder: str | os.PathLike[str], *, inside: Iterable[str] = ()
) -> Path:
    """``folder`` as a :class:`~pathlib.Path`, unless following it (or ``folder/NAME`` for a
    NAME in ``inside``) runs into a loop of symbolic links: a ``ValueError`` naming
    ``argument`` then.

    Such a path looks missing to :meth:`pathlib.Path.exists`, and :meth:`pathlib.Path.resolve`
    raises a ``RuntimeError`` on it (Python < 3.13), so it is refused where it comes in. A path
    that does not exist, or a link to nothing, passes: what is to be made there is the
    caller's to check.

    Args:
        argument: the argument's name, for the error.
        folder: the path given.
        inside: names inside ``folder`` that must not be loops either (``("runs",)``).

    Example:
        >>> import tempfile
        >>> loop = Path(tempfile.mkdtemp()) / "loop"
        >>> loop.symlink_to(loop)
        >>> try:
        ...     check_folder("out", loop)
        ... except ValueError as err:
        ...     print(err.argument, "|", err.detail.split(" (")[0].replace(str(loop), "LOOP"))
        out | expected a folder, got LOOP, whose path runs into a loop of symbolic links
    """
    path = Path(folder)
    for candidate in (path, *(path / name for name in inside)):
        try:
            os.stat(candidate)
        except OSError as err:
            if err.errno != errno.ELOOP:
                continue  # missing, or not ours to judge here
            raise bad_value(
                argument,
                f"expected a folder, got {candidate}, whose path runs into a loop of symbolic "
                "links (links that lead back to themselves); remove or repoint the link",
            ) from None
    return path


def check_generator(generator: object) -> torch.Generator:
    """A CPU :class:`torch.Generator`."""
    import torch

    if not isinstance(generator, torch.Generator):
        raise bad_type("generator", f"expected a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise bad_value("generator", f"expected a CPU torch.Generator, got {generator.device}")
    return generator


def topk_and_graph(topk: int, graph: object) -> ArgumentValueError:
    """The error for ``topk`` given together with ``graph``: the command line's ``--topk K`` is
    the shorthand for ``--graph topk[k=K]``, so one of the two (an explicit ``--graph softmax``
    too)."""
    return bad_value(
        "topk",
        f"is shorthand for graph='topk[k={topk}]'; expected topk or graph, got both "
        f"(topk={topk}, graph={graph!r})",
    )
