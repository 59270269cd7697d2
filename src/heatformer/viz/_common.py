"""Shared plumbing of :mod:`heatformer.viz`: axes or a new figure, one graph of a batch, labels.

The public half of the plumbing, figures on an Agg canvas and saving them, is
:mod:`heatformer.viz.figures`; what is here only ``viz``'s own modules use (and
:func:`token_labels`, public as ``heatformer.viz.token_labels``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value
from heatformer.graph_ops import DenseGraph, Graph
from heatformer.viz.figures import PathLike, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.collections import Collection
    from matplotlib.figure import Figure

#: Glyphs for whitespace and control bytes in token labels.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """``(figure, axes)``: the given axes and its figure, or a new single-axes figure."""
    if ax is None:
        fig = new_figure(figsize)
        return fig, fig.add_subplot()
    root = ax.figure.figure  # the root Figure, also for an Axes in a SubFigure
    return cast("Figure", root), ax


def finish_figure(fig: Figure, ax: Axes, title: str | None, save: PathLike | None) -> Figure:
    """The last steps of every ``viz`` figure: the axes' ``title`` (when given), then
    :func:`~heatformer.viz.figures.save_figure`; returns ``fig``."""
    if title is not None:
        ax.set_title(title, fontsize=10)
    save_figure(fig, save)
    return fig


def single_graph(graph: Graph | Tensor, index: tuple[int, ...] | int | None) -> DenseGraph:
    """One graph of a batch as an unbatched float64 :class:`DenseGraph` (detached, on CPU).

    Args:
        graph: any heatformer graph, or a dense ``(..., N, N)`` weight tensor.
        index: which graph of the batch, e.g. ``(b, h)``; ``None`` for an unbatched graph.

    Raises:
        TypeError: ``graph`` is neither a Graph nor a tensor.
        ValueError: ``index`` does not select exactly one graph.
    """
    if isinstance(graph, Tensor):
        graph = DenseGraph(graph.detach().to(torch.float64))
    if not isinstance(graph, Graph):
        raise bad_type(
            "graph", f"expected a heatformer Graph or an (N, N) tensor, got {type(graph).__name__}"
        )
    if index is None:
        index = ()
    if isinstance(index, int):
        index = (index,)
    batch = tuple(graph.batch_shape)
    if len(index) != len(batch):
        raise bad_value(
            "index",
            f"the graph has batch shape {batch}; expected an index with {len(batch)} entries "
            f"selecting one graph, got {index!r}",
        )
    for i, (j, size) in enumerate(zip(index, batch)):
        if not -size <= j < size:
            raise bad_value("index", f"entry {i} must lie in [0, {size}), got {j}")
    dense = graph.to_dense().detach()
    dense = dense[index] if index else dense
    return DenseGraph(dense.to(device="cpu", dtype=torch.float64))


def token_labels(tokens: Sequence[str] | str | bytes | None, num_nodes: int) -> list[str]:
    """Readable node labels: the given tokens (whitespace made visible) or ``0 ... N-1``.

    Args:
        tokens: one label per node, or a ``str``/``bytes`` whose characters are the tokens.
        num_nodes: ``N``.

    Raises:
        ValueError: the number of tokens is not ``N``.

    Example:
        >>> token_labels("a b", 3)
        ['a', '␣', 'b']
    """
    if tokens is None:
        return [str(i) for i in range(num_nodes)]
    if isinstance(tokens, bytes):
        tokens = [chr(b) for b in tokens]
    labels = [_visible(str(t)) for t in tokens]
    if len(labels) != num_nodes:
        raise bad_value("tokens", f"expected {num_nodes} labels (one per node), got {len(labels)}")
    return labels


def relative_luminance(rgb: Sequence[float]) -> float:
    """The WCAG 2 relative luminance of an sRGB colour with channels in ``[0, 1]``.

    Example:
        >>> relative_luminance((1.0, 1.0, 1.0)), relative_luminance((0.0, 0.0, 0.0))
        (1.0, 0.0)
    """
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The WCAG 2 contrast ratio of two sRGB colours (channels in ``[0, 1]``), 1 to 21."""
    la, lb = relative_luminance(a), relative_luminance(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def text_colour_on(background: Sequence[float]) -> tuple[float, float, float]:
    """Black or white, whichever contrasts more with ``background`` (sRGB in ``[0, 1]``).

    The better of the two always has a contrast ratio of at least 4.58 (WCAG AA asks 4.5 for
    text): white on a background darker than relative luminance 0.179, black on the others.

    Example:
        >>> text_colour_on((0.5, 0.0, 0.15))  # dark red: white text
        (1.0, 1.0, 1.0)
        >>> text_colour_on((1.0, 1.0, 0.8))  # pale yellow: black text
        (0.0, 0.0, 0.0)
    """
    white, black = (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)
    return white if contrast_ratio(white, background) > contrast_ratio(black, background) else black


def colour_labels(ax: Axes, nodes: Collection) -> None:
    """Colour the node labels of ``ax`` (texts with gid ``"node-label"``) for the current
    colours of ``nodes``: black or white, whichever contrasts more with the node (a WCAG
    contrast ratio of at least 4.5), on a halo of the node's colour, so that a label wider
    than its node reads too.

    :func:`~heatformer.viz.draw_attention_graph` calls it, and again whenever the nodes'
    colour scale changes; call it after ``set_array`` on the ``"nodes"`` collection.
    """
    from matplotlib.patheffects import withStroke

    values = nodes.get_array()
    if values is None:  # pragma: no cover - draw_attention_graph always colours by value
        return
    colours = nodes.to_rgba(values)  # (N, 4): what the nodes are drawn in
    texts = [t for t in ax.texts if t.get_gid() == "node-label"]
    for text, colour in zip(texts, colours):
        halo = max(1.5, 0.4 * float(text.get_fontsize()))  # points
        text.set_color(text_colour_on(colour))
        text.set_path_effects([withStroke(linewidth=halo, foreground=colour)])


def _visible(token: str) -> str:
    out = "".join(_VISIBLE.get(c, c if c.isprintable() else "·") for c in token)
    return out or "∅"
