"""How :func:`~heatformer.analysis.markov.leading_eigenvalues` and
:func:`~heatformer.analysis.markov.leading_eigenvectors` compute: the registries of their
solvers over a :class:`~heatformer.analysis._markov_methods.Chain`.

Not part of the API. :data:`EIGENVALUE_METHODS` and :data:`EIGENVECTOR_METHODS` (``"dense"``:
the explicit ``P`` read by one ``propagate`` of the identity, numpy's eigensolver;
``"arnoldi"``: ARPACK on products with ``P``) refuse the same calls; the order of the values
(:data:`MODULUS_DECIMALS`) and the scaling and phase of the eigenvectors are set here, once for
both. The conventions are in :mod:`~heatformer.analysis.markov`'s docstring, which re-exports
the registries.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from heatformer._optional import require
from heatformer.analysis._markov_methods import ARNOLDI_NCV, DTYPE, EIG_DENSE_MAX_NODES, Chain
from heatformer.graph_ops._methods import Method

__all__ = ["EIGENVALUE_METHODS", "EIGENVECTOR_METHODS", "MODULUS_DECIMALS"]

#: decimals of the moduli that :func:`~heatformer.analysis.markov.leading_eigenvalues` orders
#: by (equal to them: a tie)
MODULUS_DECIMALS = 12


def _order(values: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` of ``values`` largest in modulus, by decreasing modulus (to
    :data:`MODULUS_DECIMALS` decimals), then real part, then imaginary part (a conjugate pair:
    ``+`` first)."""
    modulus = np.round(np.abs(values), MODULUS_DECIMALS)
    order: np.ndarray = np.lexsort((-values.imag, -values.real, -modulus))[:k]
    return order


def _unit(vectors: np.ndarray) -> np.ndarray:
    """The columns of ``vectors`` ``(N, k)`` at unit Euclidean norm, each turned by a phase (a
    sign, for a real one) that makes its entry of largest modulus real and positive (the first
    of them, moduli equal to :data:`MODULUS_DECIMALS` decimals)."""
    v = vectors.astype(np.complex128) / np.linalg.norm(vectors, axis=0)  # (N, k)
    cols = np.arange(v.shape[1])
    peak = np.argmax(np.round(np.abs(v), MODULUS_DECIMALS), axis=0)  # (k,)
    top = v[peak, cols]
    v = v * (np.abs(top) / top)[None, :]
    v[peak, cols] = np.abs(top)  # exactly real
    return v


def _walks(chain: Chain) -> np.ndarray:
    """``P`` ``(Bf, N, N)``, ``W`` read by one :meth:`~heatformer.graph_ops.Graph.propagate` of
    the identity."""
    eye = torch.eye(chain.n, dtype=DTYPE, device=chain.graph.device)  # (N, N): W = W @ I
    with torch.no_grad():
        w = chain.graph.propagate(eye).reshape(chain.bf, chain.n, chain.n).cpu().numpy()
    return w * chain.inv_degree[:, :, None]


def _eig_dense(chain: Chain, k: int, tol: float) -> np.ndarray:
    values = np.linalg.eigvals(_walks(chain)).astype(np.complex128)  # (Bf, N)
    return np.stack([v[_order(v, k)] for v in values])


def _arnoldi(chain: Chain, b: int, k: int, tol: float, *, vectors: bool) -> Any:
    """ARPACK's ``k`` eigenvalues of graph ``b``'s ``P`` largest in modulus (and, with
    ``vectors``, their right eigenvectors ``(N, k)``), from products with ``P``."""
    linalg = require("scipy.sparse.linalg", "scipy", feature="heatformer.analysis.markov")
    n = chain.n

    def matvec(v: np.ndarray) -> np.ndarray:
        return chain.product(b, v)

    op = linalg.LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    ncv = min(n, max(2 * k + 1, ARNOLDI_NCV))
    return linalg.eigs(
        op, k=k, which="LM", v0=np.ones(n), tol=tol, ncv=ncv, return_eigenvectors=vectors
    )


def _eig_arnoldi(chain: Chain, k: int, tol: float) -> np.ndarray:
    out = np.zeros((chain.bf, k), dtype=np.complex128)
    for b in range(chain.bf):
        values = _arnoldi(chain, b, k, tol, vectors=False)
        out[b] = values[_order(values, k)]
    return out


def _vectors_dense(chain: Chain, k: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    values = np.zeros((chain.bf, k), dtype=np.complex128)
    vectors = np.zeros((chain.bf, chain.n, k), dtype=np.complex128)
    for b, p in enumerate(_walks(chain)):
        lam, vec = np.linalg.eig(p)  # columns: right eigenvectors, P v = lam v
        order = _order(lam.astype(np.complex128), k)
        values[b], vectors[b] = lam[order], _unit(vec[:, order])
    return values, vectors


def _vectors_arnoldi(chain: Chain, k: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    values = np.zeros((chain.bf, k), dtype=np.complex128)
    vectors = np.zeros((chain.bf, chain.n, k), dtype=np.complex128)
    for b in range(chain.bf):
        lam, vec = _arnoldi(chain, b, k, tol, vectors=True)
        order = _order(lam, k)
        values[b], vectors[b] = lam[order], _unit(vec[:, order])
    return values, vectors


def _eig_dense_refuse(chain: Chain, k: int, tol: float) -> str | None:
    if chain.n > EIG_DENSE_MAX_NODES:
        return f"N = {chain.n} > EIG_DENSE_MAX_NODES = {EIG_DENSE_MAX_NODES} (an O(N^3) eigensolve)"
    return None


def _eig_arnoldi_refuse(chain: Chain, k: int, tol: float) -> str | None:
    if k >= chain.n - 1:
        return f"ARPACK needs k < N - 1, got k = {k} for N = {chain.n}"
    return None


#: name -> how :func:`~heatformer.analysis.markov.leading_eigenvalues` computes them, in the
#: order ``"auto"`` tries them (``compute(chain, k, tol)``, ``refuse(chain, k, tol)``).
EIGENVALUE_METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "dense", _eig_dense, _eig_dense_refuse,
            "exact: W read by one propagate of the identity, numpy.linalg.eigvals; "
            "N <= EIG_DENSE_MAX_NODES",
        ),
        Method(
            "arnoldi", _eig_arnoldi, _eig_arnoldi_refuse,
            "ARPACK (implicitly restarted Arnoldi) on P (propagate, or the explicit copy of a "
            "graph that lists its edges), to tol; k < N - 1",
        ),
    )
}  # fmt: skip

#: name -> how :func:`~heatformer.analysis.markov.leading_eigenvectors` computes the values and
#: their right eigenvectors (``compute(chain, k, tol) -> (values, vectors)``), with the
#: refusals of :data:`EIGENVALUE_METHODS`.
EIGENVECTOR_METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "dense", _vectors_dense, _eig_dense_refuse,
            "exact: W read by one propagate of the identity, numpy.linalg.eig; "
            "N <= EIG_DENSE_MAX_NODES",
        ),
        Method(
            "arnoldi", _vectors_arnoldi, _eig_arnoldi_refuse,
            "ARPACK on P with its Ritz vectors, to tol; k < N - 1",
        ),
    )
}  # fmt: skip
