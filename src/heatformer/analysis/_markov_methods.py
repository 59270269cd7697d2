"""How :mod:`heatformer.analysis.markov` computes: the random walk of a graph in float64 and the
registries of the solvers that read it.

Not part of the API. :class:`Chain` is what every method shares: the chain's products (by the
graph's explicit copy or its ``propagate``), its explicit ``P``, the one closed class and the
banded plan of each graph. :data:`STATIONARY_METHODS` (``"dense"``, ``"banded"``,
``"arnoldi"``) holds the stationary solvers, each with its refusal, and the limits they refuse
by; the eigenvalue solvers are in :mod:`~heatformer.analysis._markov_eigen`. The conventions,
the banded solve's maths and the references are in :mod:`~heatformer.analysis.markov`'s
docstring, which re-exports the registries and the limits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from heatformer import checks as V
from heatformer._optional import require
from heatformer.graph_ops import heat
from heatformer.graph_ops._methods import Method
from heatformer.graph_ops.protocol import Graph

if TYPE_CHECKING:
    import scipy.sparse

__all__ = [
    "ARNOLDI_NCV",
    "BANDED_MAX_BYTES",
    "BORDER_MAX_NODES",
    "DENSE_MAX_NODES",
    "DTYPE",
    "EIG_DENSE_MAX_NODES",
    "STATIONARY_METHODS",
    "Chain",
]

#: the dtype of every computation here
DTYPE = torch.float64
#: most nodes of the dense stationary solve (an ``N x N`` float64 LU per graph, ``O(N^3)``)
DENSE_MAX_NODES = 2048
#: most nodes of the dense eigenvalues (a non-symmetric ``N x N`` eigenproblem, ``O(N^3)``)
EIG_DENSE_MAX_NODES = 1024
#: most dense nodes (global tokens) the banded solve sets apart from the band
BORDER_MAX_NODES = 64
#: a node is dense when its edges (out and in) outnumber the median node's this many times (a
#: window's global token has ``2 N``, the others ``2 (2 w + 1 + g)``)
BORDER_DEGREE_FACTOR = 2
#: most bytes of LAPACK's band storage, ``(2 l + u + 1) N`` float64 entries
BANDED_MAX_BYTES = 8 << 30
#: Krylov basis size of ARPACK (``ncv``, at least ``2 k + 1``): a window graph's eigenvalues
#: below 1 lie in a cluster about ``(w / N)^2`` apart, which a small basis resolves slowly
#: (at 65,536 tokens, w = 32: 1,804 products with 60, 3,342 with ARPACK's default 20)
ARNOLDI_NCV = 60
#: entries of the explicit edges walked at once (index arrays of ``O(ROW_CHUNK_ENTRIES)``)
ROW_CHUNK_ENTRIES = 1 << 22


def _scipy(module: str) -> Any:
    return require(f"scipy.{module}", "scipy", feature="heatformer.analysis.markov")


# ---- the chain of a graph ------------------------------------------------------------------


@dataclass
class _Band:
    """The banded solve of one graph: its closed class and where the band lies in it.

    Attributes:
        matrix: ``P`` on the closed class, ``(m, m)`` CSR (canonical, no stored zeros).
        nodes: ``(m,)`` the closed class's nodes.
        border: ``(s,)`` positions (in ``0 .. m - 1``) of the nodes set apart.
        lower, upper: half-bandwidths of ``M = (I - P_RR)^T`` on the other nodes.
    """

    matrix: scipy.sparse.csr_array
    nodes: np.ndarray
    border: np.ndarray
    lower: int
    upper: int


class Chain:
    """The random walk ``P = D_out^{-1} W`` of a graph in float64, with what the methods share:
    the inverse out-degrees and, made once when asked, the explicit ``P`` of each graph and its
    banded plan (:meth:`bands`)."""

    def __init__(self, graph: Graph) -> None:
        with torch.no_grad():
            self.graph = graph.to(DTYPE)
            degree = self.graph.out_degree().reshape(-1, graph.num_nodes)  # (Bf, N)
        self.n = graph.num_nodes
        self.batch = graph.batch_shape
        self.bf = math.prod(self.batch)
        empty = (degree <= 0).nonzero()
        if len(empty):
            b, i = (int(v) for v in empty[0])
            raise V.bad_value(
                "graph",
                f"expected every node to have an out-edge (so that P = D^-1 W is stochastic), got "
                f"{len(empty)} without one, e.g. node {i}{self.where(b)}: a fully masked row; "
                f"drop it (the key mask, drop_masked_queries) or give it a self-loop",
            )
        self.inv_degree = (1.0 / degree).cpu().numpy()  # (Bf, N)
        self._explicit: list[scipy.sparse.csr_array] | None = None
        self._multiplied: Graph | None = None
        self._bands: list[_Band | str] | None = None

    def index(self, b: int) -> tuple[int, ...] | None:
        """The batch index of graph ``b`` of the flattened batch (None: an unbatched graph)."""
        return tuple(int(i) for i in np.unravel_index(b, self.batch)) if self.batch else None

    def where(self, b: int) -> str:
        """``" of graph (h, ...)"`` for graph ``b`` of a batch, else ``""``, for messages."""
        return f" of graph {self.index(b)}" if self.batch else ""

    def product(self, b: int, v: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        """``P v`` (or ``P^T v``) for graph ``b``, ``v`` ``(N,)``: by the graph's explicit copy
        (:meth:`explicit`) when it lists its edges, else through
        :meth:`~heatformer.graph_ops.Graph.propagate` (or its transpose) of the whole batch."""
        if self.lists_edges:
            p = self.explicit()[b]
            out: np.ndarray = p.T @ v if transpose else p @ v
            return out
        x = torch.zeros(self.bf, self.n, 1, dtype=DTYPE, device=self.graph.device)
        col = v.reshape(self.n, 1)
        if transpose:  # P^T v = W^T (D^-1 v)
            col = col * self.inv_degree[b][:, None]
        x[b] = torch.from_numpy(np.ascontiguousarray(col)).to(x.device)
        x = x.reshape(*self.batch, self.n, 1)
        graph = self.multiplied()
        with torch.no_grad():
            y = graph.propagate_transpose(x) if transpose else graph.propagate(x)
        out = y.reshape(self.bf, self.n, 1)[b].cpu().numpy()
        if not transpose:  # P v = D^-1 (W v)
            out = out * self.inv_degree[b][:, None]
        return out.reshape(v.shape)

    def multiplied(self) -> Graph:
        """The graph whose products :meth:`product` takes: the graph itself, or its explicit
        weights (:meth:`~heatformer.graph_ops.Graph.materialized`, made once) when an implicit
        kind has them within heat's ``MATERIALIZE_BUDGET_BYTES`` (a dense attention graph:
        one matrix product instead of a softmax recomputed per product)."""
        if self._multiplied is None:
            size = self.graph.materialized_bytes()
            self._multiplied = self.graph
            if size is not None and size <= heat.MATERIALIZE_BUDGET_BYTES:
                with torch.no_grad():
                    self._multiplied = self.graph.materialized()
        return self._multiplied

    def dense(self) -> np.ndarray:
        """``P`` ``(Bf, N, N)``, from the graph's dense weights."""
        with torch.no_grad():
            w = self.graph.to_dense().reshape(self.bf, self.n, self.n).cpu().numpy()
        return w * self.inv_degree[:, :, None]

    @property
    def lists_edges(self) -> bool:
        """Whether the graph lists its edges (:meth:`~heatformer.graph_ops.Graph.
        sparse_entries`), so that :meth:`explicit` costs what they do, not ``N x N``."""
        return self.graph.sparse_entries() is not None

    def explicit(self) -> list[scipy.sparse.csr_array]:
        """Each graph's ``P`` as a canonical CSR ``(N, N)``, made once from the graph's edges
        (:meth:`~heatformer.graph_ops.Graph.to_sparse`, then
        :meth:`~heatformer.graph_ops.SparseGraph.to_scipy` per graph)."""
        if self._explicit is None:
            sparse = _scipy("sparse")
            with torch.no_grad():
                edges = self.graph.to_sparse()
            explicit = []
            for b in range(self.bf):
                p = edges.to_scipy(self.index(b))
                if not np.all(self.inv_degree[b] == 1.0):  # rows of attention sum to 1 already
                    p = sparse.diags(self.inv_degree[b]).tocsr() @ p  # diags_array: SciPy 1.11
                explicit.append(_canonical(p))
            self._explicit = explicit
        return self._explicit

    def bands(self) -> list[_Band | str]:
        """Each graph's :class:`_Band`, or why its band is too wide."""
        if self._bands is None:
            self._bands = [_band(p, self.where(b)) for b, p in enumerate(self.explicit())]
        return self._bands


def _canonical(p: scipy.sparse.csr_array) -> scipy.sparse.csr_array:
    """``p`` with sorted, summed entries and no stored zeros (a top-k row's zero-weight padding
    is no edge)."""
    p.sum_duplicates()
    p.eliminate_zeros()
    return p


def _row_chunks(indptr: np.ndarray) -> Iterator[tuple[int, int]]:
    """Row ranges ``[r0, r1)`` of about :data:`ROW_CHUNK_ENTRIES` entries each."""
    n = len(indptr) - 1
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + ROW_CHUNK_ENTRIES, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        yield r0, r1
        r0 = r1


def _entries(p: scipy.sparse.csr_array) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(rows, cols, values)`` of ``p``'s entries, a chunk of rows at a time."""
    for r0, r1 in _row_chunks(p.indptr):
        lo, hi = p.indptr[r0], p.indptr[r1]
        rows = np.repeat(np.arange(r0, r1), np.diff(p.indptr[r0 : r1 + 1]))
        yield rows, p.indices[lo:hi], p.data[lo:hi]


def _closed_class(p: scipy.sparse.csr_array, where: str) -> np.ndarray:
    """The nodes of the one closed class of the chain ``p`` (canonical CSR), ascending.

    Raises:
        ValueError: naming ``graph``, when the chain has several closed classes.
    """
    count, labels = _scipy("sparse.csgraph").connected_components(
        p, directed=True, connection="strong"
    )
    n = p.shape[0]
    if count == 1:
        return np.arange(n)
    leaks = np.zeros(count, dtype=bool)  # a class with an edge out of it
    for rows, cols, _ in _entries(p):
        out = labels[rows] != labels[cols]
        leaks[labels[rows[out]]] = True
    closed = np.flatnonzero(~leaks)
    if len(closed) != 1:
        first = [int(np.flatnonzero(labels == c)[0]) for c in closed[:3]]
        raise V.bad_value(
            "graph",
            f"expected a chain with one closed class of nodes (a unique stationary distribution), "
            f"got {len(closed)}{where}, holding e.g. nodes {first}: a node that attends only to "
            f"itself (a causal window w = 1) or groups of tokens that never attend outside",
        )
    return np.flatnonzero(labels == closed[0])


def _band(p: scipy.sparse.csr_array, where: str) -> _Band | str:
    """The banded plan of one graph's ``P`` (canonical CSR), or why its band is too wide.

    The border: the nodes whose edges (out and in) outnumber the median node's
    :data:`BORDER_DEGREE_FACTOR` times (a window's global tokens), at most
    :data:`BORDER_MAX_NODES`, the densest first; one node when none is.
    """
    nodes = _closed_class(p, where)
    m = len(nodes)
    if m < p.shape[0]:
        p = _canonical(p[nodes][:, nodes])
    degree = np.diff(p.indptr) + np.bincount(p.indices, minlength=m)
    dense = np.flatnonzero(degree > BORDER_DEGREE_FACTOR * np.median(degree))
    if len(dense) > BORDER_MAX_NODES:
        dense = np.sort(dense[np.argsort(-degree[dense], kind="stable")[:BORDER_MAX_NODES]])
    border = dense if len(dense) else np.array([int(np.argmax(degree))])
    keep = np.ones(m, dtype=bool)
    keep[border] = False
    pos = np.cumsum(keep) - 1  # position of each kept node among the kept ones
    lower = upper = 0
    for rows, cols, _ in _entries(p):
        ok = keep[rows] & keep[cols]
        gap = pos[cols[ok]] - pos[rows[ok]]  # P[r, c] is M[c, r]: M's row minus its column
        if gap.size:
            lower, upper = max(lower, int(gap.max())), max(upper, -int(gap.min()))
    r = m - len(border)
    stored = 2 * lower + upper + 1
    if r and (stored > r or stored * r * 8 > BANDED_MAX_BYTES):
        return (
            f"the band{where} is not narrow: half-widths {lower} and {upper} on {r} nodes once "
            f"{len(border)} dense node(s) are set apart ({stored} x {r} band storage, more than "
            f"a dense matrix or BANDED_MAX_BYTES = {BANDED_MAX_BYTES})"
        )
    return _Band(p, nodes, border, lower, upper)


# ---- stationary distribution ---------------------------------------------------------------


def _solve_band(band: _Band) -> np.ndarray:
    """:math:`\\pi` on the closed class of a :class:`_Band` (the module's bordered banded
    solve), ``(m,)`` summing to 1."""
    p, border, m = band.matrix, band.border, len(band.nodes)
    if m == 1:
        return np.ones(1)
    s, lower, upper = len(border), band.lower, band.upper
    keep = np.ones(m, dtype=bool)
    keep[border] = False
    pos = np.cumsum(keep) - 1
    r = m - s
    ab = np.zeros((lower + upper + 1, r))  # M[i, j] = ab[upper + i - j, j], M = (I - P_RR)^T
    ab[upper] = 1.0
    for rows, cols, vals in _entries(p):
        ok = keep[rows] & keep[cols]
        pr, pc = pos[rows[ok]], pos[cols[ok]]
        ab[upper + pc - pr, pr] -= vals[ok]  # canonical: every (r, c) once
    border_rows = p[border]  # (s, m): P_S., whose R columns are P_SR
    rhs = np.zeros((r, s))  # P_SR^T
    for t in range(s):
        lo, hi = border_rows.indptr[t], border_rows.indptr[t + 1]
        cols, vals = border_rows.indices[lo:hi], border_rows.data[lo:hi]
        rhs[pos[cols[keep[cols]]], t] = vals[keep[cols]]
    x = _scipy("linalg").solve_banded(
        (lower, upper), ab, rhs, overwrite_ab=True, overwrite_b=True, check_finite=False
    )  # (r, s): M^{-1} P_SR^T
    del ab
    p_ss = border_rows[:, border].toarray()  # (s, s)
    p_rs = p[:, border][keep]  # (r, s)
    schur = (np.eye(s) - p_ss).T - p_rs.T @ x  # (s, s), singular: pi_S^T spans its null space
    if s == 1:
        pi_s = np.ones(1)
    else:
        pi_s = np.linalg.svd(schur)[2][-1]
    pi = np.empty(m)
    pi[border] = pi_s
    pi[keep] = x @ pi_s
    return pi / pi.sum()


def _solve_dense(p: np.ndarray) -> np.ndarray:
    """:math:`\\pi` of an irreducible stochastic ``p`` ``(m, m)``: the LU solve of
    :math:`(I - P)^T \\pi = 0` with its last equation replaced by :math:`\\sum \\pi = 1`."""
    m = p.shape[0]
    a = np.eye(m) - p.T
    a[-1] = 1.0
    rhs = np.zeros(m)
    rhs[-1] = 1.0
    return np.linalg.solve(a, rhs)


def _stationary_dense(chain: Chain, tol: float) -> np.ndarray:
    sparse = _scipy("sparse")
    out = np.zeros((chain.bf, chain.n))
    for b, p in enumerate(chain.dense()):
        nodes = _closed_class(_canonical(sparse.csr_array(p)), chain.where(b))
        out[b, nodes] = _solve_dense(p[np.ix_(nodes, nodes)])
    return out


def _stationary_banded(chain: Chain, tol: float) -> np.ndarray:
    out = np.zeros((chain.bf, chain.n))
    for b, band in enumerate(chain.bands()):
        if isinstance(band, str):  # pragma: no cover - refused before
            raise V.bad_value("method", f"'banded' refused: {band}")
        out[b, band.nodes] = _solve_band(band)
    return out


def _stationary_arnoldi(chain: Chain, tol: float) -> np.ndarray:
    linalg = _scipy("sparse.linalg")
    n = chain.n
    out = np.zeros((chain.bf, n))
    for b in range(chain.bf):

        def matvec(v: np.ndarray, b: int = b) -> np.ndarray:
            return chain.product(b, v, transpose=True)

        op = linalg.LinearOperator((n, n), matvec=matvec, dtype=np.float64)
        _, vecs = linalg.eigs(
            op, k=1, which="LR", v0=np.full(n, 1.0 / n), tol=tol, ncv=min(n, ARNOLDI_NCV)
        )
        v = vecs[:, 0]
        pi = (v / v.sum()).real
        if not np.isfinite(pi).all():  # pragma: no cover - ARPACK converged to another vector
            raise ArithmeticError(f"'arnoldi' found no stationary distribution{chain.where(b)}")
        out[b] = pi
    return out


def _dense_refuse(chain: Chain, tol: float) -> str | None:
    if chain.n > DENSE_MAX_NODES:
        return f"N = {chain.n} > DENSE_MAX_NODES = {DENSE_MAX_NODES} (an O(N^3) solve)"
    return None


def _banded_refuse(chain: Chain, tol: float) -> str | None:
    if not chain.lists_edges:
        return (
            "the graph does not list its edges (sparse_entries() is None: an implicit dense "
            "kind, whose to_sparse reads all N x N weights)"
        )
    reasons = [band for band in chain.bands() if isinstance(band, str)]
    return reasons[0] if reasons else None


def _arnoldi_refuse(chain: Chain, tol: float) -> str | None:
    return f"ARPACK needs N >= 3, got {chain.n}" if chain.n < 3 else None


#: name -> how :func:`~heatformer.analysis.markov.stationary_distribution` computes
#: :math:`\pi`, in the order ``"auto"`` tries them (:class:`~heatformer.graph_ops._methods.
#: Method`: ``compute(chain, tol)``, ``refuse(chain, tol)``).
STATIONARY_METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "dense", _stationary_dense, _dense_refuse,
            "exact: LU of the dense (I - P)^T on the closed class, O(N^3); N <= DENSE_MAX_NODES",
        ),
        Method(
            "banded", _stationary_banded, _banded_refuse,
            "exact: banded LU off the dense nodes and a Schur complement on them, O(N l^2), "
            "whatever the mixing time; graphs that list their edges, with a narrow band",
        ),
        Method(
            "arnoldi", _stationary_arnoldi, _arnoldi_refuse,
            "ARPACK on P^T (propagate_transpose, or the explicit copy of a graph that lists its "
            "edges), to tol; any graph whose chain has one closed class, iterations growing as "
            "the spectral gap shrinks",
        ),
    )
}  # fmt: skip
