"""Every size from 0 up: the combination matrix at ``N = 0``, ``N = 1`` and windows past ``N``.

Generated from the same case lists as :mod:`test_matrix` (every registered operator with its
examples x every graph kind with its examples, causal or not, key-masked or not), at the sizes
where blockwise code has its edges:

- ``N = 0``: every operator on every graph kind returns an empty ``(..., 0, C)`` result, and a
  layer's backward gives every parameter a zero gradient (not None, not an error);
- ``N = 1``: the graph has one node whose only edge is its self-loop (weight 1, or no edge
  when its key is padded), so the result equals the operator on that explicit ``1 x 1``
  weight, and no gradient reaches ``q`` or ``k`` (a softmax over one key is constant);
- ``w > N``: a window at least as long as the sequence holds every key, so the graph equals
  the dense ``"softmax"`` kind with the same causal order and key mask, values and gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from heatformer._spec import format_entry
from heatformer.graph_ops import (
    DenseGraph,
    DiffusionOperator,
    Graph,
    GraphBuilder,
    resolve_graph,
    resolve_operator,
    split_maps,
)
from heatformer.models import DiffusionAttention
from test_matrix import (
    GRAPH_CASES,
    KINDS,
    OPERATOR_CASES,
    B,
    GraphCase,
    _integer_layer,
    _key_mask,
    _layer_spec,
    _truncation,
    assert_agrees,
    expected_refusal,
)

H, E, C, D_MODEL = 2, 4, 3, 8
#: examples whose series take hundreds of propagations (slow convergence is what they are for;
#: test_matrix runs them): here they run at N = 0, where the crashes were; in the equality cells
#: they cost ~0.4 s each on a window graph (half this file's time) for the same graph code as the
#: other examples of their normalization
SLOW = (
    "ppr[alpha=0.05;normalization=combinatorial]",
    "heat[t=40.0;normalization=combinatorial;tol=1e-08]",
)
#: the equality cells (N = 1, w > N) of the functional call: every other example
EQUALITY_CASES = [case for case in OPERATOR_CASES if case.id not in SLOW]
#: the layer cells: each operator's defaults and its examples with parameters a layer trains
#: (the functional cells run every example; the layer adds head grouping, the fused path and
#: the projections, no graph code)
LAYER_CASES = [
    case for case in OPERATOR_CASES if not case.values[1] or "learnable" in case.values[1]
]
#: tokens of the w > N cells, and the window they get (longer than the sequence)
LONG_N, LONG_W = 9, 20


def _past_n(kind: str) -> str | None:
    """``kind`` with its window ``w`` set past :data:`LONG_N` (None for kinds without one)."""
    builder = resolve_graph(kind)
    if "w" not in builder.params:
        return None
    return format_entry(builder.name, {**builder.params, "w": LONG_W}, sep=",")


#: every kind with a window, each with its causal/masked variants, the window past N
WIDE_CASES = {
    name.replace(case.kind, wide): GraphCase(wide, case.causal, case.masked)
    for name, case in GRAPH_CASES.items()
    if (wide := _past_n(case.kind)) is not None
}


def _qkvx(n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Float64 ``q``, ``k`` ``(B, H, n, E)`` and a signal ``x`` ``(B, H, n, C)``, with grads
    (``C != E``: the window's plain-product path; the layer cells take its fused kernels)."""
    gen = torch.Generator().manual_seed(n)
    q, k = (torch.randn(B, H, n, E, generator=gen, dtype=torch.float64) for _ in range(2))
    x = torch.randn(B, H, n, C, generator=gen, dtype=torch.float64)
    return q.requires_grad_(True), k.requires_grad_(True), x.requires_grad_(True)


def _build(
    builder: GraphBuilder,
    case: GraphCase,
    q: Tensor,
    k: Tensor,
    drop: bool = False,
    maps: int = 1,
) -> Graph:
    """The graph of ``case`` by ``builder`` (``drop``: padded queries lose their out-edges);
    for an operator with ``maps > 1`` attention maps per head (asked of the entry), the maps
    from the channels of ``q``, ``k`` as a layer splits them (batch ``(B, H, maps)``)."""
    key_mask = _key_mask(q.shape[-2]) if case.masked else None  # element 1: first 3 padded
    if maps > 1:
        q, k = split_maps(q, maps), split_maps(k, maps)  # (B, H, maps, N, E / maps)
    return builder.build(q, k, key_mask=key_mask, drop_masked_queries=drop, causal=case.causal)


def _one_node_weights(case: GraphCase, maps: int = 1) -> Tensor:
    """The explicit ``(B, H, 1, 1)`` weight of a one-token graph: its self-loop, 0 where its
    key is padded (``_key_mask`` pads element 1's first keys); ``(B, H, maps, 1, 1)`` for an
    operator with ``maps`` attention maps (each the same one-node graph)."""
    real = _key_mask(1) if case.masked else torch.ones(B, 1, dtype=torch.bool)
    w = real.double()[:, None, :, None].expand(B, H, 1, 1)
    return w if maps == 1 else w[:, :, None].expand(B, H, maps, 1, 1)


def _assert_zero_grads(tensors: dict[str, Tensor], what: str) -> None:
    for name, t in tensors.items():
        grad = t.grad
        if grad is not None:  # a tensor the result does not read may get none
            assert grad.shape == t.shape, f"{what}: grad of {name} {tuple(grad.shape)}"
            assert not bool(grad.any()), f"{what}: non-zero grad of {name} at N = 0"


# ---- functional: op(graph, x) -------------------------------------------------------------------


def _apply(
    name: str, params: dict[str, Any], case: GraphCase, n: int, drop: bool = False
) -> tuple[DiffusionOperator, tuple[Tensor, Tensor, Tensor], Tensor]:
    """The operator, its ``(q, k, x)`` of ``n`` tokens and ``op(graph, x)`` on ``case``."""
    op = resolve_operator(name, **params).double()
    q, k, x = _qkvx(n)
    return op, (q, k, x), op(_build(case.builder, case, q, k, drop, op.maps), x)


@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_functional_empty(name: str, params: dict[str, Any], case_name: str) -> None:
    op, (q, k, x), y = _apply(name, params, GRAPH_CASES[case_name], 0)
    what = f"{name}{params} on {case_name}, N = 0"
    assert y.shape == x.shape and y.dtype == x.dtype, f"{what}: {y.dtype} {tuple(y.shape)}"
    y.sum().backward()
    _assert_zero_grads({"q": q, "k": k, "x": x, **dict(op.named_parameters())}, what)


@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), EQUALITY_CASES)
def test_functional_one_node(name: str, params: dict[str, Any], case_name: str) -> None:
    case = GRAPH_CASES[case_name]
    op, (q, k, x), y = _apply(name, params, case, 1)
    expected = op(DenseGraph(_one_node_weights(case, op.maps)), x)
    what = f"{name}{params} on {case_name}, N = 1"
    assert_agrees(y, expected, torch.float64, what, _truncation(op))
    gq, gk, gx = torch.autograd.grad(y.sum(), (q, k, x), allow_unused=True)
    (ex,) = torch.autograd.grad(expected.sum(), (x,))
    assert gx is not None
    assert_agrees(gx, ex, torch.float64, f"{what}: grad x", _truncation(op))
    for label, grad in (("q", gq), ("k", gk)):  # a softmax over one key is constant
        assert grad is None or float(grad.abs().max()) <= 1e-12, f"{what}: grad {label}"


@pytest.mark.parametrize("case_name", list(WIDE_CASES))
@pytest.mark.parametrize(("name", "params"), EQUALITY_CASES)
def test_functional_window_past_n_is_softmax(
    name: str, params: dict[str, Any], case_name: str
) -> None:
    case = WIDE_CASES[case_name]
    drop = resolve_operator(name, **params).reads_transpose  # as a layer builds it for them
    op, (q, k, x), y = _apply(name, params, case, LONG_N, drop)
    expected = op(_build(resolve_graph("softmax"), case, q, k, drop, op.maps), x)
    what = f"{name}{params} on {case_name}"
    assert_agrees(y, expected, torch.float64, what, _truncation(op))
    grads = torch.autograd.grad(y.sum(), (q, k, x), allow_unused=True)
    ref_grads = torch.autograd.grad(expected.sum(), (q, k, x), allow_unused=True)
    for label, grad, ref in zip("qkx", grads, ref_grads):
        if ref is None:  # e.g. mean pooling reads no weight
            assert grad is None or not bool(grad.any()), f"{what}: grad {label}"
        else:
            assert grad is not None, f"{what}: no grad {label}"
            assert_agrees(grad, ref, torch.float64, f"{what}: grad {label}", _truncation(op))


# ---- DiffusionAttention: forward and backward ---------------------------------------------------


def _layer(
    name: str, params: dict[str, Any], case: GraphCase, dtype: torch.dtype = torch.float64
) -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(
        D_MODEL, 2, _layer_spec(name, params), graph=case.kind, causal=case.causal, dtype=dtype
    )


def _refused(name: str, params: dict[str, Any], case: GraphCase, n: int) -> bool:
    """Whether the cell is a declared refusal (checked as the matrix checks it)."""
    refusal = expected_refusal(resolve_operator(name, **params), case, "layer")
    if refusal is None:
        return False
    mask = _key_mask(n) if case.masked else None
    with pytest.raises(ValueError, match=refusal):
        _layer(name, params, case)(torch.zeros(B, n, D_MODEL, dtype=torch.float64), mask)
    return True


def _run(
    layer: DiffusionAttention,
    x: Tensor,
    mask: Tensor | None,
    probe: Tensor,
    forward: Callable[[Tensor, Tensor | None], Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Output, grad of ``x`` and of ``in_proj`` of ``forward`` (default: the layer's)."""
    x = x.detach().requires_grad_(True)
    y = (forward or layer)(x, mask)
    (y.double() * probe).sum().backward()
    assert x.grad is not None and layer.in_proj.weight.grad is not None
    return y.detach(), x.grad, layer.in_proj.weight.grad


def _one_node_layer(layer: DiffusionAttention, x: Tensor, case: GraphCase) -> Tensor:
    """The layer's documented per-head definition on the explicit ``1 x 1`` weights."""
    _, _, v = layer.project_qkv(x)  # (B, H, 1, Dh)
    heads = [
        op(DenseGraph(_one_node_weights(case, op.maps)[:, :1]), v[:, h : h + 1])  # one head's
        for h, op in enumerate(layer.head_operators)
    ]
    return layer.merge_heads(torch.cat(heads, dim=1))


@pytest.mark.parametrize("n", (0, 1))
@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), LAYER_CASES)
def test_layer_small(name: str, params: dict[str, Any], case_name: str, n: int) -> None:
    case = GRAPH_CASES[case_name]
    if _refused(name, params, case, n):
        return
    layer = _integer_layer(_layer(name, params, case))
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-1, 2, (B, n, D_MODEL), generator=gen).double()
    probe = torch.randn(B, n, D_MODEL, generator=gen, dtype=torch.float64)
    mask = _key_mask(n) if case.masked else None
    y, gx, gw = _run(layer, x, mask, probe)
    what = f"{layer.spec} on {case_name}, N = {n}"
    assert y.shape == (B, n, D_MODEL), f"{what}: shape {tuple(y.shape)}"
    if n == 0:
        assert gx.shape == x.shape
        for pname, p in layer.named_parameters():
            assert p.grad is not None, f"{what}: no grad for {pname}"
            assert not bool(p.grad.any()), f"{what}: non-zero grad for {pname}"
        return
    reference = copy.deepcopy(layer)
    reference.zero_grad()
    expected = _run(reference, x, mask, probe, lambda x, _: _one_node_layer(reference, x, case))
    truncation = max(_truncation(op) for op in layer.head_operators)
    for label, actual, exp in zip(("output", "grad x", "grad in_proj"), (y, gx, gw), expected):
        assert_agrees(actual, exp, torch.float64, f"{what}: {label}", truncation)


@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), LAYER_CASES)
def test_layer_empty_in_half_precision(name: str, params: dict[str, Any], case_name: str) -> None:
    dtype = torch.bfloat16  # its casts to float32 and back have paths of their own
    case = GRAPH_CASES[case_name]
    if expected_refusal(resolve_operator(name, **params), case, "layer") is not None:
        return  # refused before any size matters (test_layer_small checks the refusal)
    layer = _layer(name, params, case, dtype)
    x = torch.zeros(B, 0, D_MODEL, dtype=dtype, requires_grad=True)
    y = layer(x, _key_mask(0) if case.masked else None)
    assert y.shape == (B, 0, D_MODEL) and y.dtype == dtype
    y.sum().backward()
    assert all(p.grad is not None and not bool(p.grad.any()) for p in layer.parameters())


@pytest.mark.parametrize("case_name", list(WIDE_CASES))
@pytest.mark.parametrize(("name", "params"), LAYER_CASES)
def test_layer_window_past_n_is_softmax(name: str, params: dict[str, Any], case_name: str) -> None:
    case = WIDE_CASES[case_name]
    if _refused(name, params, case, LONG_N):
        return
    layer = _integer_layer(_layer(name, params, case))
    dense = _layer(name, params, GraphCase("softmax", case.causal, case.masked))
    dense.load_state_dict(layer.state_dict())
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-1, 2, (B, LONG_N, D_MODEL), generator=gen).double()
    probe = torch.randn(B, LONG_N, D_MODEL, generator=gen, dtype=torch.float64)
    mask = _key_mask(LONG_N) if case.masked else None
    outs, refs = _run(layer, x, mask, probe), _run(dense, x, mask, probe)
    truncation = max(_truncation(op) for op in layer.head_operators)
    for label, actual, expected in zip(("output", "grad x", "grad in_proj"), outs, refs):
        assert_agrees(actual, expected, torch.float64, f"{layer.spec} on {case_name}: {label}",
                      truncation)  # fmt: skip


def test_the_slow_examples_are_registered() -> None:
    """:data:`SLOW` names examples that exist (a renamed one would run everywhere, unnoticed)."""
    assert set(SLOW) <= {case.id for case in OPERATOR_CASES}


def test_every_window_kind_has_wide_cases() -> None:
    """The w > N cells exist for every registered kind with a window (none silently lost)."""
    windowed = [kind for kind in KINDS if _past_n(kind) is not None]
    assert windowed, "no registered graph kind has a window"
    assert {case.kind for case in WIDE_CASES.values()} == {_past_n(k) for k in windowed}
    assert len(WIDE_CASES) == 4 * len(windowed)
