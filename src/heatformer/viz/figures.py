"""Figures on an Agg canvas: the plumbing to compose :mod:`heatformer.viz`'s drawings.

matplotlib is the optional ``viz`` extra, so it is imported only when a plot is made, and a
missing install raises an :class:`ImportError` that says what to install
(:func:`require_matplotlib`). Figures are built with the object-oriented API on an Agg canvas
(:func:`new_figure`: a :class:`matplotlib.figure.Figure` + ``FigureCanvasAgg``): no pyplot
state, no global backend switch, no window; a figure is freed as soon as the caller drops it.
:func:`save_figure` writes one, its format from the path's suffix.

A figure of one's own, with two of ``viz``'s axes-level drawings side by side:

Example:
    >>> import torch
    >>> from heatformer.viz import draw_frequency_responses, draw_operator_outputs
    >>> lam = torch.linspace(0.0, 2.0, 5, dtype=torch.float64)
    >>> fig = new_figure((10.0, 4.0))
    >>> left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    >>> _ = draw_frequency_responses(lam, {"attention 1 − λ": 1 - lam}, ax=left)
    >>> x = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    >>> _ = draw_operator_outputs(x, {"halved": x / 2}, ax=right)
    >>> len(fig.axes)
    2
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from heatformer._optional import require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PathLike", "new_figure", "require_matplotlib", "save_figure"]

#: A path where a figure is written: a ``str`` or an :class:`os.PathLike`.
PathLike = str | os.PathLike[str]


def require_matplotlib() -> None:
    """Import matplotlib or raise an :class:`ImportError` naming the ``viz`` extra.

    Raises:
        ImportError: matplotlib is not installed; the message says
            ``pip install 'heatformer[viz]'``.
    """
    require("matplotlib", "viz", feature="heatformer.viz")


def new_figure(figsize: tuple[float, float], **kwargs: object) -> Figure:
    """A new :class:`~matplotlib.figure.Figure` on an Agg canvas, with constrained layout.

    No pyplot: the figure belongs to the caller alone and is freed when dropped.

    Args:
        figsize: ``(width, height)`` in inches.
        **kwargs: more keyword arguments of :class:`~matplotlib.figure.Figure`
            (e.g. ``dpi``).

    Returns:
        The empty :class:`~matplotlib.figure.Figure`; add axes with ``fig.add_subplot``.

    Raises:
        ImportError: matplotlib is missing (see :func:`require_matplotlib`).
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained", **kwargs)  # type: ignore[arg-type]
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, save: PathLike | None, *, dpi: int = 110) -> None:
    """Write ``fig`` to ``save`` when given (nothing when ``None``).

    Args:
        fig: the figure.
        save: the path; its suffix gives the format (``.png``, ``.svg``, ``.pdf``, ...);
            missing folders are created.
        dpi: resolution of a raster format.
    """
    if save is None:
        return
    path = Path(save)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
