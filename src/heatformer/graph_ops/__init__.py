"""Attention matrices as weighted graphs: graphs, Laplacians and diffusion operators.

This subpackage knows nothing about transformers. Everything is written against one small
protocol, "multiply a block of vectors by the graph" (:meth:`Graph.propagate`), so no
operator ever needs the ``N x N`` matrix. One module per concept:

- :mod:`~heatformer.graph_ops.protocol` -- the :class:`Graph` protocol (knows no kind);
- :mod:`~heatformer.graph_ops.dense`, :mod:`~heatformer.graph_ops.softmax`,
  :mod:`~heatformer.graph_ops.sparse`, :mod:`~heatformer.graph_ops.symmetrized` -- the kinds,
  and :mod:`~heatformer.graph_ops.window`, the window kind in its own folder (its layout,
  kernels, FlexAttention path and a sequence split over processes);
- :mod:`~heatformer.graph_ops.sparsify` -- top-k, thresholding; :mod:`~heatformer.graph_ops.
  interop` -- NetworkX, SciPy, PyG;
- :mod:`~heatformer.graph_ops.kind` and :mod:`~heatformer.graph_ops.builders` -- graph kinds for
  layers (:class:`GraphBuilder`, :data:`GRAPHS`);
- :mod:`~heatformer.graph_ops.laplacian`, :mod:`~heatformer.graph_ops.heat` (with
  :mod:`~heatformer.graph_ops.poisson`, the series' plan and certificate) and
  :mod:`~heatformer.graph_ops.operators` -- Laplacians, heat methods, diffusion operators.
"""

from heatformer.graph_ops.builders import GRAPHS, resolve_graph, shard_graph
from heatformer.graph_ops.dense import DenseGraph
from heatformer.graph_ops.heat import HEAT_METHODS, HeatMethod, heat_kernel, select_heat_method
from heatformer.graph_ops.kind import GraphBuilder
from heatformer.graph_ops.laplacian import (
    GraphLaplacian,
    adjacency_matrix,
    laplacian,
    laplacian_matrix,
    spectrum,
)
from heatformer.graph_ops.operators import (
    OPERATORS,
    PPR_METHODS,
    Attention,
    Centering,
    Differential,
    DiffusionOperator,
    HeatKernel,
    Laplacian,
    MeanPooling,
    NormalizedOperator,
    PersonalizedPageRank,
    Polynomial,
    UntiedSkip,
    resolve_operator,
    split_maps,
)
from heatformer.graph_ops.poisson import SeriesCertificate, series_certificate
from heatformer.graph_ops.protocol import Graph
from heatformer.graph_ops.softmax import SoftmaxGraph
from heatformer.graph_ops.sparse import SparseGraph
from heatformer.graph_ops.sparsify import topk_graph
from heatformer.graph_ops.symmetrized import SymmetrizedGraph
from heatformer.graph_ops.window import SequenceShard, WindowGraph

__all__ = [
    "GRAPHS",
    "HEAT_METHODS",
    "OPERATORS",
    "PPR_METHODS",
    "Attention",
    "Centering",
    "DenseGraph",
    "Differential",
    "DiffusionOperator",
    "Graph",
    "GraphBuilder",
    "GraphLaplacian",
    "HeatKernel",
    "HeatMethod",
    "Laplacian",
    "MeanPooling",
    "NormalizedOperator",
    "PersonalizedPageRank",
    "Polynomial",
    "SequenceShard",
    "SeriesCertificate",
    "SoftmaxGraph",
    "SparseGraph",
    "SymmetrizedGraph",
    "UntiedSkip",
    "WindowGraph",
    "adjacency_matrix",
    "heat_kernel",
    "laplacian",
    "laplacian_matrix",
    "resolve_graph",
    "resolve_operator",
    "select_heat_method",
    "series_certificate",
    "shard_graph",
    "spectrum",
    "split_maps",
    "topk_graph",
]
