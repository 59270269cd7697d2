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

The operator asks the graph: ``U x`` is :meth:`Graph.uniform
<heatformer.graph_ops.Graph.uniform>`, which each kind computes from its structure, never
from its weights: the mask, causal order, window and global tokens of an implicit attention
graph (an entry whose softmax weight underflows to 0 still counts), the stored entries of
positive weight of a sparse graph (the zero-weight padding of a top-k row with fewer allowed
keys is no edge), and the non-zero entries of any other graph (read in query slabs of
``(rows, N)``). The output is differentiable in ``x`` (and ``scale``); no gradient reaches
``q`` or ``k``.

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops.operators.base import DiffusionOperator
from heatformer.graph_ops.protocol import Graph

__all__ = ["MeanPooling"]


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
        return self._times(graph.uniform(x), self.scale, self.learnable)

    def frequency_response(self, lam: Tensor) -> Tensor:
        return self.scale.to(lam.dtype) * (1.0 - lam)

    def extra_repr(self) -> str:
        scale = float(self.scale.detach())
        learnable = ", learnable=True" if self.learnable else ""
        return f"scale={scale:g}{learnable}"
