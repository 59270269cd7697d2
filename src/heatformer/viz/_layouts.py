"""Where the nodes of an attention-graph drawing go: the layouts by name, and the size of an
arc diagram (shared by :mod:`heatformer.viz.graphs` and :mod:`heatformer.viz.diffusion`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from heatformer._optional import require
from heatformer.checks import check_choice

if TYPE_CHECKING:
    import networkx as nx

Position = dict[int, tuple[float, float]]


def _arc_layout(g: nx.DiGraph) -> Position:
    return {int(i): (float(i), 0.0) for i in g.nodes}


def _circular_layout(g: nx.DiGraph) -> Position:
    nx = require("networkx", "viz", feature="the circular layout")

    # clockwise from the top, so token 0 sits at 12 o'clock and the sentence reads around
    pos = nx.circular_layout(sorted(g.nodes))
    return {int(i): (float(p[1]), float(p[0])) for i, p in pos.items()}


def _spring_layout(g: nx.DiGraph) -> Position:
    nx = require("networkx", "viz", feature="the spring layout")

    pos = nx.spring_layout(g.to_undirected(), weight="weight", seed=0)
    return {int(i): (float(p[0]), float(p[1])) for i, p in pos.items()}


def _kamada_kawai_layout(g: nx.DiGraph) -> Position:
    nx = require("networkx", "viz", feature="the kamada_kawai layout")
    require("scipy", "viz", feature="the kamada_kawai layout")  # networkx solves with it

    pos = nx.kamada_kawai_layout(g.to_undirected(), weight=None)
    return {int(i): (float(p[0]), float(p[1])) for i, p in pos.items()}


#: Node layouts by name. ``"arc"`` puts the tokens on a line in reading order and bends every
#: edge into an arc (an arc diagram, the clearest view of a sentence); ``"circular"`` puts them
#: on a circle clockwise from the top; ``"spring"`` and ``"kamada_kawai"`` place strongly
#: connected tokens close together (deterministic: fixed seed).
LAYOUTS: dict[str, Callable[[nx.DiGraph], Position]] = {
    "arc": _arc_layout,
    "circular": _circular_layout,
    "spring": _spring_layout,
    "kamada_kawai": _kamada_kawai_layout,
}


def check_layout(layout: str) -> Callable[[nx.DiGraph], Position]:
    """The layout function of the name ``layout``, a key of :data:`LAYOUTS`, or a
    ``ValueError`` that lists the keys."""
    return LAYOUTS[check_choice("layout", layout, sorted(LAYOUTS))]


def arc_width(n: int) -> float:
    """Figure width in inches of an arc diagram on ``n`` nodes."""
    return max(6.0, 0.32 * n + 2)


def arc_extent(n: int, rad: float, down: bool) -> tuple[float, float]:
    """``(bottom, top)`` data limits of an arc diagram: an arc over a distance ``d`` rises
    ``rad * d / 2``; edges ``i -> j`` with ``j < i`` bend up, the others down."""
    top = 0.5 * abs(rad) * (n - 1) + 0.9
    return (-top if down else -0.9), top
