"""The mean-pooling baseline head (``"mean"``): against explicit masked means computed here."""

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


def _inputs(seed: int = 0, dtype: torch.dtype = F64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, E, generator=gen, dtype=F64).to(dtype)
    k = torch.randn(B, H, N, E, generator=gen, dtype=F64).to(dtype)
    x = torch.randn(B, H, N, C, generator=gen, dtype=F64).to(dtype)
    key_mask = torch.ones(B, N, dtype=torch.bool)
    key_mask[1, :3] = False  # left padding in element 1
    return q, k, x, key_mask


def _masked_mean(allowed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``mean_{j allowed} x_j`` row by row with explicit loops; 0 for a row with no key."""
    out = torch.zeros_like(x)
    allowed = allowed.expand(*x.shape[:-2], N, N)
    for idx in torch.cartesian_prod(*(torch.arange(s) for s in x.shape[:-2])):
        b, h = (int(i) for i in idx)
        for i in range(N):
            keys = [j for j in range(N) if bool(allowed[b, h, i, j])]
            if keys:
                out[b, h, i] = sum(x[b, h, j] for j in keys) / len(keys)
    return out


def _allowed(key_mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_graph_mean_is_the_masked_mean(causal: bool, masked: bool) -> None:
    """Causal: the running mean over the prefix; masked: over the real keys only."""
    q, k, x, key_mask = _inputs()
    mask = key_mask if masked else None
    graph = resolve_graph("softmax").build(q, k, key_mask=mask, causal=causal)
    expected = _masked_mean(_allowed(mask, causal), x)
    torch.testing.assert_close(MeanPooling()(graph, x), expected, atol=1e-12, rtol=1e-12)
    if causal and not masked:  # the running mean, written as a cumulative sum
        running = x.cumsum(-2) / torch.arange(1, N + 1, dtype=F64)[:, None]
        torch.testing.assert_close(MeanPooling()(graph, x), running, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_global", [0, 2])
def test_window_graph_mean_is_the_mean_over_the_window(causal: bool, num_global: int) -> None:
    q, k, x, key_mask = _inputs(1)
    graph = WindowGraph(q, k, window=3, causal=causal, num_global=num_global, key_mask=key_mask)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    band = ((i - j >= 0) & (i - j < 3)) if causal else (i - j).abs() <= 3
    glob = (i < num_global) | (j < num_global)
    allowed = band | (glob & (j <= i) if causal else glob)
    allowed = allowed & key_mask[:, None, None, :]  # (B, 1, N, N)
    expected = _masked_mean(allowed, x)
    torch.testing.assert_close(MeanPooling()(graph, x), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_graph_mean_is_the_mean_over_the_kept_keys(causal: bool) -> None:
    """The ``k`` highest-scoring allowed keys of each query (fewer in a row with fewer)."""
    q, k, x, key_mask = _inputs(2)
    graph = resolve_graph("topk[k=3]").build(q, k, key_mask=key_mask, causal=causal)
    allowed = _allowed(key_mask, causal).expand(B, H, N, N)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, -math.inf)
    kept = torch.zeros(B, H, N, N, dtype=torch.bool)
    order = scores.argsort(-1, descending=True)[..., :3]
    kept.scatter_(-1, order, True)
    expected = _masked_mean(kept & allowed, x)
    torch.testing.assert_close(MeanPooling()(graph, x), expected, atol=1e-12, rtol=1e-12)


def test_dense_graph_mean_reads_the_non_zero_pattern() -> None:
    w = torch.rand(B, H, N, N, generator=torch.Generator().manual_seed(3), dtype=F64)
    w = w * (w > 0.5)  # a random pattern
    w[0, 0, 4] = 0.0  # a node without out-edges
    _, _, x, _ = _inputs(3)
    y = MeanPooling(scale=2.0)(DenseGraph(w), x)
    torch.testing.assert_close(y, 2.0 * _masked_mean(w != 0, x), atol=1e-12, rtol=1e-12)
    assert torch.all(y[0, 0, 4] == 0)


def test_the_weights_do_not_matter_and_no_gradient_reaches_q_or_k() -> None:
    q, k, x, key_mask = _inputs(4)
    q.requires_grad_(True)
    k.requires_grad_(True)
    graph = SoftmaxGraph(q, k, mask=key_mask[:, None, None, :])
    other = SoftmaxGraph(5 * q.detach(), -k.detach(), mask=key_mask[:, None, None, :])
    x.requires_grad_(True)
    y = MeanPooling()(graph, x)
    torch.testing.assert_close(y, MeanPooling()(other, x), atol=1e-12, rtol=1e-12)
    y.sum().backward()
    assert q.grad is None and k.grad is None and x.grad is not None


@pytest.mark.parametrize("operator", [MeanPooling, Centering])
@pytest.mark.parametrize("kind", ["softmax", "topk[k=3]", "window[w=2,global=1]", "dense"])
def test_gradcheck(kind: str, operator: type) -> None:
    """Mean pooling and centring, in ``x`` and a learnable ``scale``, on every kind."""
    q, k, x, key_mask = _inputs(5)
    x = x[:, :2, :6, :2].clone().requires_grad_(True)
    q, k = q[:, :2, :6], k[:, :2, :6]
    op = operator(scale=0.7, learnable=True).double()
    if kind == "dense":
        graph = DenseGraph(SoftmaxGraph(q, k, causal=True).to_dense())
    else:
        graph = resolve_graph(kind).build(q, k, key_mask=key_mask[:, :6], causal=True)
    assert torch.autograd.gradcheck(lambda x, s: op(graph, x), (x, op.scale))


def test_layer_head_is_the_masked_running_mean_of_its_values() -> None:
    """In a causal, key-masked layer a ``mean`` head outputs the mean of ``v`` over the real
    keys of the prefix; a query without any (left padding) outputs 0."""
    torch.manual_seed(0)
    layer = DiffusionAttention(12, 3, "attention:1,mean:2", causal=True, dtype=F64)
    x = torch.randn(B, N, 12, dtype=F64)
    _, _, _, key_mask = _inputs()
    q, k, v = layer.project_qkv(x)
    y = layer.diffuse(q, k, v, key_mask)  # (B, H, N, Dh)
    expected = _masked_mean(_allowed(key_mask, True), v[:, 1:])
    torch.testing.assert_close(y[:, 1:], expected, atol=1e-12, rtol=1e-12)
    assert torch.all(y[1, 1:, :3] == 0)


def test_half_precision_topk_keeps_every_allowed_key() -> None:
    """A kept allowed key whose softmax weight underflows in float16 still has a positive
    weight, so the float16 mean equals the float64 one."""
    q = torch.zeros(1, 1, 4, 2, dtype=torch.float16)
    k = torch.tensor([[[[30.0, 0.0], [0.0, 0.0], [-30.0, 0.0], [1.0, 0.0]]]])
    q[..., 0] = 1.0
    x = torch.arange(4.0).reshape(1, 1, 4, 1)
    for dtype in (torch.float16, F64):
        graph = resolve_graph("topk[k=3]").build(q.to(dtype), k.to(dtype), causal=True)
        assert int((graph.weight == 0).sum()) == 3  # the padding of rows 0 and 1 only
        y = MeanPooling()(graph, x.to(dtype))
        # row 2 keeps keys 0, 1, 2 (weight of key 2 ~ e^-60: zero in float16 without the floor)
        expected = torch.tensor([0.0, 0.5, 1.0, 4 / 3], dtype=F64)
        torch.testing.assert_close(y.double().flatten(), expected, atol=1e-3, rtol=0)


def test_spec_names_and_capabilities() -> None:
    op = resolve_operator("mean", scale=0.5)
    assert isinstance(op, MeanPooling) and float(op.scale) == 0.5
    assert repr(resolve_operator("MEAN")) == "MeanPooling(scale=1)"
    ops = parse_heads("attention:2,mean[scale=0.5]:2", 4)
    assert [o.name for o in ops] == ["attention", "attention", "mean", "mean"]
    assert not op.reads_transpose and op.affine_coefficients() is None
    assert [n for n, _ in MeanPooling(learnable=True).named_parameters()] == ["scale"]
    assert list(MeanPooling().parameters()) == []
    lam = torch.tensor([0.0, 0.5, 1.0])
    torch.testing.assert_close(op.frequency_response(lam), 0.5 * (1 - lam))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"scale": "1"}, TypeError, r"^scale: expected a float, got str"),
        ({"scale": True}, TypeError, r"^scale: expected a float"),
        ({"scale": math.inf}, ValueError, r"^scale: expected a finite value"),
        ({"scale": math.nan}, ValueError, r"^scale: expected a finite value"),
        ({"learnable": 1}, TypeError, r"^learnable: "),
    ],
)
@pytest.mark.parametrize("operator", [MeanPooling, Centering])
def test_bad_parameters(operator: type, kwargs: dict, error: type, match: str) -> None:
    """Mean pooling and its matched control, centring, take the same options."""
    with pytest.raises(error, match=match):
        operator(**kwargs)


@pytest.mark.parametrize("operator", [MeanPooling, Centering])
def test_bad_calls(operator: type) -> None:
    q, k, x, _ = _inputs()
    graph = SoftmaxGraph(q, k)
    with pytest.raises(TypeError, match=r"^graph: "):
        operator()(q, x)
    with pytest.raises(ValueError, match=r"^x: "):
        operator()(graph, x[..., :4, :])
    with pytest.raises(TypeError, match=rf"^{operator.name}: unknown parameter"):
        resolve_operator(operator.name, t=1.0)
