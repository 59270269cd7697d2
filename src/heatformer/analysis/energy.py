r"""Smoothness of a signal on a graph: the Dirichlet energy ``tr(x^T L x)``.

Unlike the other metrics of :mod:`heatformer.analysis`, :func:`dirichlet_energy` works in
the dtype of its input and is differentiable, so it can serve as a regulariser.

References:
    Chung. Spectral Graph Theory. AMS, 1997.
    Cai, Wang. A note on over-smoothing for graph neural networks. arXiv:2006.13318, 2020.
"""

from __future__ import annotations

from torch import Tensor

from heatformer.checks import bad_type, bad_value, check_float_tensor
from heatformer.graph_ops import Graph, laplacian

__all__ = ["dirichlet_energy"]


def dirichlet_energy(graph: Graph, x: Tensor, normalization: str = "rw") -> Tensor:
    r"""Dirichlet energy :math:`\operatorname{tr}(x^\top L x)` of a signal on a graph.

    :math:`L` is the Laplacian of ``graph`` in the requested normalization (out-degree
    :math:`D_{out}`, self-loops kept, as everywhere in :mod:`heatformer.graph_ops`):

    - ``"rw"``: :math:`L = D_{out}^{+}(D_{out} - W)`; for attention :math:`I - P`.
    - ``"sym"``: :math:`L = D^{+1/2}(D - W_s)D^{+1/2}`, :math:`W_s = (W + W^\top)/2`,
      :math:`D` the degrees of :math:`W_s`. For symmetric :math:`W` the energy is
      :math:`\frac12\sum_{ij} W_{ij}\lVert x_i/\sqrt{d_i} - x_j/\sqrt{d_j}\rVert^2`;
      its kernel is spanned by :math:`D^{1/2}\mathbf{1}`, not by the constant.
    - ``"combinatorial"``: :math:`L = D_{out} - W`; for symmetric :math:`W`,
      :math:`\frac12\sum_{ij} W_{ij}\lVert x_i - x_j\rVert^2`.

    Low energy means a smooth signal (neighbouring tokens alike), which is what
    over-smoothing drives to zero. For ``"rw"`` on a non-symmetric graph the quadratic
    form is not a sum of squares and can be negative.

    Unlike the other metrics this one is computed in the dtype of ``x`` and the graph,
    so it can be used directly as a differentiable regulariser.

    Args:
        graph: any :class:`heatformer.graph_ops.Graph` (``DenseGraph``,
            ``SoftmaxGraph``, ``SparseGraph``, ...) with batch shape ``(...)``.
        x: signal on the nodes, shape ``(..., N, C)``.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.

    Returns:
        Tensor of shape ``(...)``, one energy per graph.

    Raises:
        TypeError: ``graph`` not a Graph, ``x`` not a floating tensor of the graph's dtype.
        ValueError: ``x`` not ``(..., N, C)`` for the graph's ``N`` and batch shape, or an
            unknown ``normalization`` (both checked by
            :func:`heatformer.graph_ops.laplacian`).

    Shape:
        - x: :math:`(..., N, C)`
        - output: :math:`(...)`

    Equivalent to::

        (x * laplacian(graph, x, normalization)).sum((-2, -1))

    References:
        Chung. Spectral Graph Theory. AMS, 1997.
        Cai, Wang. A note on over-smoothing for graph neural networks.
        arXiv:2006.13318, 2020.

    Examples:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> path = DenseGraph(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
        >>> dirichlet_energy(path, torch.tensor([[0.0], [1.0], [3.0]]), "combinatorial")
        tensor(5.)
        >>> dirichlet_energy(path, torch.ones(3, 1), "rw")
        tensor(0.)
    """
    x = check_float_tensor("x", x, min_dim=2, shape="(..., N, C)")
    if not isinstance(graph, Graph):
        raise bad_type("graph", f"expected a heatformer.graph_ops.Graph, got {type(graph)}")
    if x.shape[-2] != graph.num_nodes:
        raise bad_value(
            "x",
            f"expected shape (..., N={graph.num_nodes}, C), got {tuple(x.shape)} "
            f"(dim -2 must equal the graph's num_nodes)",
        )
    lx = laplacian(graph, x, normalization)  # (..., N, C)
    return (x * lx).sum((-2, -1))
