r"""Heat diffusion of a signal on an attention graph, as a strip of frames or an animated GIF.

A frame at time ``t`` is ``u(t) = exp(-t L) x`` (:func:`~heatformer.graph_ops.heat_kernel`),
the output of a heat head with diffusion time ``t`` on the value channel ``x``. With the
default random-walk Laplacian of an attention graph, ``L = I - P``, entry ``i`` of ``u(t)``
for a one-hot ``x = e_j`` is how much of token ``j``'s value has reached token ``i``'s output
(on a causal graph, only tokens ``i >= j`` hear it). ``u(t)`` keeps constants constant (rows
of ``P`` sum to 1) and tends to a weighted average as ``t`` grows. With the combinatorial
Laplacian ``L = D - W`` of a symmetric graph, heat is conserved: ``sum_i u_i(t) = sum_i x_i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value, check_times
from heatformer.graph_ops import DenseGraph, Graph, heat_kernel
from heatformer.viz._common import colour_labels, single_graph
from heatformer.viz._layouts import arc_extent, arc_width, check_layout
from heatformer.viz.figures import PathLike, new_figure, save_figure
from heatformer.viz.graphs import draw_attention_graph, find_collection

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

__all__ = [
    "animate_heat_diffusion",
    "draw_heat_strip",
    "heat_diffusion_frames",
    "plot_heat_diffusion",
    "write_heat_gif",
]


def _signal(signal: int | Tensor | Sequence[float], n: int) -> Tensor:
    if isinstance(signal, bool):
        raise bad_type("signal", f"expected a node index or an (N,) tensor, got {signal!r}")
    if isinstance(signal, int):
        if not -n <= signal < n:
            raise bad_value("signal", f"expected a node index in [0, {n}), got {signal}")
        x = torch.zeros(n, dtype=torch.float64)
        x[signal] = 1.0
        return x
    x = torch.as_tensor(
        signal.detach().cpu() if isinstance(signal, Tensor) else signal, dtype=torch.float64
    )
    if x.shape != (n,):
        raise bad_value("signal", f"expected a node index or shape ({n},), got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise bad_value("signal", "expected finite values, got NaN or inf")
    return x


def heat_diffusion_frames(
    graph: Graph | Tensor,
    signal: int | Tensor | Sequence[float],
    times: Sequence[float] | Tensor,
    *,
    index: tuple[int, ...] | int | None = None,
    normalization: str = "rw",
    method: str = "exact",
) -> Tensor:
    """The heat flow ``exp(-t L) x`` of a signal at several times (the numbers behind a plot).

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        signal: a node index (a one-hot "drop of heat" on that node) or an ``(N,)`` signal.
        times: diffusion times ``t >= 0``.
        index: which graph of the batch; ``None`` for an unbatched graph.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        method: ``"exact"`` (default: the matrix exponential, exact to rounding, fine for the
            small graphs one draws), ``"series"`` or ``"auto"`` (see
            :data:`~heatformer.graph_ops.HEAT_METHODS`).

    Returns:
        ``(T, N)`` float64 tensor, row ``s`` the signal at ``times[s]``.

    Example:
        >>> import torch  # a path 0 - 1 - 2, combinatorial Laplacian: heat is conserved
        >>> w = torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]])
        >>> frames = heat_diffusion_frames(w, 0, [0.0, 1.0, 50.0], normalization="combinatorial")
        >>> frames.sum(-1)
        tensor([1., 1., 1.], dtype=torch.float64)
        >>> frames[-1]   # spread evenly in the end
        tensor([0.3333, 0.3333, 0.3333], dtype=torch.float64)
    """
    one = single_graph(graph, index)
    x = _signal(signal, one.num_nodes).unsqueeze(-1)  # (N, 1)
    frames = [
        heat_kernel(one, x, t, normalization=normalization, method=method).squeeze(-1)
        for t in check_times(times)
    ]
    return torch.stack(frames)  # (T, N)


def _heat_norm(frames: Tensor, gamma: float) -> Normalize:
    """A shared colour scale; a power law (``gamma < 1``) makes faint heat visible."""
    from matplotlib.colors import Normalize, PowerNorm

    lo, hi = float(frames.min()), float(frames.max())
    if hi <= lo:
        hi = lo + 1.0
    if lo >= 0.0 and gamma != 1.0:
        return PowerNorm(gamma, vmin=0.0, vmax=hi)
    return Normalize(min(lo, 0.0), hi)


def plot_heat_diffusion(
    graph: Graph | Tensor,
    signal: int | Tensor | Sequence[float],
    times: Sequence[float] | Tensor = (0.0, 0.5, 1.0, 2.0, 4.0),
    *,
    index: tuple[int, ...] | int | None = None,
    normalization: str = "rw",
    tokens: Sequence[str] | str | bytes | None = None,
    layout: str = "arc",
    top_k: int | None = 2,
    cmap: str = "YlOrRd",
    gamma: float = 0.5,
    save: PathLike | None = None,
) -> Figure:
    """A strip of frames of the heat flow ``exp(-t L) x``: the graph with nodes coloured by heat.

    Frames are stacked top to bottom for the ``"arc"`` layout (each frame is one line of
    tokens) and left to right otherwise; all share one colour scale, shown by a colorbar.
    :func:`heat_diffusion_frames` computes them, :func:`draw_heat_strip` draws them.

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        signal: a node index (one-hot) or an ``(N,)`` signal.
        times: diffusion times, one frame each.
        index: which graph of the batch.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        tokens: node labels.
        layout: a key of :data:`~heatformer.viz.LAYOUTS`.
        top_k: edges drawn per node (the diffusion always uses the full graph); ``None``
            draws every edge.
        cmap: matplotlib colormap of the heat.
        gamma: colour scale ``(u / max u) ** gamma`` for non-negative heat, so that faint
            heat far from the source shows (1 = linear); the colour bar's label says so
            (``colour ∝ √value`` for the default 0.5).
        save: write the figure to this path.

    Returns:
        A :class:`~matplotlib.figure.Figure` with one axes per time plus the colorbar's.
    """
    check_layout(layout)
    one = single_graph(graph, index)
    ts = check_times(times)
    frames = heat_diffusion_frames(one, signal, ts, normalization=normalization)
    return draw_heat_strip(
        one, ts, frames, tokens=tokens, layout=layout, top_k=top_k, cmap=cmap, gamma=gamma,
        label=f"heat exp(−tL) x  ({normalization})", save=save,
    )  # fmt: skip


def _checked_frames(
    graph: Graph | Tensor, times: Sequence[float] | Tensor, frames: Tensor
) -> tuple[DenseGraph, list[float], Tensor]:
    """``(graph, times, frames)`` of :func:`draw_heat_strip` and :func:`write_heat_gif`
    checked: one float64 graph on the CPU, the times as floats, frames ``(T, N)`` float64."""
    one = single_graph(graph, None)
    ts = check_times(times)
    if not isinstance(frames, Tensor):
        raise bad_type("frames", f"expected a (T, N) tensor, got {type(frames).__name__}")
    expected = (len(ts), one.num_nodes)
    if tuple(frames.shape) != expected:
        raise bad_value(
            "frames", f"expected shape {expected} (one row per time), got {tuple(frames.shape)}"
        )
    return one, ts, frames.detach().to("cpu", torch.float64)


def draw_heat_strip(
    graph: Graph | Tensor,
    times: Sequence[float] | Tensor,
    frames: Tensor,
    *,
    tokens: Sequence[str] | str | bytes | None = None,
    layout: str = "arc",
    top_k: int | None = 2,
    cmap: str = "YlOrRd",
    gamma: float = 0.5,
    label: str = "heat",
    totals: bool = False,
    save: PathLike | None = None,
) -> Figure:
    """A strip of given frames on a graph: one axes per time, nodes coloured by the frame.

    The figure of :func:`plot_heat_diffusion` for frames computed elsewhere (e.g. the heat
    flow of another operator, or stored numbers): each axes is :func:`draw_attention_graph`
    with the nodes coloured by one row of ``frames`` and titled ``t = ...``; all share one
    colour scale, shown by a colour bar. Frames are stacked top to bottom for the ``"arc"``
    layout and left to right otherwise.

    Args:
        graph: one unbatched graph (a heatformer graph or an ``(N, N)`` weight tensor).
        times: the frames' times ``t >= 0``, one each.
        frames: ``(T, N)``: row ``s`` the values of the nodes at ``times[s]``.
        tokens: node labels.
        layout: a key of :data:`~heatformer.viz.LAYOUTS`.
        top_k: edges drawn per node; ``None`` draws every edge.
        cmap: matplotlib colormap of the values.
        gamma: colour scale exponent for non-negative values (see
            :func:`plot_heat_diffusion`).
        label: the colour bar's label (it adds ``colour ∝ √value`` when ``gamma`` is 0.5).
        totals: add each frame's total ``Σ_i u_i(t)`` to its title.
        save: write the figure to this path.

    Returns:
        A :class:`~matplotlib.figure.Figure` with one axes per time plus the colorbar's.

    Raises:
        ValueError: unknown ``layout``, bad ``times``, ``frames`` not of shape ``(T, N)``.
    """
    check_layout(layout)
    one, ts, frames = _checked_frames(graph, times, frames)
    norm = _heat_norm(frames, gamma)
    n, count = one.num_nodes, len(ts)
    if layout == "arc":
        drawn = (one.topk(top_k) if top_k is not None else one).to_dense()
        bottom, top = arc_extent(n, 0.2, bool(drawn.triu(1).gt(0).any()))
        width = arc_width(n)
        fig = new_figure((width + 1.2, count * (width * (top - bottom) / (n + 1) + 0.5)))
        axes = [fig.add_subplot(count, 1, s + 1) for s in range(count)]
    else:
        fig = new_figure((3.4 * count + 1.0, 3.8))
        axes = [fig.add_subplot(1, count, s + 1) for s in range(count)]
    for ax, t, frame in zip(axes, ts, frames):
        draw_attention_graph(
            one, tokens=tokens, top_k=top_k, layout=layout, node_values=frame, cmap=cmap,
            norm=norm, curvature=0.2 if layout == "arc" else None, edge_width=2.0,
            edge_alpha=0.45, ax=ax,
            title=f"t = {t:g}" + (f",  total {float(frame.sum()):.4f}" if totals else ""),
        )  # fmt: skip
    _colorbar(fig, axes, cmap, norm, label)
    save_figure(fig, save)
    return fig


def _scale_note(norm: Normalize) -> str:
    """How colour follows value under ``norm``: ``""`` when linearly, else e.g.
    ``"colour ∝ √value"`` (a :class:`~matplotlib.colors.PowerNorm`)."""
    from matplotlib.colors import PowerNorm

    if not isinstance(norm, PowerNorm) or norm.gamma == 1.0:
        return ""
    return "colour ∝ √value" if norm.gamma == 0.5 else f"colour ∝ value^{norm.gamma:g}"


def _colorbar(fig: Figure, axes: list[Axes], cmap: str, norm: Normalize, label: str) -> None:
    """The colour bar of the heat frames, its label saying when the scale is not linear."""
    from matplotlib.cm import ScalarMappable

    note = _scale_note(norm)
    label = f"{label}  ({note})" if note else label
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, shrink=0.6, label=label)


def _gif_path(save: PathLike) -> Path:
    path = Path(save)
    if path.suffix.lower() != ".gif":
        raise bad_value("save", f"expected a path ending in .gif, got {str(save)!r}")
    return path


def _check_fps(fps: int) -> None:
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        raise bad_value("fps", f"expected a positive int, got {fps!r}")


def animate_heat_diffusion(
    graph: Graph | Tensor,
    signal: int | Tensor | Sequence[float],
    times: Sequence[float] | Tensor | None = None,
    *,
    save: PathLike,
    index: tuple[int, ...] | int | None = None,
    normalization: str = "rw",
    tokens: Sequence[str] | str | bytes | None = None,
    layout: str = "arc",
    top_k: int | None = 2,
    cmap: str = "YlOrRd",
    gamma: float = 0.5,
    fps: int = 6,
    dpi: int = 80,
) -> Path:
    """An animated GIF of the heat flow (matplotlib's ``PillowWriter``; Pillow is needed).

    The graph is drawn once; each frame only recolours the nodes, so a long animation is cheap.
    :func:`heat_diffusion_frames` computes the frames, :func:`write_heat_gif` writes them.

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        signal: a node index (one-hot) or an ``(N,)`` signal.
        times: diffusion times, one frame each (default: 24 times from 0 to 6).
        save: the ``.gif`` path to write (required).
        index: which graph of the batch.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        tokens: node labels.
        layout: a key of :data:`~heatformer.viz.LAYOUTS`.
        top_k: edges drawn per node (``None``: all).
        cmap: matplotlib colormap of the heat.
        gamma: colour scale exponent (see :func:`plot_heat_diffusion`).
        fps: frames per second.
        dpi: resolution of the frames.

    Returns:
        The path of the written GIF.

    Raises:
        ValueError: ``save`` does not end in ``.gif``; bad times, signal or layout.
        ImportError: matplotlib or Pillow is missing.
    """
    _gif_path(save)
    _check_fps(fps)
    ts = check_times(times if times is not None else torch.linspace(0.0, 6.0, 24))
    one = single_graph(graph, index)
    frames = heat_diffusion_frames(one, signal, ts, normalization=normalization)
    return write_heat_gif(
        one, ts, frames, save=save, tokens=tokens, layout=layout, top_k=top_k, cmap=cmap,
        gamma=gamma, label=f"heat exp(−tL) x  ({normalization})", title="heat flow exp(−tL) x",
        fps=fps, dpi=dpi,
    )  # fmt: skip


def write_heat_gif(
    graph: Graph | Tensor,
    times: Sequence[float] | Tensor,
    frames: Tensor,
    *,
    save: PathLike,
    tokens: Sequence[str] | str | bytes | None = None,
    layout: str = "arc",
    top_k: int | None = 2,
    cmap: str = "YlOrRd",
    gamma: float = 0.5,
    label: str = "heat",
    title: str = "heat flow",
    fps: int = 6,
    dpi: int = 80,
) -> Path:
    """An animated GIF of given frames on a graph, one GIF frame per time.

    The GIF of :func:`animate_heat_diffusion` for frames computed elsewhere: the graph is
    drawn once (:func:`draw_attention_graph`, with a colour bar on one scale for all frames);
    each frame recolours the nodes with one row of ``frames`` and retitles the axes
    ``"{title}, t = ..., total ..."``. Needs Pillow (a matplotlib dependency).

    Args:
        graph: one unbatched graph (a heatformer graph or an ``(N, N)`` weight tensor).
        times: the frames' times ``t >= 0``, one each.
        frames: ``(T, N)``: row ``s`` the values of the nodes at ``times[s]``.
        save: the ``.gif`` path to write (required; missing folders are created).
        tokens: node labels.
        layout: a key of :data:`~heatformer.viz.LAYOUTS`.
        top_k: edges drawn per node (``None``: all).
        cmap: matplotlib colormap of the values.
        gamma: colour scale exponent (see :func:`plot_heat_diffusion`).
        label: the colour bar's label.
        title: what the frames show; each frame's title adds its time and total.
        fps: frames per second.
        dpi: resolution of the frames.

    Returns:
        The path of the written GIF.

    Raises:
        ValueError: ``save`` does not end in ``.gif``; bad ``fps``, ``times``, ``layout``;
            ``frames`` not of shape ``(T, N)``.
        ImportError: matplotlib or Pillow is missing.
    """
    path = _gif_path(save)
    _check_fps(fps)
    check_layout(layout)
    one, ts, frames = _checked_frames(graph, times, frames)
    norm = _heat_norm(frames, gamma)
    fig = draw_attention_graph(
        one, tokens=tokens, top_k=top_k, layout=layout, node_values=frames[0], cmap=cmap,
        norm=norm, curvature=0.3 if layout == "arc" else None, edge_width=2.0, edge_alpha=0.45,
    )  # fmt: skip
    ax = fig.axes[0]
    nodes = find_collection(ax, "nodes")
    _colorbar(fig, [ax], cmap, norm, label)
    try:
        from matplotlib.animation import PillowWriter
    except ImportError as err:  # pragma: no cover - Pillow is a matplotlib dependency
        raise ImportError("write_heat_gif needs Pillow: pip install pillow") from err
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.canvas.draw()  # lay out once, then freeze the layout: frames only recolour nodes
    fig.set_layout_engine("none")
    writer = PillowWriter(fps=fps)
    with writer.saving(fig, str(path), dpi):
        for t, frame in zip(ts, frames):
            nodes.set_array(frame.numpy())
            colour_labels(ax, nodes)  # the labels read on the nodes' new colours
            ax.set_title(f"{title}, t = {t:.2f}, total {float(frame.sum()):.3f}", fontsize=10)
            writer.grab_frame()
    return path
