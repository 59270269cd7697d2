"""Bad input raises ValueError/TypeError whose message names the argument (DESIGN.md)."""

from __future__ import annotations

import math

import pytest
import torch

import heatformer.graph_ops.heat as heat_module
from heatformer.graph_ops import (
    OPERATORS,
    Attention,
    DenseGraph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    SoftmaxGraph,
    SparseGraph,
    heat_kernel,
    laplacian,
    laplacian_matrix,
    resolve_operator,
    select_heat_method,
    spectrum,
    topk_graph,
)

N = 4


@pytest.fixture
def graph() -> DenseGraph:
    return DenseGraph(torch.rand(3, N, N, generator=torch.Generator().manual_seed(0)))


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(3, N, 2)


# ---- graphs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weight", "error", "pattern"),
    [
        (torch.rand(3, 4), ValueError, r"^weight: expected a square"),
        (torch.rand(2, 3, 4), ValueError, r"^weight: expected a square"),
        (torch.rand(4), ValueError, r"^weight: expected at least 2 dimensions"),
        (torch.ones(3, 3, dtype=torch.int64), TypeError, r"^weight: .*floating-point"),
        (torch.ones(3, 3, dtype=torch.bool), TypeError, r"^weight: .*floating-point"),
        (-torch.eye(3), ValueError, r"^weight: expected non-negative"),
        (torch.full((3, 3), math.nan), ValueError, r"^weight: expected finite"),
        (torch.full((3, 3), math.inf), ValueError, r"^weight: expected finite"),
        ([[1.0, 0.0], [0.0, 1.0]], TypeError, r"^weight: expected a torch.Tensor"),
    ],
    ids=["rect", "rect-batched", "1d", "int", "bool", "negative", "nan", "inf", "list"],
)
def test_dense_graph_rejects(weight, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        DenseGraph(weight)


def _qk(n=4, e=3, dtype=torch.float32):
    return torch.randn(2, n, e, dtype=dtype), torch.randn(2, n, e, dtype=dtype)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"k": torch.randn(2, 4, 5)}, ValueError, r"^k: expected the feature dim of q"),
        ({"k": torch.randn(2, 5, 3)}, ValueError, r"^k: a SoftmaxGraph is square"),
        ({"k": torch.randn(3, 4, 3)}, ValueError, r"^k: batch dims"),
        ({"k": torch.randn(2, 4, 3, dtype=torch.float64)}, TypeError, r"^k: expected the dtype"),
        ({"q": torch.ones(2, 4, 3, dtype=torch.int32)}, TypeError, r"^q: .*floating-point"),
        ({"k": torch.ones(2, 4, 3, dtype=torch.int64)}, TypeError, r"^k: .*floating-point"),
        ({"q": torch.randn(4)}, ValueError, r"^q: expected at least 2 dimensions"),
        ({"mask": torch.ones(4, 3, dtype=torch.bool)}, ValueError, r"^mask: expected a shape"),
        ({"mask": torch.ones(3, 4, 4, dtype=torch.bool)}, ValueError, r"^mask: expected a shape"),
        ({"mask": torch.ones(2, 2, 4, 4, dtype=torch.bool)}, ValueError, r"^mask: .*shape"),
        ({"mask": torch.ones(4, 4)}, TypeError, r"^mask: expected dtype torch.bool"),
        ({"mask": torch.ones(4, 4, dtype=torch.int64)}, TypeError, r"^mask: expected dtype"),
        ({"mask": [[True] * 4] * 4}, TypeError, r"^mask: expected a bool torch.Tensor"),
        ({"scale": "big"}, TypeError, r"^scale:"),
        ({"scale": True}, TypeError, r"^scale:"),
        ({"causal": 1}, TypeError, r"^causal: expected a bool"),
    ],
    ids=lambda v: str(v)[:40] if not isinstance(v, dict) else "-".join(v),
)
def test_softmax_graph_rejects(kwargs, error, pattern) -> None:
    q, k = _qk()
    args = {"q": q, "k": k}
    args.update({name: kwargs[name] for name in ("q", "k") if name in kwargs})
    options = {name: v for name, v in kwargs.items() if name not in ("q", "k")}
    with pytest.raises(error, match=pattern):
        SoftmaxGraph(args["q"], args["k"], **options)


@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan])
def test_non_finite_scale_is_a_value_error(scale) -> None:
    q, k = _qk()
    with pytest.raises(ValueError, match=r"^scale:"):
        SoftmaxGraph(q, k, scale=scale)


def test_softmax_mask_error_says_what_was_expected() -> None:
    q, k = _qk()
    with pytest.raises(ValueError, match=r"\(2, 4, 4\), got \(4, 3\)"):
        SoftmaxGraph(q, k, mask=torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"True = may attend.*got torch.float32"):
        SoftmaxGraph(q, k, mask=torch.ones(4, 4))


@pytest.mark.parametrize(
    ("row", "col", "weight", "kwargs", "error", "pattern"),
    [
        ([0, 1], [1, 0], [1.0, 1.0], {"num_nodes": 0}, ValueError, r"^num_nodes:"),
        ([0, 1], [1, 0], [1.0, 1.0], {"num_nodes": 2.0}, TypeError, r"^num_nodes:"),
        ([0.0, 1.0], [1, 0], [1.0, 1.0], {"num_nodes": 2}, TypeError, r"^row:"),
        ([0, 1], [1.0, 0.0], [1.0, 1.0], {"num_nodes": 2}, TypeError, r"^col:"),
        ([0, 1], [1, 0], [1, 1], {"num_nodes": 2}, TypeError, r"^weight:"),
        ([0, 1, 1], [1, 0], [1.0, 1.0], {"num_nodes": 2}, ValueError, r"row, col, weight"),
        ([0, 2], [1, 0], [1.0, 1.0], {"num_nodes": 2}, ValueError, r"^row, col: expected indices"),
        ([0, -1], [1, 0], [1.0, 1.0], {"num_nodes": 2}, ValueError, r"^row, col:"),
        ([0, 1], [2, 0], [1.0, 1.0], {"num_nodes": 2, "batch_shape": (2,)}, ValueError,
         r"^row, col: an edge joins two different graphs"),
        ([0, 1], [1, 0], [1.0, -1.0], {"num_nodes": 2}, ValueError, r"^weight: .*non-negative"),
        ([0, 1], [1, 0], [1.0, math.nan], {"num_nodes": 2}, ValueError, r"^weight: .*finite"),
    ],
)  # fmt: skip
def test_sparse_graph_rejects(row, col, weight, kwargs, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        SparseGraph(torch.tensor(row), torch.tensor(col), torch.tensor(weight), **kwargs)


def test_sparse_constructors_reject() -> None:
    with pytest.raises(
        ValueError, match=r"^edge_index: expected an integer tensor of shape \(2, E\)"
    ):
        SparseGraph.from_edge_index(torch.tensor([[0, 1, 2]]))
    with pytest.raises(TypeError, match=r"^edge_index: expected an integer tensor"):
        SparseGraph.from_edge_index([[0, 1], [1, 0]])
    # errors name the arguments the caller passed, not internal ones
    edges = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(
        ValueError, match=r"^edge_index: expected indices in \[0, 2\) for num_nodes 2, got \[0, 5\]"
    ):
        SparseGraph.from_edge_index(torch.tensor([[0, 5], [1, 0]]), num_nodes=2)
    with pytest.raises(ValueError, match=r"^edge_weight: expected finite, non-negative"):
        SparseGraph.from_edge_index(edges, torch.tensor([1.0, -2.0]))
    with pytest.raises(ValueError, match=r"^edge_weight: expected finite, non-negative"):
        SparseGraph.from_edge_index(edges, torch.tensor([1.0, math.nan]))
    with pytest.raises(TypeError, match=r"^edge_weight: expected a floating-point tensor"):
        SparseGraph.from_edge_index(edges, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"^edge_index, edge_weight: expected E source"):
        SparseGraph.from_edge_index(edges, torch.ones(3))
    with pytest.raises(TypeError, match=r"^num_nodes: expected a positive int"):
        SparseGraph.from_edge_index(edges, num_nodes=2.0)
    with pytest.raises(ValueError, match=r"^indices: expected column indices in \[0, 3\)"):
        SparseGraph.from_ell(torch.full((3, 2), 3), torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"^weight: expected finite, non-negative"):
        SparseGraph.from_ell(torch.zeros(3, 2, dtype=torch.long), -torch.ones(3, 2))
    with pytest.raises(TypeError, match=r"^indices:"):
        SparseGraph.from_ell(torch.zeros(3, 2), torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"^weight: expected the shape of indices"):
        SparseGraph.from_ell(torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 3))


def test_graph_methods_reject(graph) -> None:
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"^eps:"):
            graph.threshold(bad)
        with pytest.raises(ValueError, match=r"^eps:"):
            graph.to_sparse().threshold(bad)
    with pytest.raises(ValueError, match=r"^row_block:"):
        graph.topk(2, row_block=-1)
    q, k = _qk()
    with pytest.raises(ValueError, match=r"^k_top: expected 1 <= k_top <= 4, got 5$"):
        topk_graph(q, k, k_top=5)
    for g in (graph, graph.to_sparse()):
        with pytest.raises(TypeError, match=r"^eps: expected a float threshold > 0, got str$"):
            g.threshold("a")
    with pytest.raises(ValueError, match=r"^index: .* ints in range"):
        DenseGraph(torch.rand(2, 5, 5)).to_networkx(5)
    with pytest.raises(ValueError, match=r"^index: .* ints in range"):
        DenseGraph(torch.rand(2, 5, 5)).to_scipy(-3)
    assert DenseGraph(torch.rand(2, 5, 5)).to_networkx(-1).number_of_nodes() == 5


# ---- signals -----------------------------------------------------------------------------------

ALL_OPERATORS = [
    Attention(),
    Laplacian(),
    Laplacian("sym", learnable=True),
    HeatKernel(),
    HeatKernel(t=[0.5, 1.0, 2.0]),
    HeatKernel(t=1.0, learnable=True),
    PersonalizedPageRank(),
    Polynomial(),
]
OPERATOR_IDS = ["attention", "laplacian", "laplacian-learnable", "heat", "heat-per-head",
                "heat-learnable", "ppr", "polynomial"]  # fmt: skip


def _functional(name):
    return {
        "laplacian": lambda g, x: laplacian(g, x),
        "heat_kernel": lambda g, x: heat_kernel(g, x, 1.0),
        "propagate": lambda g, x: g.propagate(x),
        "propagate_transpose": lambda g, x: g.propagate_transpose(x),
    }[name]


FUNCTIONALS = ["laplacian", "heat_kernel", "propagate", "propagate_transpose"]
CALLS = [*ALL_OPERATORS, *map(_functional, FUNCTIONALS)]
CALL_IDS = [*OPERATOR_IDS, "laplacian()", "heat_kernel()", "propagate", "propagate_transpose"]

BAD_SIGNALS = {
    "wrong-N": (torch.randn(3, N + 1, 2), ValueError, r"^x: expected shape \(\.\.\., N=4, C\)"),
    "wrong-dtype": (torch.randn(3, N, 2, dtype=torch.float64), TypeError,
                    r"^x: expected the graph's dtype torch.float32, got torch.float64"),
    "int": (torch.ones(3, N, 2, dtype=torch.int64), TypeError, r"^x: .*floating-point"),
    "1d": (torch.randn(N), ValueError, r"^x: expected at least 2 dimensions"),
    "batch": (torch.randn(5, N, 2), ValueError, r"^x: leading dims"),
}  # fmt: skip


@pytest.mark.parametrize("bad", list(BAD_SIGNALS))
@pytest.mark.parametrize("call", CALLS, ids=CALL_IDS)
def test_bad_signal(graph, call, bad) -> None:
    x, error, pattern = BAD_SIGNALS[bad]
    with pytest.raises(error, match=pattern):
        call(graph, x)


@pytest.mark.parametrize(
    "call",
    [pytest.param(call, id=name) for call, name in zip(CALLS, CALL_IDS)],
)
def test_signal_of_wrong_type(graph, call) -> None:
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list"):
        call(graph, [[1.0, 2.0]] * N)


@pytest.mark.parametrize(
    "call",
    [*ALL_OPERATORS, lambda g, x: laplacian(g, x), lambda g, x: heat_kernel(g, x)],
    ids=[*OPERATOR_IDS, "laplacian()", "heat_kernel()"],
)
def test_not_a_graph(x, call) -> None:
    with pytest.raises(TypeError, match=r"^graph: expected a heatformer Graph"):
        call(torch.eye(N), x[0])


def test_dense_helpers_reject_non_graphs() -> None:
    for fn in (laplacian_matrix, spectrum):
        with pytest.raises(TypeError, match=r"^graph:"):
            fn(torch.eye(3))


# ---- option values -----------------------------------------------------------------------------


def _assert_lists(message: str, names) -> None:
    for name in names:
        assert repr(name) in message, f"{name!r} missing from: {message}"


@pytest.mark.parametrize("bad", ["RW", "normalized", "", None, 1])
def test_unknown_normalization(graph, x, bad) -> None:
    calls = [
        lambda: laplacian(graph, x, bad),
        lambda: laplacian_matrix(graph, bad),
        lambda: spectrum(graph, bad),
        lambda: heat_kernel(graph, x, 1.0, normalization=bad),
        lambda: Laplacian(bad),
        lambda: HeatKernel(normalization=bad),
        lambda: PersonalizedPageRank(normalization=bad),
        lambda: Polynomial(normalization=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"^normalization: expected one of") as info:
            call()
        _assert_lists(str(info.value), ["rw", "sym", "combinatorial"])


@pytest.mark.parametrize(
    ("t", "error"),
    [
        (-0.1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (torch.tensor([1.0, -1.0, 0.5]), ValueError),
        (torch.tensor([1.0, math.nan, 0.5]), ValueError),
        (torch.tensor([1, 2, 3]), TypeError),
        (True, TypeError),
        ("1.0", TypeError),
    ],
    ids=["negative", "nan", "inf", "tensor-negative", "tensor-nan", "int-tensor", "bool", "str"],
)
def test_bad_time(graph, x, t, error) -> None:
    with pytest.raises(error, match=r"^t:"):
        heat_kernel(graph, x, t)
    with pytest.raises(error, match=r"^t:"):
        HeatKernel(t=t)


def test_time_list_of_non_numbers_names_t() -> None:
    with pytest.raises(TypeError, match=r"^t:"):
        HeatKernel(t=[0.5, "a"])


def test_time_shape_must_broadcast_to_batch(graph, x) -> None:
    for t in (torch.ones(2), torch.ones(3, 1), torch.ones(2, 3)):
        with pytest.raises(ValueError, match=r"^t: expected a shape that broadcasts"):
            heat_kernel(graph, x, t)


def test_learnable_time_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^t: a learnable t"):
        HeatKernel(t=0.0, learnable=True)


@pytest.mark.parametrize("tol", [0.0, 1.0, -1e-3, 2.0, math.nan])
def test_bad_tol(graph, x, tol) -> None:
    with pytest.raises(ValueError, match=r"^tol:"):
        heat_kernel(graph, x, 1.0, tol=tol)
    with pytest.raises(ValueError, match=r"^tol:"):
        HeatKernel(tol=tol)
    with pytest.raises(ValueError, match=r"^tol:"):
        PersonalizedPageRank(tol=tol)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, 1.5, math.nan, math.inf])
def test_alpha_outside_open_unit_interval(alpha) -> None:
    with pytest.raises(ValueError, match=r"^alpha: expected a value in the open interval \(0, 1\)"):
        PersonalizedPageRank(alpha=alpha)


@pytest.mark.parametrize("alpha", ["0.5", None, True])
def test_alpha_of_wrong_type(alpha) -> None:
    with pytest.raises(TypeError, match=r"^alpha:"):
        PersonalizedPageRank(alpha=alpha)


@pytest.mark.parametrize(
    ("coeffs", "error"),
    [
        ([], ValueError),
        (torch.ones(2, 2), ValueError),
        ([1.0, math.nan], ValueError),
        ([1.0, math.inf], ValueError),
        (["a", "b"], TypeError),
        ("12", TypeError),
        (torch.tensor([1, 2]), TypeError),
        (3.0, TypeError),
    ],
    ids=["empty", "2d", "nan", "inf", "strings", "str", "int-tensor", "scalar"],
)
def test_bad_coeffs(coeffs, error) -> None:
    with pytest.raises(error, match=r"^coeffs:"):
        Polynomial(coeffs)


@pytest.mark.parametrize("step", ["1", None, True])
def test_bad_step_type(step) -> None:
    with pytest.raises(TypeError, match=r"^step:"):
        Laplacian(step=step)


@pytest.mark.parametrize("step", [math.nan, math.inf])
def test_non_finite_step_is_a_value_error(step) -> None:
    with pytest.raises(ValueError, match=r"^step:"):
        Laplacian(step=step)


# ---- heat methods ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["taylor", "Exact", "", "krylov"])
def test_unknown_heat_method(graph, x, method) -> None:
    for call in (
        lambda: heat_kernel(graph, x, 1.0, method=method),
        lambda: HeatKernel(method=method),
        lambda: select_heat_method(graph, 1.0, "rw", 1e-6, method),
    ):
        with pytest.raises(ValueError, match=r"^method: expected one of") as info:
            call()
        _assert_lists(str(info.value), ["auto", "series", "exact"])


def test_heat_method_must_be_a_string(graph, x) -> None:
    for call in (
        lambda: heat_kernel(graph, x, 1.0, method=[]),
        lambda: HeatKernel(method=[]),
    ):
        with pytest.raises(TypeError, match=r"^method: expected a str, got list$"):
            call()


def test_refused_exact_method(graph, x, monkeypatch) -> None:
    monkeypatch.setattr(heat_module, "EXACT_MAX_NODES", N - 1)
    with pytest.raises(
        ValueError, match=r"^method: 'exact' refused: .*N = 4 > EXACT_MAX_NODES = 3"
    ):
        heat_kernel(graph, x, 1.0, method="exact")
    with pytest.raises(ValueError, match=r"^method: 'exact' refused"):
        HeatKernel(method="exact")(graph, x)
    # auto still serves the call with the series
    torch.testing.assert_close(
        heat_kernel(graph, x, 1.0), heat_kernel(graph, x, 1.0, method="series")
    )


def test_refused_series_method(graph, x, monkeypatch) -> None:
    monkeypatch.setattr(heat_module, "SERIES_MAX_TERMS", 3)
    with pytest.raises(ValueError, match=r"^method: 'series' refused: needs \d+ propagations"):
        heat_kernel(graph, x, 1.0, method="series")


# ---- operator names ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["diffusion", "heat_kernel", "", "lap lacian"])
def test_unknown_operator_name_lists_valid_names(name) -> None:
    with pytest.raises(ValueError, match=r"^name: unknown operator") as info:
        resolve_operator(name)
    _assert_lists(str(info.value), sorted(OPERATORS))
    _assert_lists(str(info.value), ["pagerank", "poly"])


def test_operator_name_of_wrong_type() -> None:
    with pytest.raises(TypeError, match=r"^name:"):
        resolve_operator(3)
    with pytest.raises(TypeError, match=r"^kwargs:"):
        resolve_operator(Attention(), t=1.0)


def test_operator_kwargs_are_checked() -> None:
    with pytest.raises(TypeError, match=r"^attention:.*'t'"):
        resolve_operator("attention", t=1.0)
    with pytest.raises(TypeError, match=r"^heat: unknown parameter\(s\) \['tt'\]") as info:
        resolve_operator("heat", tt=1.0)
    _assert_lists(str(info.value), ["t", "normalization", "method", "tol", "learnable"])
    with pytest.raises(ValueError, match=r"^alpha:"):
        resolve_operator("ppr", alpha=2.0)
    with pytest.raises(ValueError, match=r"^normalization:"):
        resolve_operator("heat", normalization="bogus")


# ---- key masks at the graph kinds' boundary ----------------------------------------------------

BAD_KEY_MASKS = {
    "batch 3 for 2": (torch.ones(3, 5, dtype=torch.bool), ValueError),
    "N 4 for 5": (torch.ones(2, 4, dtype=torch.bool), ValueError),
    "heads 3 for 2": (torch.ones(2, 3, 5, dtype=torch.bool), ValueError),
    "no dims": (torch.tensor(True), ValueError),
    "float": (torch.ones(2, 5), TypeError),
}


@pytest.mark.parametrize("bad", list(BAD_KEY_MASKS))
@pytest.mark.parametrize("kind", ["softmax", "topk[k=2]", "window[w=2]"])
def test_a_key_mask_that_does_not_fit_is_refused_naming_key_mask(kind: str, bad: str) -> None:
    """A key mask of the wrong batch gave torch's expand error in a window graph, and named
    ``mask`` (the dense graph's argument, not the builder's) in the others."""
    from heatformer.graph_ops import WindowGraph, resolve_graph

    key_mask, error = BAD_KEY_MASKS[bad]
    q = torch.randn(2, 2, 5, 4)  # (B, H, N, E)
    with pytest.raises(error, match=r"^key_mask: expected") as info:
        resolve_graph(kind).build(q, q, key_mask=key_mask)
    assert info.value.argument == "key_mask"  # type: ignore[attr-defined]
    if kind.startswith("window"):
        with pytest.raises(error, match=r"^key_mask: expected"):
            WindowGraph(q, q, window=2, key_mask=key_mask)
    # what fits: (B, N), a leading 1, (B, H, N)
    for good in ((2, 5), (1, 5), (2, 2, 5)):
        graph = resolve_graph(kind).build(q, q, key_mask=torch.ones(good, dtype=torch.bool))
        assert graph.num_nodes == 5
