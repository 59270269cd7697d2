"""The random walk on the demo's heads: TokenRank ``π``, ``λ₂`` and ``v₂`` (issue 42, item 8).

The numbers of every head (``DemoData.tokenrank``, ``walk_eigenvalues``, ``walk_eigenvector``
and their copy in ``explore.html``'s JSON) are checked against numpy's eigendecompositions of
``Pᵀ`` and ``P``, nothing taken from heatformer; the facts (:func:`walk_facts`) against the
numbers; the words of both pages against the facts, on causal and bidirectional softmax heads
and on made-up heads whose walk is complex, refused or not row-stochastic. The browser test
(``test_demo_browser.py``) checks what the interactive page draws.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import viz_helpers as vh
from heatformer.analysis import LayerSnapshot
from heatformer.graph_ops import Attention, DenseGraph, Laplacian, SoftmaxGraph
from heatformer.lab.demo import DemoData, demo_from_snapshots
from heatformer.lab.demo import page as page_module
from heatformer.lab.demo.explore import explorer_data
from heatformer.lab.demo.facts import ZERO_ENTRY, demo_facts, walk_facts
from heatformer.lab.demo.text import eigenvector_text, tokenrank_text
from heatformer.viz import token_labels

TEXT = "def add(a, b): return a + b"


def _softmax_data(causal: bool, *, seed: int = 0) -> DemoData:
    gen = torch.Generator().manual_seed(seed)
    n, snaps = len(TEXT), []
    for _ in range(2):
        q, k = (torch.randn(4, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
        graph = DenseGraph(SoftmaxGraph(q, k, causal=causal).to_dense())  # (H, N, N)
        values = torch.randn(4, n, 8, generator=gen, dtype=torch.float64)  # (H, N, Dh)
        snaps.append(
            LayerSnapshot(graph, values, (Attention(), Attention(), Laplacian(), Laplacian()))
        )
    return demo_from_snapshots(snaps, text=TEXT, source=5)


@pytest.mark.parametrize("causal", [True, False])
def test_tokenrank_and_v2_of_every_head_are_numpy_s(causal: bool) -> None:
    data = _softmax_data(causal)
    numbers = explorer_data(data)
    layers, heads, n = data.attention.shape[:3]
    assert data.tokenrank.shape == (layers, heads, n) and data.tokenrank.dtype == torch.float64
    assert data.walk_eigenvalues.shape == (layers, heads, 3)
    assert data.walk_eigenvector.dtype == torch.complex128
    for li in range(layers):
        for h in range(heads):
            p = data.attention[li, h].numpy()
            pi = data.tokenrank[li, h].numpy()
            np.testing.assert_allclose(pi, vh.stationary_reference(p), rtol=0, atol=1e-10)
            if causal:  # the walk drains to token 0: exactly e_0
                assert pi[0] == 1.0 and (pi[1:] == 0).all()
            v2, lam2 = vh.second_eigenvector_reference(p)
            got = data.walk_eigenvalues[li, h].numpy()
            assert got[0] == pytest.approx(1.0, abs=1e-12)
            assert complex(got[1]) == pytest.approx(lam2, abs=1e-12)
            np.testing.assert_allclose(data.walk_eigenvector[li, h].numpy(), v2, rtol=0, atol=1e-9)
            # the interactive page embeds the same numbers (12 decimals)
            walk = numbers["heads"][li][h]["walk"]
            np.testing.assert_allclose(walk["pi"], pi, rtol=0, atol=1e-12)
            np.testing.assert_allclose(walk["vector"], v2.real, rtol=0, atol=1e-9)
            assert complex(*walk["lambda2"]) == pytest.approx(lam2, abs=1e-12)
            assert walk["peak"] == int(np.argmax(np.abs(v2).round(12)))


def _labels(data: DemoData) -> list[str]:
    return token_labels(data.labels, data.attention.shape[-1])


@pytest.mark.parametrize("causal", [True, False])
def test_the_facts_of_every_head_are_those_of_its_numbers(causal: bool) -> None:
    data = _softmax_data(causal)
    for li in range(2):
        for h in range(4):
            f = walk_facts(data, li, h)
            p = data.attention[li, h]
            pi, v = data.tokenrank[li, h], data.walk_eigenvector[li, h]
            assert (f.layer, f.head, f.operator) == (li, h, data.operators[li][h])
            assert f.causal is causal and f.on_first is causal and f.unique
            assert f.empty_node is None and f.rows_sum_to_one
            assert f.support == (1 if causal else len(TEXT))
            assert [i for i, _ in f.top] == pi.argsort(descending=True)[: len(f.top)].tolist()
            assert f.lambda2 == complex(data.walk_eigenvalues[li, h, 1])
            assert f.lambda2_real is (abs(f.lambda2.imag) <= 1e-8)  # sqrt(eps) of float64
            assert f.vector_complex is bool((v.imag.abs() > ZERO_ENTRY).any())
            assert not f.lambda2_repeated
            assert f.peak == int(v.abs().argmax()) and float(v[f.peak].real) > 0
            assert f.signs == (
                int((v.real > ZERO_ENTRY).sum()),
                int((v.real < -ZERO_ENTRY).sum()),
                int((v.real.abs() <= ZERO_ENTRY).sum()),
            )
            if causal:  # a triangular P: lambda_2 is the largest self-weight after token 0's
                m = 1 + int(p.diagonal()[1:].argmax())
                assert f.self_weight_token == m
                assert f.lambda2.real == pytest.approx(float(p[m, m]), abs=1e-12)
                assert f.signs[2] >= 1  # v_2 vanishes before a token it starts from
            else:
                assert f.self_weight_token is None


def test_the_words_state_the_facts_of_a_causal_and_a_bidirectional_head() -> None:
    causal = _softmax_data(True)
    f = walk_facts(causal, 1, 2)
    labels = _labels(causal)
    rank = tokenrank_text(labels, f, drawn=True)
    assert rank.startswith("TokenRank of layer 1, head 2 (laplacian): the stationary")
    assert "the left eigenvector of P for λ₁ = 1 (its Perron vector)" in rank
    assert "This head is causal" in rank and "π = e₀, all of the mass on token 0 ‘d’" in rank
    assert "Node area ∝ π" in rank
    vec = eigenvector_text(labels, f, drawn=True)
    m = f.self_weight_token
    assert f"λ₂ = {f.lambda2.real:.4f}" in vec and f"1 − |λ₂| = {1 - abs(f.lambda2):.4g}" in vec
    assert f"λ₂ is the self-weight P[{m}, {m}] of token {m} ‘{labels[m]}’" in vec
    assert f"its largest entry, on token {f.peak} ‘{labels[f.peak]}’, is positive" in vec
    pos, neg, zero = f.signs
    assert f"{pos} positive, {neg} negative and {zero} zero" in vec
    assert vec.endswith("Node colour: v₂, red positive, blue negative.")
    assert "is complex" not in vec and "λ₂ is repeated" not in vec

    both = _softmax_data(False)
    f = walk_facts(both, 0, 1)
    labels = _labels(both)
    rank = tokenrank_text(labels, f, drawn=False)
    (i, first), (j, second), (k, third) = f.top
    assert (
        f"on ‘{labels[i]}’ (token {i}, π = {first:.3f}), ‘{labels[j]}’ (token {j}, π = "
        f"{second:.3f}) and ‘{labels[k]}’ (token {k}, π = {third:.3f})"
    ) in rank
    assert "every token has π > 0" in rank and "causal" not in rank and "Node area" not in rank
    vec = eigenvector_text(labels, f, drawn=False)
    assert "causal" not in vec and "Node colour" not in vec


def _made_up_heads() -> DemoData:
    """Four heads of 6 tokens: a directed cycle with self-loops (complex λ₂), two closed
    classes (no unique π, λ₂ = 1 repeated), a query that attends to nothing (no walk), and
    weights whose rows do not sum to 1."""
    n = 6
    eye = torch.eye(n, dtype=torch.float64)
    cycle = 0.5 * eye + 0.5 * eye.roll(1, 1)
    blocks = torch.block_diag(torch.full((3, 3), 1 / 3), torch.full((3, 3), 1 / 3)).double()
    empty = torch.full((n, n), 1 / n, dtype=torch.float64)
    empty[2] = 0.0
    loose = torch.rand(n, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.1
    graph = DenseGraph(torch.stack([cycle, blocks, empty, loose]))  # (4, N, N)
    ops = (Attention(), Attention(), Attention(), Laplacian())
    layer = LayerSnapshot(graph, torch.randn(4, n, 2, dtype=torch.float64), ops)
    return demo_from_snapshots([layer], text="abcdef", source=1)


def test_complex_refused_and_unnormalized_walks_are_said_as_they_are() -> None:
    data = _made_up_heads()
    labels = _labels(data)
    cycle, blocks, empty, loose = (walk_facts(data, 0, h) for h in range(4))
    # the cycle: pi uniform, lambda_2 = (1 + e^{2 pi i / 6}) / 2 and its conjugate
    np.testing.assert_allclose(data.tokenrank[0, 0].numpy(), np.full(6, 1 / 6), atol=1e-12)
    lam = (1 + np.exp(2j * np.pi / 6)) / 2
    assert cycle.lambda2 == pytest.approx(lam, abs=1e-12)
    assert not cycle.lambda2_real and cycle.vector_complex and not cycle.lambda2_repeated
    words = eigenvector_text(labels, cycle, drawn=True)
    assert f"λ₂ = {lam.real:.4f} + {lam.imag:.4g}i" in words
    assert "λ₂ is complex, its conjugate is λ₃" in words
    assert "its phase turned so that its largest entry" in words and "is real and positive" in words
    assert "Node colour: the real part of v₂" in words
    v2, _ = vh.second_eigenvector_reference(data.attention[0, 0].numpy())
    np.testing.assert_allclose(data.walk_eigenvector[0, 0].numpy(), v2, atol=1e-12)
    # two closed classes: pi refused (zeros), lambda_2 = 1 repeated
    assert not blocks.unique and (data.tokenrank[0, 1] == 0).all()
    assert blocks.lambda2 == pytest.approx(1.0) and blocks.lambda2_repeated
    assert "several closed classes" in tokenrank_text(labels, blocks, drawn=True)
    assert "λ₂ is repeated" in eigenvector_text(labels, blocks, drawn=True)
    # a query that attends to nothing: no walk at all
    assert empty.empty_node == 2 and empty.lambda2 is None and not empty.unique
    assert (data.walk_eigenvalues[0, 2] == 0).all()
    assert "token 2 ‘c’ has no out-edges" in tokenrank_text(labels, empty, drawn=True)
    assert eigenvector_text(labels, empty, drawn=True).endswith("none, there is no walk.")
    # rows that do not sum to 1: the walk on P = D^-1 W
    assert not loose.rows_sum_to_one and loose.unique
    w = data.attention[0, 3].numpy()
    np.testing.assert_allclose(
        data.tokenrank[0, 3].numpy(),
        vh.stationary_reference(w / w.sum(1, keepdims=True)),
        atol=1e-12,
    )
    assert "P = D⁻¹W (the weights with each row divided by its sum)" in tokenrank_text(
        labels, loose, drawn=True
    )
    # the interactive page draws nothing it cannot: no pi where refused, no v_2 without a walk
    walks = [head["walk"] for head in explorer_data(data)["heads"][0]]
    assert [w["pi"] is None for w in walks] == [False, True, True, False]
    assert [w["vector"] is None for w in walks] == [False, False, True, False]
    json.dumps(walks, allow_nan=False)  # standard JSON


def test_the_static_page_says_the_walk_of_its_head() -> None:
    """The section's words (``test_demo_page.py`` checks it is on the written page, numbered
    and linked)."""
    data = _softmax_data(False)
    facts = demo_facts(data)
    assert facts.walk == walk_facts(data, data.layer, data.attention_head)
    key, title, text, files = page_module._walk_section(Path(), data, facts, explore=True)
    assert (key, title, files) == ("walk", "The random walk on this head: TokenRank and λ₂", [])
    words = html.unescape(re.sub(r"<[^>]+>", "", text))
    labels = _labels(data)
    assert tokenrank_text(labels, facts.walk, drawn=False) in words
    assert eigenvector_text(labels, facts.walk, drawn=False) in words
    assert f"layer {data.layer}, head {data.attention_head} (attention)" in words
    assert "Node area" not in words and "Node colour" not in words  # nothing drawn here
    assert text.startswith("The head of {ref:graph} read as a random walk.")
    assert '<a href="explore.html">The interactive page</a> draws both on the graph' in text
    bare = page_module._walk_section(Path(), data, facts, explore=False)[2]
    assert "interactive page" not in bare


def test_data_without_the_walk_reads_back_with_it_computed() -> None:
    data = _softmax_data(False)
    plain = json.loads(json.dumps(data.to_dict(), allow_nan=False))
    assert DemoData.from_dict(plain).to_dict() == plain
    old = {k: v for k, v in plain.items() if k not in {"tokenrank", "walk_eigenvalues",
                                                       "walk_eigenvector"}}  # fmt: skip
    back = DemoData.from_dict(old)
    torch.testing.assert_close(back.tokenrank, data.tokenrank, rtol=0, atol=1e-15)
    torch.testing.assert_close(back.walk_eigenvalues, data.walk_eigenvalues, rtol=0, atol=1e-15)
    torch.testing.assert_close(back.walk_eigenvector, data.walk_eigenvector, rtol=0, atol=1e-15)
