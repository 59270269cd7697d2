"""The centring head (``"center"``): ``(I' - U) x`` against a dense float64 construction from
the allowed-key mask, on every graph kind, causal and key-masked; edge cases N = 0, N = 1 and
rows with a single allowed key; gradcheck; the property that makes it the matched control of
mean pooling."""

from __future__ import annotations

import math

import pytest
import torch

from heatformer.graph_ops import (
    Centering,
    DenseGraph,
    MeanPooling,
    SoftmaxGraph,
    WindowGraph,
    resolve_graph,
    resolve_operator,
)
from heatformer.models import DiffusionAttention, parse_heads

F64 = torch.float64
B, H, N, E, C = 2, 3, 10, 4, 5


def _inputs(seed: int = 0, n: int = N):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, E, generator=gen, dtype=F64)
    k = torch.randn(B, H, n, E, generator=gen, dtype=F64)
    x = torch.randn(B, H, n, C, generator=gen, dtype=F64)
    key_mask = torch.ones(B, n, dtype=torch.bool)
    key_mask[1, :3] = False  # left padding in element 1
    return q, k, x, key_mask


def _centred(allowed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The dense construction: ``U = A / rowsum(A)`` from the bool allowed mask ``A``,
    ``I'`` = rows with a key, ``I' x - U x`` (numpy, float64)."""
    a = allowed.expand(*x.shape[:-2], x.shape[-2], x.shape[-2]).double().numpy()
    count = a.sum(-1, keepdims=True)
    u = a / count.clip(min=1)
    xs = x.detach().numpy()
    return torch.from_numpy((count > 0) * xs - u @ xs)


def _allowed(key_mask: torch.Tensor | None, causal: bool, n: int = N) -> torch.Tensor:
    allowed = torch.ones(B, 1, n, n, dtype=torch.bool)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    return allowed


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_graph_centring_is_x_minus_the_masked_mean(causal: bool, masked: bool) -> None:
    q, k, x, key_mask = _inputs()
    mask = key_mask if masked else None
    graph = resolve_graph("softmax").build(q, k, key_mask=mask, causal=causal)
    y = Centering()(graph, x)
    _close(y, _centred(_allowed(mask, causal), x))
    if not causal and not masked:  # V - mean(V) over the whole sequence
        _close(y, x - x.mean(-2, keepdim=True))
    if causal and not masked:  # x minus the running mean; row 0 has one key: exactly 0
        running = x.cumsum(-2) / torch.arange(1, N + 1, dtype=F64)[:, None]
        _close(y, x - running)
        assert torch.all(y[..., 0, :] == 0)
    if causal and masked:  # element 1: rows 0-2 have no key (0), row 3 only itself (0)
        assert torch.all(y[1, :, :4] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_global", [0, 2])
def test_window_graph_centring_uses_the_window(causal: bool, num_global: int) -> None:
    q, k, x, key_mask = _inputs(1)
    graph = WindowGraph(q, k, window=3, causal=causal, num_global=num_global, key_mask=key_mask)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    band = ((i - j >= 0) & (i - j < 3)) if causal else (i - j).abs() <= 3
    glob = (i < num_global) | (j < num_global)
    allowed = band | (glob & (j <= i) if causal else glob)
    allowed = allowed & key_mask[:, None, None, :]  # (B, 1, N, N)
    _close(Centering()(graph, x), _centred(allowed, x))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("k_top", [1, 3])
def test_topk_graph_centring_uses_the_kept_keys(causal: bool, k_top: int) -> None:
    """The ``k`` highest-scoring allowed keys of each query; with ``k = 1`` every row has a
    single key and the output is ``x_i - x_{j*(i)}``."""
    q, k, x, key_mask = _inputs(2)
    graph = resolve_graph(f"topk[k={k_top}]").build(q, k, key_mask=key_mask, causal=causal)
    allowed = _allowed(key_mask, causal).expand(B, H, N, N)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, -math.inf)
    kept = torch.zeros(B, H, N, N, dtype=torch.bool)
    kept.scatter_(-1, scores.argsort(dim=-1, descending=True, stable=True)[..., :k_top], True)
    y = Centering()(graph, x)
    _close(y, _centred(kept & allowed, x))
    if k_top == 1:
        best = torch.gather(x, -2, scores.argmax(-1, keepdim=True).expand(B, H, N, C))
        has = allowed.any(-1, keepdim=True)
        _close(y, torch.where(has, x - best, 0.0))


def test_dense_graph_centring_reads_the_non_zero_pattern() -> None:
    w = torch.rand(B, H, N, N, generator=torch.Generator().manual_seed(3), dtype=F64)
    w = w * (w > 0.5)  # a random pattern
    w[0, 0, 4] = 0.0  # a node without out-edges
    w[0, 1, 5] = 0.0
    w[0, 1, 5, 2] = 0.3  # a node with one out-edge
    _, _, x, _ = _inputs(3)
    y = Centering(scale=2.0)(DenseGraph(w), x)
    _close(y, 2.0 * _centred(w != 0, x))
    assert torch.all(y[0, 0, 4] == 0)
    _close(y[0, 1, 5], 2.0 * (x[0, 1, 5] - x[0, 1, 2]))


@pytest.mark.parametrize("kind", ["softmax", "topk[k=3]", "window[w=2,global=1]"])
@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_single_token_sequences(kind: str, n: int) -> None:
    """N = 0: an empty output; N = 1: the token is its own mean, so exactly 0 (causal or not)."""
    q, k, x, key_mask = _inputs(4, n)
    for causal in (False, True):
        graph = resolve_graph(kind).build(q, k, key_mask=key_mask[:, :n], causal=causal)
        y = Centering()(graph, x)
        assert y.shape == (B, H, n, C) and torch.all(y == 0)


def test_centring_is_identity_minus_mean_pooling_and_ignores_the_weights() -> None:
    q, k, x, key_mask = _inputs(5)
    q.requires_grad_(True)
    k.requires_grad_(True)
    mask = key_mask[:, None, None, :]
    graph = SoftmaxGraph(q, k, mask=mask, causal=True)
    other = SoftmaxGraph(5 * q.detach(), -k.detach(), mask=mask, causal=True)
    x.requires_grad_(True)
    y = Centering()(graph, x)
    _close(y, Centering()(other, x))
    has = _allowed(key_mask, True).any(-1, keepdim=True)  # (B, 1, N, 1)
    _close(y, has * x - MeanPooling()(graph, x))
    y.sum().backward()
    assert q.grad is None and k.grad is None and x.grad is not None


def test_mean_pooling_cannot_change_the_spread_and_centring_removes_the_mean() -> None:
    """The confound of issue 25: in a bidirectional layer a mean head adds one vector to every
    token (the within-sequence deviations of ``x + U x`` are those of ``x``); the centring head
    outputs exactly those deviations, whose sequence mean is 0."""
    q, k, x, _ = _inputs(6)
    graph = SoftmaxGraph(q, k)
    pooled = MeanPooling()(graph, x)
    assert torch.allclose(pooled, pooled[..., :1, :].expand_as(pooled), atol=1e-14, rtol=0)
    deviations = x - x.mean(-2, keepdim=True)
    _close((x + pooled) - (x + pooled).mean(-2, keepdim=True), deviations)
    y = Centering()(graph, x)
    _close(y, deviations)
    assert float(y.mean(-2).abs().max()) < 1e-14


def test_layer_head_is_v_minus_the_masked_running_mean() -> None:
    """In a causal, key-masked layer a ``center`` head outputs ``v`` minus its mean over the
    real keys of the prefix; a query without any (left padding) outputs 0."""
    torch.manual_seed(0)
    layer = DiffusionAttention(12, 3, "attention:1,center:2", causal=True, dtype=F64)
    x = torch.randn(B, N, 12, dtype=F64)
    _, _, _, key_mask = _inputs()
    q, k, v = layer.project_qkv(x)
    y = layer.diffuse(q, k, v, key_mask)  # (B, H, N, Dh)
    _close(y[:, 1:], _centred(_allowed(key_mask, True), v[:, 1:]))
    assert torch.all(y[1, 1:, :4] == 0)  # no key, or only itself
    assert not layer.supports_cache and layer.fused_heads == (0,)


def test_spec_names_and_capabilities() -> None:
    op = resolve_operator("center", scale=0.5)
    assert isinstance(op, Centering) and float(op.scale) == 0.5
    assert repr(resolve_operator("CENTER")) == "Centering(scale=1)"
    ops = parse_heads("attention:2,center[scale=0.5]:2", 4)
    assert [o.name for o in ops] == ["attention", "attention", "center", "center"]
    assert not op.reads_transpose and op.affine_coefficients() is None
    assert op.affine_constants() is None
    assert [n for n, _ in Centering(learnable=True).named_parameters()] == ["scale"]
    assert list(Centering().parameters()) == []
    lam = torch.tensor([0.0, 0.5, 1.0])
    torch.testing.assert_close(op.frequency_response(lam), 0.5 * lam)


def test_nan_stays_in_its_channel() -> None:
    """(Bad options and calls: tests/graph_ops/test_mean_pooling.py, for both operators.)"""
    q, k, x, _ = _inputs()
    graph = SoftmaxGraph(q, k)
    x = x.clone()
    x[0, 0, 2, 1] = math.nan  # NaN in, NaN out: in channel 1 of that head, nowhere else
    y = Centering()(graph, x)
    assert torch.isnan(y[0, 0, :, 1]).all() and not torch.isnan(y[0, 0, :, 0]).any()
    assert not torch.isnan(y[1]).any()
