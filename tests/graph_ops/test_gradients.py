"""``torch.autograd.gradcheck`` in float64: every operator x graph kind, and the operators'
own parameters (diffusion time, polynomial coefficients, Laplacian step).

Graph weights enter through smooth parametrizations with a fixed sparsity pattern
(``W = exp(theta) * pattern``), so finite differences never switch an edge or a node's
degree on or off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call

import graph_helpers as gh
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    SoftmaxGraph,
    SparseGraph,
    heat_kernel,
)

NORMALIZATIONS = ("rw", "sym", "combinatorial")
N = 5
GRAPH_VARIANTS = ["dense", "softmax", "softmax-masked", "softmax-causal", "sparse"]

# cheaper settings than the reference tests (gradcheck evaluates each one many times)
GRAD_OPERATORS = {
    "attention": lambda: Attention(),
    **{f"laplacian-{nz}": lambda nz=nz: Laplacian(nz) for nz in NORMALIZATIONS},
    **{
        f"heat-{nz}-{method}": lambda nz=nz, method=method: HeatKernel(
            t=0.8, normalization=nz, method=method, tol=1e-8
        )
        for nz in NORMALIZATIONS
        for method in ("series", "exact")
    },
    **{
        f"ppr-{nz}": lambda nz=nz: PersonalizedPageRank(alpha=0.5, normalization=nz, tol=1e-8)
        for nz in NORMALIZATIONS
    },
    **{
        f"polynomial-{nz}": lambda nz=nz: Polynomial([0.5, -1.0, 0.25], normalization=nz)
        for nz in NORMALIZATIONS
    },
}


def _pattern() -> torch.Tensor:
    """A directed pattern on N nodes with self-loops; node 1 has no out-edges but in-edges."""
    gen = torch.Generator().manual_seed(0)
    pattern = (torch.rand(N, N, generator=gen) < 0.6) | torch.eye(N, dtype=torch.bool)
    pattern[1, :] = False
    pattern[[0, 2, 4], 1] = True
    return pattern


def graph_function(variant: str, pattern: torch.Tensor | None = None):
    """``(inputs, make_graph)``: leaf tensors to check and a function building the graph."""
    gen = torch.Generator().manual_seed(1)
    pattern = _pattern() if pattern is None else pattern
    if variant == "dense":
        theta = torch.randn(N, N, generator=gen, dtype=torch.float64) * 0.5
        return (theta,), lambda theta: DenseGraph(theta.exp() * pattern)
    if variant == "sparse":
        row, col = pattern.nonzero(as_tuple=True)
        theta = torch.randn(row.numel(), generator=gen, dtype=torch.float64) * 0.5
        return (theta,), lambda theta: SparseGraph(row, col, theta.exp(), num_nodes=N)
    q = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    k = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    mask = None if variant == "softmax" else pattern  # row 1 fully masked
    causal = variant == "softmax-causal"
    return (q, k), lambda q, k: SoftmaxGraph(q, k, mask=mask, causal=causal)


def _leaves(tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def _operator_cases():
    for name in GRAD_OPERATORS:
        for variant in GRAPH_VARIANTS:
            yield pytest.param(name, variant, id=f"{name}-{variant}")


@pytest.mark.parametrize(("name", "variant"), list(_operator_cases()))
def test_gradcheck_operator(name, variant) -> None:
    """Every operator x graph kind, w.r.t. the graph's tensors and the signal."""
    op = GRAD_OPERATORS[name]().double()
    graph_inputs, make_graph = graph_function(variant)
    x = torch.randn(N, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    n_graph = len(graph_inputs)

    def f(*inputs):
        return op(make_graph(*inputs[:n_graph]), inputs[n_graph])

    assert torch.autograd.gradcheck(f, _leaves((*graph_inputs, x)), fast_mode=True)


def _padding_cases():
    for name in GRAD_OPERATORS:
        for variant in ("dense", "softmax-masked", "sparse"):
            yield pytest.param(name, variant, id=f"{name}-{variant}")


def _isolated_response(name: str) -> float:
    """What ``GRAD_OPERATORS[name]`` does to a node with no edges at all: attention and the
    Laplacians give 0, the heat kernel ``exp(0) = 1``, PPR ``alpha`` (``A``'s row is 0;
    for "combinatorial" ``A = I - L/c`` has a unit diagonal there, so it sums the whole series:
    ``1`` up to its tolerance), the polynomial ``c_0``."""
    if name == "attention" or name.startswith("laplacian-"):
        return 0.0
    if name.startswith("heat-") or name == "ppr-combinatorial":
        return 1.0
    if name.startswith("ppr-"):
        return 0.5
    assert name.startswith("polynomial-"), name
    return 0.5


@pytest.mark.parametrize(("name", "variant"), list(_padding_cases()))
def test_padding_token_has_finite_gradients(name, variant) -> None:
    """A node of degree 0 (padding: masked as a query *and* as a key; or an isolated node):
    forward and backward stay finite, and the node's output is what the operator does to a
    node without edges."""
    pattern = _pattern()
    pattern[3, :] = False
    pattern[:, 3] = False
    graph_inputs, make_graph = graph_function(variant, pattern)
    x = torch.randn(N, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    leaves = _leaves((*graph_inputs, x))
    y = GRAD_OPERATORS[name]().double()(make_graph(*leaves[:-1]), leaves[-1])
    assert bool(torch.isfinite(y).all())
    # the isolated node's row of every Laplacian is 0, so its output is response(0) * x[3]
    torch.testing.assert_close(y[3], _isolated_response(name) * x[3], atol=1e-7, rtol=0)
    y.square().sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


@pytest.mark.parametrize("method", ["series", "exact"])
@pytest.mark.parametrize("variant", ["dense", "softmax-masked", "sparse"])
def test_gradcheck_time_per_head(variant, method, normalization) -> None:
    """Gradient w.r.t. a tensor ``t`` of one time per head, through the functional form."""
    case = gh.make_attention(3, n=4, batch=(2, 3), masked=True, empty_rows=(1,))
    if variant == "softmax-masked":
        g = case.graph("softmax")
    else:
        w = torch.as_tensor(case.probs()) + 0.2 * torch.eye(4, dtype=torch.float64)
        g = DenseGraph(w) if variant == "dense" else DenseGraph(w).to_sparse()
    t = torch.tensor([0.3, 1.0, 2.5], dtype=torch.float64, requires_grad=True)

    def f(t):
        return heat_kernel(g, case.x, t, normalization=normalization, method=method, tol=1e-12)

    assert torch.autograd.gradcheck(f, (t,))


@pytest.mark.parametrize("t", [0.4, [0.5, 2.0]], ids=["scalar", "per-head"])
@pytest.mark.parametrize("normalization", ["rw", "sym"])
def test_gradcheck_learnable_time(t, normalization) -> None:
    """``HeatKernel(learnable=True)``: gradients reach ``log_t`` (and q, k, x)."""
    op = HeatKernel(t=t, normalization=normalization, tol=1e-12, learnable=True).double()
    case = gh.make_attention(4, n=4, batch=(2,), masked=True, empty_rows=(0,))

    def f(log_t, q, k, x):
        g = SoftmaxGraph(q, k, mask=case.mask)
        return functional_call(op, {"log_t": log_t}, (g, x))

    assert torch.autograd.gradcheck(f, _leaves((op.log_t, case.q, case.k, case.x)), fast_mode=True)


def test_learnable_time_gradient_is_minus_l_heat() -> None:
    """``d/dt exp(-tL) x = -L exp(-tL) x``; chain rule through ``t = exp(log_t)``."""
    case = gh.make_attention(5, n=5)
    g = case.graph("softmax")
    op = HeatKernel(t=0.75, tol=1e-12, learnable=True).double()
    y = op(g, case.x)
    weight = torch.randn_like(y)
    (grad,) = torch.autograd.grad((y * weight).sum(), op.log_t)
    lap = torch.eye(5, dtype=torch.float64) - torch.as_tensor(case.probs())
    dy_dt = -lap @ y.detach()
    torch.testing.assert_close(grad, (dy_dt * weight).sum() * op.t.detach())


@pytest.mark.parametrize("normalization", ["rw", "sym", "combinatorial"])
def test_gradcheck_polynomial_coeffs(normalization) -> None:
    op = Polynomial([0.5, -1.0, 0.25], normalization=normalization, learnable=True).double()
    case = gh.make_attention(6, n=4, batch=(2,), masked=True, causal=True)

    def f(coeffs, q, k, x):
        return functional_call(
            op, {"coeffs": coeffs}, (SoftmaxGraph(q, k, mask=case.mask, causal=True), x)
        )

    assert torch.autograd.gradcheck(f, _leaves((op.coeffs, case.q, case.k, case.x)))


def test_polynomial_coeff_gradient_is_power_of_l() -> None:
    """``d/dc_k sum_j c_j L^j x = L^k x``."""
    op = Polynomial([0.5, -1.0, 0.25], normalization="sym", learnable=True).double()
    w = gh.random_weights(2, 5, isolated=(1,))
    g = DenseGraph(torch.as_tensor(w))
    x = torch.randn(5, 1, dtype=torch.float64)
    y = op(g, x)
    grads = torch.autograd.grad(y.sum(), op.coeffs)[0]
    lap = gh.laplacian_reference(w, "sym")
    xs = x.numpy()
    expected = [(np.linalg.matrix_power(lap, k) @ xs).sum() for k in range(3)]
    gh.assert_close_np(grads, np.array(expected), atol=1e-12)


@pytest.mark.parametrize("normalization", ["rw", "sym", "combinatorial"])
def test_gradcheck_laplacian_step(normalization) -> None:
    op = Laplacian(normalization, step=0.7, learnable=True).double()
    case = gh.make_attention(7, n=4, batch=(2,))

    def f(step, q, k, x):
        return functional_call(op, {"step": step}, (SoftmaxGraph(q, k), x))

    assert torch.autograd.gradcheck(f, _leaves((op.step, case.q, case.k, case.x)))


@pytest.mark.parametrize("kind", ["softmax", "sparse"])
def test_gradcheck_propagate_transpose_and_degrees(kind) -> None:
    """The transposed product and the in-degree (used by ``"sym"``) are differentiable."""
    inputs, make_graph = graph_function("softmax-masked" if kind == "softmax" else "sparse")
    x = torch.randn(N, 2, dtype=torch.float64)

    def f(*args):
        g = make_graph(*args[:-1])
        return g.propagate_transpose(args[-1]), g.in_degree(), g.out_degree()

    assert torch.autograd.gradcheck(f, _leaves((*inputs, x)))


# ---- second derivatives: double backward through every graph kind ---------------------------

DOUBLE_BACKWARD_KINDS = ["softmax", "topk[k=3]", "window[w=2]", "window[w=2,global=1]"]


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kind", DOUBLE_BACKWARD_KINDS)
def test_gradgradcheck_every_graph_kind(kind: str, causal: bool, masked: bool) -> None:
    """``gradgradcheck`` of a Laplacian head in ``q``, ``k`` and ``x``, values as wide as keys.

    The window kinds run their fused CPU kernels in the forward pass, and their backward
    recomputes with plain products when ``create_graph`` is set (it raised an in-place error
    before). The dense kinds call SDPA, whose fused CPU kernel has no second derivative in
    torch: they run under its math backend, as the docs say to (docs/concepts/graph-kinds.md).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from heatformer.graph_ops import resolve_graph

    gen = torch.Generator().manual_seed(3)
    q, k, x = (
        torch.randn(1, 1, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    key_mask = torch.tensor([[False, True, True, True, True, True]]) if masked else None
    builder = resolve_graph(kind)

    def f(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return Laplacian()(builder.build(q, k, key_mask=key_mask, causal=causal), x)

    if builder.name == "window":
        assert torch.autograd.gradgradcheck(f, (q, k, x), fast_mode=True)
    else:
        with sdpa_kernel(SDPBackend.MATH):
            assert torch.autograd.gradgradcheck(f, (q, k, x), fast_mode=True)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kind", ["window[w=2]", "window[w=2,global=1]"])
def test_gradgradcheck_heat_series_on_window_graphs(kind: str, causal: bool) -> None:
    """A heat series propagates one window graph many times, each product summing its ``q``,
    ``k`` gradients into the graph's one buffer (``GradSink``): also differentiable."""
    from heatformer.graph_ops import resolve_graph

    gen = torch.Generator().manual_seed(4)
    q, k, x = (
        torch.randn(1, 1, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    key_mask = torch.tensor([[True, True, False, True, True, True]])
    builder, op = resolve_graph(kind), HeatKernel(t=0.5, tol=1e-8)

    def f(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return op(builder.build(q, k, key_mask=key_mask, causal=causal), x)

    assert torch.autograd.gradgradcheck(f, (q, k, x), fast_mode=True)
