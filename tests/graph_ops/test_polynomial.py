"""Polynomial filters in the adjacency basis and started at personalized PageRank (GPR-GNN's
start): the coefficients, the truncated PageRank series, learning, the response, bad options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graph_helpers as gh
from heatformer.checks import ArgumentError
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    PersonalizedPageRank,
    Polynomial,
    resolve_operator,
)
from heatformer.graph_ops.operators.polynomial import ppr_coefficients
from heatformer.models import GPT, GPTConfig
from heatformer.models.files import load_model, save_model
from references import adjacency_reference

F64 = torch.float64
SPEC = "polynomial[init=ppr,alpha=0.2,order=8,learnable=true]"


def test_the_issue_spec_starts_at_alpha_one_minus_alpha_to_the_k() -> None:
    op = resolve_operator(SPEC)
    assert isinstance(op, Polynomial) and op.basis == "adjacency" and op.learnable
    expected = [0.2 * 0.8**k for k in range(9)]
    assert op.coeffs.detach().double().tolist() == pytest.approx(expected, rel=1e-7)
    assert [n for n, _ in op.named_parameters()] == ["coeffs"]
    default = Polynomial(init="ppr")  # GPR-GNN's defaults: alpha = 0.1, K = 10
    assert (default.alpha, default.order, default.coeffs.numel()) == (0.1, 10, 11)
    assert ppr_coefficients(0.5, 3) == [0.5, 0.25, 0.125, 0.0625]


@pytest.mark.parametrize("normalization", ["rw", "sym", "combinatorial"])
def test_ppr_start_is_the_truncated_pagerank_series(normalization: str) -> None:
    """``sum_k alpha (1 - alpha)^k A^k x`` with ``A`` the normalized adjacency (numpy), a node
    without edges included; within ``(1 - alpha)^(K + 1)`` of PageRank itself."""
    w = gh.random_weights(3, 9, batch=(2,), isolated=(4,))  # symmetric, an isolated node
    x = np.random.default_rng(0).standard_normal((2, 9, 3))
    op = Polynomial(init="ppr", alpha=0.3, order=12, normalization=normalization)
    y = op(DenseGraph(torch.as_tensor(w)), torch.as_tensor(x))
    a = np.stack([adjacency_reference(wg, normalization) for wg in w])
    expected = sum(0.3 * 0.7**k * np.linalg.matrix_power(a, k) @ x for k in range(13))
    gh.assert_close_np(y, expected, atol=1e-12)
    ppr = PersonalizedPageRank(alpha=0.3, normalization=normalization, tol=1e-14)
    tail = 0.7**13 * float(np.abs(x).max()) * 2
    gh.assert_close_np(y, ppr(DenseGraph(torch.as_tensor(w)), torch.as_tensor(x)), atol=tail)


def test_the_adjacency_basis_holds_attention() -> None:
    g = DenseGraph(torch.rand(2, 7, 7, dtype=F64, generator=torch.Generator().manual_seed(2)))
    x = torch.randn(2, 7, 4, dtype=F64)
    torch.testing.assert_close(Polynomial([0.0, 1.0], basis="adjacency")(g, x), Attention()(g, x))


def test_learned_coefficients_get_gradients_and_load_as_saved(tmp_path) -> None:
    config = GPTConfig(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=8,
                       heads=f"attention:1,{SPEC}:1")  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config)
    ids = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(1))
    model(ids).square().mean().backward()
    ops = [block.attn.head_operators[1] for block in model.blocks]
    assert all(isinstance(op, Polynomial) and op.coeffs.grad is not None for op in ops)
    assert all(bool(op.coeffs.grad.any()) for op in ops)
    with torch.no_grad():
        ops[1].coeffs.mul_(-1.0)  # a "learned" filter
    save_model(model, tmp_path / "model")
    loaded = load_model(tmp_path / "model")
    coeffs = [block.attn.head_operators[1].coeffs for block in loaded.blocks]
    assert all(torch.equal(c, op.coeffs) for c, op in zip(coeffs, ops, strict=True))


@pytest.mark.parametrize("normalization", ["sym", "combinatorial"])
def test_adjacency_response_on_eigenvectors(normalization: str) -> None:
    """``op(u) = sum_k c_k (1 - lam / c)^k u`` for the eigenvectors of a symmetric graph's
    Laplacian (``c`` the largest out-degree for the combinatorial one, else 1)."""
    w = gh.random_weights(10, 6, isolated=())
    lap = gh.laplacian_reference(w, normalization)
    lam, u = np.linalg.eigh(lap)
    op = Polynomial([0.3, -0.5, 0.2, 0.1], basis="adjacency", normalization=normalization)
    scale = float(w.sum(-1).max()) if normalization == "combinatorial" else 1.0
    response = op.frequency_response(torch.as_tensor(lam), scale=scale).numpy()
    gh.assert_close_np(
        op(DenseGraph(torch.as_tensor(w)), torch.as_tensor(u)), u * response, atol=1e-10
    )


@pytest.mark.parametrize(
    ("kwargs", "argument", "error"),
    [
        ({"init": "ppr", "coeffs": [1.0]}, "coeffs", ValueError),
        ({"alpha": 0.2}, "alpha", ValueError),
        ({"order": 3}, "order", ValueError),
        ({"init": "ppr", "alpha": 1.0}, "alpha", ValueError),
        ({"init": "ppr", "order": -1}, "order", ValueError),
        ({"init": "ppr", "order": 2.5}, "order", TypeError),
        ({"init": "heat"}, "init", ValueError),
        ({"init": "ppr", "basis": "laplacian"}, "basis", ValueError),
        ({"basis": "chebyshev"}, "basis", ValueError),
    ],
)
def test_bad_options_name_the_argument(kwargs: dict, argument: str, error: type) -> None:
    with pytest.raises(error) as info:
        Polynomial(**kwargs)
    assert isinstance(info.value, ArgumentError) and info.value.argument == argument


def test_repr_shows_the_start() -> None:
    assert repr(Polynomial(init="ppr", alpha=0.5, order=2)) == (
        "Polynomial(coeffs=[0.5, 0.25, 0.125], normalization='rw', basis='adjacency', "
        "init='ppr', alpha=0.5, order=2)"
    )
    assert repr(Polynomial()) == "Polynomial(coeffs=[1.0, -1.0], normalization='rw')"


def test_gains_and_passband_read_the_ends_of_the_spectrum() -> None:
    """``h(0) = sum c_k`` and ``h(2) = sum (-1)^k c_k`` in the adjacency basis (equal to the
    response on a graph's constant vector and on an eigenvector of eigenvalue -1 of ``A``); a
    PageRank start is low-pass, alternating signs make it high-pass."""
    op = Polynomial(init="ppr", alpha=0.2, order=8, learnable=True)
    c = [0.2 * 0.8**k for k in range(9)]
    low, high = op.gains()
    assert low == pytest.approx(sum(c)) and high == pytest.approx(
        sum((-1) ** k * v for k, v in enumerate(c))
    )
    assert op.passband == "low-pass"
    with torch.no_grad():
        op.coeffs.mul_(torch.tensor([(-1.0) ** k for k in range(9)]))
    assert op.passband == "high-pass"
    w = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64)  # A's eigenvalues 1 and -1
    u = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=F64)  # their eigenvectors
    y = op.double()(DenseGraph(w), u)
    torch.testing.assert_close(y, u * torch.tensor(op.gains(), dtype=F64))
