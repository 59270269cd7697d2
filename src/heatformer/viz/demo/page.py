"""The teaching demo's page: pictures and ``index.html`` drawn from a :class:`DemoData` only.

:func:`write_demo` takes the numbers :mod:`heatformer.viz.demo.compute` produced (no model, no
training) and writes the PNG pictures, the animated GIF and an ``index.html`` that explains
what each picture teaches:

attention is a graph (and a matrix), one per head and layer; its Laplacian spectrum; heat flow
of a one-hot signal over time, in the influence view ``exp(−tL) e_j`` (total not conserved)
and the mass view ``exp(−tLᵀ) e_j`` (total conserved); how a Laplacian head differs from an
attention head (high-pass vs low-pass); top-k pruning; token geometry across layers,
attention-only vs with Laplacian heads. Sections are numbered when the page is written, and a
text refers to another section as ``{ref:key}`` (a link "section N").
"""

from __future__ import annotations

import html
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

from heatformer._progress import Progress
from heatformer.checks import bad_value
from heatformer.graph_ops import DenseGraph
from heatformer.viz._common import PathLike, new_figure, require_matplotlib, save_figure
from heatformer.viz.demo.data import DemoData
from heatformer.viz.demo.explore import write_explorer
from heatformer.viz.diffusion import _draw_heat_strip, _write_heat_gif
from heatformer.viz.graphs import (
    _draw_topk_pruning,
    draw_attention_graph,
    find_collection,
    plot_attention_matrix,
)
from heatformer.viz.layers import plot_per_layer
from heatformer.viz.spectra import _draw_frequency_responses, _draw_operator_outputs, _draw_spectra

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["DemoResult", "check_writable", "write_demo"]


@dataclass(frozen=True)
class DemoResult:
    """What :func:`build_demo` / :func:`render_demo` wrote.

    Attributes:
        out_dir: the output folder.
        index_html: the page.
        files: the pictures (PNG and GIF), in the order the page shows them.
        explore_html: the interactive page (``explore.html``), or ``None`` when not written.
        losses: for each trained configuration, ``(first, last)`` training loss (nats/byte).
        seconds: wall time.
    """

    out_dir: Path
    index_html: Path
    files: tuple[Path, ...]
    losses: dict[str, tuple[float, float]] = field(default_factory=dict)
    seconds: float = 0.0
    explore_html: Path | None = None


@dataclass
class _Page:
    """The page's sections, in order; ``{ref:key}`` in a text becomes a numbered link."""

    sections: list[tuple[str, str, str, list[str]]] = field(default_factory=list)

    def add(self, key: str, title: str, text: str, *files: str) -> None:
        self.sections.append((key, title, text, list(files)))

    def numbers(self) -> dict[str, int]:
        """``{key: section number}``, numbered from 1 in the order of the page."""
        return {key: i for i, (key, *_) in enumerate(self.sections, start=1)}


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
img { max-width: 100%; height: auto; display: block; margin: 0.8em 0; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
.meta { color: #555; font-size: 0.9em; }
"""

_REF = re.compile(r"\{ref:([a-z0-9-]+)\}")


def _link_refs(text: str, numbers: dict[str, int]) -> str:
    """Replace every ``{ref:key}`` by a link "section N" to that section."""

    def link(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in numbers:  # a section that this page does not have
            raise bad_value(
                "text", f"expected a reference to one of {sorted(numbers)}, got {key!r}"
            )
        return f'<a href="#{key}">section {numbers[key]}</a>'

    return _REF.sub(link, text)


def _write_page(path: Path, title: str, intro: str, page: _Page, meta: str) -> None:
    numbers = page.numbers()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{_link_refs(intro, numbers)}</p>",
        f'<p class="meta">{meta}</p>',
    ]
    for key, heading, text, files in page.sections:
        parts.append(f'<section id="{key}"><h2>{numbers[key]}. {html.escape(heading)}</h2>')
        parts.append(f"<p>{_link_refs(text, numbers)}</p>")
        for name in files:
            alt = html.escape(f"{heading} ({name})")
            parts.append(f'<img src="{html.escape(name)}" alt="{alt}">')
        parts.append("</section>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def check_writable(out: Path) -> None:
    """Create ``out`` and write a scratch file there, or raise ``ValueError``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise bad_value(
            "out_dir",
            f"expected a folder that can be created and written, got {out} ({err.strerror or err})",
        ) from None


def _spectra_shown(data: DemoData) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The spectra to draw and their titles: ``"rw"`` and ``"combinatorial"`` as one panel
    when every out-degree of the head is 1 (or 0), which makes ``D − W = I − D⁻¹W``."""
    head = data.attention[data.layer, data.attention_head]  # (N, N)
    out = head.sum(-1)
    same = bool(((out - 1).abs().le(1e-9) | out.abs().le(1e-12)).all())
    if not same:
        return dict(data.spectra), {}
    shown = {k: v for k, v in data.spectra.items() if k != "combinatorial"}
    return shown, {"rw": "random walk = combinatorial  $L = I - P$  (out-degrees 1)"}


def _draw_geometry(per_layer: dict[str, tuple[float, ...]]) -> Figure:
    """The token-geometry chart: x is "embedding", then the output of layer 0, 1, ...; the
    y-axis is the whole range [0, 1] of a share, since one seed has no error bars."""
    fig = plot_per_layer(
        per_layer, ylabel="within-sequence share of variance", first_layer=0,
        title="how far apart the tokens of a sequence stay (one seed: no error bars)",
    )  # fmt: skip
    ax = fig.axes[0]
    depth = max(len(v) for v in per_layer.values())
    ax.set_xticks(list(range(depth)), ["embedding", *(f"layer {i}" for i in range(depth - 1))])
    ax.set_xlabel("token states after")
    ax.set_ylim(0.0, 1.0)
    return fig


def _totals(frames: Tensor) -> str:
    return ", ".join(f"{float(v):.2f}" for v in frames.sum(-1))


def write_demo(
    out_dir: PathLike,
    data: DemoData,
    *,
    gif: bool = True,
    explore: bool = True,
    progress: bool = False,
) -> DemoResult:
    """Write the demo's pictures and ``index.html``, drawn from ``data`` alone, and the
    interactive ``explore.html`` (:func:`~heatformer.viz.demo.explore.write_explorer`).

    Args:
        out_dir: output folder (created).
        data: the numbers, from :func:`~heatformer.viz.demo.compute_demo`,
            :func:`~heatformer.viz.demo.demo_from_snapshots` or
            :meth:`DemoData.from_dict <heatformer.viz.demo.DemoData.from_dict>`.
        gif: also write the animated GIF of the heat flow.
        explore: also write the interactive page ``explore.html`` (self-contained, offline).
        progress: report the pictures written on stderr (:mod:`heatformer._progress`).

    Returns:
        The :class:`DemoResult`.
    """
    require_matplotlib()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = data.labels
    n, (layers, heads) = len(tokens), data.attention.shape[:2]
    att, lap, source, layer_no = data.attention_head, data.laplacian_head, data.source, data.layer
    graph = DenseGraph(data.attention[layer_no, att])  # the head of the single-head pictures
    files: list[str] = []
    page = _Page()
    bar = Progress(
        7 + bool(gif) + bool(data.per_layer), "demo pictures", unit="picture", enabled=progress
    )

    def wrote(name: str) -> None:
        files.append(name)
        bar.update(1)

    def name_of(h: int) -> str:
        return f"head {h} ({data.operators[layer_no][h]})"

    # attention is a graph
    fig = draw_attention_graph(
        graph, tokens=tokens, layout="arc",
        title=f"layer {layer_no}, {name_of(att)}: arrow i → j = query i reads key j",
    )  # fmt: skip
    fig.colorbar(
        find_collection(fig, "nodes"), ax=fig.axes[0], shrink=0.7, pad=0.01,
        label="in-degree Σᵢ P[i, j]",
    )  # fmt: skip
    save_figure(fig, out / "attention_graph.png")
    wrote("attention_graph.png")
    page.add(
        "graph",
        "Attention is a graph",
        "Every token is a node. Query <i>i</i> sends an edge to each key <i>j</i> it attends "
        "to, with weight <code>P[i, j]</code> (a softmax row: the weights of a node's "
        "out-edges sum to 1), drawn thicker and darker for larger weights. The arrow "
        "<i>i</i> → <i>j</i> says who reads from whom: query <i>i</i> reads key <i>j</i>, so "
        "the value of <i>j</i> travels the other way, from key <i>j</i> to query <i>i</i> "
        "(this is why the heat of {ref:heat} moves against the arrows). The model is causal, "
        "so every arrow points back to an earlier token (or to itself: attention keeps "
        "self-loops). The node colour (colour bar) is the in-degree "
        "<code>Σ<sub>i</sub> P[i, j]</code>, the total attention a token receives; tokens "
        "that collect much of it are <i>attention sinks</i>. An attention head's output is "
        "the average <code>P v</code> of the values over each node's out-edges.",
        "attention_graph.png",
    )
    # all heads as matrices, one shared colour scale
    vmax = float(data.attention.max()) or 1.0
    fig = new_figure((3.0 * heads + 1.2, 3.0 * layers + 0.6))
    matrix_axes = []
    for li in range(layers):
        for h in range(heads):
            ax = fig.add_subplot(layers, heads, li * heads + h + 1)
            plot_attention_matrix(
                data.attention[li, h], tokens=tokens, ax=ax, colorbar=False,
                title=f"layer {li}, head {h}: {data.operators[li][h]}",
            )  # fmt: skip
            ax.images[0].set_clim(0.0, vmax)
            ax.set_xlabel("key j" if li == layers - 1 else "", fontsize=8)
            ax.set_ylabel("query i" if h == 0 else "", fontsize=8)
            ax.tick_params(labelsize=5 if n > 20 else 7)
            matrix_axes.append(ax)
    fig.colorbar(
        ScalarMappable(norm=Normalize(0.0, vmax), cmap="Blues"), ax=matrix_axes, shrink=0.8,
        label="attention weight P[i, j]",
    )  # fmt: skip
    save_figure(fig, out / "attention_heads.png")
    wrote("attention_heads.png")
    page.add(
        "matrices",
        "The same graphs as matrices, every head of every layer",
        "Row <i>i</i> is query <i>i</i>, column <i>j</i> key <i>j</i> (axis labels), one "
        "colour scale for all heads (colour bar); the upper triangle is empty because the "
        "model is causal. A Laplacian head has an attention graph just like an attention "
        "head; only what it does with it differs ({ref:laplacian-head}). Heads specialize: "
        "some look at the previous character, some at the start of the line, some spread out.",
        "attention_heads.png",
    )
    # spectrum
    shown, titles = _spectra_shown(data)
    _draw_spectra(shown, titles=titles, save=out / "spectrum.png")
    wrote("spectrum.png")
    same = (
        "The combinatorial Laplacian <code>D − W</code> equals <code>I − P</code> here, since "
        "every out-degree of an attention graph is 1 (<code>D = I</code>): the two spectra are "
        "the same, so one panel shows both."
        if titles
        else "The combinatorial Laplacian <code>D − W</code> has its own panel: this graph's "
        "out-degrees are not all 1."
    )
    page.add(
        "spectrum",
        "Its Laplacian spectrum",
        "The random-walk Laplacian of an attention graph is <code>L = I − P</code>. Its "
        "eigenvalue 0 belongs to the constant signal (<code>P 1 = 1</code>): smooth signals "
        "have small eigenvalues, rough ones large. A directed graph usually has complex "
        "eigenvalues, inside the disk <code>|λ − 1| ≤ 1</code>; but a causal "
        "<code>P</code> is lower-triangular, so here they are its diagonal, "
        "<code>1 − P[i, i]</code>, real and in [0, 1]. The symmetric normalization (of "
        "<code>W<sub>s</sub> = (W + Wᵀ)/2</code>) has real eigenvalues in [0, 2]. " + same,
        "spectrum.png",
    )
    # heat flow, both views
    src_label = tokens[source] if tokens[source].strip() else repr(tokens[source])
    _draw_heat_strip(
        graph, data.heat_times, data.heat, tokens=tokens, totals=True,
        label="influence exp(−tL) e_j", save=out / "heat_flow.png",
    )  # fmt: skip
    wrote("heat_flow.png")
    _draw_heat_strip(
        graph, data.heat_times, data.mass, tokens=tokens, totals=True,
        label="mass exp(−tLᵀ) e_j", save=out / "heat_mass.png",
    )  # fmt: skip
    wrote("heat_mass.png")
    shown_files = ["heat_flow.png", "heat_mass.png"]
    if gif:
        path = out / "heat_flow.gif"
        _write_heat_gif(
            graph, data.animation_times, data.animation, path=path, tokens=tokens, dpi=120
        )
        wrote("heat_flow.gif")
        shown_files.append("heat_flow.gif")
    times = ", ".join(f"{t:g}" for t in data.heat_times)
    page.add(
        "heat",
        "Heat flow of a one-hot signal: influence and mass",
        f"Put 1 on token <i>j</i> = {source} (<code>{html.escape(src_label)}</code>) and 0 "
        "elsewhere, then let it diffuse for a time <i>t</i>. There are two ways to do this on "
        "a directed graph, and only one of them conserves the total. "
        "<b>Influence view</b> (first strip): <code>u(t) = exp(−tL) e<sub>j</sub></code>, the "
        "output of a heat head with time <i>t</i> (<code>du/dt = −L u</code>). Entry <i>i</i> "
        "is how much of token <i>j</i>'s value token <i>i</i>'s output holds. Every output "
        "is a weighted average of values (the rows of <code>exp(−tL)</code> sum to 1), so "
        "constants stay constant; but its columns do not sum to 1, and the total "
        "<code>Σ<sub>i</sub> u<sub>i</sub>(t)</code> is <b>not conserved</b>: at "
        f"<i>t</i> = {times} it is {_totals(data.heat)}. It counts how many outputs listen "
        "to token <i>j</i>; it is not an amount of heat. It moves against the arrows, from "
        "key to query, to later tokens only (causal), along the strong edges first. "
        "<b>Mass view</b> (second strip): <code>m(t) = exp(−tLᵀ) e<sub>j</sub></code> "
        "(<code>dm/dt = −Lᵀ m</code>): a unit of mass on token <i>j</i> flows along the "
        "arrows, from query to key, back to earlier tokens, and piles up on the sinks. "
        "Since <code>1ᵀ Lᵀ = (L 1)ᵀ = 0</code>, its total is <b>conserved</b>: "
        f"{_totals(data.mass)}. This is the heat of a physics course. "
        "Heat is low-pass: it smooths. heatformer computes <code>exp(−tL) x</code> without "
        "any matrix, as the positive series <code>e<sup>−t</sup> Σ<sub>k</sub> "
        "t<sup>k</sup>/k! P<sup>k</sup> x</code>; the mass view of token <i>j</i> is row "
        "<i>j</i> of the same kernel, since <code>exp(−tLᵀ) = exp(−tL)ᵀ</code>. The "
        "animation is the influence view.",
        *shown_files,
    )
    # Laplacian head vs attention head
    fig = new_figure((12.5, 4.2))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _draw_frequency_responses(
        data.lam, data.responses, eigenvalues=data.eigenvalues, ax=ax1,
        title="what each head does to each frequency", save=None,
    )  # fmt: skip
    _draw_operator_outputs(
        data.channel, data.outputs, tokens=tokens, ax=ax2, save=None,
        title=f"one value channel on layer {layer_no}, head {data.filter_head}",
    )  # fmt: skip
    save_figure(fig, out / "laplacian_vs_attention.png")
    wrote("laplacian_vs_attention.png")
    page.add(
        "laplacian-head",
        "A Laplacian head is high-pass, an attention head low-pass",
        "Left: an operator <code>f(L)</code> multiplies the part of a signal along a "
        "Laplacian eigenvector with eigenvalue λ by <code>f(λ)</code> (the eigenvalues of "
        "{ref:spectrum}). Attention <code>P = I − L</code> has <code>f(λ) = 1 − λ</code>: it "
        "keeps the smooth part (λ near 0) and damps the rough part (low-pass, like the heat "
        "of {ref:heat}). A Laplacian head outputs <code>(I − P) v = v − P v</code>, "
        "<code>f(λ) = λ</code>: it removes the common part and keeps what makes a token "
        "differ from its neighbours (high-pass). The ticks are the real parts of this head's "
        "eigenvalues. Right: one channel of the head's values <code>v</code> and both "
        "outputs; the two outputs add up to <code>v</code>.",
        "laplacian_vs_attention.png",
    )
    # top-k pruning, one colour scale per row
    kept = [(title, DenseGraph(w)) for title, w in data.topk.items()]
    fig = _draw_topk_pruning(kept, tokens=tokens, layout="arc", save=None)
    cols = len(kept)
    mats, nets = fig.axes[:cols], fig.axes[cols : 2 * cols]
    top = max(float(w.max()) for w in data.topk.values()) or 1.0
    received = max(float(w.sum(0).max()) for w in data.topk.values()) or 1.0
    for ax in mats:
        ax.images[0].set_clim(0.0, top)
    for ax in nets:
        find_collection(ax, "nodes").set_clim(0.0, received)
    fig.colorbar(
        ScalarMappable(norm=Normalize(0.0, top), cmap="Blues"), ax=mats, shrink=0.8,
        label="weight P[i, j]",
    )  # fmt: skip
    fig.colorbar(
        ScalarMappable(norm=Normalize(0.0, received), cmap="YlOrRd"), ax=nets, shrink=0.9,
        label="in-degree",
    )  # fmt: skip
    save_figure(fig, out / "topk.png")
    wrote("topk.png")
    page.add(
        "topk",
        "Top-k pruning",
        "Each query keeps only its <i>k</i> heaviest edges, renormalized to sum 1. The graph "
        "then has <i>N k</i> edges instead of about <i>N²</i>/2, so a diffusion step costs "
        "<i>O(N k)</i>: this is how heatformer runs heat and Laplacian heads on long "
        "sequences (a sparse matrix product per step). Most of the structure survives. "
        "Matrices: query <i>i</i> (rows) by key <i>j</i> (columns); nodes coloured by "
        "in-degree, as in {ref:graph}.",
        "topk.png",
    )
    # token geometry per layer
    if data.per_layer:
        save_figure(_draw_geometry(data.per_layer), out / "geometry.png")
        wrote("geometry.png")
        page.add(
            "geometry",
            "Token geometry across layers",
            "The share of the token variance that lies within a sequence (the rest is "
            "between sequences), of the embedding and of the output of each layer (layer "
            "<i>i</i> is block <i>i</i>, as in the pictures above and in "
            "<code>heatformer compare</code>), on held-out windows. Averaging (attention, "
            "heat) pulls the tokens of a sequence together; Laplacian heads push them apart "
            "(Zhang &amp; Papyan, 2026). <b>One seed, so no error bars</b>: tiny models "
            "trained for seconds, and a gap of a few hundredths between the lines can be "
            "noise (the y-axis shows the whole range 0 to 1; run again with another "
            "<code>--seed</code>, or <code>heatformer compare</code> with several seeds for "
            "mean ± std). Measure, don't assume.",
            "geometry.png",
        )
    loss_text = "; ".join(
        f"<code>{html.escape(k)}</code> training loss {a:.2f} → {b:.2f} nats/byte"
        for k, (a, b) in data.losses.items()
    )
    bar.close()
    explore_html = write_explorer(out, data) if explore else None
    index = out / "index.html"
    _write_page(
        index,
        "heatformer: attention as a graph",
        f"What a small transformer's attention looks like as a graph, on the sentence "
        f"<code>{html.escape(data.text)}</code>. Pictures of layer {layer_no} (layers are "
        f"numbered from 0: layer 0 is the first block); the attention head is head {att}"
        + (f", the Laplacian head head {lap}." if lap is not None else ".")
        + (
            ' <b><a href="explore.html">Play with it</a></b>: the interactive page (sliders '
            "for <i>t</i> and the number of steps, any layer, head, token and operator)."
            if explore
            else ""
        ),
        page,
        " ".join(p for p in (html.escape(data.meta), loss_text) if p),
    )
    return DemoResult(
        out_dir=out,
        index_html=index,
        files=tuple(out / f for f in files),
        losses=dict(data.losses),
        seconds=time.perf_counter() - start,
        explore_html=explore_html,
    )
