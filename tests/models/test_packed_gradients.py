"""The layer's ``q, k, v`` gradients returned in the projection's layout without a copy
(``heatformer.models._packed``): the same gradients as autograd's own unbind, for every
operator, the graph kinds, causal or not, one or two sequences; the copy is skipped exactly
where the window graph's backward wrote the three parts into one buffer (the contract of
``heatformer.graph_ops.window.packed``)."""

from __future__ import annotations

import pytest
import torch

import model_helpers as mh
from heatformer._spec import format_entry
from heatformer.graph_ops import GRAPHS, OPERATORS
from heatformer.graph_ops.window.packed import projection_gradient
from heatformer.models import _packed, attention
from heatformer.models._packed import unbind_packed
from heatformer.models.heads import format_operator

#: every registered operator (its first example) on all four heads, and beside attention heads
HEADS = [
    spec
    for name, cls in OPERATORS.items()
    for spec in (
        f"{format_operator(name, cls.examples[0])}:4",
        f"attention:2,{format_operator(name, cls.examples[0])}:2",
    )
]
#: every registered graph kind with each of its examples
KINDS = [
    format_entry(name, params, sep=",") for name, cls in GRAPHS.items() for params in cls.examples
]


def _grads(layer, x):
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    (layer(x) * torch.linspace(-1.0, 1.0, x.shape[-1], dtype=x.dtype)).sum().backward()
    return [x.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("spec", HEADS)
@pytest.mark.parametrize("graph", KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_gradients_equal_autograds_unbind(spec, graph, causal, batch, monkeypatch) -> None:
    layer = mh.random_layer(spec, graph=graph, causal=causal)
    x = torch.randn(batch, 11, layer.embed_dim, dtype=torch.float64)
    packed = _grads(layer, x)
    monkeypatch.setattr(attention, "unbind_packed", lambda qkv: qkv.unbind(2))
    plain = _grads(layer, x)
    for got, want in zip(packed, plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("spec", "graph", "batch", "copy_free"),
    [
        ("attention:4", "window[w=3,global=1]", 1, True),  # P v: the three parts in one buffer
        ("attention:4", "window[w=5]", 1, True),
        ("attention:4", "window[w=5]", 2, False),  # heads of two sequences: not one layout
        ("attention:2,laplacian:2", "window[w=5]", 1, False),  # v also read as I v: a sum
        ("heat[t=0.5]:4", "window[w=5]", 1, False),  # later terms propagate other values
        ("attention:4", "softmax", 1, False),  # SDPA's own gradients
    ],
)
def test_copy_skipped_where_the_parts_share_a_buffer(
    spec, graph, batch, copy_free, monkeypatch
) -> None:
    seen: list[bool] = []

    def spy(grads, shape):
        found = projection_gradient(grads, shape)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(_packed, "projection_gradient", spy)
    layer = mh.random_layer(spec, graph=graph, causal=True)
    x = torch.randn(batch, 13, layer.embed_dim, dtype=torch.float64)
    grads = _grads(layer, x)
    assert seen == [copy_free]
    monkeypatch.setattr(attention, "unbind_packed", lambda qkv: qkv.unbind(2))
    for got, want in zip(grads, _grads(layer, x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gradcheck_through_the_copy_free_path() -> None:
    layer = mh.random_layer("attention:2", graph="window[w=2,global=1]", causal=True,
                            embed_dim=4, num_heads=2)  # fmt: skip
    x = torch.randn(1, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    assert torch.autograd.gradgradcheck(layer, (x,))


def test_unbind_packed_is_unbind() -> None:
    qkv = torch.randn(2, 5, 3, 2, 4, requires_grad=True)
    for got, want in zip(unbind_packed(qkv), qkv.unbind(2), strict=True):
        assert torch.equal(got, want)
    weights = torch.randn(3, 2, 5, 2, 4)
    sum(((t * w).sum() for t, w in zip(unbind_packed(qkv), weights, strict=True))).backward()
    torch.testing.assert_close(qkv.grad, weights.permute(1, 2, 0, 3, 4))
    with torch.no_grad():  # no graph: unbind itself
        assert unbind_packed(qkv)[0]._base is qkv


def test_a_buffer_laid_out_otherwise_is_stacked() -> None:
    buf = torch.randn(1, 5, 3, 2, 4)
    shape = buf.shape
    parts = tuple(buf[:, :, i] for i in range(3))
    found = projection_gradient(parts, shape)
    assert found is not None and found.data_ptr() == buf.data_ptr() and torch.equal(found, buf)
    assert projection_gradient((parts[1], parts[0], parts[2]), shape) is None  # order
    assert projection_gradient(tuple(p.clone() for p in parts), shape) is None  # own storage
    other = torch.randn(1, 5, 4, 2, 4)  # a fourth part: the rows are 4 parts apart
    assert projection_gradient(tuple(other[:, :, i] for i in range(3)), shape) is None


def test_torch_func_grad_through_the_unbind() -> None:
    """``torch.func`` transforms differentiate the layer as before (the unbind declares its
    context and vmap rule; wrapped gradients without storage are stacked)."""
    from torch.func import functional_call, grad

    layer = mh.random_layer("attention:2,laplacian:2", graph="softmax", causal=True)
    params = dict(layer.named_parameters())
    x = torch.randn(2, 7, layer.embed_dim, dtype=torch.float64)

    def loss(p):
        return functional_call(layer, p, (x,)).square().sum()

    got = grad(loss)(params)
    layer.zero_grad(set_to_none=True)
    loss(params).backward()
    for name, value in got.items():
        torch.testing.assert_close(value, params[name].grad, rtol=1e-12, atol=1e-12)
