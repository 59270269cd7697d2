"""Diffusion operators against dense numpy references, SDPA and each other."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graph_helpers as gh
from heatformer.graph_ops import (
    OPERATORS,
    Attention,
    Centering,
    DenseGraph,
    Differential,
    HeatKernel,
    Laplacian,
    MeanPooling,
    PersonalizedPageRank,
    Polynomial,
    SymmetrizedGraph,
    UntiedSkip,
    heat_kernel,
    laplacian,
    resolve_operator,
)

# attention graphs (three kinds, with a fully masked row) and general directed weights
SOURCES = ["dense", "softmax", "sparse", "weights-dense", "weights-sparse"]


def build(source: str, seed: int = 0, device: str | torch.device = "cpu"):
    """(graph, x, reference weights)."""
    if source.startswith("weights-"):
        w = gh.random_weights(seed, 6, batch=(2,), symmetric=False, isolated=(3,))
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 6, 3, generator=gen, dtype=torch.float64).to(device)
        return (
            gh.graph_from_weights(w, source.removeprefix("weights-"), torch.float64, device),
            x,
            w,
        )
    case = gh.make_attention(seed, n=6, batch=(2,), masked=True, empty_rows=(2,), device=device)
    return case.graph(source), case.x, case.probs()


@pytest.mark.parametrize("source", SOURCES)
def test_operator_equals_reference(operator_spec, source, device) -> None:
    _, spec = operator_spec
    g, x, w = build(source, device=device)
    y = spec.make().to(device)(g, x)
    assert y.shape == x.shape and y.device.type == device.type
    gh.assert_close_np(y, spec.reference(w, gh.to_numpy(x)), atol=1e-10)


@pytest.mark.parametrize("alpha", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("source", SOURCES)
def test_ppr_equals_dense_solve(source, alpha, normalization) -> None:
    """``alpha (I - (1 - alpha) A)^{-1} x`` with ``A`` from DESIGN.md / GraphLaplacian."""
    g, x, w = build(source, seed=1)
    op = PersonalizedPageRank(alpha=alpha, normalization=normalization, tol=1e-12)
    expected = gh.ppr_reference(w, gh.to_numpy(x), alpha, normalization)
    gh.assert_close_np(op(g, x), expected, atol=1e-10 * float(x.abs().max()))


@pytest.mark.parametrize("tol", [1e-2, 1e-5])
def test_ppr_truncation_within_tol(tol) -> None:
    g, x, w = build("softmax", seed=2)
    y = PersonalizedPageRank(alpha=0.1, tol=tol)(g, x)
    err = np.abs(gh.to_numpy(y) - gh.ppr_reference(w, gh.to_numpy(x), 0.1, "rw")).max()
    assert err <= tol * float(x.abs().max())


@pytest.mark.parametrize(
    "coeffs", [[2.0], [0.0, 1.0], [1.0, -1.0], [0.3, -0.2, 0.5, -0.1, 0.05]], ids=str
)
@pytest.mark.parametrize("source", SOURCES)
def test_polynomial_equals_matrix_powers(source, coeffs, normalization) -> None:
    g, x, w = build(source, seed=3)
    y = Polynomial(torch.tensor(coeffs, dtype=torch.float64), normalization=normalization)(g, x)
    expected = gh.polynomial_reference(w, gh.to_numpy(x), coeffs, normalization)
    gh.assert_close_np(y, expected, atol=1e-11)


@pytest.mark.parametrize(
    "variant", [{}, {"masked": True}, {"causal": True}], ids=["plain", "masked", "causal"]
)
def test_polynomial_one_minus_l_is_attention(graph_kind, variant) -> None:
    """On attention without fully masked rows, ``I - L_rw = P``."""
    case = gh.make_attention(4, n=6, batch=(2, 2), **variant)
    g = case.graph(graph_kind)
    torch.testing.assert_close(Polynomial([1.0, -1.0]).double()(g, case.x), Attention()(g, case.x))


def test_polynomial_zero_one_is_laplacian(graph_kind, normalization) -> None:
    case = gh.make_attention(5, n=6, batch=(2,), masked=True, empty_rows=(0,))
    g = case.graph(graph_kind)
    torch.testing.assert_close(
        Polynomial([0.0, 1.0], normalization=normalization).double()(g, case.x),
        Laplacian(normalization)(g, case.x),
    )


@pytest.mark.parametrize(
    "variant",
    [{}, {"masked": True}, {"causal": True}, {"masked": True, "causal": True}],
    ids=["plain", "masked", "causal", "masked-causal"],
)
def test_attention_equals_sdpa(graph_kind, variant, dtype, device) -> None:
    """SDPA is the golden attention (every row keeps at least one key here)."""
    case = gh.make_attention(6, n=7, batch=(2, 3), dtype=dtype, device=device, **variant)
    mask = case.mask
    if case.causal and mask is not None:  # SDPA takes one or the other
        mask = mask & torch.ones(7, 7, dtype=torch.bool, device=device).tril()
    expected = F.scaled_dot_product_attention(
        case.q, case.k, case.x, attn_mask=mask, is_causal=case.causal and mask is None
    )
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(
        Attention()(case.graph(graph_kind), case.x), expected, atol=atol, rtol=0
    )


def test_laplacian_operator_is_x_minus_sdpa(graph_kind) -> None:
    """The Laplacian head: ``(I - P) V``."""
    case = gh.make_attention(7, n=6, batch=(2, 3), causal=True)
    expected = case.x - F.scaled_dot_product_attention(case.q, case.k, case.x, is_causal=True)
    torch.testing.assert_close(Laplacian()(case.graph(graph_kind), case.x), expected)


@pytest.mark.parametrize("step", [0.5, -2.0])
def test_laplacian_step_scales(graph_kind, normalization, step) -> None:
    case = gh.make_attention(8, n=5, batch=(2,), masked=True)
    g = case.graph(graph_kind)
    y = Laplacian(normalization, step=step).double()(g, case.x)
    torch.testing.assert_close(y, step * laplacian(g, case.x, normalization))


def test_heat_operator_equals_functional(graph_kind, normalization) -> None:
    case = gh.make_attention(9, n=5, batch=(2, 3), masked=True, empty_rows=(4,))
    g = case.graph(graph_kind)
    xn = gh.to_numpy(case.x)
    for t in (0.0, 0.5, 4.0):  # exactly representable in float32
        op = HeatKernel(t=t, normalization=normalization, tol=1e-10)
        y = op(g, case.x)
        torch.testing.assert_close(
            y, heat_kernel(g, case.x, t, normalization=normalization, tol=1e-10)
        )
        # and both are the golden heat kernel, not just each other
        expected = gh.heat_reference(case.probs(), xn, t, normalization)
        gh.assert_close_np(y, expected, atol=1e-9 * np.abs(xn).max())


@pytest.mark.parametrize("kind", ["dense", "softmax", "sparse"])
def test_operator_on_symmetrized_graph(operator_spec, kind) -> None:
    """A ``SymmetrizedGraph`` declares ``symmetric = True``, which lets the Laplacians skip
    the transpose product and take the out-degree as ``W_s``'s degree: every operator on it
    must still equal the reference on ``W_s = (W + W^T) / 2``."""
    _, spec = operator_spec
    case = gh.make_attention(14, n=6, batch=(2,), masked=True, causal=True, empty_rows=(2,))
    g = SymmetrizedGraph(case.graph(kind))
    assert g.symmetric
    p = case.probs()
    ws = 0.5 * (p + np.swapaxes(p, -1, -2))
    y = spec.make()(g, case.x)
    gh.assert_close_np(y, spec.reference(ws, gh.to_numpy(case.x)), atol=1e-10)


def test_operator_is_permutation_equivariant(operator_spec, graph_kind) -> None:
    """Every operator on every kind, one fixed relabelling (hypothesis draws more in
    test_properties.py)."""
    _, spec = operator_spec
    case = gh.make_attention(13, n=6, batch=(2,), masked=True, empty_rows=(1,))
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    gh.assert_permutation_equivariant(spec.make(), case, graph_kind, perm)


# ---- fully masked rows -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dense", "softmax", "sparse", "topk"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fully_masked_rows(operator_spec, kind, causal) -> None:
    """Zero attention output, zero Laplacian row, and finite values and gradients everywhere."""
    name, spec = operator_spec
    case = gh.make_attention(10, n=6, batch=(2,), masked=True, causal=causal, empty_rows=(0, 3))
    q = case.q.clone().requires_grad_()
    k = case.k.clone().requires_grad_()
    x = case.x.clone().requires_grad_()
    g = gh.differentiable_attention_graph(kind, q, k, mask=case.mask, causal=causal)
    y = spec.make()(g, x)
    assert bool(torch.isfinite(y).all())
    # a node without out-edges has a zero row; under "sym" it still has in-edges (W_s row)
    if name == "attention" or (name.startswith("laplacian-") and name != "laplacian-sym"):
        assert not y[:, [0, 3]].any(), "a node without out-edges has a zero row"
    if name.startswith("heat-") and not name.startswith("heat-sym"):
        torch.testing.assert_close(y[:, [0, 3]], x[:, [0, 3]])  # exp(0) on a zero row
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    for name_, grad in (("q", q.grad), ("k", k.grad), ("x", x.grad)):
        assert grad is not None and bool(torch.isfinite(grad).all()), name_
    if kind in ("softmax", "dense", "sparse"):
        w = case.probs()
        gh.assert_close_np(y, spec.reference(w, gh.to_numpy(case.x)), atol=1e-10)


# ---- frequency response ------------------------------------------------------------------------


FREQUENCY_OPERATORS = {
    "attention": lambda nz: Attention(),
    "laplacian": lambda nz: Laplacian(nz, step=0.7),
    "heat": lambda nz: HeatKernel(t=0.8, normalization=nz, tol=1e-12),
    "heat-per-head": lambda nz: HeatKernel(t=[0.25, 2.0], normalization=nz, tol=1e-12),
    "ppr": lambda nz: PersonalizedPageRank(alpha=0.3, normalization=nz, tol=1e-12),
    "polynomial": lambda nz: Polynomial([0.5, -1.0, 0.3], normalization=nz),
    "polynomial-ppr": lambda nz: Polynomial(init="ppr", alpha=0.3, order=6, normalization=nz),
}


@pytest.mark.parametrize("nz", ["sym", "rw"])
@pytest.mark.parametrize("op_name", sorted(FREQUENCY_OPERATORS))
def test_frequency_response_on_eigenvectors(op_name, nz) -> None:
    """``op(u) = response(lam) u`` for the eigenvectors ``u`` of a symmetric graph's ``L_sym``.

    For ``"rw"`` the eigenvectors are ``D^{-1/2} u`` (``L_rw = D^{-1/2} L_sym D^{1/2}``), with
    the same eigenvalues; ``Attention`` is always the rw operator.
    """
    if op_name == "attention" and nz == "sym":
        pytest.skip("Attention has no normalization option")
    w = gh.random_weights(11, 6, batch=(2,), isolated=())  # symmetric, self-loops, connected
    lam, u = np.linalg.eigh(np.stack([gh.laplacian_reference(wg, "sym") for wg in w]))
    vecs = u if nz == "sym" else u / np.sqrt(w.sum(-1))[..., None]
    g = DenseGraph(torch.as_tensor(w))
    op = FREQUENCY_OPERATORS[op_name](nz).double()
    y = op(g, torch.as_tensor(vecs))
    response = op.frequency_response(torch.as_tensor(lam))  # (2, N) or (H=2, 2, N) per head
    if op_name == "heat-per-head":
        response = response.diagonal(dim1=0, dim2=1).T  # head h acts on graph h of the batch
    gh.assert_close_np(y, vecs * response.numpy()[..., None, :], atol=1e-10)


def test_frequency_response_combinatorial_ppr() -> None:
    w = gh.random_weights(12, 5, isolated=())
    lam, u = np.linalg.eigh(gh.laplacian_reference(w, "combinatorial"))
    op = PersonalizedPageRank(alpha=0.3, normalization="combinatorial", tol=1e-12)
    y = op(DenseGraph(torch.as_tensor(w)), torch.as_tensor(u))
    dmax = float(w.sum(-1).max())
    response = op.frequency_response(torch.as_tensor(lam), scale=dmax).numpy()
    gh.assert_close_np(y, u * response[None, :], atol=1e-8)


@pytest.mark.parametrize("op_name", ["heat", "polynomial", "laplacian"])
def test_frequency_response_combinatorial(op_name) -> None:
    w = gh.random_weights(12, 5, isolated=())
    lam, u = np.linalg.eigh(gh.laplacian_reference(w, "combinatorial"))
    op = FREQUENCY_OPERATORS[op_name]("combinatorial").double()
    y = op(DenseGraph(torch.as_tensor(w)), torch.as_tensor(u))
    gh.assert_close_np(y, u * op.frequency_response(torch.as_tensor(lam)).numpy(), atol=1e-10)


# ---- registry, parameters ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kwargs", "cls"),
    [
        ("attention", {}, Attention),
        ("Laplacian", {"normalization": "sym"}, Laplacian),
        ("heat", {"t": 2.0}, HeatKernel),
        (" HEAT ", {}, HeatKernel),
        ("ppr", {"alpha": 0.3}, PersonalizedPageRank),
        ("pagerank", {}, PersonalizedPageRank),
        ("personalized_pagerank", {}, PersonalizedPageRank),
        ("polynomial", {"coeffs": [1.0, 2.0]}, Polynomial),
        ("poly", {}, Polynomial),
    ],
)
def test_resolve_operator(name, kwargs, cls) -> None:
    op = resolve_operator(name, **kwargs)
    assert type(op) is cls
    direct = cls(**kwargs)
    g, x, _ = build("softmax")
    torch.testing.assert_close(op(g, x), direct(g, x))
    assert resolve_operator(op) is op


def test_registry_lists_every_operator() -> None:
    assert OPERATORS == {
        "attention": Attention,
        "laplacian": Laplacian,
        "heat": HeatKernel,
        "ppr": PersonalizedPageRank,
        "polynomial": Polynomial,
        "mean": MeanPooling,
        "center": Centering,
        "skip": UntiedSkip,
        "diff": Differential,
    }
    for name, cls in OPERATORS.items():
        assert cls.name == name


def test_learnable_parameters() -> None:
    assert [n for n, _ in Laplacian(learnable=True).named_parameters()] == ["step"]
    assert [n for n, _ in Laplacian().named_parameters()] == []
    heat = HeatKernel(t=[0.5, 2.0], learnable=True)
    assert [n for n, _ in heat.named_parameters()] == ["log_t"]
    torch.testing.assert_close(heat.t, torch.tensor([0.5, 2.0]))
    assert [n for n, _ in Polynomial([1.0, 2.0], learnable=True).named_parameters()] == ["coeffs"]
    assert list(HeatKernel(t=1.0).parameters()) == []
    assert list(PersonalizedPageRank().parameters()) == []


def test_ppr_order_from_tol() -> None:
    """The smallest ``K`` with ``(1 - alpha)^{K+1} <= tol``."""
    for alpha in (0.05, 0.15, 0.5, 0.9):
        for tol in (1e-2, 1e-6, 1e-12):
            k = PersonalizedPageRank(alpha=alpha, tol=tol).order
            assert (1 - alpha) ** (k + 1) <= tol * (1 + 1e-12)
            assert k == 0 or (1 - alpha) ** k > tol


def test_extra_repr() -> None:
    assert "normalization='sym'" in repr(Laplacian("sym"))
    assert "t=[0.5, 2.0]" in repr(HeatKernel(t=[0.5, 2.0]))
    assert "alpha=0.3" in repr(PersonalizedPageRank(alpha=0.3))
    assert "coeffs=[1.0, -1.0]" in repr(Polynomial())


# ---- constants checked in the dtype they are used in (issue 21) ---------------------------


def _graph_and_signal(dtype: torch.dtype) -> tuple[DenseGraph, torch.Tensor]:
    w = torch.rand(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = torch.randn(4, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return DenseGraph(w.to(dtype)), x.to(dtype)


@pytest.mark.parametrize(
    ("make", "dtype", "used_in", "argument"),
    [
        (lambda: Polynomial([1e39]), torch.float32, torch.float32, "coeffs"),  # was inf
        (lambda: Polynomial([0.5, 1e39]), torch.float16, torch.float32, "coeffs"),  # Horner
        (lambda: Laplacian(step=7e4), torch.float16, torch.float16, "step"),  # y * step
        (lambda: MeanPooling(scale=1e39), torch.float32, torch.float32, "scale"),
    ],
    ids=["poly-float32", "poly-half", "laplacian-step-float16", "mean-scale-float32"],
)
def test_fixed_constants_are_checked_where_they_are_used(make, dtype, used_in, argument) -> None:
    """A fixed constant is kept in float64 and refused on first use in a dtype that cannot
    hold it (it was an inf output), naming the dtype it is used in (a polynomial of half
    signals sums in float32); the same operator still computes in float64."""
    op = make()
    with pytest.raises(ValueError, match=rf"^{argument}: \[.*\] overflows {used_in}"):
        op(*_graph_and_signal(dtype))
    g64, x64 = _graph_and_signal(torch.float64)
    y = op(g64, x64)
    assert bool(y.isfinite().all()) and float(y.abs().max()) > 1e4


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: Polynomial([1.0, 1e39], learnable=True), "coeffs"),
        (lambda: Polynomial([1e39], dtype=torch.float32), "coeffs"),
        (lambda: Laplacian(step=1e39, learnable=True), "step"),
        (lambda: MeanPooling(scale=7e4, dtype=torch.float16), "scale"),
    ],
    ids=["poly-learnable", "poly-dtype", "laplacian-learnable", "mean-dtype-float16"],
)
def test_constants_are_checked_at_construction_when_the_dtype_is_known(make, argument) -> None:
    """A learnable constant is rounded to the factory dtype at once (it was an inf parameter);
    a ``dtype=`` names the dtype of use."""
    with pytest.raises(ValueError, match=rf"^{argument}: \[.*\] overflows torch\.float"):
        make()


def test_to_refuses_a_constant_its_dtype_cannot_hold_and_converts_nothing() -> None:
    """``.half()`` of a heat head with ``t = 1e5`` made the buffer inf (the layer then failed
    with ``t: expected a finite value``); now refused before any tensor is converted, while a
    time float16 holds converts and still computes."""
    from heatformer.models import DiffusionAttention

    op = HeatKernel(t=[1e5, 1.0])
    with pytest.raises(ValueError, match=r"^t: \[100000\.0, 1\.0\] overflows torch\.float16"):
        op.half()
    assert op.t.dtype == torch.float64 and float(op.t[0]) == 1e5
    layer = DiffusionAttention(8, 2, "attention:1,polynomial[coeffs=(1 100000)]:1")
    with pytest.raises(ValueError, match=r"^coeffs: "):
        layer.half()
    small = HeatKernel(t=2.0).half()
    g, x = _graph_and_signal(torch.float16)
    assert small.t.dtype == torch.float16 and bool(small(g, x).isfinite().all())
