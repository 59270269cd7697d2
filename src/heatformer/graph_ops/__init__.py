"""Attention matrices as weighted graphs: graphs, Laplacians and diffusion operators.

This subpackage knows nothing about transformers. Everything is written against one small
protocol, "multiply a block of vectors by the graph" (:meth:`Graph.propagate`), so no
operator ever needs the ``N x N`` matrix.
"""

from heatformer.graph_ops.graphs import (
    DenseGraph,
    Graph,
    SoftmaxGraph,
    SparseGraph,
    SymmetrizedGraph,
    topk_graph,
)
from heatformer.graph_ops.heat import HEAT_METHODS, HeatMethod, heat_kernel, select_heat_method
from heatformer.graph_ops.laplacian import (
    GraphGenerator,
    adjacency_matrix,
    laplacian,
    laplacian_matrix,
    spectrum,
)
from heatformer.graph_ops.operators import (
    OPERATORS,
    PPR_METHODS,
    Attention,
    DiffusionOperator,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    resolve_operator,
)

__all__ = [
    "HEAT_METHODS",
    "OPERATORS",
    "PPR_METHODS",
    "Attention",
    "DenseGraph",
    "DiffusionOperator",
    "Graph",
    "GraphGenerator",
    "HeatKernel",
    "HeatMethod",
    "Laplacian",
    "PersonalizedPageRank",
    "Polynomial",
    "SoftmaxGraph",
    "SparseGraph",
    "SymmetrizedGraph",
    "adjacency_matrix",
    "heat_kernel",
    "laplacian",
    "laplacian_matrix",
    "resolve_operator",
    "select_heat_method",
    "spectrum",
    "topk_graph",
]
