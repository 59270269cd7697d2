r"""``MeanPooling()``: the mean-pooling baseline head, ``scale * U x``.

Every query outputs the plain mean of the values over the keys it may attend, whatever their
attention weights: the random walk on the *uniform* graph ``U`` with the structure of ``W``,

.. math:: U_{ij} = \frac{[j \in \mathcal{N}(i)]}{|\mathcal{N}(i)|}, \qquad
          \mathrm{mean}(G, x)_i = \frac{1}{|\mathcal{N}(i)|} \sum_{j \in \mathcal{N}(i)} x_j,

with ``N(i)`` the out-neighbours of ``i`` (``0`` for a node without any). In a causal layer
that is the running mean over the prefix, in a key-masked one the mean over the real keys, on a
window graph the mean over the window (and the global tokens), on a top-k graph the mean over
the ``k`` kept keys. It is the reviewer's control of Zhang & Papyan (2026): a head that
averages without any query/key geometry, to tell "collapse helps" from "averaging helps".

Which keys a query may attend is read from the graph's structure, never from its weights:
the mask, causal order, window and global tokens of an implicit attention graph (an entry
whose softmax weight underflows to 0 still counts), the stored entries of positive weight of a
sparse graph (the zero-weight padding of a top-k row with fewer allowed keys is no edge), and
the non-zero entries of any other graph (read in query slabs of ``(rows, N)``). The output is
differentiable in ``x`` (and ``scale``); no gradient reaches ``q`` or ``k``.

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops.operators.base import DiffusionOperator
from heatformer.graph_ops.protocol import Graph, _fold, _numel, _safe_reciprocal
from heatformer.graph_ops.softmax import SoftmaxGraph
from heatformer.graph_ops.sparse import SparseGraph
from heatformer.graph_ops.window import WindowGraph

__all__ = ["MeanPooling", "uniform_graph"]

#: feature width of the constant queries/keys of a uniform implicit graph (a multiple of 8,
#: which fused attention kernels want)
_ZERO_DIM = 8


def _zeros(graph: Graph) -> Tensor:
    """Constant queries/keys ``(*batch, N, 8)``: every allowed score is 0, every row uniform."""
    return torch.zeros(
        *graph.batch_shape, graph.num_nodes, _ZERO_DIM, dtype=graph.dtype, device=graph.device
    )


def _uniform_softmax(graph: Graph) -> Graph:
    g: SoftmaxGraph = graph  # type: ignore[assignment]
    z = _zeros(g)
    return SoftmaxGraph(z, z, mask=g.mask, causal=g.causal, row_block=g.row_block)


def _uniform_window(graph: Graph) -> Graph:
    g: WindowGraph = graph  # type: ignore[assignment]
    z = _zeros(g)
    key_mask = g._key_mask  # (Bf, N) or None
    if key_mask is not None:
        key_mask = key_mask.reshape(*g.batch_shape, g.num_nodes)
    return WindowGraph(
        z, z, window=g.window, causal=g.causal, num_global=g.num_global, key_mask=key_mask,
        drop_masked_queries=g.drop_masked_queries, row_block=g.row_block,
    )  # fmt: skip


def _uniform_sparse(graph: Graph) -> Graph:
    g: SparseGraph = graph  # type: ignore[assignment]
    edge = (g.weight.detach() > 0).to(g.dtype)  # (E,): a zero-weight entry is no edge
    size = _numel(g.batch_shape) * g.num_nodes
    count = torch.zeros(size, dtype=g.dtype, device=g.device).index_add_(0, g.row, edge)
    weight = edge * _safe_reciprocal(count)[g.row]  # (E,): 1 / |N(i)| on every edge of row i
    return SparseGraph._trusted(
        g.row, g.col, weight, num_nodes=g.num_nodes, batch_shape=g.batch_shape, sort=False
    )


#: graph kind (exact type) -> the uniform graph with its structure, propagated by the kind's
#: own product; any other graph takes the generic slab path of :func:`_uniform_propagate`
_UNIFORM: dict[type[Graph], Callable[[Graph], Graph]] = {
    SoftmaxGraph: _uniform_softmax,
    WindowGraph: _uniform_window,
    SparseGraph: _uniform_sparse,
}


def uniform_graph(graph: Graph) -> Graph | None:
    """The uniform graph ``U`` with the structure of ``graph``, when its kind has one (softmax,
    window and sparse graphs; None for others, whose ``U x`` is computed in query slabs).

    Its rows sum to 1 (0 for a node without out-edges), so ``uniform_graph(g).propagate(x)``
    is the mean of ``x`` over each node's out-neighbours.
    """
    make = _UNIFORM.get(type(graph))
    return make(graph) if make is not None else None


def _uniform_propagate(graph: Graph, x: Tensor) -> Tensor:
    """``U x`` for ``x`` ``(..., N, C)``: by the uniform graph of the same kind, or from the
    non-zero pattern of ``graph``'s weight rows, one ``(Bf, rows, N)`` slab at a time."""
    uniform = uniform_graph(graph)
    if uniform is not None:
        return uniform.propagate(x)
    xf, unfold = _fold(x, graph.batch_shape)  # (Bf, N, C')
    outs = []
    for start, stop in graph._blocks(None):
        with torch.no_grad():
            edges = (graph.weight_rows(start, stop) != 0).to(x.dtype)  # (Bf, rows, N)
        count = edges.sum(-1, keepdim=True)  # (Bf, rows, 1)
        outs.append((edges @ xf) * _safe_reciprocal(count))  # (Bf, rows, C')
    return unfold(torch.cat(outs, dim=1))


class MeanPooling(DiffusionOperator):
    r"""Mean pooling over the allowed keys: ``scale * U x``, whatever the attention weights.

    ``U`` is the uniform random walk on the graph's structure (see the module docstring): row
    ``i`` averages ``x`` over the keys query ``i`` may attend -- all of them in a plain
    bidirectional layer, the prefix ``j <= i`` in a causal one, the real keys under a key mask,
    the window, the top-k keys. A node without out-edges outputs 0. The output ignores ``q`` and
    ``k``, so it is not affine in ``P v`` (no fused path, no KV cache: generation recomputes),
    and reads only the keys a query may attend (allowed in causal layers).

    Args:
        scale: a factor on the output (default 1).
        learnable: make ``scale`` a parameter.

    Shape:
        ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

    Equivalent to::

        edges = (graph.to_dense() != 0)            # allowed keys (implicit kinds: the mask)
        U = edges / edges.sum(-1, keepdim=True).clamp_min(1)
        scale * U @ x

    Its frequency response ``1 - lam`` is that of attention on ``U`` itself (``U = I - L_U``),
    with ``lam`` an eigenvalue of ``U``'s random-walk Laplacian, not of ``P``'s.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0.9, 0.1, 0.], [0.2, 0.2, 0.6], [0., 1., 0.]]))
        >>> MeanPooling()(g, torch.tensor([[1.], [2.], [6.]])).squeeze(-1)
        tensor([1.5000, 3.0000, 2.0000])
    """

    name = "mean"
    examples = ({}, {"scale": 0.5, "learnable": True})

    def __init__(
        self,
        *,
        scale: float = 1.0,
        learnable: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.learnable = V.check_bool("learnable", learnable)
        self.scale: Tensor
        self._register_factor("scale", scale, learnable, device, dtype)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        return self._times(_uniform_propagate(graph, x), self.scale, self.learnable)

    def frequency_response(self, lam: Tensor) -> Tensor:
        return self.scale.to(lam.dtype) * (1.0 - lam)

    def extra_repr(self) -> str:
        scale = float(self.scale.detach())
        learnable = ", learnable=True" if self.learnable else ""
        return f"scale={scale:g}{learnable}"
