"""The teaching demo's page: pictures and ``index.html`` drawn from a :class:`DemoData` only.

:func:`write_demo` takes the numbers :mod:`heatformer.lab.demo.compute` produced (no model, no
training) and writes the PNG pictures, the animated GIF and an ``index.html`` that explains
what each picture teaches:

attention is a graph (and a matrix), one per head and layer; its Laplacian spectrum; heat flow
of a one-hot signal over time, in the influence view ``exp(−tL) e_j`` (total not conserved)
and the mass view ``exp(−tLᵀ) e_j`` (total conserved); how a Laplacian head differs from an
attention head (high-pass vs low-pass); top-k pruning; the random walk on the head, in words
(TokenRank and ``λ₂``; ``explore.html`` draws them); token geometry across layers,
attention-only vs with Laplacian heads. Sections are numbered when the page is written, and a
text refers to another section as ``{ref:key}`` (a link "section N"). The words come from
:mod:`heatformer.lab.demo.text`, which says of the model only what
:func:`~heatformer.lab.demo.facts.demo_facts` measured on the data (causal or bidirectional,
bytes or word pieces, real or complex eigenvalues, which spectrum panels coincide).
"""

from __future__ import annotations

import functools
import html
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

from heatformer.checks import bad_value
from heatformer.graph_ops import DenseGraph
from heatformer.lab.demo.data import DemoData
from heatformer.lab.demo.explore import write_explorer
from heatformer.lab.demo.facts import PageFacts, demo_facts
from heatformer.lab.demo.text import (
    MERGED_SPECTRUM_TITLE,
    geometry_text,
    graph_text,
    heat_text,
    intro_text,
    laplacian_text,
    matrices_text,
    meta_text,
    spectrum_text,
    topk_text,
    walk_text,
)
from heatformer.lab.progress import Progress
from heatformer.viz import (
    draw_attention_graph,
    draw_frequency_responses,
    draw_heat_strip,
    draw_operator_outputs,
    draw_spectra,
    draw_topk_pruning,
    find_collection,
    new_figure,
    plot_attention_matrix,
    plot_per_layer,
    require_matplotlib,
    save_figure,
    write_heat_gif,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["DemoResult", "check_writable", "demo_pictures", "write_demo"]


@dataclass(frozen=True)
class DemoResult:
    """What :func:`build_demo` / :func:`render_demo` wrote.

    Attributes:
        out_dir: the output folder.
        index_html: the page.
        files: the pictures (PNG and GIF), in the order the page shows them.
        explore_html: the interactive page (``explore.html``), or ``None`` when not written.
        losses: for each trained configuration, ``(first, last)`` training loss (bits/byte).
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


def _spectra_shown(data: DemoData, facts: PageFacts) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The spectra to draw and their titles: ``"rw"`` and ``"combinatorial"`` as one panel
    when every out-degree of the head is 1 (or 0) at the resolution of the model's dtype
    (:attr:`PageFacts.row_stochastic <heatformer.lab.demo.facts.PageFacts>`), which makes
    ``D − W = I − D⁻¹W``."""
    if not facts.row_stochastic:
        return dict(data.spectra), {}
    shown = {k: v for k, v in data.spectra.items() if k != "combinatorial"}
    return shown, {"rw": MERGED_SPECTRUM_TITLE}


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


#: One section of the page: ``(key, title, text, files written)``.
_Section = tuple[str, str, str, list[str]]


def _head_name(data: DemoData, h: int) -> str:
    return f"head {h} ({data.operators[data.layer][h]})"


def _graph_section(out: Path, data: DemoData, facts: PageFacts) -> _Section:
    """The attention head as an arc diagram, nodes coloured by in-degree."""
    graph = DenseGraph(data.attention[data.layer, data.attention_head])
    fig = draw_attention_graph(
        graph, tokens=data.labels, layout="arc",
        title=f"layer {data.layer}, {_head_name(data, data.attention_head)}: arrow i → j = "
        "query i reads key j",
    )  # fmt: skip
    fig.colorbar(
        find_collection(fig, "nodes"), ax=fig.axes[0], shrink=0.7, pad=0.01,
        label="in-degree Σᵢ P[i, j]",
    )  # fmt: skip
    save_figure(fig, out / "attention_graph.png")
    return "graph", "Attention is a graph", graph_text(facts), ["attention_graph.png"]


def _matrices_section(out: Path, data: DemoData, facts: PageFacts) -> _Section:
    """Every head of every layer as a matrix, one shared colour scale."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    layers, heads, n = *data.attention.shape[:2], data.attention.shape[-1]
    vmax = float(data.attention.max()) or 1.0
    fig = new_figure((3.0 * heads + 1.2, 3.0 * layers + 0.6))
    matrix_axes = []
    for li in range(layers):
        for h in range(heads):
            ax = fig.add_subplot(layers, heads, li * heads + h + 1)
            plot_attention_matrix(
                data.attention[li, h], tokens=data.labels, ax=ax, colorbar=False,
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
    title = "The same graphs as matrices, every head of every layer"
    return "matrices", title, matrices_text(data, facts), ["attention_heads.png"]


def _spectrum_section(out: Path, data: DemoData, facts: PageFacts) -> _Section:
    """The head's Laplacian spectra, one panel for two that coincide."""
    shown, titles = _spectra_shown(data, facts)
    draw_spectra(shown, titles=titles, imag_tol=facts.imag_tol, save=out / "spectrum.png")
    return "spectrum", "Its Laplacian spectrum", spectrum_text(facts), ["spectrum.png"]


def _heat_section(out: Path, data: DemoData, facts: PageFacts, *, gif: bool) -> _Section:
    """Both views of the heat flow from the source token, and the animation."""
    graph = DenseGraph(data.attention[data.layer, data.attention_head])
    for name, frames, label in (
        ("heat_flow.png", data.heat, "influence exp(−tL) e_j"),
        ("heat_mass.png", data.mass, "mass exp(−tLᵀ) e_j"),
    ):
        draw_heat_strip(
            graph, data.heat_times, frames, tokens=data.labels, totals=True, label=label,
            save=out / name,
        )  # fmt: skip
    files = ["heat_flow.png", "heat_mass.png"]
    if gif:
        write_heat_gif(
            graph, data.animation_times, data.animation, save=out / "heat_flow.gif",
            tokens=data.labels, dpi=120, label="influence uᵢ(t)",
            title="influence u(t) = exp(−tL) e_j",
        )  # fmt: skip
        files.append("heat_flow.gif")
    title = "Heat flow of a one-hot signal: influence and mass"
    return "heat", title, heat_text(data, facts), files


def _laplacian_section(out: Path, data: DemoData, facts: PageFacts) -> _Section:
    """Frequency responses, and what both operators make of one value channel."""
    fig = new_figure((12.5, 4.2))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    draw_frequency_responses(
        data.lam, data.responses, eigenvalues=data.eigenvalues, ax=ax1,
        title="what each head does to each frequency",
    )  # fmt: skip
    draw_operator_outputs(
        data.channel, data.outputs, tokens=data.labels, ax=ax2,
        title=f"one value channel on layer {data.layer}, head {data.filter_head}",
        signal_label="values v (one channel)",
    )  # fmt: skip
    save_figure(fig, out / "laplacian_vs_attention.png")
    title = "A Laplacian head is high-pass, an attention head low-pass"
    return "laplacian-head", title, laplacian_text(), ["laplacian_vs_attention.png"]


def _topk_section(out: Path, data: DemoData, facts: PageFacts) -> _Section:
    """The head's graph, full and pruned, one colour scale per row of the picture."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig = draw_topk_pruning(list(data.topk.items()), tokens=data.labels, layout="arc")
    cols = len(data.topk)
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
    return "topk", "Top-k pruning", topk_text(facts), ["topk.png"]


def _walk_section(out: Path, data: DemoData, facts: PageFacts, *, explore: bool) -> _Section:
    """The random walk on the head of the graph section: TokenRank and ``λ₂``, in words."""
    title = "The random walk on this head: TokenRank and λ₂"
    return "walk", title, walk_text(data, facts, explore=explore), []


def _geometry_section(out: Path, data: DemoData, facts: PageFacts) -> _Section:
    """The within-sequence share of the token variance per layer, of each trained model."""
    save_figure(_draw_geometry(data.per_layer or {}), out / "geometry.png")
    return "geometry", "Token geometry across layers", geometry_text(data), ["geometry.png"]


def demo_pictures(data: DemoData, *, gif: bool = True) -> tuple[str, ...]:
    """The names of the pictures :func:`write_demo` writes for ``data``, in page order: 7, plus
    the GIF with ``gif``, plus the token-geometry chart when ``data.per_layer`` is given.

    Example:
        >>> import torch
        >>> from heatformer.lab.demo import demo_from_snapshots
        >>> from heatformer.analysis import LayerSnapshot
        >>> from heatformer.graph_ops import Attention, DenseGraph
        >>> layer = LayerSnapshot(DenseGraph(torch.full((1, 3, 3), 1 / 3)), torch.ones(1, 3, 2),
        ...                       (Attention(),))
        >>> len(demo_pictures(demo_from_snapshots([layer], text="abc")))
        8
    """
    names = ["attention_graph.png", "attention_heads.png", "spectrum.png", "heat_flow.png"]
    names += ["heat_mass.png", *(["heat_flow.gif"] if gif else [])]
    names += ["laplacian_vs_attention.png", "topk.png"]
    return (*names, *(["geometry.png"] if data.per_layer else []))


def write_demo(
    out_dir: str | os.PathLike[str],
    data: DemoData,
    *,
    gif: bool = True,
    explore: bool = True,
    progress: bool = False,
) -> DemoResult:
    """Write the demo's pictures and ``index.html``, drawn from ``data`` alone, and the
    interactive ``explore.html`` (:func:`~heatformer.lab.demo.explore.write_explorer`).

    What the text says of the model (causal or bidirectional, bytes or word pieces, real or
    complex eigenvalues, which spectrum panels coincide, what the heads read) is measured on
    ``data`` by :func:`~heatformer.lab.demo.facts.demo_facts` and worded by
    :mod:`heatformer.lab.demo.text`.

    Args:
        out_dir: output folder (created).
        data: the numbers, from :func:`~heatformer.lab.demo.compute_demo`,
            :func:`~heatformer.lab.demo.demo_from_snapshots` or
            :meth:`DemoData.from_dict <heatformer.lab.demo.DemoData.from_dict>`.
        gif: also write the animated GIF of the heat flow.
        explore: also write the interactive page ``explore.html`` (self-contained, offline).
        progress: report the pictures written on stderr (:mod:`heatformer.lab.progress`).

    Returns:
        The :class:`DemoResult`; its ``files`` are :func:`demo_pictures`.
    """
    require_matplotlib()
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    facts = demo_facts(data)
    sections: list[Callable[[Path, DemoData, PageFacts], _Section]] = [
        _graph_section, _matrices_section, _spectrum_section,
        functools.partial(_heat_section, gif=gif), _laplacian_section, _topk_section,
        functools.partial(_walk_section, explore=explore),
        *([_geometry_section] if data.per_layer else []),
    ]  # fmt: skip
    files: list[str] = []
    page = _Page()
    bar = Progress(len(demo_pictures(data, gif=gif)), "demo pictures", unit="picture",
                   enabled=progress)  # fmt: skip
    for section in sections:
        key, title, text, names = section(out, data, facts)
        page.add(key, title, text, *names)
        for name in names:  # one progress step per picture
            files.append(name)
            bar.update(1)
    bar.close()
    explore_html = write_explorer(out, data) if explore else None
    index = out / "index.html"
    title = "heatformer: attention as a graph"
    _write_page(index, title, intro_text(data, explore=explore), page, meta_text(data, facts))
    return DemoResult(
        out_dir=out,
        index_html=index,
        files=tuple(out / f for f in files),
        losses=dict(data.losses),
        seconds=time.perf_counter() - start,
        explore_html=explore_html,
    )
