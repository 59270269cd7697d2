"""Attention matrices drawn as graphs and as matrices, with top-k pruning.

Conventions (those of :mod:`heatformer.graph_ops`): row ``i`` of the weight matrix holds the
out-edges of node ``i``; for attention, query ``i`` attends to key ``j`` with weight
``W[i, j]``, drawn as an arrow ``i -> j`` (information flows the other way, from the key's
value to the query's output). Self-loops are kept and drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from heatformer.checks import bad_value
from heatformer.graph_ops import Graph
from heatformer.viz._common import (
    axes_or_new,
    colour_labels,
    finish_figure,
    single_graph,
    token_labels,
)
from heatformer.viz._layouts import arc_extent, arc_width, check_layout
from heatformer.viz.figures import PathLike, new_figure, save_figure

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.collections import Collection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

__all__ = [
    "draw_attention_graph",
    "draw_topk_pruning",
    "find_collection",
    "plot_attention_matrix",
    "plot_topk_pruning",
    "topk_title",
]


def draw_attention_graph(
    graph: Graph | Tensor,
    index: tuple[int, ...] | int | None = None,
    *,
    tokens: Sequence[str] | str | bytes | None = None,
    top_k: int | None = None,
    min_weight: float = 0.0,
    layout: str = "arc",
    self_loops: bool = True,
    node_values: Tensor | Sequence[float] | None = None,
    cmap: str = "YlOrRd",
    vmin: float | None = None,
    vmax: float | None = None,
    norm: Normalize | None = None,
    curvature: float | None = None,
    edge_width: float = 3.5,
    edge_alpha: float = 1.0,
    ax: Axes | None = None,
    title: str | None = None,
    save: PathLike | None = None,
) -> Figure:
    """Draw one attention graph: edge width and opacity by weight, nodes labelled by token.

    The graph is converted with :meth:`~heatformer.graph_ops.Graph.to_networkx` after the
    optional pruning :meth:`~heatformer.graph_ops.Graph.topk` (each node keeps its ``top_k``
    heaviest out-edges, renormalized to sum 1). Nodes are coloured by ``node_values``, by
    default the in-degree (the total attention a token receives: "attention sinks" stand
    out). The drawing is three collections (see :func:`find_collection`): ``"nodes"``,
    ``"edges"`` with one path per drawn edge, in the order of ``to_networkx().edges``, and
    ``"arrowheads"`` with one triangle per edge; arrows point from query to key. Each label is
    black or white, whichever reads better on its node, on a halo of the node's colour.

    Args:
        graph: any heatformer graph (e.g. a ``SoftmaxGraph`` of shape ``(B, H)``) or an
            ``(..., N, N)`` weight tensor.
        index: which graph of the batch, e.g. ``(b, h)``; ``None`` for an unbatched graph.
        tokens: node labels (a sequence of strings, or a ``str``/``bytes`` with one character
            per node); whitespace is shown as ``␣``, ``↵``, ``⇥``. Default: node numbers.
        top_k: keep only the ``top_k`` heaviest out-edges of every node (``1 <= top_k <= N``).
        min_weight: do not draw edges lighter than this (after pruning).
        layout: a key of :data:`LAYOUTS`.
        self_loops: draw self-loops (the diagonal of the attention matrix).
        node_values: ``(N,)`` values that colour the nodes (default: in-degree).
        cmap: matplotlib colormap name of the nodes.
        vmin, vmax: colour range of the nodes (default: the range of ``node_values``).
        norm: a matplotlib colour normalization of the nodes (overrides ``vmin``/``vmax``).
        curvature: how much edges bend (``rad`` of matplotlib's ``arc3``; default 0.45 for
            the arc layout, whose arcs then rise about 0.23 times their length, else 0.12).
        edge_width: line width of the heaviest edge, in points.
        edge_alpha: opacity of the heaviest edge (lighter edges are more transparent).
        ax: draw into this axes instead of a new figure.
        title: axes title.
        save: write the figure to this path (format from the suffix, e.g. ``.png``).

    Returns:
        The :class:`~matplotlib.figure.Figure` (the one holding ``ax`` when given).

    Raises:
        ValueError: unknown ``layout``, bad ``index``/``top_k``, wrong number of tokens or
            node values, negative ``min_weight``.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import SoftmaxGraph
        >>> q, k = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
        >>> fig = draw_attention_graph(SoftmaxGraph(q, k), index=0, tokens="hello", top_k=2)
        >>> len(find_collection(fig, "edges").get_paths())  # 5 tokens x 2 edges each
        10

    Over 80 lines for its eighteen parameters and their documentation only: the body
    checks, prunes and hands the drawing to ``_canvas``, ``_draw_nodes``, ``_draw_edges`` and
    ``_draw_labels``.
    """
    import numpy as np

    place = check_layout(layout)
    if isinstance(min_weight, bool) or not isinstance(min_weight, (int, float)) or min_weight < 0:
        raise bad_value("min_weight", f"expected a number >= 0, got {min_weight!r}")
    one = single_graph(graph, index)
    n = one.num_nodes
    labels = token_labels(tokens, n)
    pruned = one.topk(top_k) if top_k is not None else one
    g = pruned.to_networkx()
    edges = [
        (int(i), int(j), float(w))
        for i, j, w in g.edges(data="weight")
        if w > min_weight and (self_loops or i != j)
    ]
    values = _node_values(node_values, pruned, n)
    pos = place(g)
    xy = np.array([pos[i] for i in range(n)], dtype=float)  # (N, 2)
    rad = float(curvature) if curvature is not None else (0.45 if layout == "arc" else 0.12)
    down = any(j > i for i, j, _ in edges)  # some edge points right: arcs below the line too
    fig, ax, scale, spacing = _canvas(ax, layout, xy, rad, down)
    diameter = float(np.clip(0.85 * spacing * scale, 4.0, 24.0))  # node size in points
    _draw_nodes(ax, xy, values, diameter, cmap=cmap, norm=norm, vmin=vmin, vmax=vmax)
    _draw_edges(
        ax, xy, edges, rad=rad, radius=0.5 * diameter / scale, scale=scale, width=edge_width,
        alpha=edge_alpha, up=layout == "arc",
    )  # fmt: skip
    _draw_labels(ax, xy, labels, diameter)
    return finish_figure(fig, ax, title, save)


def _node_values(node_values: Tensor | Sequence[float] | None, graph: Graph, n: int) -> np.ndarray:
    """The ``(N,)`` colours of the nodes: ``node_values`` checked, or the in-degree."""
    import numpy as np

    if node_values is None:
        return graph.in_degree().numpy()
    values = np.asarray(
        node_values.detach().cpu() if isinstance(node_values, Tensor) else node_values,
        dtype=float,
    ).reshape(-1)
    if values.shape[0] != n:
        raise bad_value("node_values", f"expected {n} values (one per node), got {values.shape[0]}")
    return values


def _canvas(
    ax: Axes | None, layout: str, xy: np.ndarray, rad: float, down: bool
) -> tuple[Figure, Axes, float, float]:
    """The figure and equal-aspect axes of a drawing of nodes at ``xy``, limits set (an arc
    diagram's from its arcs, ``down``: some bend below the line), without axis lines.

    Returns:
        ``(figure, axes, points per data unit, node spacing in data units)``.
    """
    import numpy as np

    n = xy.shape[0]
    bottom, top = arc_extent(n, rad, down)
    if layout == "arc":
        width = arc_width(n)
        figsize = (width, width * (top - bottom) / (n + 1) + 0.5)
    else:
        figsize = (6.0, 6.0)
    fig, ax = axes_or_new(ax, figsize)
    spacing = _spacing(xy)
    if layout == "arc":
        limits = ((-1.0, float(n)), (bottom, top))
    else:
        pad = 0.12 * float(np.ptp(xy, axis=0).max() or 1.0) + 1.5 * spacing
        lo, hi = xy.min(0) - pad, xy.max(0) + pad
        limits = ((float(lo[0]), float(hi[0])), (float(lo[1]), float(hi[1])))
    ax.set_xlim(*limits[0])
    ax.set_ylim(*limits[1])
    ax.set_aspect("equal")
    ax.set_axis_off()
    return fig, ax, _points_per_unit(ax, limits), spacing


def _draw_nodes(
    ax: Axes,
    xy: np.ndarray,
    values: np.ndarray,
    diameter: float,
    *,
    cmap: str,
    norm: Normalize | None,
    vmin: float | None,
    vmax: float | None,
) -> None:
    """The nodes, ``diameter`` points wide, coloured by ``values``: the collection ``"nodes"``."""
    nodes = ax.scatter(
        xy[:, 0], xy[:, 1], s=diameter**2, c=values, cmap=cmap,
        norm=norm, vmin=None if norm is not None else vmin,
        vmax=None if norm is not None else vmax, edgecolors="0.3", linewidths=0.6, zorder=2,
    )  # fmt: skip
    nodes.set_gid("nodes")
    nodes.set_in_layout(False)  # inside the fixed limits; skipping it keeps layout fast


def _draw_labels(ax: Axes, xy: np.ndarray, labels: Sequence[str], diameter: float) -> None:
    """Each node's label at its centre, in a font that fits nodes of ``diameter`` points,
    coloured to read on its node (``colour_labels``), now and whenever the nodes' colour
    scale changes (``set_clim``, ``set_norm``, ``set_cmap``)."""
    import numpy as np

    font = float(np.clip(0.55 * diameter, 4.0, 9.0))
    for (x, y), label in zip(xy, labels):
        text = ax.text(
            x, y, label, ha="center", va="center", fontsize=font, zorder=3, in_layout=False,
            clip_on=True,
        )  # fmt: skip
        text.set_gid("node-label")
    nodes = find_collection(ax, "nodes")
    colour_labels(ax, nodes)
    nodes.callbacks.connect("changed", lambda _: colour_labels(ax, nodes))


def _spacing(xy: np.ndarray) -> float:
    """Median distance from a node to its nearest neighbour (1 for a single node)."""
    import numpy as np

    if xy.shape[0] < 2:
        return 1.0
    d = np.sqrt(((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1))  # (N, N)
    np.fill_diagonal(d, np.inf)
    return float(np.median(d.min(1)))


def _points_per_unit(ax: Axes, limits: tuple[tuple[float, float], tuple[float, float]]) -> float:
    """Typographic points per data unit of an equal-aspect axes with these limits."""
    fig = ax.figure.figure
    box = ax.get_position()  # figure fraction (before the constrained layout: approximate)
    width = box.width * fig.get_figwidth() * 72.0
    height = box.height * fig.get_figheight() * 72.0
    (x0, x1), (y0, y1) = limits
    return float(min(width / (x1 - x0), height / (y1 - y0)))


def _draw_edges(
    ax: Axes,
    xy: np.ndarray,
    edges: list[tuple[int, int, float]],
    *,
    rad: float,
    radius: float,
    scale: float,
    width: float,
    alpha: float,
    up: bool,
) -> None:
    """Every edge as a curved path in one collection, arrowheads in a second one.

    Edge ``i -> j`` is the quadratic Bezier curve of matplotlib's ``arc3`` connection style
    (control point ``mid + rad * (dy, -dx)``), cut where it enters the node circle of ``j``;
    a self-loop is a cubic loop pointing away from the centre (up in the arc layout). One
    collection with one path per edge draws thousands of edges in milliseconds.
    """
    import numpy as np
    from matplotlib.collections import PathCollection, PolyCollection
    from matplotlib.path import Path as MPath

    if not edges:
        return
    weights = np.array([w for _, _, w in edges])
    rel = weights / weights.max()
    colors = np.zeros((len(edges), 4))
    colors[:, :3] = (0.12, 0.28, 0.55)
    colors[:, 3] = alpha * (0.06 + 0.94 * rel)
    widths = 0.2 + (width - 0.2) * rel  # points
    centre = xy.mean(0)
    paths, heads = [], []
    ts = np.linspace(0.0, 1.0, 65)[:, None]  # (T, 1)
    for (i, j, _), lw in zip(edges, widths):
        p1, p2 = xy[i], xy[j]
        if i == j:
            u = np.array([0.0, 1.0]) if up else p1 - centre
            u = u / np.linalg.norm(u) if np.linalg.norm(u) > 1e-12 else np.array([0.0, 1.0])
            a, b = _rotate(u, 0.6), _rotate(u, -0.6)
            ctrl = [p1 + radius * a, p1 + 3.2 * radius * _rotate(u, 0.7),
                    p1 + 3.2 * radius * _rotate(u, -0.7), p1 + radius * b]  # fmt: skip
            paths.append(MPath(np.array(ctrl), [MPath.MOVETO] + [MPath.CURVE4] * 3))
            tip, direction = ctrl[3], ctrl[3] - ctrl[2]
        else:
            d = p2 - p1
            c = 0.5 * (p1 + p2) + rad * np.array([d[1], -d[0]])
            curve = (1 - ts) ** 2 * p1 + 2 * (1 - ts) * ts * c + ts**2 * p2  # (T, 2)
            outside = np.nonzero(np.linalg.norm(curve - p2, axis=1) >= radius)[0]
            t = float(ts[outside[-1], 0]) if outside.size else 0.5
            tip = (1 - t) ** 2 * p1 + 2 * (1 - t) * t * c + t**2 * p2
            ctrl1 = p1 + t * (c - p1)  # de Casteljau: the part of the curve up to t
            paths.append(
                MPath(np.array([p1, ctrl1, tip]), [MPath.MOVETO, MPath.CURVE3, MPath.CURVE3])
            )
            direction = 2 * (1 - t) * (c - p1) + 2 * t * (p2 - c)
        norm = np.linalg.norm(direction)
        direction = direction / norm if norm > 1e-12 else np.array([1.0, 0.0])
        length = (3.5 + 1.6 * lw) / scale
        normal = np.array([-direction[1], direction[0]])
        base = tip - length * direction
        heads.append([tip, base + 0.45 * length * normal, base - 0.45 * length * normal])
    lines = PathCollection(paths, facecolors="none", edgecolors=colors, linewidths=widths, zorder=1)
    lines.set_gid("edges")
    arrows = PolyCollection(heads, facecolors=colors, edgecolors="none", zorder=1)
    arrows.set_gid("arrowheads")
    for coll in (lines, arrows):
        coll.set_in_layout(False)  # within the axes limits; measuring every path is slow
        ax.add_collection(coll, autolim=False)


def _rotate(u: np.ndarray, angle: float) -> np.ndarray:
    import numpy as np

    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * u[0] - s * u[1], s * u[0] + c * u[1]])


def find_collection(fig_or_ax: Figure | Axes, gid: str) -> Collection:
    """The collection with this ``gid`` drawn by :func:`draw_attention_graph`.

    ``"nodes"`` (one marker per node), ``"edges"`` (one path per drawn edge) or
    ``"arrowheads"`` (one triangle per drawn edge).
    """
    from matplotlib.figure import FigureBase

    axes = fig_or_ax.axes if isinstance(fig_or_ax, FigureBase) else [fig_or_ax]
    for ax in axes:
        for coll in ax.collections:
            if coll.get_gid() == gid:
                return coll
    raise bad_value("gid", f"no collection {gid!r} in this figure")


def plot_attention_matrix(
    graph: Graph | Tensor,
    index: tuple[int, ...] | int | None = None,
    *,
    tokens: Sequence[str] | str | bytes | None = None,
    top_k: int | None = None,
    cmap: str = "Blues",
    ax: Axes | None = None,
    title: str | None = None,
    colorbar: bool = True,
    save: PathLike | None = None,
) -> Figure:
    """The attention matrix ``W`` as an image: row ``i`` (query) attends to column ``j`` (key).

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        index: which graph of the batch; ``None`` for an unbatched graph.
        tokens: row and column labels (see :func:`draw_attention_graph`).
        top_k: show the top-k pruned matrix (each row keeps ``top_k`` entries, renormalized).
        cmap: matplotlib colormap name.
        ax: draw into this axes instead of a new figure.
        title: axes title.
        colorbar: add a colorbar (one more axes).
        save: write the figure to this path.

    Returns:
        The :class:`~matplotlib.figure.Figure`; the axes holds one image.
    """
    one = single_graph(graph, index)
    if top_k is not None:
        one = single_graph(one.topk(top_k), None)
    n = one.num_nodes
    labels = token_labels(tokens, n)
    fig, ax = axes_or_new(ax, (5.2, 4.4))
    image = ax.imshow(one.to_dense().numpy(), cmap=cmap, vmin=0.0, interpolation="nearest")
    step = max(1, n // 40)
    ticks = list(range(0, n, step))
    font = 8 if n <= 32 else 6
    ax.set_xticks(ticks, [labels[i] for i in ticks], fontsize=font)
    ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=font)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if title is not None:
        ax.set_title(title, fontsize=10)
    if colorbar:
        fig.colorbar(image, ax=ax, shrink=0.8, label="weight W[i, j]")
    save_figure(fig, save)
    return fig


def plot_topk_pruning(
    graph: Graph | Tensor,
    index: tuple[int, ...] | int | None = None,
    *,
    ks: Sequence[int | None] = (None, 4, 2),
    tokens: Sequence[str] | str | bytes | None = None,
    layout: str = "arc",
    save: PathLike | None = None,
) -> Figure:
    """Top-k sparsification side by side: for each ``k``, the matrix (top) and the graph.

    ``None`` in ``ks`` is the full graph. Each pruned graph keeps exactly ``k`` out-edges per
    node, renormalized to sum 1 (:meth:`~heatformer.graph_ops.Graph.topk`).

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        index: which graph of the batch.
        ks: the values of ``k`` to show, one column each.
        tokens: node labels.
        layout: a key of :data:`LAYOUTS` for the graph row.
        save: write the figure to this path.

    Returns:
        A :class:`~matplotlib.figure.Figure` with ``2 * len(ks)`` axes (matrices first).
    """
    check_layout(layout)
    if len(ks) == 0:
        raise bad_value("ks", "expected at least one value of k (None = the full graph)")
    one = single_graph(graph, index)
    kept = [(topk_title(k), one if k is None else one.topk(k)) for k in ks]
    return draw_topk_pruning(kept, tokens=tokens, layout=layout, save=save)


def topk_title(k: int | None) -> str:
    """The name of the column of ``k`` in :func:`plot_topk_pruning`: ``"full attention"``
    for ``None``, else ``"top-k"``; name the graphs given to :func:`draw_topk_pruning` with it
    to match.

    Example:
        >>> topk_title(None), topk_title(4)
        ('full attention', 'top-4')
    """
    return "full attention" if k is None else f"top-{k}"


def draw_topk_pruning(
    kept: Sequence[tuple[str, Graph | Tensor]],
    *,
    tokens: Sequence[str] | str | bytes | None = None,
    layout: str = "arc",
    save: PathLike | None = None,
) -> Figure:
    """Given graphs side by side, one column each: the matrix (top) and the graph below it.

    The figure of :func:`plot_topk_pruning` for graphs pruned elsewhere (e.g. stored
    numbers): each column is :func:`plot_attention_matrix` titled with the column's name, and
    :func:`draw_attention_graph` (nodes coloured by in-degree, each column on its own colour
    scale) titled with the name and the number of edges (weights above 0).

    Args:
        kept: ``(name, graph)`` pairs, one column each in order; every graph is unbatched
            (a heatformer graph or an ``(N, N)`` weight tensor), all with the same ``N``.
            :func:`topk_title` gives :func:`plot_topk_pruning`'s names.
        tokens: node labels (see :func:`draw_attention_graph`).
        layout: a key of :data:`LAYOUTS` for the graph row.
        save: write the figure to this path.

    Returns:
        A :class:`~matplotlib.figure.Figure` with ``2 * len(kept)`` axes: the matrices, then
        the graphs.

    Raises:
        ValueError: no graphs, graphs of different sizes, a batched graph, unknown ``layout``.
    """
    check_layout(layout)
    if len(kept) == 0:
        raise bad_value("kept", "expected at least one (name, graph) pair")
    graphs = [(str(name), single_graph(g, None)) for name, g in kept]
    sizes = [g.num_nodes for _, g in graphs]
    if len(set(sizes)) != 1:
        raise bad_value("kept", f"expected graphs with one number of nodes, got {sizes}")
    n = sizes[0]
    cols = len(graphs)
    width = max(4.2 * cols, 0.16 * n * cols)
    graph_height = 0.35 if layout == "arc" else 1.0  # relative to the matrix row
    fig = new_figure((width, (width / cols) * (1.0 + graph_height) + 0.6))
    grid = fig.add_gridspec(2, cols, height_ratios=[1.0, graph_height])
    mat_axes = [fig.add_subplot(grid[0, c]) for c in range(cols)]
    graph_axes = [fig.add_subplot(grid[1, c]) for c in range(cols)]
    for c, (name, pruned) in enumerate(graphs):
        plot_attention_matrix(pruned, tokens=tokens, ax=mat_axes[c], title=name, colorbar=False)
        draw_attention_graph(pruned, tokens=tokens, layout=layout, ax=graph_axes[c])
        count = int((pruned.to_dense() > 0).sum())
        graph_axes[c].set_title(f"{name}: {count} edges", fontsize=9)
    save_figure(fig, save)
    return fig
