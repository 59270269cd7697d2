"""Properties that hold for every graph (hypothesis draws the graphs)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graph_helpers as gh
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    GraphLaplacian,
    heat_kernel,
    laplacian_matrix,
    spectrum,
)

#: data_too_large: hypothesis 6.80 (the floor; make test-oldest) once failed its health check
#: on these small draws ("20 examples overran while generating 9 valid ones"), not reproduced
#: with 47 seeds; it checks how data is generated, not what the tests assert
SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.data_too_large]
)
NORMALIZATIONS = ("rw", "sym", "combinatorial")


def _subset(draw, n: int) -> set[int]:
    """A proper subset of ``range(n)`` (a prefix of a permutation: no rejected draws, which
    unique elements from a small range make)."""
    return set(draw(st.permutations(range(n)))[: draw(st.integers(0, n - 1))])


@st.composite
def attention_cases(draw, *, causal: bool | None = None, min_n: int = 2):
    """Keyword arguments of ``gh.make_attention``: size, batch, mask, causality, empty rows."""
    n = draw(st.integers(min_n, 6))
    masked = draw(st.booleans())
    return {
        "seed": draw(st.integers(0, 2**31 - 1)),
        "n": n,
        "batch": draw(st.sampled_from([(), (2,), (2, 2)])),
        "features": draw(st.integers(1, 4)),
        "masked": masked,
        "causal": draw(st.booleans()) if causal is None else causal,
        "empty_rows": _subset(draw, n) if masked else (),
        "scale": draw(st.sampled_from([None, 0.3, 3.0])),
    }


@st.composite
def weight_cases(draw, *, symmetric: bool | None = None):
    """Keyword arguments of ``gh.random_weights``."""
    n = draw(st.integers(2, 6))
    return {
        "seed": draw(st.integers(0, 2**31 - 1)),
        "n": n,
        "batch": draw(st.sampled_from([(), (2,)])),
        "symmetric": draw(st.booleans()) if symmetric is None else symmetric,
        "isolated": sorted(_subset(draw, n)),
        "self_loops": draw(st.booleans()),
        "density": draw(st.floats(0.2, 1.0)),
    }


def _kinds(params):
    case = gh.make_attention(**params)
    return case, {kind: case.graph(kind) for kind in gh.GRAPH_KINDS}


# ---- stochasticity and spectra -----------------------------------------------------------------


@SETTINGS
@given(params=attention_cases())
def test_softmax_rows_sum_to_one_or_zero(params) -> None:
    _, graphs = _kinds(params)
    empty = np.zeros(params["n"], dtype=bool)
    empty[list(params["empty_rows"])] = True
    expected = np.broadcast_to(np.where(empty, 0.0, 1.0), (*params["batch"], params["n"]))
    ones = torch.ones(*params["batch"], params["n"], 1, dtype=torch.float64)
    for kind, g in graphs.items():
        gh.assert_close_np(g.to_dense().sum(-1), expected, atol=1e-12)
        gh.assert_close_np(g.out_degree(), expected, atol=1e-12)
        gh.assert_close_np(Attention()(g, ones).squeeze(-1), expected, atol=1e-12)
        assert bool((g.to_dense() >= 0).all()), kind


@SETTINGS
@given(params=weight_cases())
def test_rw_normalized_rows_sum_to_one_or_zero(params) -> None:
    w = gh.random_weights(**params)
    expected = (w.sum(-1) > 0).astype(float)
    ones = torch.ones(*w.shape[:-1], 1, dtype=torch.float64)
    for kind in ("dense", "sparse"):
        g = gh.graph_from_weights(w, kind, torch.float64)
        gh.assert_close_np(
            GraphLaplacian(g, "rw").adjacency(ones).squeeze(-1), expected, atol=1e-12
        )
        gh.assert_close_np(g.topk(params["n"]).out_degree(), expected, atol=1e-12)
        rw = np.eye(params["n"]) * expected[..., None] - laplacian_matrix(g, "rw").numpy()
        np.testing.assert_allclose(rw.sum(-1), expected, atol=1e-12)


@SETTINGS
@given(params=weight_cases(), attention=attention_cases())
def test_sym_spectrum_in_zero_two(params, attention) -> None:
    w = gh.random_weights(**params)
    graphs = [gh.graph_from_weights(w, "dense", torch.float64)]
    graphs += [gh.make_attention(**attention).graph(kind) for kind in gh.GRAPH_KINDS]
    for g in graphs:
        ev = spectrum(g, "sym")
        assert not ev.is_complex()
        assert float(ev.min()) >= -1e-10 and float(ev.max()) <= 2 + 1e-10
        # and it is the spectrum of the numpy reference
        lap = gh.laplacian_batch_reference(gh.to_numpy(g.to_dense()), "sym")
        gh.assert_close_np(ev, np.linalg.eigvalsh(lap), atol=1e-10)


# ---- heat semigroup ----------------------------------------------------------------------------


@SETTINGS
@given(params=attention_cases(), method=st.sampled_from(["series", "exact"]))
def test_time_zero_is_identity(params, method) -> None:
    case, graphs = _kinds(params)
    for g in graphs.values():
        for nz in NORMALIZATIONS:
            y = heat_kernel(g, case.x, 0.0, normalization=nz, method=method)
            torch.testing.assert_close(y, case.x, atol=1e-14, rtol=0)


@SETTINGS
@given(
    params=attention_cases(),
    s=st.floats(0.0, 4.0),
    t=st.floats(0.0, 4.0),
    nz=st.sampled_from(NORMALIZATIONS),
)
def test_semigroup(params, s, t, nz) -> None:
    """``exp(-sL) exp(-tL) x = exp(-(s+t)L) x``."""
    case, graphs = _kinds(params)
    for g in graphs.values():
        kw = {"normalization": nz, "tol": 1e-12}
        twice = heat_kernel(g, heat_kernel(g, case.x, t, **kw), s, **kw)
        once = heat_kernel(g, case.x, s + t, **kw)
        torch.testing.assert_close(twice, once, atol=1e-10, rtol=0)


@SETTINGS
@given(params=weight_cases(symmetric=True), t=st.floats(0.0, 10.0))
def test_combinatorial_heat_conserves_mass_on_undirected_graphs(params, t) -> None:
    """``1^T exp(-t L_comb) x = 1^T x`` when ``W = W^T`` (columns of ``L_comb`` sum to 0)."""
    w = gh.random_weights(**params)
    x = torch.randn(
        *w.shape[:-1], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    for kind in ("dense", "sparse"):
        g = gh.graph_from_weights(w, kind, torch.float64)
        y = heat_kernel(g, x, t, normalization="combinatorial", tol=1e-12)
        torch.testing.assert_close(y.sum(-2), x.sum(-2), atol=1e-10, rtol=0)


@SETTINGS
@given(params=attention_cases(), t=st.floats(0.0, 30.0))
def test_rw_heat_preserves_constants(params, t) -> None:
    """``exp(-t L_rw) 1 = 1``: ``L_rw 1 = 0`` (rows of ``D^+ W`` sum to 1, or the row is 0)."""
    _, graphs = _kinds(params)
    ones = torch.ones(*params["batch"], params["n"], 2, dtype=torch.float64)
    for g in graphs.values():
        torch.testing.assert_close(heat_kernel(g, ones, t, tol=1e-12), ones, atol=1e-10, rtol=0)


@SETTINGS
@given(params=weight_cases(), t=st.floats(0.0, 10.0))
def test_sym_heat_fixes_sqrt_degree(params, t) -> None:
    """``L_sym D^{1/2} 1 = 0``, so ``exp(-t L_sym)`` fixes ``sqrt(d)`` (d from ``W_s``)."""
    w = gh.random_weights(**params)
    d = 0.5 * (w.sum(-1) + w.sum(-2))
    v = torch.as_tensor(np.sqrt(d))[..., None]
    for kind in ("dense", "sparse"):
        g = gh.graph_from_weights(w, kind, torch.float64)
        y = heat_kernel(g, v, t, normalization="sym", tol=1e-12)
        torch.testing.assert_close(y, v, atol=1e-10, rtol=0)


@SETTINGS
@given(params=weight_cases(), t=st.floats(0.0, 10.0), nz=st.sampled_from(NORMALIZATIONS))
def test_heat_is_positive_on_positive_signals(params, t, nz) -> None:
    """The heat kernel of a graph Laplacian is entrywise non-negative (a diffusion)."""
    w = gh.random_weights(**params)
    g = gh.graph_from_weights(w, "dense", torch.float64)
    n = params["n"]
    eye = torch.eye(n, dtype=torch.float64).expand(*w.shape[:-2], n, n)
    kernel = heat_kernel(g, eye, t, normalization=nz, tol=1e-12)
    assert float(kernel.min()) >= -1e-12


# ---- permutation equivariance and kind agreement ----------------------------------------------


MANY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.data_too_large])


@MANY
@given(params=attention_cases(causal=False), perm_seed=st.integers(0, 2**31 - 1), data=st.data())
def test_every_operator_is_permutation_equivariant(params, perm_seed, data) -> None:
    """Relabelling the nodes of q, k, the mask and x relabels the output, for every operator
    (drawn per example) on every graph kind."""
    case = gh.make_attention(**params)
    perm = torch.randperm(params["n"], generator=torch.Generator().manual_seed(perm_seed))
    op = gh.OPERATOR_SPECS[data.draw(st.sampled_from(sorted(gh.OPERATOR_SPECS)))].make()
    for kind in gh.GRAPH_KINDS:
        gh.assert_permutation_equivariant(op, case, kind, perm)


@MANY
@given(params=attention_cases(), data=st.data())
def test_softmax_graph_agrees_with_dense_softmax(params, data) -> None:
    """``SoftmaxGraph(q, k, mask, causal)`` and ``DenseGraph(softmax(...))`` under every
    operator (drawn per example); both also match the numpy reference."""
    case = gh.make_attention(**params)
    name = data.draw(st.sampled_from(sorted(gh.OPERATOR_SPECS)))
    spec = gh.OPERATOR_SPECS[name]
    op = spec.make()
    y = op(case.graph("softmax"), case.x)
    torch.testing.assert_close(y, op(DenseGraph(case.probs_tensor()), case.x), atol=1e-10, rtol=0)
    gh.assert_close_np(y, spec.reference(case.probs(), gh.to_numpy(case.x)), atol=1e-9)
