"""The heat series' certificate: the order it picks from ``tol`` and the Poisson-tail bound it
guarantees, against ``scipy.linalg.expm`` in float64 (issue 42, item 7).

For ``P`` row-stochastic the truncation error of the series in the induced maximum norm is
exactly ``1 - (1 - tail)^s``: every check below compares the whole truncated operator (the
series applied to the identity) with the exponential, not one signal.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch

import graph_helpers as gh
import heatformer.graph_ops.heat as heat_module
from heatformer.checks import ArgumentError
from heatformer.graph_ops import (
    DenseGraph,
    HeatKernel,
    SeriesCertificate,
    heat_kernel,
    resolve_operator,
    series_certificate,
)
from heatformer.graph_ops.poisson import poisson_order, poisson_tail
from references import laplacian_reference

TOLS = [1e-2, 1e-4, 1e-8]
TIMES = [0.5, 3.0, 20.0]  # 20: split into 3 sub-steps


def _row_stochastic(seed: int, n: int, batch: tuple[int, ...] = ()) -> np.ndarray:
    """A random row-stochastic ``P`` ``(..., N, N)`` with exact zeros (float64)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.0, 1.0, (*batch, n, n)) * (rng.random((*batch, n, n)) < 0.5)
    w[..., np.arange(n), (np.arange(n) + 1) % n] += 0.1  # every row keeps an edge
    return w / w.sum(-1, keepdims=True)


def _operator(
    graph: DenseGraph, t: float | list[float], tol: float, normalization: str
) -> np.ndarray:
    """The series' operator ``(..., N, N)``: the series applied to the identity."""
    n = graph.num_nodes
    eye = torch.eye(n, dtype=torch.float64).expand(*graph.batch_shape, n, n)
    op = HeatKernel(t=t, tol=tol, normalization=normalization, method="series")
    return gh.to_numpy(op(graph, eye))


def _expm(p: np.ndarray, t: float, normalization: str = "rw") -> np.ndarray:
    return scipy.linalg.expm(-t * laplacian_reference(p, normalization))


@pytest.mark.parametrize("tol", TOLS)
@pytest.mark.parametrize("t", TIMES)
def test_the_bound_is_the_truncation_error_in_the_max_norm(t: float, tol: float) -> None:
    """``||exp(-tL) - series||_inf`` equals the certified ``1 - (1 - tail)^s`` (<= tol) on
    random row-stochastic ``P`` in float64, for every graph of a batch."""
    p = _row_stochastic(int(t * 10) + int(-math.log10(tol)), 9, batch=(2, 3))
    series = _operator(DenseGraph(torch.from_numpy(p)), t, tol, "rw")
    cert = HeatKernel(t=t, tol=tol).certificate
    assert cert.splits == max(1, math.ceil(t / heat_module.SERIES_MAX_STEP))
    assert cert.bound <= tol
    for idx in np.ndindex(2, 3):
        err = np.abs(_expm(p[idx], t) - series[idx]).sum(-1).max()  # induced inf-norm
        assert err <= cert.bound * (1 + 1e-9) + 1e-14
        assert err >= cert.bound * (1 - 1e-6) - 1e-14  # attained: the bound is tight
        # on the constant signal the error is the bound itself, in every row
        ones = np.ones(9)
        np.testing.assert_allclose(_expm(p[idx], t) @ ones - series[idx] @ ones, cert.bound,
                                   rtol=1e-6, atol=1e-14)  # fmt: skip


def test_per_head_times_are_covered_by_the_largest() -> None:
    """One plan (the largest time's) for every head: each head's error is within the bound."""
    times = [0.3, 1.0, 4.0]
    p = _row_stochastic(3, 7, batch=(3,))
    series = _operator(DenseGraph(torch.from_numpy(p)), times, 1e-4, "rw")
    cert = HeatKernel(t=times, tol=1e-4).certificate
    assert cert.tau == 4.0
    errors = [np.abs(_expm(p[h], t) - series[h]).sum(-1).max() for h, t in enumerate(times)]
    assert max(errors) <= cert.bound * (1 + 1e-9) + 1e-14
    assert errors[0] < errors[1] < errors[2]  # a shorter time: a smaller tail


def test_rows_without_edges_and_the_sym_norm_keep_the_bound() -> None:
    """A node without out-edges keeps its value (an identity row of ``M``): the bound still
    holds in the max norm; for ``"sym"`` it holds in the 2-norm."""
    w = gh.random_weights(4, 8, batch=(2,), symmetric=False, isolated=(3,))
    g = DenseGraph(torch.from_numpy(w))
    for normalization, order in (("rw", np.inf), ("combinatorial", np.inf), ("sym", 2)):
        series = _operator(g, 2.0, 1e-3, normalization)
        c = series_certificate(float(g.out_degree().amax()) * 2.0, 1e-3)
        bound = HeatKernel(t=2.0, tol=1e-3).certificate.bound
        if normalization == "combinatorial":  # tau = d_max t: the graph is not row-stochastic
            bound = c.bound
        for b in range(2):
            err = _expm(w[b], 2.0, normalization) - series[b]
            assert np.linalg.norm(err, order) <= bound * (1 + 1e-9) + 1e-14


def test_the_series_runs_as_many_propagations_as_certified(monkeypatch) -> None:
    """The series length comes from ``tol``: ``s * K`` products with the graph."""
    p = torch.from_numpy(_row_stochastic(0, 6))
    calls = []
    for t, tol in [(1.0, 1e-6), (1.0, 1e-10), (3.0, 1e-3), (20.0, 1e-6)]:
        g = DenseGraph(p)
        counted = g.propagate
        monkeypatch.setattr(g, "propagate", lambda x, f=counted: (calls.append(1), f(x))[1])
        calls.clear()
        HeatKernel(t=t, tol=tol, method="series")(g, torch.ones(6, 1, dtype=torch.float64))
        assert len(calls) == HeatKernel(t=t, tol=tol).certificate.propagations
    assert HeatKernel(t=1.0).certificate.order == 9  # the documented default: 9 terms
    assert HeatKernel(t=1.0, tol=1e-10).certificate.order == 12


@pytest.mark.parametrize("tau", [1e-3, 0.5, 1.0, 3.7, 8.0, 40.0])
def test_poisson_tail_and_order_against_mpmath(tau: float) -> None:
    """``poisson_tail`` to 1e-12 relative, down to tails far below 2^-53, and ``poisson_order``
    the smallest order within the tolerance (60-digit references)."""
    mpmath.mp.dps = 60
    lam = mpmath.mpf(tau)

    def tail(k: int) -> mpmath.mpf:  # the terms themselves: no cancellation at tiny tails
        terms = range(k + 1, k + 400)
        return mpmath.fsum(mpmath.exp(-lam) * lam**j / mpmath.factorial(j) for j in terms)

    for k in [0, 3, int(tau) + 5, int(tau) + 30]:
        exact = tail(k)
        assert abs(poisson_tail(tau, k) - float(exact)) <= 1e-12 * float(exact)
    for tol in [1e-2, 1e-6, 1e-12, 1e-20]:
        k = poisson_order(tau, tol)
        assert tail(k) <= tol and (k == 0 or tail(k - 1) > tol)
    assert math.isclose(poisson_tail(tau, 2), float(scipy.stats.poisson.sf(2, tau)), rel_tol=1e-12)


def _old_poisson_order(tau: float, tol: float) -> int:
    """The order as it was chosen before the certificate (``1 - CDF`` in float64)."""
    if tau <= 0:
        return 0
    log_pmf = -tau
    cdf = math.exp(log_pmf)
    k = 0
    while 1.0 - cdf > tol:
        k += 1
        log_pmf += math.log(tau) - math.log(k)
        cdf += math.exp(log_pmf)
    return k


@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-6, 1e-8, 1e-10])
def test_existing_specs_keep_their_series(tol: float) -> None:
    """Saved models load as saved: for every tolerance down to 1e-10 (the default 1e-6
    included) the plan is the one chosen before, at 4001 times from 0 to 200 (below 1e-10 the
    old ``1 - CDF`` lost the tail to rounding, and the order could be one off either way)."""
    for tau in np.linspace(0.0, 200.0, 4001):
        s = max(1, math.ceil(tau / heat_module.SERIES_MAX_STEP))
        assert heat_module.series_plan(float(tau), tol) == (
            s,
            _old_poisson_order(tau / s, tol / s),
        )


def test_a_spec_without_tol_means_the_default() -> None:
    op = resolve_operator("heat[t=0.5]")
    assert op.tol == 1e-6 and op.certificate == series_certificate(0.5, 1e-6)
    fine = resolve_operator("heat[t=2.0,tol=1e-9]")
    assert fine.tol == 1e-9 and fine.certificate.bound <= 1e-9
    assert isinstance(fine.certificate, SeriesCertificate)
    learn = resolve_operator("heat[t=1.0,learnable=true,tol=1e-3]")
    assert learn.certificate == series_certificate(4.0, 1e-3)  # planned for t_max = 4 t
    case = gh.make_attention(2, n=6, batch=(2,))
    g = case.graph("softmax")
    explicit = resolve_operator("heat[t=0.5,tol=1e-6]")(g, case.x)
    torch.testing.assert_close(op(g, case.x), explicit, atol=0, rtol=0)


@pytest.mark.parametrize("tol", [0.0, 1.0, -1e-3, 2.0, float("nan"), float("inf")])
def test_tol_outside_the_open_unit_interval_is_refused(tol: float) -> None:
    with pytest.raises(ValueError, match=r"tol") as err:
        HeatKernel(t=1.0, tol=tol)
    assert isinstance(err.value, ArgumentError) and err.value.argument == "tol"
    with pytest.raises(ValueError, match=r"tol") as err:
        heat_kernel(DenseGraph(torch.eye(2)), torch.ones(2, 1), 1.0, tol=tol)
    assert err.value.argument == "tol"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"tol") as err:
        series_certificate(1.0, tol)
    assert err.value.argument == "tol"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"tol: expected a value in the open interval \(0, 1\)"):
        resolve_operator(f"heat[t=1.0,tol={tol}]")


def test_bad_certificate_arguments_name_themselves() -> None:
    with pytest.raises(TypeError) as err:
        HeatKernel(t=1.0, tol="small")  # type: ignore[arg-type]
    assert err.value.argument == "tol"  # type: ignore[attr-defined]
    for tau in (-1.0, float("nan"), "1"):
        with pytest.raises(ValueError) as err:
            series_certificate(tau, 1e-6)  # type: ignore[arg-type]
        assert err.value.argument == "tau"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"^t: expected at least one time"):
        _ = HeatKernel(t=torch.ones(0)).certificate
