"""The demo page's physics and its figures: the numbers the text states, the two heat views,
generated section numbers, colour bars, axis labels, one spectrum panel where two coincide,
the animation's size and the honest geometry chart.

Built from random causal attention graphs (no training), so these tests take seconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import scipy.linalg
import torch

import heatformer.lab.demo.page as page_module
import heatformer.viz.diffusion
import heatformer.viz.spectra
import viz_helpers as vh
from heatformer.analysis import LayerSnapshot
from heatformer.graph_ops import Attention, DenseGraph, Laplacian, SoftmaxGraph, heat_kernel
from heatformer.lab.demo import DemoData, demo_from_snapshots, write_demo
from heatformer.lab.demo.compute import mass_frames
from heatformer.lab.demo.facts import demo_facts
from heatformer.viz import find_collection

TEXT = "def add(a, b): return a + b"


def _layers(n: int, *, seed: int = 0, layers: int = 2) -> list[LayerSnapshot]:
    gen = torch.Generator().manual_seed(seed)
    snaps = []
    for _ in range(layers):
        q, k = (torch.randn(4, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
        graph = DenseGraph(SoftmaxGraph(q, k, causal=True).to_dense())  # (H, N, N)
        values = torch.randn(4, n, 8, generator=gen, dtype=torch.float64)  # (H, N, Dh)
        ops = (Attention(), Attention(), Laplacian(), Laplacian())
        snaps.append(LayerSnapshot(graph, values, ops))
    return snaps


@pytest.fixture(scope="module")
def data() -> DemoData:
    per_layer = {"attention:4": [0.95, 0.96, 0.97], "attention:2,laplacian:2": [0.95, 0.94, 0.93]}
    return demo_from_snapshots(_layers(len(TEXT)), text=TEXT, source=7, per_layer=per_layer)


@pytest.fixture(scope="module")
def written(data: DemoData, tmp_path_factory: pytest.TempPathFactory):
    """The page of ``data`` with every figure it saved: ``(result, {file name: figure})``."""
    figures = {}
    save = page_module.save_figure

    def keep(fig, path, **kwargs) -> None:
        if path is not None:
            figures[Path(path).name] = fig
        save(fig, path, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for module in (page_module, heatformer.viz.diffusion, heatformer.viz.spectra):
            mp.setattr(module, "save_figure", keep)
        result = write_demo(tmp_path_factory.mktemp("page"), data, gif=True)
    return result, figures


def test_the_mass_view_conserves_the_total_and_the_influence_view_does_not(data) -> None:
    head = data.attention[data.layer, data.attention_head]  # (N, N) float64
    n, j = head.shape[0], data.source
    lap = torch.eye(n, dtype=torch.float64) - head  # L = I - P
    for t, u, m in zip(data.heat_times, data.heat, data.mass):
        golden = torch.from_numpy(scipy.linalg.expm(-t * lap.numpy()))  # exp(-tL)
        torch.testing.assert_close(u, golden[:, j], rtol=0, atol=1e-12)  # influence: column j
        torch.testing.assert_close(m, golden.T[:, j], rtol=0, atol=1e-12)  # mass: exp(-tL^T) e_j
        assert abs(float(m.sum()) - 1.0) < 1e-12  # conserved, in float64
        assert float(m.min()) >= -1e-15  # and a mass: never negative
    # the influence view's total is 1^T exp(-tL) e_j: the library's heat kernel on the identity
    eye = torch.eye(n, dtype=torch.float64)
    for t, u in zip(data.heat_times, data.heat):
        kernel = heat_kernel(DenseGraph(head), eye, t, method="series", tol=1e-12)  # (N, N)
        assert abs(float(u.sum()) - float(kernel.sum(0)[j])) < 1e-10
    totals = data.heat.sum(-1)
    assert float(totals[0]) == 1.0
    assert float((totals - 1).abs().max()) > 0.3  # not conserved on this graph
    # mass_frames is the same thing for any graph and times
    torch.testing.assert_close(mass_frames(DenseGraph(head), j, [0.0, 2.0]), data.mass[[0, 3]])


def test_the_page_states_both_views_totals(written, data) -> None:
    result, _ = written
    page = result.index_html.read_text(encoding="utf-8")
    heat = re.search(r'<section id="heat">(.*?)</section>', page, re.S).group(1)
    influence = ", ".join(f"{float(v):.2f}" for v in data.heat.sum(-1))
    assert f"it is {influence}." in heat
    assert "<b>not conserved</b>" in heat
    assert "<b>conserved</b>: 1.00, 1.00, 1.00, 1.00, 1.00" in heat
    assert "exp(−tLᵀ)" in heat and "from key to query" in heat and "from query to key" in heat
    assert re.findall(r'<img src="(heat_[^"]+)"', heat) == [
        "heat_flow.png", "heat_mass.png", "heat_flow.gif",
    ]  # fmt: skip
    # the strips title every frame with its total
    _, figures = written
    for name, frames in (("heat_flow.png", data.heat), ("heat_mass.png", data.mass)):
        titles = [ax.get_title() for ax in figures[name].axes if ax.get_title()]
        assert titles == [
            f"t = {t:g},  total {float(f.sum()):.4f}" for t, f in zip(data.heat_times, frames)
        ]


def test_sections_are_numbered_and_cross_references_link_to_them(written) -> None:
    result, _ = written
    page = result.index_html.read_text(encoding="utf-8")
    sections = re.findall(r'<section id="([a-z-]+)"><h2>(\d+)\. ', page)
    assert [key for key, _ in sections] == [
        "graph", "matrices", "spectrum", "heat", "laplacian-head", "topk", "walk", "geometry",
    ]  # fmt: skip
    assert [int(i) for _, i in sections] == list(range(1, 9))
    number = {key: int(i) for key, i in sections}
    links = re.findall(r'<a href="#([a-z-]+)">section (\d+)</a>', page)
    assert len(links) >= 5 and "{ref:" not in page
    for key, i in links:
        assert number[key] == int(i)
    matrices = re.search(r'<section id="matrices">(.*?)</section>', page, re.S).group(1)
    assert f'<a href="#laplacian-head">section {number["laplacian-head"]}</a>' in matrices
    graph = re.search(r'<section id="graph">(.*?)</section>', page, re.S).group(1)
    assert "query <i>i</i> reads key <i>j</i>" in graph and "from key <i>j</i> to query" in graph
    walk = re.search(r'<section id="walk">(.*?)</section>', page, re.S).group(1)
    assert f'The head of <a href="#graph">section {number["graph"]}</a> read as' in walk
    with pytest.raises(ValueError, match="text: expected a reference to one of"):
        page_module._link_refs("see {ref:nowhere}", number)


def test_colour_bars_and_query_key_labels(written, data) -> None:
    _, figures = written
    graph = figures["attention_graph.png"]
    assert [ax.get_ylabel() for ax in graph.axes[1:]] == ["in-degree Σᵢ P[i, j]"]
    layers, heads = data.attention.shape[:2]
    heads_fig = figures["attention_heads.png"]
    matrices, bars = heads_fig.axes[: layers * heads], heads_fig.axes[layers * heads :]
    assert [ax.get_ylabel() for ax in bars] == ["attention weight P[i, j]"]
    vmax = float(data.attention.max())
    for c, ax in enumerate(matrices):
        assert ax.images[0].get_clim() == (0.0, vmax)  # one scale for every head
        assert ax.get_xlabel() == ("key j" if c >= (layers - 1) * heads else "")
        assert ax.get_ylabel() == ("query i" if c % heads == 0 else "")
    topk = figures["topk.png"]
    assert [ax.get_ylabel() for ax in topk.axes[6:]] == ["weight P[i, j]", "in-degree"]
    assert [ax.get_xlabel() for ax in topk.axes[:3]] == ["key j"] * 3


def test_one_spectrum_panel_where_rw_and_combinatorial_coincide(written, data) -> None:
    _, figures = written
    spectra = data.spectra  # rw = combinatorial on an attention graph (out-degrees 1)
    torch.testing.assert_close(spectra["rw"], spectra["combinatorial"])
    axes = figures["spectrum.png"].axes
    assert len(axes) == 2
    assert axes[0].get_title().startswith("random walk = combinatorial")
    result, _ = written
    assert "one panel shows both" in result.index_html.read_text(encoding="utf-8")
    # a graph whose out-degrees are not 1 keeps its three panels
    doubled = DemoData.from_dict({**data.to_dict(), "attention": (2 * data.attention).tolist()})
    shown, titles = page_module._spectra_shown(doubled, demo_facts(doubled))
    assert list(shown) == ["rw", "sym", "combinatorial"] and titles == {}


def test_the_animation_is_readable(written) -> None:
    result, _ = written
    gif = result.out_dir / "heat_flow.gif"
    assert vh.gif_frames(gif) == 25
    from PIL import Image

    with Image.open(gif) as image:
        width, height = image.size
    assert width >= 1200 and height >= 300, (width, height)  # was 851 x 213 at 80 dpi


def test_the_animation_says_what_it_shows(data, tmp_path, monkeypatch) -> None:
    # it was titled "heat flow" and its colour bar "heat", beside a text saying that the
    # influence view it shows is not an amount of heat (issue 38)
    from matplotlib.animation import PillowWriter

    shown = []
    grab = PillowWriter.grab_frame

    def spy(self, **kwargs) -> None:
        grab(self, **kwargs)
        ax, bar = self.fig.axes
        shown.append((ax.get_title(), bar.get_ylabel(), vh.node_labels(ax, draw=False)))

    monkeypatch.setattr(PillowWriter, "grab_frame", spy)
    page_module._heat_section(tmp_path, data, demo_facts(data), gif=True)
    assert len(shown) == len(data.animation_times)
    for (title, bar, labels), t, frame in zip(shown, data.animation_times, data.animation):
        total = float(frame.sum())
        assert title == f"influence u(t) = exp(−tL) e_j, t = {t:.2f}, total {total:.3f}"
        assert bar == "influence uᵢ(t)  (colour ∝ √value)"
        assert "heat" not in (title + bar).lower()
        assert min(c for _, c, _ in labels) >= 4.5  # every label reads on every frame
    page = page_module.heat_text(data, demo_facts(data))
    assert "The animation is the influence view" in page


def test_colour_scales_and_legends_say_what_they_show(written, data) -> None:
    result, figures = written
    # the heat strips: a square-root colour scale, and their colour bars say so
    for name, label in (("heat_flow.png", "influence exp(−tL) e_j"),
                        ("heat_mass.png", "mass exp(−tLᵀ) e_j")):  # fmt: skip
        *frames, bar = figures[name].axes
        assert bar.get_ylabel() == f"{label}  (colour ∝ √value)"
        nodes = find_collection(frames[0], "nodes")
        assert float(nodes.norm(0.25 * nodes.norm.vmax)) == pytest.approx(0.5)
    # every node label reads on its node, in every picture with nodes (top-k: after its
    # shared colour scale was set)
    for name in ("attention_graph.png", "heat_flow.png", "heat_mass.png", "topk.png"):
        axes = [ax for ax in figures[name].axes if ax.texts]
        assert axes and all(
            c >= 4.5 and halo for ax in axes for _, c, halo in vh.node_labels(ax)
        ), name
    # the values channel is v in the legend, as in the text; the outputs P v and (I − P) v
    right = figures["laplacian_vs_attention.png"].axes[1]
    legend = [t.get_text() for t in right.get_legend().get_texts()]
    assert legend == ["values v (one channel)", "attention head: P v", "Laplacian head: (I − P) v"]
    words = vh.page_text(result.index_html)
    assert "one channel of the head's values v and both outputs" in words["laplacian-head"]
    # the text says that the influence view, not heat, moves against the arrows
    assert "the influence view of section 4 moves against the arrows" in words["graph"]


def test_the_geometry_chart_is_honest_about_one_seed(written) -> None:
    result, figures = written
    ax = figures["geometry.png"].axes[0]
    assert ax.get_ylim() == (0.0, 1.0)  # a share: its whole range, not 0.93 to 0.98
    assert [t.get_text() for t in ax.get_xticklabels()] == ["embedding", "layer 0", "layer 1"]
    assert "one seed" in ax.get_title()
    page = result.index_html.read_text(encoding="utf-8")
    geometry = re.search(r'<section id="geometry">(.*?)</section>', page, re.S).group(1)
    assert "<b>One seed, so no error bars</b>" in geometry
    assert "layer <i>i</i> is block <i>i</i>" in geometry
