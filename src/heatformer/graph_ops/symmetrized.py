"""The undirected graph ``W_s = (W + W^T) / 2`` of any graph, never materialized."""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops.protocol import Graph

__all__ = ["SymmetrizedGraph"]


class SymmetrizedGraph(Graph):
    """The undirected graph ``W_s = (W + W^T) / 2`` of any graph, without materializing it.

    ``propagate(x) = (W x + W^T x) / 2``; degrees are the mean of out- and in-degree.

    Args:
        base: the directed graph.
    """

    symmetric = True

    def __init__(self, base: Graph) -> None:
        if not isinstance(base, Graph):
            raise V.bad_type("base", f"expected a Graph, got {type(base).__name__}")
        self.base = base
        self._tensor = base._tensor

    @property
    def num_nodes(self) -> int:
        return self.base.num_nodes

    @property
    def batch_shape(self) -> torch.Size:
        return self.base.batch_shape

    def propagate(self, x: Tensor) -> Tensor:
        return 0.5 * (self.base.propagate(x) + self.base.propagate_transpose(x))

    def propagate_transpose(self, x: Tensor) -> Tensor:
        return self.propagate(x)

    def out_degree(self) -> Tensor:
        return 0.5 * (self.base.out_degree() + self.base.in_degree())

    def in_degree(self) -> Tensor:
        return self.out_degree()

    def weight_rows(self, start: int, stop: int) -> Tensor:
        rows = self.base.weight_rows(start, stop)  # (Bf, rows, N)
        # columns start:stop of W, i.e. rows of W^T, gathered block by block
        cols = torch.cat(
            [self.base.weight_rows(s, e)[..., start:stop] for s, e in self._blocks(None)], dim=1
        )  # (Bf, N, rows)
        return 0.5 * (rows + cols.transpose(-1, -2))

    def to_dense(self) -> Tensor:
        w = self.base.to_dense()
        return 0.5 * (w + w.transpose(-1, -2))

    def symmetrize(self) -> SymmetrizedGraph:
        return self

    def to(self, dtype: torch.dtype) -> SymmetrizedGraph:
        return self if dtype == self.dtype else SymmetrizedGraph(self.base.to(dtype))
