"""Tests for heatformer.analysis.filters: the polynomial filters of a model's heads, their
response and band, against a hand computation with numpy on a fine grid."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from heatformer.analysis import PASSBANDS, filter_response, polynomial_filters
from heatformer.checks import ArgumentError
from heatformer.graph_ops import Attention, Polynomial
from heatformer.graph_ops.operators.polynomial import ppr_coefficients
from heatformer.models import GPT, DiffusionAttention, GPTConfig

#: the edges of the thirds of [0, 2] (3000 intervals each for Simpson's rule)
_EDGES = (0.0, 2.0 / 3.0, 4.0 / 3.0, 2.0)


def _by_hand(coefficients: list[float], basis: str) -> tuple[list[float], list[float], str]:
    """``(g(0), g(1), g(2))``, the energy shares of the thirds and the label, from ``g``
    evaluated term by term on a fine grid and integrated with Simpson's rule."""
    c = np.asarray(coefficients, dtype=np.float64)

    def g(lam: np.ndarray) -> np.ndarray:
        z = 1.0 - lam if basis == "adjacency" else lam
        return sum(ck * z**k for k, ck in enumerate(c))

    energies = []
    for low, high in itertools.pairwise(_EDGES):
        lam = np.linspace(low, high, 3001)
        weights = np.ones_like(lam)
        weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
        energies.append(float((weights * g(lam) ** 2).sum() * (lam[1] - lam[0]) / 3.0))
    shares = [e / sum(energies) for e in energies]
    label = PASSBANDS[int(np.argmax(shares))]
    return [float(g(np.array(x))) for x in (0.0, 1.0, 2.0)], shares, label


@pytest.mark.parametrize("basis", ["adjacency", "laplacian"])
@pytest.mark.parametrize("seed", range(6))
def test_filter_response_matches_a_hand_computation(basis: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    coefficients = rng.normal(size=int(rng.integers(1, 9))).tolist()
    response = filter_response(coefficients, basis)
    gains, shares, label = _by_hand(coefficients, basis)
    assert response.gains == pytest.approx(gains, rel=1e-12, abs=1e-12)
    assert response.energy == pytest.approx(shares, rel=1e-9, abs=1e-12)
    assert sum(response.energy) == pytest.approx(1.0, rel=1e-12)
    assert response.label == label


def test_labels_of_known_filters() -> None:
    ppr = filter_response(ppr_coefficients(0.2, 8))  # all positive: low-pass
    assert ppr.label == "low-pass" and ppr.gains[0] == pytest.approx(1 - 0.8**9)
    assert ppr.gains[1] == pytest.approx(0.2)  # g(1) = gamma_0
    alternating = [(-1) ** k * c for k, c in enumerate(ppr_coefficients(0.2, 8))]
    assert filter_response(alternating).label == "high-pass"  # g(lam) = ppr's g(2 - lam)
    assert filter_response([0.0, 1.0], "laplacian").energy == pytest.approx(
        [1 / 27, 7 / 27, 19 / 27]  # int lam^2 on the thirds, over 8/3
    )
    assert filter_response([1.0, 0.0, -1.0]).label == "band"  # 1 - (1 - lam)^2, peak at 1
    assert filter_response([0.0, 1.0]).label == "low-pass"  # P: 1 - lam, a tie goes low
    zero = filter_response(torch.zeros(3))
    assert (zero.label, zero.energy) == ("none", (0.0, 0.0, 0.0))


def test_the_response_is_the_operators_frequency_response() -> None:
    lam = torch.linspace(0, 2, 9, dtype=torch.float64)
    for op in (Polynomial(init="ppr", alpha=0.3, order=5), Polynomial([0.5, -1.0, 0.25])):
        coeffs, basis = op.polynomial_coefficients()
        c = coeffs.double().numpy()
        z = 1.0 - lam.numpy() if basis == "adjacency" else lam.numpy()
        expected = op.frequency_response(lam).numpy()
        assert np.polynomial.polynomial.polyval(z, c) == pytest.approx(expected, rel=1e-12)
        gains = filter_response(coeffs, basis).gains
        assert gains == pytest.approx(expected[[0, 4, 8]].tolist(), rel=1e-12)
    assert Attention().polynomial_coefficients() is None  # a polynomial, without coefficients


def test_polynomial_filters_reads_the_coefficients_set_in_every_layer() -> None:
    heads = (
        "polynomial[init=ppr,alpha=0.2,order=3,learnable=true]:2,attention:1;"
        "attention:3;"
        "attention:1,polynomial[init=ppr,alpha=0.5,order=2,learnable=true]:1,laplacian:1"
    )
    config = GPTConfig(vocab_size=8, block_size=4, n_layer=3, n_head=3, n_embd=12, heads=heads)
    gpt = GPT(config)
    first = [0.5, -0.4, 0.3, -0.2]  # alternating: high-pass
    last = [1.0, 0.0, -1.0]  # 1 - (1 - lam)^2: band
    with torch.no_grad():
        gpt.blocks[0].attn.head_operators[0].coeffs.copy_(torch.tensor(first))
        gpt.blocks[2].attn.head_operators[1].coeffs.copy_(torch.tensor(last))
    filters = polynomial_filters(gpt)
    assert [(f.layer, f.module, f.heads) for f in filters] == [
        (0, "blocks.0.attn", (0, 1)),  # one spec entry: one operator, one filter
        (2, "blocks.2.attn", (1,)),  # layer 1 has none, and still counts
    ]
    for f, coefficients in zip(filters, (first, last), strict=True):
        assert f.coefficients == pytest.approx(coefficients, rel=1e-7)
        gains, shares, label = _by_hand(list(f.coefficients), "adjacency")
        assert f.response.gains == pytest.approx(gains, rel=1e-12, abs=1e-12)
        assert f.response.energy == pytest.approx(shares, rel=1e-9)
        assert f.label == label
        assert (f.operator, f.basis, f.learnable) == ("polynomial", "adjacency", True)
    assert [f.label for f in filters] == ["high-pass", "band"]
    record = json.loads(json.dumps(filters[1].as_dict()))
    assert record["coefficients"] == list(filters[1].coefficients)
    assert (record["heads"], record["label"], record["energy"]) == (
        [1],
        "band",
        list(filters[1].response.energy),
    )


def test_fixed_coefficients_and_models_without_polynomial_heads() -> None:
    layer = DiffusionAttention(8, 2, [Attention(), Polynomial([0.0, 1.0])])  # L = I - P
    model = nn.ModuleDict({"attn": layer})
    (f,) = polynomial_filters(model)
    assert (f.module, f.heads, f.basis, f.learnable) == ("attn", (1,), "laplacian", False)
    assert f.coefficients == (0.0, 1.0) and f.label == "high-pass"
    assert f.response.gains == (0.0, 1.0, 2.0)
    gpt = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8))
    assert polynomial_filters(gpt) == []
    assert polynomial_filters(nn.Linear(2, 2)) == []


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: polynomial_filters("gpt"), "model"),
        (lambda: filter_response([]), "coefficients"),
        (lambda: filter_response([[1.0, 2.0]]), "coefficients"),
        (lambda: filter_response([1.0, float("nan")]), "coefficients"),
        (lambda: filter_response("12"), "coefficients"),
        (lambda: filter_response(["a"]), "coefficients"),
        (lambda: filter_response([1.0], basis="adjacent"), "basis"),
    ],
)
def test_bad_input_names_the_argument(call: Callable[[], object], argument: str) -> None:
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert isinstance(caught.value, ArgumentError) and caught.value.argument == argument
