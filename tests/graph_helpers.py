"""Shared builders, independent references and assertions for the graph_ops tests.

Everything a test compares against is computed here with numpy/scipy only, from the formulas
in DESIGN.md, never with heatformer itself:

- :func:`softmax_reference` -- the attention matrix ``P = softmax(q k^T * scale)`` with the
  SDPA mask polarity (``True`` = may attend); a row with no allowed key is 0.
- :func:`laplacian_reference`, :func:`adjacency_reference` -- the three normalizations with
  the pseudo-inverse of the degree (0 where the degree is 0) and self-loops kept.
- :func:`heat_reference` (``scipy.linalg.expm``), :func:`ppr_reference` (a dense solve),
  :func:`polynomial_reference` (matrix powers).

Test modules import it directly (``import graph_helpers as gh``; ``tests/`` is on
``sys.path``), and the graph builders build every graph kind from the *same* weights, so one
reference serves ``DenseGraph``, ``SoftmaxGraph`` and ``SparseGraph``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import scipy.linalg
import torch
from torch import Tensor

from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    DiffusionOperator,
    Graph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    SoftmaxGraph,
)
from references import adjacency_reference, laplacian_reference, softmax_reference

GRAPH_KINDS = ("dense", "softmax", "sparse")
NORMALIZATIONS = ("rw", "sym", "combinatorial")


# ---- numpy references ------------------------------------------------------------------------


def to_numpy(x: Tensor) -> np.ndarray:
    """A float64 numpy copy of any tensor."""
    return x.detach().cpu().to(torch.float64).numpy()


def _batched(fn: Callable[..., np.ndarray], w: np.ndarray, x: np.ndarray, *args) -> np.ndarray:
    """Apply ``fn(w_g, x_g, *args)`` to every graph of a batch (x broadcast to w's batch)."""
    batch = w.shape[:-2]
    x = np.broadcast_to(x, (*batch, *x.shape[-2:]))
    out = np.empty(x.shape)
    for idx in np.ndindex(*batch):
        out[idx] = fn(w[idx], x[idx], *args)
    return out


def heat_reference(
    w: np.ndarray, x: np.ndarray, t: float | np.ndarray, normalization: str
) -> np.ndarray:
    """``expm(-t L) x`` with ``scipy.linalg.expm``; ``t`` may vary per graph (broadcast)."""
    batch = w.shape[:-2]
    ts = np.broadcast_to(np.asarray(t, dtype=float), batch)
    x = np.broadcast_to(x, (*batch, *x.shape[-2:]))
    out = np.empty(x.shape)
    for idx in np.ndindex(*batch):
        lap = laplacian_reference(w[idx], normalization)
        out[idx] = scipy.linalg.expm(-ts[idx] * lap) @ x[idx]
    return out


def ppr_reference(w: np.ndarray, x: np.ndarray, alpha: float, normalization: str) -> np.ndarray:
    """``alpha (I - (1 - alpha) A)^{-1} x`` by a dense solve."""

    def one(wg: np.ndarray, xg: np.ndarray) -> np.ndarray:
        a = adjacency_reference(wg, normalization)
        return alpha * np.linalg.solve(np.eye(len(wg)) - (1 - alpha) * a, xg)

    return _batched(one, w, x)


def polynomial_reference(
    w: np.ndarray, x: np.ndarray, coeffs: Sequence[float], normalization: str
) -> np.ndarray:
    """``sum_k c_k L^k x`` with explicit matrix powers."""

    def one(wg: np.ndarray, xg: np.ndarray) -> np.ndarray:
        lap = laplacian_reference(wg, normalization)
        return sum(c * np.linalg.matrix_power(lap, p) @ xg for p, c in enumerate(coeffs))

    return _batched(one, w, x)


def laplacian_batch_reference(w: np.ndarray, normalization: str) -> np.ndarray:
    """:func:`laplacian_reference` over a batch ``(..., N, N)``."""
    out = np.empty(w.shape)
    for idx in np.ndindex(*w.shape[:-2]):
        out[idx] = laplacian_reference(w[idx], normalization)
    return out


# ---- random graphs -----------------------------------------------------------------------------


def random_weights(
    seed: int,
    n: int,
    *,
    batch: tuple[int, ...] = (),
    symmetric: bool = True,
    isolated: Sequence[int] = (0,),
    self_loops: bool = True,
    density: float = 0.6,
) -> np.ndarray:
    """Random non-negative weights ``(..., N, N)`` in [0.1, 1] with exact zeros.

    ``isolated`` nodes have no edge at all (zero row and column); with ``self_loops`` roughly
    half of the other nodes get a diagonal entry (always at least node ``n - 1``).
    """
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.1, 1.0, (*batch, n, n)) * (rng.random((*batch, n, n)) < density)
    diag = np.arange(n)
    w[..., diag, diag] = 0.0
    if symmetric:
        upper = np.triu(w, 1)
        w = upper + np.swapaxes(upper, -1, -2)
    if self_loops:
        loops = rng.uniform(0.1, 1.0, (*batch, n)) * (rng.random((*batch, n)) < 0.5)
        loops[..., n - 1] = rng.uniform(0.1, 1.0, batch)
        w[..., diag, diag] = loops
    for i in isolated:
        w[..., i, :] = 0.0
        w[..., :, i] = 0.0
    return w


@dataclass(frozen=True)
class AttentionCase:
    """Queries, keys, mask and a signal: one attention graph, buildable as every graph kind.

    ``graph("dense")`` is ``DenseGraph(P)`` with ``P`` from :func:`softmax_reference`,
    ``graph("softmax")`` the implicit ``SoftmaxGraph``, ``graph("sparse")`` the same ``P``
    as a ``SparseGraph`` (``DenseGraph(P).to_sparse()``): the same weights in all three.
    """

    q: Tensor
    k: Tensor
    x: Tensor
    mask: Tensor | None = None
    causal: bool = False
    scale: float | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.q.shape[-2])

    def probs(self) -> np.ndarray:
        """The reference attention matrix (float64 numpy)."""
        mask = None if self.mask is None else self.mask.cpu().numpy()
        return softmax_reference(
            to_numpy(self.q), to_numpy(self.k), scale=self.scale, mask=mask, causal=self.causal
        )

    def probs_tensor(self) -> Tensor:
        return torch.as_tensor(self.probs(), dtype=self.q.dtype, device=self.q.device)

    def graph(self, kind: str) -> Graph:
        if kind == "softmax":
            return SoftmaxGraph(
                self.q, self.k, scale=self.scale, mask=self.mask, causal=self.causal
            )
        if kind == "dense":
            return DenseGraph(self.probs_tensor())
        if kind == "sparse":
            return DenseGraph(self.probs_tensor()).to_sparse()
        raise ValueError(kind)

    def permuted(self, perm: Tensor) -> AttentionCase:
        """The same case with its nodes relabelled: node ``i`` of the result is ``perm[i]``."""
        if self.causal:
            raise ValueError("a causal graph is not permutation equivariant")
        mask = None if self.mask is None else self.mask[..., perm, :][..., perm]
        return replace(
            self, q=self.q[..., perm, :], k=self.k[..., perm, :], x=self.x[..., perm, :], mask=mask
        )


def make_attention(
    seed: int,
    *,
    n: int = 5,
    batch: tuple[int, ...] = (),
    features: int = 3,
    channels: int = 2,
    masked: bool = False,
    causal: bool = False,
    empty_rows: Sequence[int] = (),
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> AttentionCase:
    """A random :class:`AttentionCase`.

    With ``masked`` a random mask keeps about 70% of the edges (and always the diagonal);
    ``empty_rows`` are fully masked (nodes with no out-edges).
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, features, generator=gen, dtype=torch.float64)
    k = torch.randn(*batch, n, features, generator=gen, dtype=torch.float64)
    x = torch.randn(*batch, n, channels, generator=gen, dtype=torch.float64)
    mask = None
    if masked or empty_rows:
        mask = torch.rand(*batch, n, n, generator=gen) < (0.7 if masked else 2.0)
        mask |= torch.eye(n, dtype=torch.bool)
        for r in empty_rows:
            mask[..., r, :] = False
        mask = mask.to(device)
    return AttentionCase(
        q.to(device=device, dtype=dtype),
        k.to(device=device, dtype=dtype),
        x.to(device=device, dtype=dtype),
        mask=mask,
        causal=causal,
        scale=scale,
    )


def graph_from_weights(w: np.ndarray, kind: str, dtype: torch.dtype, device: str = "cpu") -> Graph:
    """``DenseGraph`` or ``SparseGraph`` holding the weights ``w``."""
    dense = DenseGraph(torch.as_tensor(w, dtype=dtype, device=device))
    if kind == "dense":
        return dense
    if kind == "sparse":
        return dense.to_sparse()
    raise ValueError(f"no {kind!r} graph from explicit weights")


# ---- operators with their references -----------------------------------------------------------


@dataclass(frozen=True)
class OperatorSpec:
    """An operator (built in float64) and its numpy reference ``(W, x) -> y``."""

    make: Callable[[], DiffusionOperator]
    reference: Callable[[np.ndarray, np.ndarray], np.ndarray]


def _spec(make: Callable[[], DiffusionOperator], ref: Callable[..., np.ndarray]) -> OperatorSpec:
    return OperatorSpec(lambda: make().double(), ref)


OPERATOR_SPECS: dict[str, OperatorSpec] = {
    "attention": _spec(
        Attention,
        lambda w, x: _batched(lambda wg, xg: adjacency_reference(wg, "rw") @ xg, w, x),
    ),
    **{
        f"laplacian-{nz}": _spec(
            lambda nz=nz: Laplacian(nz),
            lambda w, x, nz=nz: _batched(lambda wg, xg: laplacian_reference(wg, nz) @ xg, w, x),
        )
        for nz in NORMALIZATIONS
    },
    "laplacian-step": _spec(
        lambda: Laplacian("rw", step=0.75),
        lambda w, x: 0.75 * _batched(lambda wg, xg: laplacian_reference(wg, "rw") @ xg, w, x),
    ),
    **{
        f"heat-{nz}-{method}": _spec(
            lambda nz=nz, method=method, t=t: HeatKernel(
                t=t, normalization=nz, method=method, tol=1e-12
            ),
            lambda w, x, nz=nz, t=t: heat_reference(w, x, t, nz),
        )
        for nz, method, t in [
            ("rw", "series", 1.5),
            ("sym", "series", 0.75),
            ("combinatorial", "series", 2.5),
            ("rw", "exact", 0.5),
            ("sym", "exact", 3.0),
        ]
    },
    **{
        f"ppr-{nz}": _spec(
            lambda nz=nz: PersonalizedPageRank(alpha=0.25, normalization=nz, tol=1e-12),
            lambda w, x, nz=nz: ppr_reference(w, x, 0.25, nz),
        )
        for nz in NORMALIZATIONS
    },
    **{
        f"polynomial-{nz}": _spec(
            lambda nz=nz: Polynomial([0.5, -1.0, 0.25, 0.125], normalization=nz),
            lambda w, x, nz=nz: polynomial_reference(w, x, [0.5, -1.0, 0.25, 0.125], nz),
        )
        for nz in NORMALIZATIONS
    },
}


def differentiable_attention_graph(
    kind: str, q: Tensor, k: Tensor, *, mask: Tensor | None = None, causal: bool = False
) -> Graph:
    """An attention graph of ``kind`` whose weights are differentiable in ``q`` and ``k``.

    ``"dense"``: ``DenseGraph(SoftmaxGraph(...).to_dense())``; ``"sparse"``: its non-zero
    entries (``to_sparse``); ``"topk"``: the 3 heaviest keys per query.
    """
    g = SoftmaxGraph(q, k, mask=mask, causal=causal)
    if kind == "softmax":
        return g
    if kind == "dense":
        return DenseGraph(g.to_dense())
    if kind == "sparse":
        return g.to_sparse()
    if kind == "topk":
        return g.topk(min(3, g.num_nodes))
    raise ValueError(kind)


# ---- assertions --------------------------------------------------------------------------------


def assert_permutation_equivariant(
    op: Callable[[Graph, Tensor], Tensor],
    case: AttentionCase,
    kind: str,
    perm: Tensor,
    *,
    atol: float = 1e-10,
    rtol: float = 1e-8,
) -> None:
    """``op(graph(perm), x[perm]) == op(graph, x)[perm]``: relabelling the nodes of the graph
    and of the signal relabels the output the same way."""
    y = op(case.graph(kind), case.x)
    moved = case.permuted(perm)
    y_perm = op(moved.graph(kind), moved.x)
    torch.testing.assert_close(y_perm, y[..., perm, :], atol=atol, rtol=rtol)


def assert_close_np(actual: Tensor, expected: np.ndarray, *, atol: float, rtol: float = 0.0):
    """Compare a tensor with a numpy reference in float64."""
    np.testing.assert_allclose(to_numpy(actual), expected, atol=atol, rtol=rtol)


# ---- fixtures ----------------------------------------------------------------------------------


def band_mask(
    n: int, w: int, causal: bool, g: int, key_mask: torch.Tensor | None, drop: bool
) -> torch.Tensor:
    """The dense mask the window graph stands for (written from its definition)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    gap = i - j
    band = ((gap >= 0) & (gap < w)) if causal else gap.abs() <= w
    glob = (i < g) | (j < g)
    allowed = band | (glob & (gap >= 0)) if causal else band | glob
    if key_mask is None:
        return allowed
    allowed = allowed & key_mask[:, None, :]
    if drop:
        allowed = allowed & key_mask[:, :, None]
    return allowed[:, None]  # (B, 1, N, N)
