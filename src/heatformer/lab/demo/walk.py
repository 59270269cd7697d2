"""The random walk on every head of the demo: TokenRank ``π``, ``λ₂`` and its eigenvector ``v₂``.

Each head's ``(N, N)`` attention matrix is read as a Markov chain, ``P = D_out⁻¹ W`` (``P = W``
when its rows sum to 1, as softmax rows do), and :mod:`heatformer.analysis` computes, in
float64:

- TokenRank, :func:`~heatformer.analysis.stationary_distribution`: ``π P = π``, ``Σ π = 1``,
  the left eigenvector of ``P`` for ``λ₁ = 1`` (its Perron vector);
- :func:`~heatformer.analysis.leading_eigenvectors`: the eigenvalues of ``P`` largest in
  modulus (``λ₁ = 1``, ``λ₂``, ``λ₃``: the third tells whether ``λ₂`` is repeated) and the right
  eigenvector of ``λ₂``, ``P v₂ = λ₂ v₂``, at unit length with its entry of largest modulus
  real and positive.

A head the library refuses keeps zeros: all of them when a node has no out-edge (``P`` is not
stochastic), ``π`` alone when the chain has several closed classes (no unique ``π``);
:func:`~heatformer.lab.demo.facts.walk_facts` reads those zeros back as what they mean.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from heatformer.analysis import leading_eigenvectors, stationary_distribution
from heatformer.checks import ArgumentError
from heatformer.graph_ops import DenseGraph

__all__ = ["WALK_EIGENVALUES", "head_walks"]

#: How many leading eigenvalues of each head's ``P`` the demo keeps: ``λ₁``, ``λ₂`` and ``λ₃``.
WALK_EIGENVALUES = 3


def _refused_for_graph(err: ValueError) -> bool:
    """Whether the library refused the graph itself (not an argument of the demo's call)."""
    return isinstance(err, ArgumentError) and err.argument == "graph"


def head_walks(attention: Tensor) -> dict[str, Any]:
    """TokenRank, the leading eigenvalues and ``v₂`` of the walk on every head.

    Args:
        attention: ``(L, H, N, N)`` attention weights (query rows), float64 on the CPU.

    Returns:
        ``{"tokenrank": (L, H, N) float64, "walk_eigenvalues": (L, H, K) complex128,
        "walk_eigenvector": (L, H, N) complex128}`` with ``K = min(3, N)``; ``v₂`` is zero when
        ``N < 2``, and a refused head's entries are zero (see the module docstring).

    Example:
        >>> import torch
        >>> p = torch.tensor([[[[0.5, 0.5], [0.25, 0.75]]]], dtype=torch.float64)
        >>> walks = head_walks(p)
        >>> walks["tokenrank"]  # pi P = pi: (1/3, 2/3)
        tensor([[[0.3333, 0.6667]]], dtype=torch.float64)
        >>> walks["walk_eigenvalues"].real  # 1 and the trace minus 1
        tensor([[[1.0000, 0.2500]]], dtype=torch.float64)
    """
    layers, heads, n = attention.shape[:3]
    k = min(WALK_EIGENVALUES, n)
    pi = torch.zeros(layers, heads, n, dtype=torch.float64)
    values = torch.zeros(layers, heads, k, dtype=torch.complex128)
    vector = torch.zeros(layers, heads, n, dtype=torch.complex128)
    for li in range(layers):
        for h in range(heads):
            graph = DenseGraph(attention[li, h].to(torch.float64))  # one head: (N, N)
            try:
                values[li, h], vectors = leading_eigenvectors(graph, k)  # (K,), (N, K)
            except ValueError as err:  # a node without out-edges: no walk at all
                if not _refused_for_graph(err):
                    raise
                continue
            if k >= 2:
                vector[li, h] = vectors[:, 1]
            try:
                pi[li, h] = stationary_distribution(graph)
            except ValueError as err:  # several closed classes: no unique pi
                if not _refused_for_graph(err):
                    raise
    return {"tokenrank": pi, "walk_eigenvalues": values, "walk_eigenvector": vector}
