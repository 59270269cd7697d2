"""heatformer.analysis.markov: the stationary distribution and leading eigenvalues of the random
walk P = D_out^-1 W, on every graph kind, against references built in numpy / SciPy from the
graphs' formulas (never from heatformer): a dense eigendecomposition at small N, SciPy's sparse
direct solver and its shift-invert Arnoldi on an explicit window matrix at N = 65,536."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
import torch

from heatformer.analysis import (
    leading_eigenvalues,
    leading_eigenvectors,
    stationary_distribution,
)
from heatformer.analysis.markov import EIGENVALUE_METHODS, EIGENVECTOR_METHODS, STATIONARY_METHODS
from heatformer.checks import ArgumentError
from heatformer.graph_ops import DenseGraph, Graph, SoftmaxGraph, WindowGraph
from references import softmax_reference, topk_reference

N, E, BATCH = 40, 8, (2, 3)  # batched heads: (B, H)


def _qk(seed: int, batch: tuple[int, ...] = BATCH, n: int = N) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, E, generator=gen).double()  # float32-representable
    k = torch.randn(*batch, n, E, generator=gen).double()
    return q, k


def _window_mask(n: int, w: int, g: int, causal: bool) -> np.ndarray:
    """The window kind's allowed pairs from its definition (DESIGN, window/graph.py)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    glob = (i < g) | (j < g)
    if causal:
        return (i - j >= 0) & ((i - j < w) | glob)
    return (np.abs(i - j) <= w) | glob


def _kind(name: str, seed: int = 0) -> tuple[Graph, np.ndarray]:
    """A batched graph of kind ``name`` and its random walk P ``(..., N, N)`` built in numpy."""
    q, k = _qk(seed)
    qn, kn = q.numpy(), k.numpy()
    if name == "dense":
        gen = torch.Generator().manual_seed(seed)
        w = torch.rand(*BATCH, N, N, generator=gen, dtype=torch.float64)
        w = w * (w > 0.6)  # a sparse pattern, strongly connected at this density
        w = w + 0.1 * torch.eye(N, dtype=torch.float64).roll(1, 0)  # a cycle: irreducible
        p = w.numpy() / w.numpy().sum(-1, keepdims=True)
        return DenseGraph(w), p
    if name == "softmax":
        return SoftmaxGraph(q, k), softmax_reference(qn, kn)
    if name == "topk":
        scores = qn @ np.swapaxes(kn, -1, -2) / math.sqrt(E)
        return SoftmaxGraph(q, k).topk(6), topk_reference(softmax_reference(qn, kn), scores, 6)
    if name.startswith("window"):  # window-g: w = 3 and g global tokens
        g = int(name.split("-")[1])
        mask = _window_mask(N, 3, g, causal=False)
        return WindowGraph(q, k, window=3, num_global=g), softmax_reference(qn, kn, mask=mask)
    raise AssertionError(name)


KINDS = ["dense", "softmax", "topk", "window-0", "window-1", "window-2"]


def _pi_reference(p: np.ndarray) -> np.ndarray:
    """pi of each chain of a batch ``(..., N, N)``: the eigenvector of P^T for the eigenvalue
    nearest 1 (numpy.linalg.eig), normalized to sum 1."""
    n = p.shape[-1]
    out = np.empty(p.shape[:-1])
    for idx in np.ndindex(*p.shape[:-2]):
        values, vectors = np.linalg.eig(p[idx].T)
        v = vectors[:, np.argmin(np.abs(values - 1.0))].real
        out[idx] = v / v.sum()
        assert np.sort(np.abs(values - 1.0))[1] > 1e-8, "the reference needs a simple eigenvalue"
    return out.reshape(*p.shape[:-2], n)


def _residual(p: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """||P^T pi - pi||_1 per graph."""
    return np.abs(np.einsum("...ij,...i->...j", p, pi) - pi).sum(-1)


# ---- stationary distribution ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "method"),
    [  # "banded" refuses the kinds without a band: test_banded_refuses_graphs_without_...
        (kind, method)
        for kind in KINDS
        for method in ("auto", *STATIONARY_METHODS)
        if method != "banded" or kind.startswith("window")
    ],
)
def test_stationary_matches_dense_eigendecomposition(kind: str, method: str) -> None:
    graph, p = _kind(kind)
    pi = stationary_distribution(graph, method=method)
    assert pi.shape == (*BATCH, N) and pi.dtype == torch.float64
    reference = _pi_reference(p)
    tol = 1e-12 if method != "arnoldi" else 1e-10
    np.testing.assert_allclose(pi.numpy(), reference, rtol=0, atol=tol)
    assert (_residual(p, pi.numpy()) < (1e-13 if method != "arnoldi" else 1e-10)).all()
    np.testing.assert_allclose(pi.sum(-1).numpy(), 1.0, rtol=0, atol=1e-14)
    assert (pi >= -1e-15).all()


@pytest.mark.parametrize("kind", ["softmax", "window-1"])
def test_implicit_graphs_are_recomputed_in_float64(kind: str) -> None:
    """A float32 attention graph (of float32-representable q, k) gives the float64 graph's pi,
    not a float32 one: the chain recomputes the weights in float64."""
    graph, p = _kind(kind)
    pi = stationary_distribution(graph.to(torch.float32))
    assert pi.dtype == torch.float64
    np.testing.assert_allclose(pi.numpy(), _pi_reference(p), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", list(STATIONARY_METHODS))
@pytest.mark.parametrize("num_global", [0, 1])
def test_causal_window_drains_to_token_zero(num_global: int, method: str) -> None:
    """A causal P is lower triangular and token 0 attends only to itself: pi = e_0."""
    q, k = _qk(1)
    graph = WindowGraph(q, k, window=4, num_global=num_global, causal=True)
    pi = stationary_distribution(graph, method=method)
    expected = torch.zeros(*BATCH, N, dtype=torch.float64)
    expected[..., 0] = 1.0
    if method == "arnoldi":
        torch.testing.assert_close(pi, expected, rtol=0, atol=1e-10)
    else:  # exact: the one closed class is {0}
        assert torch.equal(pi, expected)


@pytest.mark.parametrize("graph_of", ["softmax", "dense"])
def test_causal_dense_kinds_drain_to_token_zero(graph_of: str) -> None:
    q, k = _qk(2, batch=(3,))
    if graph_of == "softmax":
        graph: Graph = SoftmaxGraph(q, k, causal=True)
    else:
        graph = DenseGraph(torch.tril(torch.rand(3, N, N, dtype=torch.float64) + 0.01))
    for method in ("dense", "arnoldi"):
        pi = stationary_distribution(graph, method=method)
        torch.testing.assert_close(pi[:, 0], torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-10)
        assert float(pi[:, 1:].abs().max()) < 1e-10


def test_symmetrized_causal_graph_is_ranked_by_its_degrees() -> None:
    """The module's advice for causal models: the bidirectional W_s = (W + W^T) / 2 is a
    reversible chain, whose pi is proportional to its degrees."""
    q, k = _qk(3, batch=(2,))
    graph = WindowGraph(q, k, window=5, causal=True).symmetrize()
    pi = stationary_distribution(graph)
    degree = graph.out_degree()
    torch.testing.assert_close(pi, degree / degree.sum(-1, keepdim=True), rtol=1e-12, atol=0)


def test_transient_nodes_get_no_mass() -> None:
    """A key mask without drop_masked_queries: padded keys are never attended, so their nodes
    are transient; pi lives on the one closed class (the real tokens) and matches numpy."""
    q, k = _qk(4)
    key_mask = torch.ones(BATCH[0], N, dtype=torch.bool)
    key_mask[0, -5:] = False
    key_mask[1, 7] = False
    graph = WindowGraph(q, k, window=3, num_global=1, key_mask=key_mask)
    mask = _window_mask(N, 3, 1, causal=False) & key_mask.numpy()[:, None, None, :]
    p = softmax_reference(q.numpy(), k.numpy(), mask=mask)
    for method in STATIONARY_METHODS:
        pi = stationary_distribution(graph, method=method).numpy()
        assert np.abs(pi[0, :, -5:]).max() < 1e-12 and np.abs(pi[1, :, 7]).max() < 1e-12
        np.testing.assert_allclose(pi, _pi_reference(p), rtol=0, atol=1e-10)


def test_several_closed_classes_are_refused() -> None:
    block = torch.ones(4, 4, dtype=torch.float64)
    graph = DenseGraph(torch.block_diag(block, block))  # two chains that never meet
    for method in ("dense", "banded"):
        with pytest.raises(ValueError, match=r"one closed class.*got 2") as err:
            stationary_distribution(graph.to_sparse(), method=method)
        assert err.value.argument == "graph"  # type: ignore[attr-defined]


def test_causal_window_of_one_key_is_refused() -> None:
    """w = 1, causal: every token attends only to itself, P = I, every distribution is
    stationary: N closed classes."""
    q, k = _qk(5, batch=())
    with pytest.raises(ValueError, match=f"got {N}") as err:
        stationary_distribution(WindowGraph(q, k, window=1, causal=True), method="banded")
    assert err.value.argument == "graph"  # type: ignore[attr-defined]


@pytest.mark.parametrize("fn", ["stationary", "eigenvalues"])
def test_nodes_without_out_edges_are_refused(fn: str) -> None:
    q, k = _qk(6)
    key_mask = torch.ones(BATCH[0], N, dtype=torch.bool)
    key_mask[1, 3] = False
    graph = WindowGraph(q, k, window=3, key_mask=key_mask, drop_masked_queries=True)
    with pytest.raises(ValueError, match=r"out-edge.*node 3 of graph \(1, 0\)") as err:
        stationary_distribution(graph) if fn == "stationary" else leading_eigenvalues(graph, 2)
    assert err.value.argument == "graph"  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["softmax", "dense", "topk"])
def test_banded_refuses_graphs_without_a_narrow_band(kind: str) -> None:
    graph, _ = _kind(kind)
    reason = "does not list its edges" if kind != "topk" else "is not narrow"
    with pytest.raises(ValueError, match=f"'banded' refused: .*{reason}") as err:
        stationary_distribution(graph, method="banded")
    assert err.value.argument == "method"  # type: ignore[attr-defined]


def test_non_attention_weights_are_row_normalized() -> None:
    """P = D_out^-1 W for any weights: a weighted path graph's pi is proportional to its
    (symmetric) degrees, for every method, on DenseGraph and its SparseGraph."""
    w = torch.zeros(N, N, dtype=torch.float64)
    idx = torch.arange(N - 1)
    w[idx, idx + 1] = w[idx + 1, idx] = torch.linspace(1.0, 5.0, N - 1, dtype=torch.float64)
    expected = w.sum(-1) / w.sum()
    for graph in (DenseGraph(w), DenseGraph(w).to_sparse()):
        for method in STATIONARY_METHODS:
            if method == "banded" and graph.sparse_entries() is None:
                continue
            pi = stationary_distribution(graph, method=method)
            torch.testing.assert_close(pi, expected, rtol=1e-10, atol=1e-13)


def test_a_refused_method_says_why_and_auto_takes_the_next() -> None:
    """Two nodes: ARPACK refuses (it needs N >= 3), "auto" takes the dense solve; a window graph
    past DENSE_MAX_NODES: "dense" refuses, "auto" takes the banded solve."""
    graph = DenseGraph(torch.tensor([[1.0, 3.0], [1.0, 1.0]]))
    torch.testing.assert_close(stationary_distribution(graph), torch.tensor([0.4, 0.6]).double())
    with pytest.raises(ValueError, match=r"'arnoldi' refused: ARPACK needs N >= 3, got 2"):
        stationary_distribution(graph, method="arnoldi")
    q, k = _qk(10, batch=(), n=2100)
    window = WindowGraph(q, k, window=8, num_global=1)
    with pytest.raises(ValueError, match=r"'dense' refused: N = 2100 > DENSE_MAX_NODES = 2048"):
        stationary_distribution(window, method="dense")
    torch.testing.assert_close(
        stationary_distribution(window), stationary_distribution(window, method="banded")
    )


# ---- leading eigenvalues -------------------------------------------------------------------


def _eig_reference(p: np.ndarray, k: int) -> np.ndarray:
    values = np.linalg.eigvals(p)  # (..., N)
    out = np.empty((*p.shape[:-2], k), dtype=np.complex128)
    for idx in np.ndindex(*p.shape[:-2]):
        v = values[idx]
        out[idx] = v[np.lexsort((-v.imag, -v.real, -np.abs(v).round(12)))][:k]
    return out


def _assert_same_eigenvalues(got: np.ndarray, expected: np.ndarray, atol: float) -> None:
    """Equal moduli in order, and equal values up to conjugation (a conjugate pair split by
    the k-th place may come back as either member)."""
    np.testing.assert_allclose(np.abs(got), np.abs(expected), rtol=0, atol=atol)
    np.testing.assert_allclose(got.real, expected.real, rtol=0, atol=atol)
    np.testing.assert_allclose(np.abs(got.imag), np.abs(expected.imag), rtol=0, atol=atol)


@pytest.mark.parametrize("method", ["auto", *EIGENVALUE_METHODS])
@pytest.mark.parametrize("kind", KINDS)
def test_leading_eigenvalues_match_numpy(kind: str, method: str) -> None:
    graph, p = _kind(kind, seed=7)
    got = leading_eigenvalues(graph, 5, method=method)
    assert got.shape == (*BATCH, 5) and got.dtype == torch.complex128
    expected = _eig_reference(p, 5)
    _assert_same_eigenvalues(got.numpy(), expected, 1e-12 if method != "arnoldi" else 1e-9)
    torch.testing.assert_close(got[..., 0], torch.ones(BATCH, dtype=torch.complex128))
    moduli = got.abs()
    assert (moduli[..., :-1] >= moduli[..., 1:] - 1e-12).all()


def test_leading_eigenvalues_of_a_periodic_chain() -> None:
    """The 3-node path: eigenvalues 1, 0, -1, ordered by modulus, then real part."""
    path = DenseGraph(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    got = leading_eigenvalues(path, 3)
    torch.testing.assert_close(
        got, torch.tensor([1.0, -1.0, 0.0], dtype=torch.complex128), rtol=0, atol=1e-15
    )


def test_leading_eigenvalues_use_only_propagate() -> None:
    """A graph whose only working products are propagate (to_dense and the transpose raise)
    still gives its eigenvalues, by both methods."""
    graph, p = _kind("window-1", seed=8)

    class OnlyPropagate(Graph):
        def __init__(self, base: Graph) -> None:
            self.base, self._tensor = base, base._tensor

        @property
        def num_nodes(self) -> int:
            return self.base.num_nodes

        @property
        def batch_shape(self) -> torch.Size:
            return self.base.batch_shape

        def propagate(self, x: torch.Tensor) -> torch.Tensor:
            return self.base.propagate(x)

        def out_degree(self) -> torch.Tensor:
            return self.base.out_degree()

        def to(self, dtype: torch.dtype) -> OnlyPropagate:
            return OnlyPropagate(self.base.to(dtype))

        def propagate_transpose(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("not through propagate")

        def weight_rows(self, start: int, stop: int) -> torch.Tensor:
            raise AssertionError("not through propagate")

    for method in EIGENVALUE_METHODS:
        got = leading_eigenvalues(OnlyPropagate(graph), 3, method=method)
        _assert_same_eigenvalues(got.numpy(), _eig_reference(p, 3), 1e-9)


# ---- leading eigenvectors ------------------------------------------------------------------


@pytest.mark.parametrize("method", ["auto", *EIGENVECTOR_METHODS])
@pytest.mark.parametrize("kind", KINDS)
def test_leading_eigenvectors_match_numpy_eig(kind: str, method: str) -> None:
    """Right eigenvectors, P v = lam v, against numpy.linalg.eig of the numpy-built P: the
    values of leading_eigenvalues, unit norm, the largest entry real and positive, and each
    simple value's vector numpy's up to its phase."""
    graph, p = _kind(kind, seed=7)
    values, vectors = leading_eigenvectors(graph, 4, method=method)
    assert values.shape == (*BATCH, 4) and vectors.shape == (*BATCH, N, 4)
    assert values.dtype == vectors.dtype == torch.complex128
    atol = 1e-12 if method != "arnoldi" else 1e-9
    _assert_same_eigenvalues(values.numpy(), _eig_reference(p, 4), atol)
    for idx in np.ndindex(*BATCH):
        lam, vec, pb = values[idx].numpy(), vectors[idx].numpy(), p[idx]
        np.testing.assert_allclose(pb @ vec, vec * lam[None, :], rtol=0, atol=1e3 * atol)
        np.testing.assert_allclose(np.linalg.norm(vec, axis=0), 1.0, rtol=0, atol=1e-12)
        peak = np.argmax(np.abs(vec).round(12), axis=0)
        top = vec[peak, np.arange(4)]
        assert (top.imag == 0).all() and (top.real > 0).all()  # the phase convention
        ref_values, ref_vectors = np.linalg.eig(pb)
        for i in range(4):
            gaps = np.abs(ref_values - lam[i])
            if np.sort(gaps)[1] < 1e-6:  # a repeated value: its vector is not unique
                continue
            ref = ref_vectors[:, np.argmin(gaps)]
            overlap = abs(np.vdot(ref / np.linalg.norm(ref), vec[:, i]))
            assert overlap == pytest.approx(1.0, abs=1e3 * atol)
    # v_1 is the constant: P 1 = 1
    torch.testing.assert_close(
        vectors[..., 0], torch.full((*BATCH, N), N**-0.5, dtype=torch.complex128), atol=1e-9,
        rtol=0,
    )  # fmt: skip


def test_the_second_eigenvector_of_a_periodic_chain_alternates() -> None:
    path = DenseGraph(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    values, vectors = leading_eigenvectors(path, 2)
    torch.testing.assert_close(values, torch.tensor([1.0, -1.0], dtype=torch.complex128))
    expected = torch.tensor([[1.0, 1.0], [1.0, -1.0], [1.0, 1.0]], dtype=torch.complex128)
    torch.testing.assert_close(vectors, expected / 3**0.5, rtol=0, atol=1e-15)


def test_a_complex_pair_has_conjugate_eigenvectors() -> None:
    """A directed 3-cycle with self-loops: lam_2 = conj(lam_3), complex, and so are their
    vectors (the + member first, each with its largest entry real and positive)."""
    cycle = DenseGraph(
        torch.eye(3, dtype=torch.float64) + torch.eye(3, dtype=torch.float64).roll(1, 1)
    )
    values, vectors = leading_eigenvectors(cycle, 3)
    w = np.exp(2j * np.pi / 3)
    np.testing.assert_allclose(values.numpy(), [1.0, (1 + w) / 2, (1 + w.conjugate()) / 2],
                               atol=1e-12)  # fmt: skip
    p = cycle.to_dense().numpy() / 2
    v = vectors.numpy()
    np.testing.assert_allclose(p @ v, v * values.numpy()[None, :], atol=1e-12)
    np.testing.assert_allclose(v[:, 2], v[:, 1].conj(), atol=1e-12)
    assert v[0, 1] == pytest.approx(3**-0.5)  # a tie of moduli: the first entry is made real


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "argument", "error"),
    [
        (lambda g: stationary_distribution(g.to_dense()), "graph", TypeError),
        (lambda g: stationary_distribution(g, method="lu"), "method", ValueError),
        (lambda g: stationary_distribution(g, method=1), "method", TypeError),
        (lambda g: stationary_distribution(g, tol=0.0), "tol", ValueError),
        (lambda g: leading_eigenvalues(g.to_dense(), 2), "graph", TypeError),
        (lambda g: leading_eigenvalues(g, 0), "k", ValueError),
        (lambda g: leading_eigenvalues(g, N + 1), "k", ValueError),
        (lambda g: leading_eigenvalues(g, 2.0), "k", TypeError),
        (lambda g: leading_eigenvalues(g, True), "k", TypeError),
        (lambda g: leading_eigenvalues(g, 2, method="eig"), "method", ValueError),
        (lambda g: leading_eigenvalues(g, 2, tol=2.0), "tol", ValueError),
        (lambda g: leading_eigenvalues(g, N - 1, method="arnoldi"), "method", ValueError),
        (lambda g: leading_eigenvectors(g.to_dense(), 2), "graph", TypeError),
        (lambda g: leading_eigenvectors(g, 0), "k", ValueError),
        (lambda g: leading_eigenvectors(g, 2, method="eigvals"), "method", ValueError),
        (lambda g: leading_eigenvectors(g, N - 1, method="arnoldi"), "method", ValueError),
        (lambda g: stationary_distribution(DenseGraph(torch.zeros(0, 0))), "graph", ValueError),
    ],
)
def test_bad_input_names_the_argument(call, argument: str, error: type) -> None:
    graph, _ = _kind("window-1")
    with pytest.raises(error) as err:
        call(graph)
    assert isinstance(err.value, ArgumentError) and err.value.argument == argument


# ---- at N = 65,536, against SciPy on an explicit matrix ------------------------------------

BIG, W_BIG = 65_536, 32


def _explicit_window(q: np.ndarray, k: np.ndarray, w: int) -> scipy.sparse.csr_array:
    """The bidirectional window graph with global token 0 as an explicit CSR, built in numpy
    from its definition: row i > 0 is the softmax of q_i . k_j / sqrt(E) over |i - j| <= w and
    j = 0; row 0 over every key."""
    n, e = q.shape
    scale = 1.0 / math.sqrt(e)
    band = np.arange(n)[:, None] + np.arange(-w, w + 1)[None, :]  # (N, 2w + 1)
    valid = np.concatenate([np.ones((n, 1), dtype=bool), (band >= 1) & (band < n)], axis=1)
    cols = np.concatenate([np.zeros((n, 1), dtype=np.int64), np.clip(band, 0, n - 1)], axis=1)
    s = np.where(valid, np.einsum("ne,nke->nk", q, k[cols]) * scale, -np.inf)  # (N, 2w + 2)
    ex = np.exp(s - s.max(1, keepdims=True))
    weights = ex / ex.sum(1, keepdims=True)
    s0 = q[0] @ k.T * scale  # the global row: every key
    row0 = np.exp(s0 - s0.max())
    rows = np.nonzero(valid)[0]
    later = rows > 0
    data = np.concatenate([row0 / row0.sum(), weights[valid][later]])
    r = np.concatenate([np.zeros(n, dtype=np.int64), rows[later]])
    c = np.concatenate([np.arange(n), cols[valid][later]])
    return scipy.sparse.csr_array((data, (r, c)), shape=(n, n))


@pytest.fixture(scope="module")
def big_window() -> tuple[WindowGraph, scipy.sparse.csr_array]:
    q, k = (t[0] for t in _qk(9, batch=(1,), n=BIG))
    graph = WindowGraph(q, k, window=W_BIG, num_global=1)
    return graph, _explicit_window(q.numpy(), k.numpy(), W_BIG)


@pytest.mark.slow
def test_stationary_at_65k_matches_scipy_spsolve(big_window) -> None:
    graph, p = big_window
    # pi_0 = 1 fixed (Stewart 1994, 2.3): (I - P^T) on tokens 1.. is banded and non-singular,
    # and pi_j - sum_{i >= 1} P_ij pi_i = P_0j; then normalize
    a = (scipy.sparse.identity(BIG, format="csc") - p.T.tocsc())[1:, 1:]
    rest = scipy.sparse.linalg.spsolve(a.tocsc(), p[[0], 1:].toarray()[0])
    reference = np.concatenate([[1.0], rest]) / (1.0 + rest.sum())
    pi = stationary_distribution(graph)  # auto: banded
    np.testing.assert_allclose(pi.numpy(), reference, rtol=1e-9, atol=0)
    assert np.abs(p.T @ pi.numpy() - pi.numpy()).sum() < 1e-12


@pytest.mark.slow
def test_leading_eigenvalues_at_65k_match_shift_invert_arnoldi(big_window) -> None:
    """Through propagate (ARPACK's largest-modulus mode) against SciPy's shift-invert mode
    around 1 on the explicit matrix (a sparse LU: another algorithm for the same values)."""
    graph, p = big_window
    got = leading_eigenvalues(graph, 4).numpy()
    reference = scipy.sparse.linalg.eigs(p.tocsc(), k=4, sigma=1.0 + 1e-3, which="LM")[0]
    reference = reference[np.lexsort((-reference.imag, -reference.real, -np.abs(reference)))]
    _assert_same_eigenvalues(got, reference, 1e-8)
    # lambda_1 = 1 alone; the band's eigenvalues below it, shrunk by the leak to the global
    # token (about 1 / (2 w + 2) a step), in a cluster about (w / N)^2 apart
    assert abs(got[0] - 1.0) < 1e-10 and 1 - 2 / (2 * W_BIG + 2) < abs(got[1]) < 1.0
    assert abs(got[1]) - abs(got[3]) < 1e-2
