r"""Markov-chain views of an attention graph: its stationary distribution and leading eigenvalues.

A graph is read as the random walk on it, the row-stochastic matrix

.. math:: P = D_{out}^{-1} W, \qquad P_{ij} = W_{ij} / \textstyle\sum_l W_{il},

row ``i`` the moves out of node ``i``. For attention, whose rows already sum to 1, ``P = W``:
query ``i`` moves to key ``j`` with probability ``P_ij``. Conventions of this module:

- **Stationary distribution** (TokenRank, Erel et al. 2025): the row vector :math:`\pi` with
  :math:`\pi P = \pi`, :math:`\pi \ge 0`, :math:`\sum_i \pi_i = 1` (column form
  :math:`P^T \pi = \pi`): how much of the walk's time it spends on each token in the long run.
- **Uniqueness.** :math:`\pi` is unique exactly when the chain has one *closed class* (a
  strongly connected set of nodes that no edge leaves); it is 0 outside it. A bidirectional
  attention graph (dense, top-k with its own key, a window) is one strongly connected class. A
  chain with several closed classes is refused (``ValueError`` naming ``graph``): its
  stationary distributions form a simplex, and none of them is *the* ranking.
- **Causal graphs.** A causal ``P`` is lower triangular and token 0 attends only to itself:
  ``{0}`` is the one closed class whenever every other token attends to some earlier token,
  the walk drains to token 0, and :math:`\pi = e_0` (all mass on token 0). That is what is
  returned, exactly by ``"dense"`` and ``"banded"``, to the tolerance by ``"arnoldi"``. It
  ranks nothing; a causal model's tokens are ranked on the bidirectional
  ``graph.symmetrize()`` (whose :math:`\pi` is proportional to its degrees, the chain being
  reversible) or by personalized PageRank. A causal row that attends only to itself (``w = 1``)
  is a closed class of its own: refused.
- A node without out-edges (a fully masked attention row) leaves ``P`` non-stochastic: refused,
  naming ``graph``.
- Everything is computed in float64 (the graph recomputed in it, :meth:`~heatformer.graph_ops.
  Graph.to`), with no gradient, and returned on the graph's device; a batch of graphs is
  solved one graph at a time. SciPy is needed (``pip install 'heatformer[scipy]'``).

Methods (``method=``; ``"auto"`` takes the first that accepts the graph, and a refused method
says why, as the heat kernel's do):

- :data:`STATIONARY_METHODS`: ``"dense"`` (``N <= 2048``: an LU factorization of the dense
  ``(I - P)^T``), ``"banded"`` (a graph that lists its edges, :meth:`~heatformer.graph_ops.
  Graph.sparse_entries`, with a narrow band once its dense nodes are set apart: a window
  graph and its global tokens; exact, ``O(N l^2)`` whatever the mixing time), ``"arnoldi"``
  (ARPACK on products with ``P^T``: any graph, iterations growing with the inverse square root
  of the spectral gap).
- :data:`EIGENVALUE_METHODS`: ``"dense"`` (``N <= 1024``: ``W`` read by one
  :meth:`~heatformer.graph_ops.Graph.propagate` of the identity) and ``"arnoldi"`` (ARPACK on
  products with ``P``); :data:`EIGENVECTOR_METHODS` the same two, with the right eigenvectors
  (:func:`leading_eigenvectors`).
- **Eigenvectors** are right eigenvectors, :math:`P v = \lambda v`: functions on the nodes,
  :math:`v_1` the constant; for a diagonalizable ``P``,
  :math:`P^t x = \sum_i c_i \lambda_i^t v_i`, and the part along :math:`v_2` fades as
  :math:`|\lambda_2|^t`, no other but the constant's more slowly. Each has unit Euclidean norm,
  turned by a phase (a sign, when real) that makes its entry of largest modulus real and
  positive (the first of them). The left eigenvector of :math:`\lambda_1 = 1` is :math:`\pi`.

The Arnoldi products are matrix-free: :meth:`~heatformer.graph_ops.Graph.propagate` (or its
transpose), whatever the kind; a graph that lists its edges (a window, top-k) is multiplied by
its explicit sparse copy instead (:meth:`~heatformer.graph_ops.Graph.to_sparse`: the same
``P``, made once, a product 20-40 times cheaper than a window graph's recomputed weights at
65,536 tokens), and an implicit dense kind by its explicit weights when they fit heat's
``MATERIALIZE_BUDGET_BYTES`` (:meth:`~heatformer.graph_ops.Graph.materialized`: one matrix
product, not a softmax recomputed per product). Through
:meth:`~heatformer.graph_ops.Graph.propagate`, a batch of ``Bf`` graphs is multiplied whole for
each graph's product (the protocol has no view of one graph of a
batch): ``Bf`` times the work of one graph's.

Why the banded solve: on a window graph the walk moves at most ``w`` tokens a step, so it
mixes in about ``(N / w)^2`` steps (``10^8`` at ``N = 2^20``, ``w = 64``), and power iteration
would need as many products. Set the global tokens ``S`` apart and ``R`` the rest: ``P_RR`` is
banded (half-width ``w``) and leaks into ``S``, so :math:`M = (I - P_{RR})^T` is non-singular,
and :math:`\pi P = \pi` splits into

.. math::

    \pi_R^T = M^{-1} P_{SR}^T \pi_S^T, \qquad
    \bigl[(I - P_{SS})^T - P_{RS}^T M^{-1} P_{SR}^T\bigr] \pi_S^T = 0:

one banded LU of ``M`` (LAPACK ``gbsv`` through :func:`scipy.linalg.solve_banded`, with
``|S|`` right-hand sides) and the null vector of an ``|S| x |S|`` Schur complement. A graph
without dense nodes borders one node of its closed class. Measured at ``2^20`` tokens in
``docs/benchmarks.md``.

References:
    Erel, Y. et al. Attention (as discrete-time Markov) chains. NeurIPS 2025.
    Stewart, W. J. Introduction to the Numerical Solution of Markov Chains. Princeton, 1994
    (direct solves of :math:`\pi (I - P) = 0`; the bordered and block forms).
    Lehoucq, R. B., Sorensen, D. C. & Yang, C. ARPACK Users' Guide. SIAM, 1998.
    Levin, D. A. & Peres, Y. Markov Chains and Mixing Times, 2nd ed. AMS, 2017.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.analysis._markov_eigen import (
    EIGENVALUE_METHODS,
    EIGENVECTOR_METHODS,
    MODULUS_DECIMALS,
)
from heatformer.analysis._markov_methods import (
    ARNOLDI_NCV,
    BANDED_MAX_BYTES,
    BORDER_MAX_NODES,
    DENSE_MAX_NODES,
    EIG_DENSE_MAX_NODES,
    STATIONARY_METHODS,
    Chain,
)
from heatformer.graph_ops._methods import select_method
from heatformer.graph_ops.protocol import Graph, check_graph

__all__ = [
    "ARNOLDI_NCV",
    "BANDED_MAX_BYTES",
    "BORDER_MAX_NODES",
    "DENSE_MAX_NODES",
    "EIGENVALUE_METHODS",
    "EIGENVECTOR_METHODS",
    "EIG_DENSE_MAX_NODES",
    "MODULUS_DECIMALS",
    "STATIONARY_METHODS",
    "leading_eigenvalues",
    "leading_eigenvectors",
    "stationary_distribution",
]


def _check_nodes(graph: object) -> Graph:
    """``graph``, checked to be a :class:`~heatformer.graph_ops.Graph` with a node."""
    graph = check_graph(graph)
    if graph.num_nodes == 0:
        raise V.bad_value("graph", "expected a graph with at least one node, got N = 0")
    return graph


def stationary_distribution(graph: Graph, *, method: str = "auto", tol: float = 1e-12) -> Tensor:
    r"""The stationary distribution :math:`\pi` of the random walk on ``graph`` (TokenRank).

    :math:`\pi P = \pi`, :math:`\pi \ge 0`, :math:`\sum_i \pi_i = 1` for
    :math:`P = D_{out}^{-1} W` (``P = W`` for attention); 0 outside the chain's one closed
    class, :math:`e_0` for a causal graph (see the module's conventions).

    Args:
        graph: any graph kind, batched over any leading dims.
        method: ``"auto"`` or a key of :data:`STATIONARY_METHODS`: ``"dense"`` (``N <=``
            :data:`DENSE_MAX_NODES`), ``"banded"`` (exact at any length on a window graph:
            ``O(N (w + g) w)`` time, ``O(N (w + g))`` memory), ``"arnoldi"`` (any graph).
            ``"auto"`` takes the first of them that accepts the graph.
        tol: the relative accuracy ``"arnoldi"`` stops at, ``0 < tol < 1``.

    Returns:
        float64 ``(..., N)`` on the graph's device (no gradient).

    Raises:
        TypeError: ``graph`` is not a :class:`~heatformer.graph_ops.Graph`.
        ValueError: naming ``graph``: a node without out-edges, several closed classes, no
            nodes; naming ``method``: an unknown or refused method (with the reasons);
            naming ``tol``: outside ``(0, 1)``.
        ImportError: SciPy is not installed.

    Shape:
        ``graph`` of batch shape ``(...)`` and ``N`` nodes -> ``(..., N)``.

    Equivalent to (one graph whose chain is irreducible)::

        P = W / W.sum(-1, keepdim=True)
        evals, evecs = numpy.linalg.eig(P.T)
        v = evecs[:, numpy.argmin(abs(evals - 1))].real
        v / v.sum()

    Example:
        A 3-node path graph: the walk is reversible, :math:`\pi` proportional to the degrees.

        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> path = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> stationary_distribution(path)
        tensor([0.2500, 0.5000, 0.2500], dtype=torch.float64)
        >>> causal = DenseGraph(torch.tensor([[1., 0., 0.], [1., 1., 0.], [1., 1., 1.]]))
        >>> stationary_distribution(causal)  # the walk drains to token 0
        tensor([1., 0., 0.], dtype=torch.float64)

    See Also:
        :func:`leading_eigenvalues`: :math:`\lambda_2`, whose gap to 1 sets how fast the walk
        forgets its start.
    """
    graph = _check_nodes(graph)
    tol = V.check_tol(tol)
    chain = Chain(graph)
    chosen = select_method(STATIONARY_METHODS, method, "stationary-distribution", chain, tol)
    pi = chosen.compute(chain, tol)  # (Bf, N)
    return torch.from_numpy(pi).reshape(*chain.batch, chain.n).to(graph.device)


def leading_eigenvalues(
    graph: Graph, k: int, *, method: str = "auto", tol: float = 1e-10
) -> Tensor:
    r"""The ``k`` eigenvalues of the random walk :math:`P = D_{out}^{-1} W` largest in modulus.

    :math:`\lambda_1 = 1` (``P`` is stochastic); :math:`\lambda_2` (``[..., 1]``) and the
    spectral gap :math:`1 - |\lambda_2|` say how fast the walk forgets where it started (a
    window graph's gap shrinks as :math:`(w / N)^2`), the quantity by which Erel et al. (2025)
    weigh heads. Computed from products with ``P`` only (``"arnoldi"``:
    :meth:`~heatformer.graph_ops.Graph.propagate`, or the explicit sparse copy of a graph that
    lists its edges; ``"dense"``: one :meth:`~heatformer.graph_ops.Graph.propagate` of the
    identity), never a dense ``N x N`` matrix beyond ``"dense"``'s, so it works on every graph
    kind at any length the products reach: a window graph at 65,536 tokens in seconds to a
    minute (``docs/benchmarks.md``).

    Args:
        graph: any graph kind, batched over any leading dims; every node needs an out-edge.
        k: how many eigenvalues, ``1 <= k <= N``.
        method: ``"auto"`` or a key of :data:`EIGENVALUE_METHODS`: ``"dense"`` (``N <=``
            :data:`EIG_DENSE_MAX_NODES`), ``"arnoldi"`` (``k < N - 1``).
        tol: the relative accuracy ``"arnoldi"`` stops at, ``0 < tol < 1``.

    Returns:
        complex128 ``(..., k)`` on the graph's device, by decreasing modulus (moduli equal to
        :data:`MODULUS_DECIMALS` decimals: by decreasing real part, then imaginary part).

    Raises:
        TypeError: ``graph`` is not a :class:`~heatformer.graph_ops.Graph`, ``k`` not an int.
        ValueError: naming ``graph`` (a node without out-edges), ``k``, ``method`` or ``tol``.
        ImportError: SciPy is not installed (``"arnoldi"``).

    Shape:
        ``graph`` of batch shape ``(...)`` -> ``(..., k)``.

    Equivalent to::

        P = W / W.sum(-1, keepdim=True)
        lam = numpy.linalg.eigvals(P)
        lam[numpy.lexsort((-lam.imag, -lam.real, -abs(lam).round(12)))][:k]

    Example:
        The path graph's walk is periodic: its eigenvalues are 1, 0 and -1.

        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> path = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> leading_eigenvalues(path, 2).real
        tensor([ 1., -1.], dtype=torch.float64)
    """
    graph = _check_nodes(graph)
    k = V.check_positive_int("k", k, upper=graph.num_nodes)
    tol = V.check_tol(tol)
    chain = Chain(graph)
    chosen = select_method(EIGENVALUE_METHODS, method, "eigenvalue", chain, k, tol)
    values = chosen.compute(chain, k, tol)  # (Bf, k)
    return torch.from_numpy(values).reshape(*chain.batch, k).to(graph.device)


def leading_eigenvectors(
    graph: Graph, k: int, *, method: str = "auto", tol: float = 1e-10
) -> tuple[Tensor, Tensor]:
    r"""The ``k`` eigenvalues of :math:`P = D_{out}^{-1} W` largest in modulus, with their
    right eigenvectors :math:`P v = \lambda v`.

    The values are those of :func:`leading_eigenvalues`, in its order; column ``i`` of the
    vectors belongs to value ``i``. ``[..., :, 1]`` is :math:`v_2`, the signal that repeated
    averaging over the graph (:math:`P^t x`, ``P`` diagonalizable) keeps longest after the
    constant; its sign pattern is the spectral split of the tokens (for a reversible walk, the
    two groups it mixes between most slowly). Each vector has unit Euclidean norm and is
    turned by a phase (a sign, when it is real) that makes its entry of largest modulus real
    and positive (the first of them, moduli equal to :data:`MODULUS_DECIMALS` decimals). A
    complex value's vector is complex; the vector of a repeated value is one of its
    eigenspace, as the solver returns it.

    Args:
        graph: any graph kind, batched over any leading dims; every node needs an out-edge.
        k: how many eigenpairs, ``1 <= k <= N``.
        method: ``"auto"`` or a key of :data:`EIGENVECTOR_METHODS`: ``"dense"`` (``N <=``
            :data:`EIG_DENSE_MAX_NODES`, ``numpy.linalg.eig``), ``"arnoldi"`` (``k < N - 1``,
            ARPACK's Ritz vectors).
        tol: the relative accuracy ``"arnoldi"`` stops at, ``0 < tol < 1``.

    Returns:
        ``(values, vectors)``: complex128 ``(..., k)`` and ``(..., N, k)`` on the graph's
        device (no gradient).

    Raises:
        TypeError: ``graph`` is not a :class:`~heatformer.graph_ops.Graph`, ``k`` not an int.
        ValueError: naming ``graph`` (a node without out-edges), ``k``, ``method`` or ``tol``.
        ImportError: SciPy is not installed (``"arnoldi"``).

    Shape:
        ``graph`` of batch shape ``(...)`` and ``N`` nodes -> ``(..., k)``, ``(..., N, k)``.

    Equivalent to (the phase aside)::

        P = W / W.sum(-1, keepdim=True)
        lam, vec = numpy.linalg.eig(P)
        order = numpy.lexsort((-lam.imag, -lam.real, -abs(lam).round(12)))[:k]
        lam[order], vec[:, order]

    Example:
        The 3-node path graph: :math:`v_1` the constant, :math:`v_2` of
        :math:`\lambda_2 = -1` alternates in sign (the walk's period 2).

        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> path = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> values, vectors = leading_eigenvectors(path, 2)
        >>> values.real
        tensor([ 1., -1.], dtype=torch.float64)
        >>> (vectors.real * 3**0.5).round(decimals=6)
        tensor([[ 1.,  1.],
                [ 1., -1.],
                [ 1.,  1.]], dtype=torch.float64)

    See Also:
        :func:`stationary_distribution`: the left eigenvector of :math:`\lambda_1 = 1`.
    """
    graph = _check_nodes(graph)
    k = V.check_positive_int("k", k, upper=graph.num_nodes)
    tol = V.check_tol(tol)
    chain = Chain(graph)
    chosen = select_method(EIGENVECTOR_METHODS, method, "eigenvector", chain, k, tol)
    values, vectors = chosen.compute(chain, k, tol)  # (Bf, k), (Bf, N, k)
    n = chain.n
    return (
        torch.from_numpy(values).reshape(*chain.batch, k).to(graph.device),
        torch.from_numpy(vectors).reshape(*chain.batch, n, k).to(graph.device),
    )
