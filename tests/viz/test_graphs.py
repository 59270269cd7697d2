"""Attention graphs drawn as graphs and matrices: one artist per edge, the right numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import viz_helpers as vh
from heatformer.graph_ops import DenseGraph
from heatformer.viz import (
    LAYOUTS,
    draw_attention_graph,
    draw_topk_pruning,
    find_collection,
    plot_attention_matrix,
    plot_topk_pruning,
    topk_title,
)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_path_and_arrowhead_per_edge(layout: str, tmp_path) -> None:
    graph = vh.random_attention(n=8)
    fig = draw_attention_graph(graph, 1, top_k=3, layout=layout, save=tmp_path / "g.png")
    expected = graph.topk(3).to_networkx(1).number_of_edges()
    assert expected == 8 * 3
    assert len(find_collection(fig, "edges").get_paths()) == expected
    assert len(find_collection(fig, "arrowheads").get_paths()) == expected
    assert len(find_collection(fig, "nodes").get_offsets()) == 8
    assert len(fig.axes) == 1
    assert vh.assert_png(tmp_path / "g.png")[0] > 100


def test_edge_widths_follow_weights() -> None:
    w = torch.tensor([[0.0, 1.0, 0.0], [0.25, 0.0, 0.75], [0.0, 0.5, 0.5]], dtype=torch.float64)
    fig = draw_attention_graph(DenseGraph(w))
    edges = find_collection(fig, "edges")
    weights = [w[i, j].item() for i, j in DenseGraph(w).to_networkx().edges]
    widths = edges.get_linewidths()
    order_w, order_lw = np.argsort(weights, kind="stable"), np.argsort(widths, kind="stable")
    assert list(order_w) == list(order_lw)  # heavier edge, wider line
    assert max(widths) == pytest.approx(3.5)
    alphas = edges.get_edgecolors()[:, 3]
    assert alphas.max() == pytest.approx(1.0) and alphas.min() < 0.5


def test_causal_graph_self_loops_and_min_weight() -> None:
    graph = vh.random_attention(n=6, causal=True)
    full = draw_attention_graph(graph, 0)
    assert len(find_collection(full, "edges").get_paths()) == 6 * 7 // 2  # lower triangle
    no_loops = draw_attention_graph(graph, 0, self_loops=False)
    assert len(find_collection(no_loops, "edges").get_paths()) == 6 * 5 // 2
    dense = graph.to_dense()[0]
    heavy = draw_attention_graph(graph, 0, min_weight=0.2)
    assert len(find_collection(heavy, "edges").get_paths()) == int((dense > 0.2).sum())


def test_token_labels_and_node_colours() -> None:
    graph = vh.random_attention(n=5)
    fig = draw_attention_graph(graph, 0, tokens="a b\nc")
    assert sorted(t.get_text() for t in fig.axes[0].texts) == sorted(["a", "␣", "b", "↵", "c"])
    colours = find_collection(fig, "nodes").get_array()
    np.testing.assert_allclose(colours, graph.in_degree()[0].numpy())  # default: in-degree


def test_every_label_reads_on_its_node() -> None:
    # [CLS] on the darkest node of YlOrRd: black there had a contrast ratio of 1.9 (issue 38)
    tokens = ["[CLS]", "heat", "flows", "along", "the", "[SEP]"]
    values = [1.0, 0.0, 0.2, 0.4, 0.6, 0.8]
    fig = draw_attention_graph(vh.random_attention(n=6), 0, tokens=tokens, node_values=values)
    ax = fig.axes[0]
    labels = vh.node_labels(ax)
    assert [name for name, _, _ in labels] == tokens
    assert min(c for _, c, _ in labels) >= 4.5, labels  # WCAG AA for text
    assert all(halo for _, _, halo in labels)  # a label wider than its node reads as well
    assert ax.texts[0].get_color() == (1.0, 1.0, 1.0)  # white on dark red
    # a new colour scale recolours the labels with the nodes: [CLS] is now pale, its text black
    find_collection(ax, "nodes").set_clim(0.0, 8.0)
    labels = vh.node_labels(ax)
    assert min(c for _, c, _ in labels) >= 4.5 and all(halo for _, _, halo in labels)
    assert ax.texts[0].get_color() == (0.0, 0.0, 0.0)


def test_draws_into_given_axes() -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    assert draw_attention_graph(vh.random_attention(), 0, ax=ax2, title="head 0") is fig
    assert ax2.get_title() == "head 0" and len(ax1.collections) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layout": "grid"}, "layout: expected one of"),
        ({"tokens": "abc"}, "tokens: expected 9 labels"),
        ({"top_k": 0}, "k"),
        ({"min_weight": -1.0}, "min_weight"),
        ({"node_values": [1.0, 2.0]}, "node_values: expected 9"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        draw_attention_graph(vh.random_attention(), 0, **kwargs)


def test_index_must_select_one_graph() -> None:
    with pytest.raises(ValueError, match="index"):
        draw_attention_graph(vh.random_attention(), None)
    with pytest.raises(ValueError, match="index"):
        draw_attention_graph(vh.random_attention(heads=2), 5)
    with pytest.raises(TypeError, match="graph"):
        draw_attention_graph([[0.0, 1.0], [1.0, 0.0]])  # type: ignore[arg-type]


def test_attention_matrix_shows_the_weights(tmp_path) -> None:
    graph = vh.random_attention(n=7)
    fig = plot_attention_matrix(graph, 1, save=tmp_path / "m.png")
    images = fig.axes[0].get_images()
    assert len(images) == 1 and len(fig.axes) == 2  # the matrix and its colorbar
    np.testing.assert_allclose(images[0].get_array(), graph.to_dense()[1].numpy())
    pruned = plot_attention_matrix(graph, 1, top_k=2, colorbar=False).axes[0].get_images()[0]
    array = np.asarray(pruned.get_array())
    assert ((array > 0).sum(1) == 2).all()
    np.testing.assert_allclose(array.sum(1), 1.0)
    vh.assert_png(tmp_path / "m.png")


def test_topk_pruning_panels(tmp_path) -> None:
    graph = vh.random_attention(n=10)
    fig = plot_topk_pruning(graph, 0, ks=(None, 3, 1), save=tmp_path / "t.png")
    assert len(fig.axes) == 6
    counts = [len(find_collection(ax, "edges").get_paths()) for ax in fig.axes[3:]]
    assert counts == [100, 30, 10]
    assert [ax.get_title() for ax in fig.axes[:3]] == ["full attention", "top-3", "top-1"]
    vh.assert_png(tmp_path / "t.png")


def test_topk_pruning_of_given_graphs_and_its_titles() -> None:
    graph = vh.random_attention(n=7)
    one = graph.to_dense()[1]
    kept = [(topk_title(k), one if k is None else DenseGraph(one).topk(k)) for k in (None, 2)]
    assert [name for name, _ in kept] == ["full attention", "top-2"]
    fig = draw_topk_pruning(kept, layout="circular")
    assert len(fig.axes) == 4
    np.testing.assert_allclose(fig.axes[0].get_images()[0].get_array(), one.numpy())
    counts = [len(find_collection(ax, "edges").get_paths()) for ax in fig.axes[2:]]
    assert counts == [49, 14]
    assert [ax.get_title() for ax in fig.axes[2:]] == [
        "full attention: 49 edges",
        "top-2: 14 edges",
    ]
    same = plot_topk_pruning(graph, 1, ks=(None, 2), layout="circular")
    assert [ax.get_title() for ax in same.axes] == [ax.get_title() for ax in fig.axes]
    with pytest.raises(ValueError, match="kept: expected at least one"):
        draw_topk_pruning([])
    with pytest.raises(ValueError, match=r"kept: expected graphs with one number of nodes"):
        draw_topk_pruning([("a", one), ("b", one[:3, :3])])
