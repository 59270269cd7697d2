"""Graphs given by explicit weights ``W`` ``(..., N, N)``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer._optional import require
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops.protocol import Graph

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["DenseGraph"]


class DenseGraph(Graph):
    """A batch of graphs given by explicit weights.

    Args:
        weight: ``(..., N, N)`` non-negative floating tensor; row ``i`` holds the out-edges of
            node ``i``.

    Raises:
        TypeError: if ``weight`` is not a floating-point tensor.
        ValueError: if ``weight`` is not square, has fewer than 2 dims, or has negative or
            non-finite entries.

    Example:
        >>> import torch
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> g.out_degree()
        tensor([1., 2., 1.])
        >>> g.propagate(torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([2., 4., 2.])
    """

    def __init__(self, weight: Tensor) -> None:
        weight = V.check_float_tensor("weight", weight, min_dim=2)
        V.check_square("weight", weight)
        with torch.no_grad():
            if not bool(torch.isfinite(weight).all()):
                raise V.bad_value("weight", "expected finite entries, got NaN or inf")
            if bool((weight < 0).any()):
                raise V.bad_value(
                    "weight",
                    f"expected non-negative edge weights, got min {weight.min().item():.3g}",
                )
        self.weight = self._tensor = weight

    def propagate(self, x: Tensor) -> Tensor:
        return self.weight @ self._check_x(x)

    def propagate_transpose(self, x: Tensor) -> Tensor:
        return self.weight.transpose(-1, -2) @ self._check_x(x)

    def out_degree(self) -> Tensor:
        return self._degree(-1)

    def in_degree(self) -> Tensor:
        return self._degree(-2)

    def _degree(self, dim: int) -> Tensor:
        """Row (``dim=-1``) or column sums, in float32 for half weights, rounded once."""
        return self.weight.sum(dim, dtype=accumulation_dtype(self.dtype)).to(self.dtype)

    def weight_rows(self, start: int, stop: int) -> Tensor:
        n = self.num_nodes
        return self.weight[..., start:stop, :].reshape(-1, stop - start, n)  # (Bf, rows, N)

    def to_dense(self) -> Tensor:
        return self.weight

    def to(self, dtype: torch.dtype) -> DenseGraph:
        if dtype == self.dtype:
            return self
        graph = object.__new__(DenseGraph)  # the weights were checked already
        graph.weight = graph._tensor = self.weight.to(dtype)
        return graph

    def symmetrize(self) -> DenseGraph:
        return DenseGraph(0.5 * (self.weight + self.weight.transpose(-1, -2)))

    @classmethod
    def from_networkx(
        cls, graph: nx.Graph, *, weight: str = "weight", dtype: torch.dtype | None = None
    ) -> DenseGraph:
        """Build from a NetworkX graph (nodes in ``graph.nodes`` order; undirected = symmetric).

        Args:
            graph: a :class:`networkx.Graph` or :class:`networkx.DiGraph`.
            weight: edge attribute holding the weight (missing = 1).
            dtype: floating dtype (default: torch's default dtype).
        """
        nx = require("networkx", feature="DenseGraph.from_networkx")
        a = nx.to_numpy_array(graph, weight=weight)
        return cls(torch.as_tensor(a, dtype=dtype or torch.get_default_dtype()))
