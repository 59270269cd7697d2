"""``torch.func`` transforms through every registered graph kind and operator.

Inside a transform the graphs step aside from the library's own autograd Functions
(:func:`heatformer._torch_compat.func_transforming`): a window graph computes as under
``torch.compile``, a top-k graph gathers. The references are independent: autograd's
``backward`` of the same layer, per-sequence ``backward`` for per-sample gradients, central
finite differences for forward mode.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.func import functional_call, grad, jacrev, jvp, vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

import model_helpers as mh
from heatformer import _torch_compat
from heatformer._spec import format_entry
from heatformer.graph_ops import GRAPHS, OPERATORS, resolve_graph
from heatformer.graph_ops.window.kernels import WindowAttention
from heatformer.models.heads import format_operator

#: every registered operator (its first example) on both heads
HEADS = [f"{format_operator(name, cls.examples[0])}:2" for name, cls in OPERATORS.items()]
#: every registered graph kind with each of its examples
KINDS = [
    format_entry(name, params, sep=",") for name, cls in GRAPHS.items() for params in cls.examples
]
N, DIM = 11, 16
#: PyTorch's note, under vmap (and jacrev's), that an op has no batching rule and is looped
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def _layer(spec: str, graph: str, causal: bool):
    return mh.random_layer(spec, graph=graph, causal=causal, embed_dim=DIM, num_heads=2)


def _params(layer) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in layer.named_parameters()}


def _autograd(layer, x: torch.Tensor, weights: torch.Tensor):
    """The gradients of ``<layer(x), weights>`` in the parameters and ``x``, by backward."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    (layer(x) * weights).sum().backward()
    return {name: p.grad for name, p in layer.named_parameters()}, x.grad


@pytest.mark.parametrize("spec", HEADS)
@pytest.mark.parametrize("graph", KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_grad_equals_autograd(spec: str, graph: str, causal: bool) -> None:
    layer = _layer(spec, graph, causal)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    weights = torch.randn(2, N, DIM, dtype=torch.float64)  # a loss that weighs every output

    def loss(p, x):
        return (functional_call(layer, p, (x,)) * weights).sum()

    got_p, got_x = grad(loss, argnums=(0, 1))(_params(layer), x)
    want_p, want_x = _autograd(layer, x, weights)
    torch.testing.assert_close(got_x, want_x, rtol=1e-10, atol=1e-12)
    for name, want in want_p.items():
        torch.testing.assert_close(got_p[name], want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("graph", KINDS)
def test_vjp_and_jacrev_of_the_graph_equal_autograd(graph: str) -> None:
    """The graph on its own: ``vjp`` in ``q``, ``k``, ``v`` of ``P v``, and ``jacrev``, whose
    rows are ``vjp`` with the unit vectors, against backward."""
    builder = resolve_graph(graph)
    q, k, v = (torch.randn(2, 7, 4, dtype=torch.float64) for _ in range(3))

    def propagate(q, k, v):
        return builder.build(q, k, causal=True).propagate(v)

    cot = torch.randn(2, 7, 4, dtype=torch.float64)
    got = vjp(propagate, q, k, v)[1](cot)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = torch.autograd.grad((propagate(*leaves) * cot).sum(), leaves)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    jac = jacrev(propagate, argnums=2)(q, k, v)  # (2, 7, 4, 2, 7, 4)
    torch.testing.assert_close((jac * cot[..., None, None, None]).sum((0, 1, 2)), want[2])


@pytest.mark.parametrize("spec", ["attention:1,heat:1", "laplacian:2", "ppr:2"])
@pytest.mark.parametrize("graph", KINDS)
def test_per_sample_gradients(spec: str, graph: str) -> None:
    """``vmap(grad(loss))`` over the batch gives each sequence its own gradient, as a backward
    per sequence does, on the kinds that declare ``vmaps``; the others are refused."""
    layer = _layer(spec, graph, causal=True)
    x = torch.randn(3, N, DIM, dtype=torch.float64)
    weights = torch.randn(N, DIM, dtype=torch.float64)

    def loss(p, xi):
        return (functional_call(layer, p, (xi.unsqueeze(0),))[0] * weights).sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))
    if not resolve_graph(graph).vmaps:
        with pytest.raises(RuntimeError, match="vmap"):
            per_sample(_params(layer), x)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = per_sample(_params(layer), x)
    # no op without a batching rule (SDPA's CPU kernels, unfold's backward): no per-sample loop
    assert not [str(w.message) for w in caught if "performance drop" in str(w.message)]
    for i in range(x.shape[0]):
        want, _ = _autograd(layer, x[i : i + 1], weights)
        for name, w in want.items():
            torch.testing.assert_close(got[name][i], w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("graph", KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_mode_equals_finite_differences(graph: str, causal: bool) -> None:
    layer = _layer("attention:1,heat:1", graph, causal)
    x, t = (torch.randn(2, N, DIM, dtype=torch.float64) for _ in range(2))
    with sdpa_kernel(SDPBackend.MATH):  # no forward derivative for the fused CPU kernel
        _, tangent = jvp(layer, (x,), (t,))
    eps = 1e-6
    with torch.no_grad():
        fd = (layer(x + eps * t) - layer(x - eps * t)) / (2 * eps)
    torch.testing.assert_close(tangent, fd, rtol=1e-6, atol=1e-7)


def test_the_window_kernels_step_aside_only_inside_a_transform(monkeypatch) -> None:
    """The window graph's recomputing Function runs in a plain backward and not inside
    ``grad`` (where its Python state would meet wrapped tensors); the predicate says which."""
    calls: list[bool] = []
    apply = WindowAttention.apply

    def counted(*args):
        calls.append(_torch_compat.func_transforming())
        return apply(*args)

    monkeypatch.setattr(WindowAttention, "apply", counted)
    layer = _layer("attention:2", "window[w=3]", causal=True)
    x = torch.randn(1, N, DIM, dtype=torch.float64)
    _autograd(layer, x, torch.ones_like(x))
    assert calls == [False]
    seen = []
    grad(lambda x: (seen.append(_torch_compat.func_transforming()), layer(x).sum())[1])(x)
    assert seen == [True] and calls == [False]
    assert not _torch_compat.func_transforming()
