"""Per-layer plots of token-geometry metrics, one line per model configuration.

The metrics come from :mod:`heatformer.analysis` (within-sequence variance, Neural Collapse,
Dirichlet energy, ...) evaluated on each layer's token states; this module only draws them,
so any ``{config_name: [value per layer]}`` works.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from heatformer.checks import bad_value
from heatformer.viz._common import PathLike, axes_or_new, finish_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_per_layer"]


def plot_per_layer(
    values: Mapping[str, Sequence[float] | Tensor],
    *,
    ylabel: str = "value",
    title: str | None = None,
    logy: bool = False,
    first_layer: int = 0,
    ax: Axes | None = None,
    save: PathLike | None = None,
) -> Figure:
    """One metric across layers, one line per configuration.

    Args:
        values: ``{config_name: [value at layer 0, value at layer 1, ...]}``; configurations
            may have different depths.
        ylabel: what the values are, e.g. ``"within-sequence variance"``.
        title: axes title.
        logy: logarithmic y axis (values must then be positive).
        first_layer: the layer number of the first value (e.g. 0 for the embeddings).
        ax: draw into this axes instead of a new figure.
        save: write the figure to this path.

    Returns:
        The :class:`~matplotlib.figure.Figure`; its axes has one line per configuration, in
        the order of ``values``, labelled by the configuration name.

    Raises:
        ValueError: no configurations, an empty or non-finite list, or non-positive values
            with ``logy``.

    Example:
        >>> fig = plot_per_layer({"attention:4": [1.0, 0.5, 0.2], "laplacian:4": [1.0, 0.9, 0.8]})
        >>> [line.get_label() for line in fig.axes[0].get_lines()]
        ['attention:4', 'laplacian:4']
    """
    if not isinstance(values, Mapping) or len(values) == 0:
        raise bad_value(
            "values",
            f"expected a non-empty mapping {{config_name: [value per layer]}}, got {values!r}",
        )
    series: dict[str, list[float]] = {}
    for name, seq in values.items():
        ys = [
            float(v)
            for v in (seq.detach().reshape(-1).tolist() if isinstance(seq, Tensor) else seq)
        ]
        if not ys:
            raise bad_value("values", f"expected at least one value for {name!r}, got none")
        if not all(math.isfinite(y) for y in ys):
            raise bad_value("values", f"expected finite values for {name!r}, got {ys}")
        if logy and min(ys) <= 0:
            raise bad_value("values", f"for {name!r}: logy needs positive values, got {ys}")
        series[str(name)] = ys
    fig, ax = axes_or_new(ax, (6.0, 4.0))
    depth = 0
    for name, ys in series.items():
        layers = range(first_layer, first_layer + len(ys))
        ax.plot(list(layers), ys, marker="o", lw=1.8, label=name)
        depth = max(depth, len(ys))
    if logy:
        ax.set_yscale("log")
    if depth <= 24:
        ax.set_xticks(list(range(first_layer, first_layer + depth)))
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return finish_figure(fig, ax, title, save)
