"""The untied-skip attention head (``"skip"``): ``P x + I' x W_S`` with a ``(C, C)`` weight per
head, against an explicit float64 construction on every graph kind, causal and key-masked;
``W_S = 0`` is exactly attention and ``W_S = -I`` minus the Laplacian head; gradcheck; the
layer shapes the weight and learns it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import model_helpers as mh
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    Laplacian,
    SoftmaxGraph,
    UntiedSkip,
    resolve_graph,
    resolve_operator,
)
from heatformer.integrations.torch import MultiheadDiffusionAttention
from heatformer.models import DiffusionAttention, parse_heads
from heatformer.models.routing import HeadRouter

F64 = torch.float64
B, H, N, E, C = 2, 3, 8, 4, 5
KINDS = ["softmax", "topk[k=3]", "window[w=2,global=1]"]


def _inputs(seed: int = 0, n: int = N):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, E, generator=gen, dtype=F64)
    k = torch.randn(B, H, n, E, generator=gen, dtype=F64)
    x = torch.randn(B, H, n, C, generator=gen, dtype=F64)
    w = torch.randn(H, C, C, generator=gen, dtype=F64)
    key_mask = torch.ones(B, n, dtype=torch.bool)
    key_mask[1, :3] = False  # left padding in element 1
    return q, k, x, w, key_mask


def _skip(w: torch.Tensor, init: float = 0.0) -> UntiedSkip:
    op = UntiedSkip(init=init, heads=w.shape[0], dim=w.shape[-1], dtype=F64)
    assert op.skip_weight is not None
    with torch.no_grad():
        op.skip_weight.copy_(w)
    return op


def _explicit(p: np.ndarray, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``P x + I' (x W_S[h])`` per head, in numpy float64 (``p`` ``(B, H, N, N)``)."""
    xs, ws = x.detach().numpy(), w.detach().numpy()
    has = (p != 0).any(-1, keepdims=True)
    return torch.from_numpy(p @ xs + has * np.einsum("bhnc,hcd->bhnd", xs, ws))


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_graph_against_numpy_softmax(causal: bool, masked: bool) -> None:
    """``P`` from a numpy softmax over the allowed keys (independent of the graph code)."""
    q, k, x, w, key_mask = _inputs()
    mask = key_mask if masked else None
    graph = resolve_graph("softmax").build(q, k, key_mask=mask, causal=causal)
    p = np.empty((B, H, N, N))
    for b in range(B):
        allowed = mh.allowed_matrix(N, None if mask is None else mask[b].numpy(), causal)
        for h in range(H):
            p[b, h] = mh.softmax_probs(q[b, h].numpy(), k[b, h].numpy(), allowed)
    y = _skip(w)(graph, x)
    _close(y, _explicit(p, x, w))
    if causal and masked:  # element 1, rows 0-2: no key, so no attention and no own path
        assert torch.all(y[1, :, :3] == 0)


@pytest.mark.parametrize("kind", KINDS[1:])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_and_window_graphs_against_their_explicit_weights(kind: str, causal: bool) -> None:
    q, k, x, w, key_mask = _inputs(1)
    graph = resolve_graph(kind).build(q, k, key_mask=key_mask, causal=causal)
    p = graph.to_dense().numpy()
    _close(_skip(w)(graph, x), _explicit(p, x, w))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_zero_skip_weight_is_exactly_attention_and_minus_identity_is_minus_laplacian(
    kind: str, causal: bool
) -> None:
    q, k, x, _, key_mask = _inputs(2)
    graph = resolve_graph(kind).build(q, k, key_mask=key_mask, causal=causal)
    attention = Attention()(graph, x)
    for op in (UntiedSkip(), UntiedSkip(heads=H, dim=C, dtype=F64)):
        assert torch.equal(op(graph, x), attention)  # bitwise: P x + 0
    minus_eye = -torch.eye(C, dtype=F64).expand(H, C, C)
    for op in (UntiedSkip(init=-1.0), _skip(minus_eye)):
        _close(op(graph, x), -Laplacian()(graph, x))


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_single_token_sequences(n: int) -> None:
    """N = 0: empty; N = 1: the token attends itself, ``x + x W_S``."""
    q, k, x, w, _ = _inputs(3, n)
    for kind in KINDS:
        for causal in (False, True):
            y = _skip(w)(resolve_graph(kind).build(q, k, causal=causal), x)
            _close(y, x + torch.einsum("bhnc,hcd->bhnd", x, w))


def test_gradcheck_in_every_input_and_the_skip_weight() -> None:
    """In ``q``, ``k``, ``x`` on a causal masked softmax graph and a dense graph (its weights
    too), and in the skip weight."""
    q, k, x, w, key_mask = _inputs(4)
    q, k, x = (t[:, :2, :5, :3].clone().requires_grad_(True) for t in (q, k, x))
    w = w[:2, :3, :3].clone().requires_grad_(True)
    mask = key_mask[:, None, None, :5]
    gen = torch.Generator().manual_seed(5)
    weights = torch.rand(2, 2, 5, 5, generator=gen, dtype=F64).requires_grad_(True)
    op = _skip(w.detach())

    def fn(q, k, x, weights):
        return op(SoftmaxGraph(q, k, mask=mask, causal=True), x) + op(DenseGraph(weights), x)

    assert torch.autograd.gradcheck(fn, (q, k, x, weights))
    graph = SoftmaxGraph(q.detach(), k.detach(), mask=mask, causal=True)

    def in_weight(ws):
        return torch.func.functional_call(op, {"skip_weight": ws}, (graph, x.detach()))

    assert torch.autograd.gradcheck(in_weight, (w,))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_layer_heads_against_the_numpy_layer_reference(causal: bool, masked: bool) -> None:
    """``attention:1,skip:2,laplacian:1`` with a random skip weight per head: per-head outputs
    and the layer output against numpy (``model_helpers.diffuse_ref``)."""
    layer = mh.random_layer("attention:1,skip:2,laplacian:1", causal=causal)
    skip = layer.head_operators[1]
    assert isinstance(skip, UntiedSkip) and skip.skip_weight is not None
    assert skip.skip_weight.shape == (2, layer.head_dim, layer.head_dim)
    with torch.no_grad():
        skip.skip_weight.normal_(generator=torch.Generator().manual_seed(6))
    x = mh.random_input(7)
    key_mask = mh.padding_mask(2, 6, [4, 6]) if masked else None
    y_ref, out_ref = mh.diffuse_ref(layer, x, key_mask)
    q, k, v = layer.project_qkv(x)
    np.testing.assert_allclose(mh.to_numpy(layer.diffuse(q, k, v, key_mask)), y_ref, atol=1e-9)
    np.testing.assert_allclose(mh.to_numpy(layer(x, key_mask)), out_ref, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_layer_starts_as_attention_and_learns_its_skip_weight(kind: str) -> None:
    """At ``W_S = 0`` a ``skip`` layer computes bitwise what an ``attention`` layer with the
    same projections does (float32, causal, with and without padding); the weight gets a
    gradient from the first step, and it is saved."""
    torch.manual_seed(0)
    skip = DiffusionAttention(12, 3, "skip:3", causal=True, graph=kind)
    plain = DiffusionAttention(12, 3, "attention:3", causal=True, graph=kind)
    plain.load_state_dict(skip.state_dict(), strict=False)
    x = torch.randn(2, 7, 12)
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[1, :2] = False
    assert torch.equal(skip(x), plain(x)) and torch.equal(skip(x, key_mask), plain(x, key_mask))
    skip(x).square().sum().backward()
    weight = skip.operators[0].skip_weight
    assert weight is not None and weight.grad is not None and float(weight.grad.abs().max()) > 0
    assert "operators.0.skip_weight" in skip.state_dict()
    assert not skip.supports_cache and skip.fused_heads == ()


def test_shapes_come_from_the_layer_and_are_checked() -> None:
    op = UntiedSkip(init=0.25)
    assert op.needs_shape and list(op.parameters()) == []
    DiffusionAttention(16, 4, [op, op, "attention", "attention"])
    assert not op.needs_shape and op.skip_weight is not None
    torch.testing.assert_close(op.skip_weight, 0.25 * torch.eye(4).expand(2, 4, 4))
    DiffusionAttention(16, 4, [op, op, "laplacian", "attention"])  # the same shape: kept
    with pytest.raises(ValueError, match=r"^heads: expected the shape this skip weight has"):
        DiffusionAttention(24, 4, [op, op, "attention", "attention"])
    with pytest.raises(ValueError, match=r"^heads: 'skip' heads have a parameter per head"):
        HeadRouter("skip:2", 2)
    assert HeadRouter("skip:2", 2, head_dim=3).operators[0].skip_weight.shape == (2, 3, 3)
    mha = MultiheadDiffusionAttention(12, 3, heads="attention:1,skip:2", dtype=F64)
    assert mha.heads.operators[1].skip_weight.shape == (2, 4, 4)


def test_spec_names_and_capabilities() -> None:
    op = resolve_operator("skip", init=-1.0)
    assert isinstance(op, UntiedSkip) and op.init == -1.0
    assert isinstance(resolve_operator("untied_skip"), UntiedSkip)
    assert repr(UntiedSkip(heads=2, dim=3)) == "UntiedSkip(init=0, shape=(2, 3, 3))"
    ops = parse_heads("attention:2,skip[init=0.5]:2", 4)
    assert [o.name for o in ops] == ["attention", "attention", "skip", "skip"]
    assert not op.reads_transpose and op.affine_coefficients() is None
    lam = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
    torch.testing.assert_close(op.frequency_response(lam), -lam)  # 1 - lam - 1
    shaped = UntiedSkip(init=0.5, heads=2, dim=3, dtype=F64)
    torch.testing.assert_close(shaped.frequency_response(lam), (1.5 - lam).expand(2, 3))
    assert shaped.skip_weight is not None
    with torch.no_grad():
        shaped.skip_weight[1, 0, 2] = 1.0
    with pytest.raises(ValueError, match=r"^skip_weight: expected c I per head"):
        shaped.frequency_response(lam)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"init": "1"}, TypeError, r"^init: expected a float, got str"),
        ({"init": math.inf}, ValueError, r"^init: expected a finite value"),
        ({"init": math.nan}, ValueError, r"^init: expected a finite value"),
        ({"heads": 2}, ValueError, r"^dim: expected heads and dim together"),
        ({"heads": 0, "dim": 2}, ValueError, r"^heads: "),
        ({"heads": 2, "dim": 2.0}, TypeError, r"^dim: "),
    ],
)
def test_bad_parameters(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        UntiedSkip(**kwargs)


def test_bad_calls() -> None:
    q, k, x, w, _ = _inputs()
    graph = SoftmaxGraph(q, k)
    with pytest.raises(ValueError, match=r"^x: expected 4 channels"):
        _skip(w[:, :4, :4])(graph, x)
    with pytest.raises(ValueError, match=r"^x: expected 2 heads at dim -3"):
        _skip(w[:2])(graph, x)
    with pytest.raises(TypeError, match=r"^skip: unknown parameter"):
        resolve_operator("skip", t=1.0)
