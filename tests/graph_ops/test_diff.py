"""The differential operator on its two maps: its definition, the lambda reparameterisation and
the depth rule, combining propagations, the maps of a graph, and bad input."""

from __future__ import annotations

import math
import re

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.graph_ops import (
    DenseGraph,
    Differential,
    SoftmaxGraph,
    resolve_graph,
    resolve_operator,
    split_maps,
)
from heatformer.graph_ops.operators.diff import lambda_init_at

F64 = torch.float64


def _maps(seed: int = 0, batch: tuple[int, ...] = (2, 3), n: int = 6) -> torch.Tensor:
    """Random non-negative weights ``(*batch, 2, N, N)``, one row without edges in map 2 and a
    row without edges in both maps (node 4)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(*batch, 2, n, n, generator=gen, dtype=F64)
    w[..., 1, 2, :] = 0.0
    w[..., 4, :] = 0.0
    return w


def _definition(op: Differential, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``(1 - lambda_init) RMSNorm(P_1 x - lambda P_2 x)`` with ``P_i = D_i^+ W_i``, from the
    paper's formulas (lambda from the vectors, read here)."""
    p = w / w.sum(-1, keepdim=True).clamp_min(1e-300)  # rows without edges stay 0
    lam = op.lambda_init
    if op.lambda_q1 is not None:
        q1, k1, q2, k2 = (
            v.detach() for v in (op.lambda_q1, op.lambda_k1, op.lambda_q2, op.lambda_k2)
        )
        lam += math.exp(float(q1 @ k1)) - math.exp(float(q2 @ k2))
    u = p[..., 0, :, :] @ x - lam * (p[..., 1, :, :] @ x)
    return (1 - op.lambda_init) * u / torch.sqrt(u.square().mean(-1, keepdim=True) + op.eps)


@pytest.mark.parametrize("dim", [None, 3])
def test_equals_its_definition_on_two_maps(dim: int | None) -> None:
    """Float64, batch dims ``(2, 3)``, a row without edges in one map and one in both (0)."""
    torch.manual_seed(0)
    op = Differential(lambda_init=0.3, lambda_std=0.5, dim=dim).double()
    w = _maps()
    x = torch.randn(2, 3, 6, 4, dtype=F64)
    y = op(DenseGraph(w), x)
    torch.testing.assert_close(y, _definition(op, w, x), atol=1e-14, rtol=0)
    assert torch.equal(y[..., 4, :], torch.zeros_like(y[..., 4, :]))  # no edges: 0
    x_broadcast = torch.randn(6, 4, dtype=F64)  # x broadcast over the batch: one dim fewer
    with pytest.raises(ValueError, match=r"^graph: expected a graph of batch shape \(\*batch, 2\)"):
        op(DenseGraph(w), x_broadcast)
    y1 = op(DenseGraph(w[0, 0]), x_broadcast)  # batch () + the maps
    torch.testing.assert_close(y1, _definition(op, w[0, 0], x_broadcast), atol=1e-14, rtol=0)


def test_every_row_has_rms_one_minus_lambda_init() -> None:
    """The per-head RMSNorm: each row of the output has RMS ``1 - lambda_init`` (up to eps)."""
    q, k = (
        torch.randn(2, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(s)) for s in (1, 2)
    )
    graph = SoftmaxGraph(split_maps(q, 2), split_maps(k, 2), causal=True)
    op = Differential(depth=4, eps=1e-12)
    y = op(graph, torch.randn(2, 7, 5, dtype=F64))
    expected = torch.full((2, 7), 1 - lambda_init_at(4), dtype=F64)
    torch.testing.assert_close(y.square().mean(-1).sqrt(), expected, atol=1e-9, rtol=0)


def test_combine_of_one_propagation_per_map_is_the_output() -> None:
    """What it declares (``combines_maps``), which the KV cache relies on: the output is
    ``combine`` of ``P_i x`` on every graph kind, masked and causal."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 9, 4, generator=gen, dtype=F64) for _ in "qk")
    x = torch.randn(2, 3, 9, 5, generator=gen, dtype=F64)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, :3] = False
    op = Differential(dim=2, lambda_std=0.3).double()
    assert op.maps == 2 and op.combines_maps and op.affine_coefficients() is None
    for kind in ("softmax", "topk[k=3]", "window[w=2,global=1]"):
        graph = resolve_graph(kind).build(
            split_maps(q, 2), split_maps(k, 2), key_mask=key_mask, causal=True
        )
        assert tuple(graph.batch_shape) == (2, 3, 2)
        pv = torch.stack(
            [DenseGraph(graph.to_dense()[..., i, :, :]).propagate(x) for i in (0, 1)], -3
        )
        torch.testing.assert_close(op(graph, x), op.combine(pv), atol=1e-14, rtol=0)
    with pytest.raises(ValueError, match=r"^pv: expected shape \(\*batch, 2, Nq, C\)"):
        op.combine(x)


def test_lambda_is_reparameterised_and_learned() -> None:
    """``lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init``: gradients reach the four vectors;
    without vectors (or with lambda_std = 0) lambda is lambda_init."""
    torch.manual_seed(0)
    op = Differential(lambda_init=0.4, dim=5, lambda_std=0.2).double()
    q1, k1, q2, k2 = op.lambda_q1, op.lambda_k1, op.lambda_q2, op.lambda_k2
    expected = torch.exp(q1 @ k1) - torch.exp(q2 @ k2) + 0.4
    torch.testing.assert_close(op.lambda_full(), expected, atol=1e-15, rtol=0)
    op(DenseGraph(_maps()), torch.randn(2, 3, 6, 4, dtype=F64)).sum().backward()
    assert all(v.grad is not None and bool(v.grad.any()) for v in (q1, k1, q2, k2))
    assert float(Differential(lambda_init=0.4).lambda_full()) == pytest.approx(0.4)
    zero = Differential(lambda_init=0.4, dim=3, lambda_std=0.0, dtype=F64)
    assert float(zero.lambda_full().detach()) == 0.4
    assert [n for n, _ in op.named_parameters()] == [
        "lambda_q1",
        "lambda_k1",
        "lambda_q2",
        "lambda_k2",
    ]


def test_depth_rule_is_the_papers_and_diffllamas() -> None:
    """``lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))`` at the 1-based depth ``l``; DiffLlama's
    ``lambda_init_fn`` takes the 0-based ``layer_idx = l - 1``."""
    for depth in (1, 2, 5, 24):
        assert lambda_init_at(depth) == 0.8 - 0.6 * math.exp(-0.3 * (depth - 1))
        assert Differential(depth=depth).lambda_init == lambda_init_at(depth)
    op = Differential()
    assert op.lambda_init == lambda_init_at(1) and op.depth == 1
    op.set_depth(3)
    assert op.lambda_init == lambda_init_at(3)
    Differential(depth=2).set_depth(5)  # a given depth wins
    try:
        from transformers.models.diffllama.modeling_diffllama import lambda_init_fn
    except ImportError:
        return
    assert all(lambda_init_fn(i) == lambda_init_at(i + 1) for i in range(12))


def test_frequency_response_is_that_of_its_linear_map_on_one_graph() -> None:
    """On one graph for both maps, ``P_1 - lambda P_2 = (1 - lambda) P``."""
    op = Differential(lambda_init=0.25, dim=2, lambda_std=0.3)
    lam = torch.tensor([0.0, 0.5, 2.0])
    expected = (1 - op.lambda_full().detach()) * (1 - lam)
    torch.testing.assert_close(op.frequency_response(lam), expected)


def test_split_maps_is_a_view_of_the_channels() -> None:
    t = torch.arange(2 * 3 * 6.0).reshape(2, 3, 6)  # (B, N, E)
    maps = split_maps(t, 2)
    assert maps.shape == (2, 2, 3, 3) and maps.data_ptr() == t.data_ptr()
    assert torch.equal(maps[:, 0], t[..., :3]) and torch.equal(maps[:, 1], t[..., 3:])
    with pytest.raises(ValueError, match=r"^q: expected channels divisible into 4 maps, got 6"):
        split_maps(t, 4, name="q")
    with pytest.raises(TypeError, match=r"^t: expected a tensor"):
        split_maps([1.0], 2)  # type: ignore[arg-type]


def test_spec_strings_and_the_alias() -> None:
    op = resolve_operator("diff[lambda_init=0.3;eps=1e-6]")
    assert isinstance(op, Differential) and op.lambda_init == 0.3 and op.eps == 1e-6
    assert isinstance(resolve_operator("Differential"), Differential)
    assert repr(Differential(depth=2, dim=4)) == (
        "Differential(lambda_init=0.3555, depth=2, eps=1e-05, dim=4)"
    )


@pytest.mark.parametrize(
    ("kwargs", "argument", "error"),
    [
        ({"lambda_init": 1.0}, "lambda_init", ValueError),
        ({"lambda_init": -0.1}, "lambda_init", ValueError),
        ({"lambda_init": float("nan")}, "lambda_init", ValueError),
        ({"lambda_init": "0.5"}, "lambda_init", TypeError),
        ({"depth": 0}, "depth", ValueError),
        ({"depth": 1.5}, "depth", TypeError),
        ({"lambda_init": 0.5, "depth": 2}, "depth", ValueError),
        ({"eps": 0.0}, "eps", ValueError),
        ({"lambda_std": -1.0}, "lambda_std", ValueError),
        ({"dim": 0}, "dim", ValueError),
    ],
)
def test_bad_options_name_the_argument(kwargs: dict, argument: str, error: type) -> None:
    with pytest.raises(error) as info:
        Differential(**kwargs)
    assert isinstance(info.value, ArgumentError) and info.value.argument == argument
    if any(isinstance(v, str) for v in kwargs.values()):
        return  # a spec string has no strings for numbers
    spec = "diff[" + ";".join(f"{k}={v}" for k, v in kwargs.items()) + "]"
    with pytest.raises(ValueError, match=rf"in {re.escape(repr(spec))}: {argument}: expected"):
        resolve_operator(spec)


def test_a_graph_without_its_maps_is_refused_naming_graph() -> None:
    """A graph of the heads alone (batch ``(B, H)``) for ``x`` ``(B, H, N, C)``: one clear error,
    not a broadcast of the heads against the maps (here ``H = 2``)."""
    q = torch.randn(2, 2, 5, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"^graph: expected a graph of batch shape \(\*batch, 2\)"):
        Differential()(SoftmaxGraph(q, q), torch.randn(2, 2, 5, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"^channels: expected an even head width"):
        Differential().shape_parameters(2, 5)
