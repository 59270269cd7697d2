"""Heat kernels against ``scipy.linalg.expm`` in float64 (the golden heat kernel)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given
from hypothesis import strategies as st

import graph_helpers as gh
import heatformer.graph_ops.heat as heat_module
from heatformer.graph_ops import (
    HEAT_METHODS,
    DenseGraph,
    HeatKernel,
    SoftmaxGraph,
    heat_kernel,
    select_heat_method,
)
from heatformer.graph_ops.heat import poisson_order

TIMES = [0.0, 0.1, 1.0, 5.0, 20.0]
METHODS = {"series": {"method": "series", "tol": 1e-12}, "exact": {"method": "exact"}}
# attention graphs in the three kinds, plus general directed weights with an isolated node
SOURCES = ["dense", "softmax", "sparse", "weights-dense", "weights-sparse"]


def build(source: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    """(graph, x, reference weights) for one source."""
    if source.startswith("weights-"):
        w = gh.random_weights(seed, 6, batch=(2,), symmetric=False, isolated=(2,))
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 6, 3, generator=gen, dtype=torch.float64).to(dtype)
        return gh.graph_from_weights(w, source.removeprefix("weights-"), dtype), x, w
    case = gh.make_attention(seed, n=6, batch=(2,), masked=True, empty_rows=(4,), dtype=dtype)
    return case.graph(source), case.x, case.probs()


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("t", TIMES)
@pytest.mark.parametrize("source", SOURCES)
def test_heat_equals_expm(source, t, method, normalization) -> None:
    g, x, w = build(source)
    xn = gh.to_numpy(x)
    expected = gh.heat_reference(w, xn, t, normalization)
    y = heat_kernel(g, x, t, normalization=normalization, **METHODS[method])
    assert y.shape == x.shape and y.dtype == torch.float64
    gh.assert_close_np(y, expected, atol=1e-10 * np.abs(xn).max())


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("t", TIMES)
@pytest.mark.parametrize("source", ["dense", "softmax", "sparse", "weights-sparse"])
def test_heat_float32_close_to_float64(source, t, method, normalization) -> None:
    g64, x64, w = build(source, torch.float64, seed=1)
    g32, x32, _ = build(source, torch.float32, seed=1)
    kwargs = {"method": method, "tol": 1e-6}
    y64 = heat_kernel(g64, x64, t, normalization=normalization, **kwargs)
    y32 = heat_kernel(g32, x32, t, normalization=normalization, **kwargs)
    assert y32.dtype == torch.float32
    scale = float(x64.abs().max())
    gh.assert_close_np(y32, gh.to_numpy(y64), atol=1e-5 * scale)
    gh.assert_close_np(
        y64, gh.heat_reference(w, gh.to_numpy(x64), t, normalization), atol=2e-6 * scale
    )


@pytest.mark.parametrize("method", sorted(METHODS))
def test_time_per_head_equals_scalar_calls(graph_kind, normalization, method) -> None:
    b, h = 2, 3
    case = gh.make_attention(4, n=5, batch=(b, h), masked=True, empty_rows=(1,))
    t = torch.tensor([0.3, 2.0, 7.0], dtype=torch.float64)
    kwargs = {"normalization": normalization, **METHODS[method]}
    y = heat_kernel(case.graph(graph_kind), case.x, t, **kwargs)
    op = HeatKernel(t=[0.3, 2.0, 7.0], **kwargs)
    op_y = op(case.graph(graph_kind), case.x)
    # the operator keeps t in the default dtype (see test_heat_kernel_keeps_float64_time)
    torch.testing.assert_close(
        op_y, heat_kernel(case.graph(graph_kind), case.x, op.t.double(), **kwargs)
    )
    for head in range(h):
        sub = gh.make_attention(4, n=5, batch=(b, h), masked=True, empty_rows=(1,))
        sub = type(sub)(sub.q[:, head], sub.k[:, head], sub.x[:, head], mask=sub.mask[:, head])
        y_head = heat_kernel(sub.graph(graph_kind), sub.x, float(t[head]), **kwargs)
        torch.testing.assert_close(y[:, head], y_head, atol=1e-10, rtol=0)
        torch.testing.assert_close(op_y[:, head], y_head, atol=1e-7, rtol=0)
    expected = gh.heat_reference(
        case.probs(), gh.to_numpy(case.x), t.numpy()[None, :], normalization
    )
    gh.assert_close_np(y, expected, atol=1e-10)


@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-8])
@pytest.mark.parametrize("t", [0.5, 3.0, 30.0])
def test_series_truncation_error_within_tol(normalization, t, tol) -> None:
    """The documented bound: error <= tol * max|x| (2-norm sense for ``"sym"``)."""
    g, x, w = build("weights-dense", seed=5)
    y = heat_kernel(g, x, t, normalization=normalization, method="series", tol=tol)
    err = gh.to_numpy(y) - gh.heat_reference(w, gh.to_numpy(x), t, normalization)
    if normalization == "sym":
        bound = tol * np.linalg.norm(gh.to_numpy(x), axis=-2).max()
        assert np.linalg.norm(err, axis=-2).max() <= bound
    else:
        assert np.abs(err).max() <= tol * float(x.abs().max())


def test_large_time_reaches_stationary_distribution() -> None:
    """``exp(-t(I - P)) x -> 1 pi^T x`` for an irreducible aperiodic attention graph."""
    case = gh.make_attention(8, n=6)
    p = case.probs()
    vals, vecs = np.linalg.eig(p.T)
    pi = np.real(vecs[:, np.argmin(np.abs(vals - 1))])
    pi /= pi.sum()
    y = heat_kernel(SoftmaxGraph(case.q, case.k), case.x, 200.0, tol=1e-10)
    expected = np.ones((6, 1)) * (pi @ gh.to_numpy(case.x))
    gh.assert_close_np(y, expected, atol=1e-8)


def test_float32_large_time_is_split(graph_kind, normalization) -> None:
    """DESIGN: large t is split, ``exp(-tL) = exp(-(t/s)L)^s``. Unsplit, the series' leading
    weight ``e^{-tau}`` underflows in float32 for ``tau`` beyond ~100 and the result is 0."""
    case = gh.make_attention(3, n=6, batch=(2,), masked=True, empty_rows=(4,), dtype=torch.float32)
    t = 200.0
    y = heat_kernel(case.graph(graph_kind), case.x, t, normalization=normalization, method="series")
    assert y.dtype == torch.float32 and bool(torch.isfinite(y).all())
    xn = gh.to_numpy(case.x)
    expected = gh.heat_reference(case.probs(), xn, t, normalization)
    gh.assert_close_np(y, expected, atol=1e-4 * np.abs(xn).max())


def test_series_refusal_counts_every_split(monkeypatch) -> None:
    """``SERIES_MAX_TERMS`` bounds the total number of propagations ``s * K`` (``s`` splits of
    order ``K``), not the order of one split. Expected plan computed here with scipy."""
    g, x, _ = build("softmax")
    t, tol = 100.0, 1e-6  # "rw" on attention: tau = t
    s = int(np.ceil(t / heat_module.SERIES_MAX_STEP))
    assert s > 1
    order = next(k for k in range(1000) if scipy.stats.poisson.sf(k, t / s) <= tol / s)
    total = s * order
    monkeypatch.setattr(heat_module, "SERIES_MAX_TERMS", total - 1)
    with pytest.raises(ValueError, match=rf"^method: 'series' refused: needs {total} propagations"):
        heat_kernel(g, x, t, method="series", tol=tol)
    monkeypatch.setattr(heat_module, "SERIES_MAX_TERMS", total)
    monkeypatch.setattr(heat_module, "MATERIALIZE_BUDGET_BYTES", 0)  # keep it matrix-free
    assert select_heat_method(g, t, "rw", tol).name == "series"


def test_auto_materializes_an_implicit_graph_under_the_budget(monkeypatch) -> None:
    """``"series-dense"``: the series on ``P`` formed once, while ``B H N^2`` floats fit the
    budget; same result as the matrix-free series; refused (with reasons) otherwise."""
    g, x, _ = build("softmax")
    size = g.materialized_bytes()
    assert size == g.q.shape[0] * g.num_nodes**2 * g.q.element_size()
    assert select_heat_method(g, 1.0, "rw", 1e-8).name == "series-dense"
    dense = heat_kernel(g, x, 1.0, method="series-dense", tol=1e-12)
    torch.testing.assert_close(dense, heat_kernel(g, x, 1.0, method="series", tol=1e-12),
                               atol=1e-12, rtol=0)  # fmt: skip
    monkeypatch.setattr(heat_module, "MATERIALIZE_BUDGET_BYTES", size - 1)
    assert select_heat_method(g, 1.0, "rw", 1e-8).name == "series"
    with pytest.raises(ValueError, match=r"'series-dense' refused: its explicit weights take"):
        heat_kernel(g, x, 1.0, method="series-dense")
    explicit = DenseGraph(g.to_dense().detach())  # already explicit: nothing to materialize
    assert select_heat_method(explicit, 1.0, "rw", 1e-8).name == "series"
    with pytest.raises(ValueError, match=r"no explicit form that is cheaper"):
        heat_kernel(explicit, x, 1.0, method="series-dense")


Grads = tuple[torch.Tensor, ...]


def _stored_and_recomputed(
    monkeypatch: pytest.MonkeyPatch, grads: Callable[[], Grads]
) -> tuple[Grads, Grads, int]:
    """``grads()`` with every term stored, then with CHECKPOINT_ELEMENTS lowered to 1 (the
    recomputing path), and the number of checkpoint calls of the second."""
    stored = grads()
    monkeypatch.setattr(heat_module, "CHECKPOINT_ELEMENTS", 1)
    calls: list[int] = []
    real = heat_module.checkpoint
    monkeypatch.setattr(
        heat_module, "checkpoint", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    return stored, grads(), len(calls)


@pytest.mark.parametrize("t_value", [1.5, 11.0])  # one sub-step, and two (tau > 8)
def test_large_series_terms_are_recomputed_in_backward(monkeypatch, t_value: float) -> None:
    """Above CHECKPOINT_ELEMENTS the series is recomputed in backward in segments of at most
    sqrt(2 K) terms, with the same gradients (in q, k, x and a learnable t)."""
    gen = torch.Generator().manual_seed(0)
    q, k, x = (torch.randn(2, 12, 3, generator=gen, dtype=torch.float64, requires_grad=True)
               for _ in range(3))  # fmt: skip
    t = torch.tensor([t_value, 0.7 * t_value], dtype=torch.float64, requires_grad=True)

    def grads() -> tuple[torch.Tensor, ...]:
        y = heat_kernel(SoftmaxGraph(q, k), x, t, method="series", tol=1e-10)
        return torch.autograd.grad((y**2).sum(), (q, k, x, t))

    stored, recomputed, calls = _stored_and_recomputed(monkeypatch, grads)
    order = heat_module.series_plan(float(t.detach().max()), 1e-10)[1]
    segments = heat_module._segments(order, x)
    assert 1 < len(segments) < order and calls >= len(segments)  # segments, not terms
    for a, b in zip(stored, recomputed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@given(st.integers(1, 400))
def test_series_segments_cover_the_terms_and_bound_what_backward_holds(order: int) -> None:
    """Segments tile ``1..order`` in order, shortest last; segment ``j``'s backward holds the
    ``j`` earlier segment inputs and its own terms: at most ``m``, the smallest with
    ``m (m + 1) / 2 >= order`` (no one-level schedule of checkpointed segments does better)."""
    big = torch.zeros(1).expand(heat_module.CHECKPOINT_ELEMENTS)  # its size, not its memory
    segments = heat_module._segments(order, big)
    assert segments[0][0] == 1 and segments[-1][1] == order
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(segments))
    lengths = [last - first + 1 for first, last in segments]
    assert lengths == sorted(lengths, reverse=True)
    m = max(j + length for j, length in enumerate(lengths))
    assert m * (m + 1) // 2 >= order > (m - 1) * m // 2
    assert heat_module._segments(order, big[:-1]) is None  # small: everything stored
    with torch.no_grad():
        assert heat_module._segments(order, big) is None  # no backward: nothing to keep


def test_poisson_order_is_smallest_sufficient() -> None:
    for tau in [0.01, 0.5, 1.0, 3.7, 8.0]:
        for tol in [1e-2, 1e-6, 1e-12]:
            k = poisson_order(tau, tol)
            assert scipy.stats.poisson.sf(k, tau) <= tol * (1 + 1e-9)
            assert k == 0 or scipy.stats.poisson.sf(k - 1, tau) > tol


def test_auto_prefers_series_then_falls_back(monkeypatch) -> None:
    g, x, w = build("softmax")
    assert select_heat_method(g, 1.0, "rw", 1e-6).name == "series-dense"
    monkeypatch.setattr(heat_module, "MATERIALIZE_BUDGET_BYTES", 0)
    assert select_heat_method(g, 1.0, "rw", 1e-6).name == "series"
    monkeypatch.setattr(heat_module, "SERIES_MAX_TERMS", 1)
    assert select_heat_method(g, 1.0, "rw", 1e-6).name == "exact"
    expected = gh.heat_reference(w, gh.to_numpy(x), 1.0, "rw")
    gh.assert_close_np(heat_kernel(g, x, 1.0), expected, atol=1e-10)
    monkeypatch.setattr(heat_module, "EXACT_MAX_NODES", 3)
    with pytest.raises(ValueError, match="method") as info:
        heat_kernel(g, x, 1.0)
    assert all(f"'{m}'" in str(info.value) for m in ("series-dense", "series", "exact"))
    assert "SERIES_MAX_TERMS" in str(info.value) and "EXACT_MAX_NODES" in str(info.value)


def test_registry_declares_methods() -> None:
    assert list(HEAT_METHODS) == ["series-dense", "series", "exact"]  # the order "auto" tries
    for name, entry in HEAT_METHODS.items():
        assert entry.name == name and entry.summary


def test_heat_on_path_graph_closed_form() -> None:
    """Two nodes joined by an edge: ``exp(-t L_rw) e_0 = ((1 + e^{-2t}), (1 - e^{-2t})) / 2``."""
    g = DenseGraph(torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64))
    x = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    for t in TIMES:
        y = heat_kernel(g, x, t, tol=1e-12).squeeze(-1)
        e = np.exp(-2 * t)
        np.testing.assert_allclose(y.numpy(), [(1 + e) / 2, (1 - e) / 2], atol=1e-12)


def test_heat_kernel_keeps_float64_time() -> None:
    case = gh.make_attention(0, n=5)
    t = torch.tensor(0.3, dtype=torch.float64)
    op = HeatKernel(t=t, tol=1e-12)
    assert op.t.dtype == torch.float64
    expected = heat_kernel(case.graph("softmax"), case.x, 0.3, tol=1e-12)
    torch.testing.assert_close(op(case.graph("softmax"), case.x), expected, atol=1e-14, rtol=0)


def test_a_one_term_series_of_a_large_signal_is_recomputed_too(monkeypatch) -> None:
    """Short series (here K = 1) are checkpointed as well once a term is large."""
    gen = torch.Generator().manual_seed(1)
    q, k, x = (torch.randn(1, 9, 3, generator=gen, dtype=torch.float64, requires_grad=True)
               for _ in range(3))  # fmt: skip

    def grads() -> tuple[torch.Tensor, ...]:
        y = heat_kernel(SoftmaxGraph(q, k), x, 0.1, method="series", tol=1e-2)
        return torch.autograd.grad((y**2).sum(), (q, k, x))

    assert heat_module.series_plan(0.1, 1e-2) == (1, 1)
    stored, recomputed, calls = _stored_and_recomputed(monkeypatch, grads)
    assert calls == 1
    for a, b in zip(stored, recomputed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-14, rtol=0)


# ---- past convergence: t up to 1e300 (issue 21) ---------------------------------------------

#: mpmath's working precision for the references (float64 carries 16 digits)
MP_DIGITS = 60


def _mp_laplacian(w: np.ndarray, normalization: str):
    """The Laplacian of float64 weights ``w`` ``(N, N)`` in ``MP_DIGITS`` digits: the degrees
    are summed there, so ``rw`` and ``combinatorial`` rows sum to 0 to 60 digits."""
    import mpmath

    n = w.shape[0]
    if normalization == "sym":
        w = 0.5 * (w + w.T)  # exact in float64
    W = mpmath.matrix(w.tolist())
    d = [mpmath.fsum(W[i, j] for j in range(n)) for i in range(n)]
    lap = mpmath.matrix(n, n)
    for i in range(n):
        for j in range(n):
            if normalization == "combinatorial":
                lap[i, j] = (d[i] if i == j else 0) - W[i, j]
            elif normalization == "rw":
                lap[i, j] = ((1 if i == j else 0) - W[i, j] / d[i]) if d[i] > 0 else 0
            else:
                s = d[i] * d[j]
                lap[i, j] = ((1 if i == j else 0) - W[i, j] / mpmath.sqrt(s)) if s > 0 else 0
    return lap


def _mp_heat(w: np.ndarray, x: np.ndarray, t: float, normalization: str) -> np.ndarray:
    """``exp(-t L) x`` in 60 digits; for ``t >= 1e12`` (past every gap of these graphs) the
    limit ``t -> inf``, as the resolvent ``a (a I + L)^{-1}`` at ``a = 1e-45`` (the Abel limit:
    the spectral projector onto ``L``'s kernel, off by ``a / g`` for a gap ``g``)."""
    import mpmath

    with mpmath.workdps(MP_DIGITS):
        lap = _mp_laplacian(w, normalization)
        n = lap.rows
        if t >= 1e12:
            a = mpmath.mpf("1e-45")
            op = a * mpmath.inverse(a * mpmath.eye(n) + lap)
        else:
            op = mpmath.expm(-mpmath.mpf(t) * lap)
        return np.array((op * mpmath.matrix(x.tolist())).tolist(), dtype=float)


def _converging_graphs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``(weights (N, N), x (N, 2))`` in float64 whose heat flow converges in different ways."""
    gen = torch.Generator().manual_seed(21)
    attention = gh.make_attention(21, n=6)  # irreducible and aperiodic: 1 pi^T
    padded = gh.make_attention(22, n=6, masked=True, causal=True, empty_rows=(1, 4))
    bipartite = torch.zeros(6, 6, dtype=torch.float64)  # periodic walk, converges in time
    bipartite[:3, 3:] = torch.rand(3, 3, generator=gen, dtype=torch.float64) + 0.1
    bipartite[3:, :3] = torch.rand(3, 3, generator=gen, dtype=torch.float64) + 0.1
    clusters = torch.zeros(6, 6, dtype=torch.float64)  # two clusters, spectral gap ~1e-8
    clusters[:3, :3] = torch.rand(3, 3, generator=gen, dtype=torch.float64) + 0.1
    clusters[3:, 3:] = torch.rand(3, 3, generator=gen, dtype=torch.float64) + 0.1
    clusters[0, 5], clusters[4, 1] = 1e-8, 3e-8
    x = torch.randn(6, 2, generator=gen, dtype=torch.float64)
    return {
        "attention": (attention.graph("softmax").to_dense(), x),
        "causal-padded": (padded.graph("softmax").to_dense(), x),
        "bipartite": (bipartite, x),
        "clusters": (clusters, x),
    }


CONVERGING = _converging_graphs()


@pytest.mark.parametrize("t", [1e12, 1e20, 1e300])
@pytest.mark.parametrize("name", list(CONVERGING))
def test_heat_past_convergence_returns_the_limit(name: str, t: float, normalization) -> None:
    """At ``t = 1e12`` ``torch.linalg.matrix_exp`` (and ``scipy.linalg.expm``) drift by
    ``t * 2^-53`` (7e-5 here), by 0.9 at ``t = 1e20``, and are NaN at ``1e300``; the converged
    route returns the limit (the 60-digit spectral projector) to within ``2^-53 ||L|| / g``,
    ``g`` the spectral gap: 1e-12 here, 1e-8 for the two clusters (measured: 4e-16)."""
    w, x = CONVERGING[name]
    y = HeatKernel(t=t, normalization=normalization)(DenseGraph(w), x)
    expected = _mp_heat(w.numpy(), x.numpy(), t, normalization)
    atol = 1e-8 if name == "clusters" else 1e-12
    gh.assert_close_np(y, expected, atol=atol)


def test_heat_between_a_tiny_gap_and_convergence_is_exact() -> None:
    """Two clusters joined by edges of 1e-8: at ``t = 1e8`` the flow between them is half done
    (``e^{-g t}`` of order 1); a 60-digit ``expm`` agrees to 1e-12 (``matrix_exp`` was off by
    1.4e-8, ``t * 2^-53``), and so does a time per head read from a tensor (no host read)."""
    w, x = CONVERGING["clusters"]
    expected = _mp_heat(w.numpy(), x.numpy(), 1e8, "rw")
    assert np.abs(expected - _mp_heat(w.numpy(), x.numpy(), 1e12, "rw")).max() > 1e-3
    for t in (1e8, torch.tensor([1e8], dtype=torch.float64)):
        y = heat_kernel(DenseGraph(w[None]), x[None], t)[0]
        gh.assert_close_np(y, expected, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
def test_heat_at_huge_times_is_finite_forward_and_backward(dtype, learnable: bool) -> None:
    """``t = 1e39`` (inf in float32) and ``1e300``: a float32 graph raised ``OverflowError``
    (fixed ``t``) or ``t: expected finite values`` (learnable); now the converged result, with
    finite gradients and a zero gradient in the time."""
    case = gh.make_attention(23, n=6, batch=(2,), masked=True, empty_rows=(3,))
    for t in (1e39, 1e300):
        op = HeatKernel(t=t, learnable=learnable)
        q, k, x = (v.to(dtype).requires_grad_(True) for v in (case.q, case.k, case.x))
        y = op(SoftmaxGraph(q, k, mask=case.mask), x)
        y.float().sum().backward()
        assert y.dtype == dtype and bool(y.isfinite().all())
        assert all(v.grad is not None and bool(v.grad.isfinite().all()) for v in (q, k, x))
        if learnable:
            assert op.log_t.grad is not None and float(op.log_t.grad) == 0.0
        limit = HeatKernel(t=1e300)(SoftmaxGraph(case.q, case.k, mask=case.mask), case.x)
        tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]
        assert float((y.detach().double() - limit).abs().max()) <= tol * float(case.x.abs().max())


def test_heat_gradient_past_convergence() -> None:
    """The gradient of the converged result in the weights (how the stationary distribution
    moves) through the squarings, against finite differences, at ``t = 1e12`` and ``1e300``."""
    w, x = CONVERGING["attention"]
    w = w[:4, :4].clone().requires_grad_(True)
    for t in (1e12, 1e300):
        torch.autograd.gradcheck(
            lambda w, x, t=t: HeatKernel(t=t)(DenseGraph(w), x), (w, x[:4].clone())
        )
