r"""Graph Laplacians of attention graphs, as operator actions and as dense matrices.

Conventions: ``W`` is the (directed) weight matrix with rows = out-edges (queries),
``D_out = diag(W 1)``, self-loops are kept, and ``A^+`` is the pseudo-inverse of a diagonal
(``1/d`` where ``d > 0``, else 0). The three normalizations are

.. math::

    L_{rw} &= D_{out}^{+} (D_{out} - W) = I' - D_{out}^{+} W \\
    L_{sym} &= D^{+1/2} (D - W_s) D^{+1/2} = I' - D^{+1/2} W_s D^{+1/2},
        \quad W_s = (W + W^T)/2,\ D = \mathrm{diag}(W_s 1) \\
    L_{comb} &= D_{out} - W

where ``I'`` is the identity restricted to nodes with non-zero degree (the degree the
normalization uses). Hence a node without out-edges (an isolated node, or a fully masked
attention row) has a zero ``"rw"`` and ``"combinatorial"`` Laplacian row, and a node with
neither in- nor out-edges also has a zero ``"sym"`` row, as in NetworkX. For an attention
graph ``P`` (rows sum to 1), ``L_rw = I - P``: the Laplacian head of Zhang & Papyan (2026)
outputs ``L_rw V = V - P V``.

Every normalization is written ``L = c (I - M)`` with ``c = 1`` for ``"rw"``/``"sym"`` and
``c = max_i D_out[i, i]`` for ``"combinatorial"``; ``M`` has non-negative entries and
``||M|| <= 1``, which is what the positive heat-kernel series needs.

References:
    Chung, F. (1997). *Spectral Graph Theory*. AMS.
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.

Example (path graph 0 - 1 - 2):
    >>> import torch
    >>> from heatformer.graph_ops import DenseGraph, laplacian_matrix
    >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
    >>> laplacian_matrix(g, "combinatorial")
    tensor([[ 1., -1.,  0.],
            [-1.,  2., -1.],
            [ 0., -1.,  1.]])
    >>> laplacian_matrix(g, "rw")
    tensor([[ 1.0000, -1.0000,  0.0000],
            [-0.5000,  1.0000, -0.5000],
            [ 0.0000, -1.0000,  1.0000]])
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops._arrays import safe_reciprocal, safe_rsqrt
from heatformer.graph_ops._precision import accumulation_dtype, full_precision
from heatformer.graph_ops.protocol import Graph, check_graph

__all__ = ["GraphLaplacian", "adjacency_matrix", "laplacian", "laplacian_matrix", "spectrum"]


class GraphLaplacian:
    """The Laplacian of one graph and normalization, as actions on signals ``(..., N, C)``.

    Degrees are computed once at construction; every method is differentiable.

    Attributes:
        graph: the graph.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        scale: ``c`` with ``L = c (I - M)``, shape ``batch_shape`` (1 unless combinatorial).
    """

    def __init__(self, graph: Graph, normalization: str = "rw") -> None:
        self.graph = check_graph(graph)
        self.normalization = V.check_normalization(normalization)
        ones = torch.ones(graph.batch_shape, dtype=graph.dtype, device=graph.device)
        self.scale: Tensor = ones
        self._inv: Tensor | None = None
        self._sqrt_inv: Tensor = ones
        if normalization == "rw":
            d = graph.out_degree()
            self._has = (d > 0).to(graph.dtype).unsqueeze(-1)  # (..., N, 1)
            self._inv = None if graph.row_stochastic else safe_reciprocal(d).unsqueeze(-1)
        elif normalization == "sym":
            d = (
                graph.out_degree()
                if graph.symmetric
                else 0.5 * (graph.out_degree() + graph.in_degree())
            )
            self._has = (d > 0).to(graph.dtype).unsqueeze(-1)
            self._sqrt_inv = safe_rsqrt(d).unsqueeze(-1)  # D^{+1/2}
        else:
            d = graph.out_degree()
            self._deg = d.unsqueeze(-1)  # (..., N, 1)
            # not detached: PPR's A = I - L/c depends on c; no nodes: 0 (no max to take)
            dmax = d.amax(-1) if graph.num_nodes else d.sum(-1)
            self.scale = torch.where(dmax > 0, dmax, ones)

    @property
    def scale_bound(self) -> float | None:
        """An upper bound of :attr:`scale` known without reading the weights: 1 for ``"rw"``
        and ``"sym"``, and for ``"combinatorial"`` on a row-stochastic graph (its largest
        out-degree is 1, up to rounding); None otherwise (``c`` is then data)."""
        if self.normalization != "combinatorial" or self.graph.row_stochastic:
            return 1.0
        return None

    def adjacency(self, x: Tensor) -> Tensor:
        """``A x`` for the normalized adjacency ``A`` (``D^+ W``, ``D^{+1/2} W_s D^{+1/2}``, or
        ``I - L/c`` for the combinatorial Laplacian)."""
        g = self.graph
        if self.normalization == "rw":
            y = g.propagate(x)
            return y if self._inv is None else y * self._inv
        if self.normalization == "sym":
            z = x * self._sqrt_inv
            ws = (
                g.propagate(z) if g.symmetric else 0.5 * (g.propagate(z) + g.propagate_transpose(z))
            )
            return ws * self._sqrt_inv
        return x - self.laplacian(x) / self.scale[..., None, None]

    def identity(self, x: Tensor) -> Tensor:
        """``I' x``: ``x`` on the nodes with out-edges, 0 on the others (``x`` when every row
        is known to have an edge)."""
        if self.graph.rows_nonempty:
            return x
        has = (self.graph.out_degree() > 0).to(x.dtype).unsqueeze(-1)  # (..., N, 1)
        return has * x

    def laplacian(self, x: Tensor) -> Tensor:
        """``L x``, shape ``(..., N, C)``."""
        if self.normalization == "combinatorial":
            return self._deg * x - self.graph.propagate(x)
        if self.graph.rows_nonempty:  # no isolated node to mask: skip a pass over x
            return x - self.adjacency(x)
        return self._has * x - self.adjacency(x)

    def markov(self, x: Tensor) -> Tensor:
        """``M x = x - L x / c``: non-negative, ``||M|| <= 1`` (the heat-series step)."""
        if self.normalization == "combinatorial" or self.graph.rows_nonempty:
            return self.adjacency(x)  # no isolated node keeps its own value
        return self.adjacency(x) + (1.0 - self._has) * x


def laplacian(graph: Graph, x: Tensor, normalization: str = "rw") -> Tensor:
    r"""Apply the graph Laplacian to a signal without forming it: ``L x``.

    Args:
        graph: any :class:`~heatformer.graph_ops.Graph`.
        x: ``(..., N, C)`` signal; leading dims broadcast to the graph's batch shape.
        normalization: ``"rw"`` (:math:`I' - D_{out}^+ W`), ``"sym"``
            (:math:`I' - D^{+1/2} W_s D^{+1/2}`) or ``"combinatorial"`` (:math:`D_{out} - W`).

    Returns:
        ``(..., N, C)``.

    Raises:
        TypeError: if ``graph`` is not a Graph or ``x`` is not a floating tensor.
        ValueError: on an unknown ``normalization`` or a wrong ``x`` shape.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> laplacian(g, torch.ones(3, 1), "combinatorial").squeeze(-1)   # L 1 = 0
        tensor([0., 0., 0.])
    """
    graph = check_graph(graph)
    V.check_signal(x, graph.num_nodes, graph.batch_shape, graph.dtype)
    return GraphLaplacian(graph, normalization).laplacian(x)


def laplacian_matrix(graph: Graph, normalization: str = "rw") -> Tensor:
    """The dense Laplacian ``(..., N, N)`` (for small graphs, tests and teaching).

    Computed from ``graph.to_dense()`` by the formulas in the module docstring, independently
    of :func:`laplacian`.

    Args:
        graph: any graph.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.

    Returns:
        ``(..., N, N)`` tensor.
    """
    graph = check_graph(graph)
    V.check_normalization(normalization)
    return dense_laplacian(graph.to_dense(), normalization)


def dense_laplacian(w: Tensor, normalization: str) -> Tensor:
    """The Laplacian of explicit weights ``w`` ``(..., N, N)`` (no checks; see
    :func:`laplacian_matrix`)."""
    n = w.shape[-1]
    if normalization == "combinatorial":
        return torch.diag_embed(w.sum(-1)) - w
    if normalization == "rw":
        d = w.sum(-1)
        return torch.diag_embed((d > 0).to(w.dtype)) - safe_reciprocal(d).unsqueeze(-1) * w
    eye = torch.eye(n, dtype=w.dtype, device=w.device)
    ws = 0.5 * (w + w.transpose(-1, -2))
    d = ws.sum(-1)
    s = safe_rsqrt(d)
    return eye * (d > 0).to(w.dtype).unsqueeze(-1) - s.unsqueeze(-1) * ws * s.unsqueeze(-2)


def adjacency_matrix(graph: Graph, normalization: str = "rw") -> Tensor:
    """The dense normalized adjacency ``A`` ``(..., N, N)`` that the operators propagate with.

    ``D_out^+ W`` for ``"rw"``, ``D^{+1/2} W_s D^{+1/2}`` for ``"sym"`` and ``I - L / c`` for
    ``"combinatorial"`` (``c`` the largest out-degree, 1 for a graph without edges), as
    :meth:`GraphLaplacian.adjacency` applies it; computed from ``graph.to_dense()``.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> adjacency_matrix(g, "rw")
        tensor([[0.0000, 1.0000, 0.0000],
                [0.5000, 0.0000, 0.5000],
                [0.0000, 1.0000, 0.0000]])
    """
    graph = check_graph(graph)
    V.check_normalization(normalization)
    w = graph.to_dense()
    if normalization == "rw":
        return safe_reciprocal(w.sum(-1)).unsqueeze(-1) * w
    if normalization == "sym":
        ws = 0.5 * (w + w.transpose(-1, -2))
        s = safe_rsqrt(ws.sum(-1))
        return s.unsqueeze(-1) * ws * s.unsqueeze(-2)
    dmax = w.sum(-1).amax(-1)
    c = torch.where(dmax > 0, dmax, torch.ones_like(dmax))[..., None, None]
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    return eye - dense_laplacian(w, "combinatorial") / c


def spectrum(graph: Graph, normalization: str = "rw", *, atol: float = 1e-6) -> Tensor:
    """Eigenvalues of the Laplacian, ascending (by real part).

    A symmetric eigensolver (:func:`torch.linalg.eigvalsh`) is used only where the operator is
    symmetric: always for ``"sym"``; for ``"combinatorial"`` when ``W`` is symmetric; for
    ``"rw"`` when ``W`` is symmetric (then ``L_rw`` is similar to ``L_sym`` and has its
    spectrum). Otherwise (directed attention graphs) the general solver
    :func:`torch.linalg.eigvals` is used and a complex tensor is returned.

    Args:
        graph: a small graph (the dense Laplacian is formed).
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        atol: tolerance of the symmetry test ``max|W - W^T| <= atol * max|W|``.

    Returns:
        ``(..., N)`` real (symmetric case) or complex tensor; float16/bfloat16 graphs are
        solved in float32 and give float32 (complex64) eigenvalues. A graph with no nodes
        gives an empty ``(..., 0)`` tensor.

    Raises:
        TypeError: ``graph`` not a Graph, ``atol`` not a number.
        ValueError: unknown ``normalization``, ``atol`` negative or not finite.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> spectrum(g, "sym")
        tensor([0., 1., 2.])
    """
    graph = check_graph(graph)
    V.check_normalization(normalization)
    if isinstance(atol, bool) or not isinstance(atol, (int, float)):
        raise V.bad_type("atol", f"expected a float >= 0, got {type(atol).__name__}")
    if not (math.isfinite(atol) and atol >= 0):
        raise V.bad_value("atol", f"expected a finite float >= 0, got {atol!r}")
    dtype = accumulation_dtype(graph.dtype)  # no half-precision eigensolvers
    n = graph.num_nodes
    if n == 0:  # nothing to solve; the shape and dtype an N-node answer would have
        return torch.zeros((*graph.batch_shape, 0), dtype=dtype, device=graph.device)
    with full_precision(graph.device.type):
        w = graph.to(dtype).to_dense().detach()
        asym = (w - w.transpose(-1, -2)).abs().amax()
        sym_w = bool(asym <= atol * w.abs().amax().clamp_min(1e-30))
        if normalization == "sym" or (sym_w and normalization == "combinatorial"):
            return torch.linalg.eigvalsh(dense_laplacian(w, normalization))
        if sym_w and normalization == "rw":
            return torch.linalg.eigvalsh(dense_laplacian(w, "sym"))
        ev = torch.linalg.eigvals(dense_laplacian(w, normalization))
    order = torch.argsort(ev.real, dim=-1)
    return ev.gather(-1, order)
