r"""``Centering()``: the centring head ``scale * (I' - U) x``, the matched control of mean pooling.

Every query outputs its own value minus the plain mean of the values over the keys it may
attend, whatever their attention weights:

.. math:: \mathrm{center}(G, x)_i = x_i - \frac{1}{|\mathcal{N}(i)|}
          \sum_{j \in \mathcal{N}(i)} x_j \quad (0 \text{ when } \mathcal{N}(i) = \emptyset),

that is ``(I' - U) x`` with ``U`` the uniform random walk on the structure of ``W`` (see
:mod:`~heatformer.graph_ops.operators.mean`) and ``I'`` the identity on the nodes that have
out-edges. It is the random-walk Laplacian of ``U``, as the Laplacian head ``(I - P) x`` is
that of ``P``.

Why it is the matched control (issue 25): in a bidirectional layer every query may attend
every key, so ``U x`` is the same vector for every token and a mean-pooling head adds one
vector to the whole sequence: it cannot change the within-sequence spread, whatever it
learns. The centring head ``(I - U) V = V - \bar V`` removes that vector instead -- the
averaging of a Laplacian head without the query/key geometry -- so comparing
``laplacian`` with ``center`` heads tells "collapse by attention" from "collapse by
subtracting a mean". In a causal layer ``U`` is the running mean over the prefix, under a
key mask the mean over the real keys, on a window graph over the window and the global
tokens, on a top-k graph over the ``k`` kept keys.

The operator asks the graph: ``U x`` is :meth:`Graph.uniform
<heatformer.graph_ops.Graph.uniform>` (each kind from its structure, never its weights) and
``I' x`` the nodes with out-edges, as the Laplacian head has them. The output is
differentiable in ``x`` (and ``scale``); no gradient reaches ``q`` or ``k``.

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

from torch import Tensor

from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.mean import MeanPooling
from heatformer.graph_ops.protocol import Graph

__all__ = ["Centering"]


class Centering(MeanPooling):
    r"""Centring over the allowed keys: ``scale * (I' x - U x)``, whatever the attention weights.

    Row ``i`` is ``x_i`` minus the mean of ``x`` over the keys query ``i`` may attend (all of
    them in a bidirectional layer: ``V - mean(V)``; the prefix ``j <= i`` in a causal one; the
    real keys under a key mask; the window; the top-k keys). A node without out-edges outputs
    0. The output ignores ``q`` and ``k``, so it is not affine in ``P v`` (no fused path, no KV
    cache: generation recomputes), and it reads only the keys a query may attend (allowed in
    causal layers).

    Args:
        scale, learnable: as in :class:`~heatformer.graph_ops.MeanPooling`, whose constructor
            this is.

    Shape:
        ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

    Equivalent to::

        edges = (graph.to_dense() != 0)            # allowed keys (implicit kinds: the mask)
        count = edges.sum(-1, keepdim=True)
        U = edges / count.clamp_min(1)
        scale * ((count > 0) * x - U @ x)

    Its frequency response is ``lam``, with ``lam`` an eigenvalue of ``U``'s random-walk
    Laplacian (the centring head is that Laplacian), not of ``P``'s.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0.9, 0.1, 0.], [0.2, 0.2, 0.6], [0., 0., 0.]]))
        >>> Centering()(g, torch.tensor([[1.], [2.], [6.]])).squeeze(-1)
        tensor([-0.5000, -1.0000,  0.0000])
    """

    name = "center"  # scale, learnable and their repr as MeanPooling's

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        own = GraphLaplacian(graph, "rw").identity(x)  # I' x: 0 on nodes without out-edges
        return self._times(own - graph.uniform(x), self.scale, self.learnable)

    def frequency_response(self, lam: Tensor) -> Tensor:
        return self.scale.to(lam.dtype) * lam
