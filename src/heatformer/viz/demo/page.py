"""The teaching demo's page: pictures and ``index.html`` drawn from a :class:`DemoData` only.

:func:`write_demo` takes the numbers :mod:`heatformer.viz.demo.compute` produced (no model, no
training) and writes the PNG pictures, the animated GIF and an ``index.html`` that explains
what each picture teaches:

1. attention is a graph (and a matrix), one per head and layer;
2. its Laplacian spectrum, for each normalization;
3. heat flow of a one-hot signal over time;
4. how a Laplacian head differs from an attention head (high-pass vs low-pass);
5. top-k pruning;
6. token geometry across layers, attention-only vs with Laplacian heads.
"""

from __future__ import annotations

import html
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from heatformer._progress import Progress
from heatformer.checks import bad_value
from heatformer.graph_ops import DenseGraph
from heatformer.viz._common import PathLike, new_figure, require_matplotlib, save_figure
from heatformer.viz.demo.data import DemoData
from heatformer.viz.diffusion import _draw_heat_strip, _write_heat_gif
from heatformer.viz.graphs import _draw_topk_pruning, draw_attention_graph, plot_attention_matrix
from heatformer.viz.layers import plot_per_layer
from heatformer.viz.spectra import _draw_frequency_responses, _draw_operator_outputs, _draw_spectra

__all__ = ["DemoResult", "check_writable", "write_demo"]


@dataclass(frozen=True)
class DemoResult:
    """What :func:`build_demo` / :func:`render_demo` wrote.

    Attributes:
        out_dir: the output folder.
        index_html: the page.
        files: the pictures (PNG and GIF), in the order the page shows them.
        losses: for each trained configuration, ``(first, last)`` training loss (nats/byte).
        seconds: wall time.
    """

    out_dir: Path
    index_html: Path
    files: tuple[Path, ...]
    losses: dict[str, tuple[float, float]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class _Page:
    sections: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def add(self, title: str, text: str, *files: str) -> None:
        self.sections.append((title, text, list(files)))


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
img { max-width: 100%; height: auto; display: block; margin: 0.8em 0; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
.meta { color: #555; font-size: 0.9em; }
"""


def _write_page(path: Path, title: str, intro: str, page: _Page, meta: str) -> None:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{intro}</p>",
        f'<p class="meta">{meta}</p>',
    ]
    for i, (heading, text, files) in enumerate(page.sections, start=1):
        parts.append(f'<section id="s{i}"><h2>{i}. {html.escape(heading)}</h2>')
        parts.append(f"<p>{text}</p>")
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


def write_demo(
    out_dir: PathLike, data: DemoData, *, gif: bool = True, progress: bool = False
) -> DemoResult:
    """Write the demo's pictures and ``index.html``, drawn from ``data`` alone.

    Args:
        out_dir: output folder (created).
        data: the numbers, from :func:`~heatformer.viz.demo.compute_demo`,
            :func:`~heatformer.viz.demo.demo_from_snapshots` or
            :meth:`DemoData.from_dict <heatformer.viz.demo.DemoData.from_dict>`.
        gif: also write the animated GIF of the heat flow.
        progress: report the pictures written on stderr (:mod:`heatformer._progress`).

    Returns:
        The :class:`DemoResult`.
    """
    require_matplotlib()
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
        6 + bool(gif) + bool(data.per_layer), "demo pictures", unit="picture", enabled=progress
    )

    def wrote(name: str) -> None:
        files.append(name)
        bar.update(1)

    def name_of(h: int) -> str:
        return f"head {h} ({data.operators[layer_no][h]})"

    # 1. attention is a graph
    draw_attention_graph(
        graph, tokens=tokens, layout="arc",
        title=f"layer {layer_no}, {name_of(att)}: arrows from query to key",
        save=out / "attention_graph.png",
    )  # fmt: skip
    wrote("attention_graph.png")
    page.add(
        "Attention is a graph",
        "Every token is a node. Query <i>i</i> sends an edge to each key <i>j</i> it attends "
        "to, with weight <code>P[i, j]</code> (a softmax row: the weights of a node's "
        "out-edges sum to 1), drawn thicker and darker for larger weights. The model is "
        "causal, so every arrow points back to an earlier token (or to itself: attention "
        "keeps self-loops). The node colour is the in-degree, the total attention a token "
        "receives; tokens that collect much of it are <i>attention sinks</i>. An attention "
        "head's output is the average <code>P v</code> of the values over each node's "
        "out-edges.",
        "attention_graph.png",
    )
    # all heads as matrices
    fig = new_figure((3.0 * heads + 0.5, 3.0 * layers + 0.4))
    for li in range(layers):
        for h in range(heads):
            ax = fig.add_subplot(layers, heads, li * heads + h + 1)
            plot_attention_matrix(
                data.attention[li, h], tokens=tokens, ax=ax, colorbar=False,
                title=f"layer {li}, head {h}: {data.operators[li][h]}",
            )  # fmt: skip
            ax.set_xlabel("")
            ax.set_ylabel("")
            ax.tick_params(labelsize=5 if n > 20 else 7)
    save_figure(fig, out / "attention_heads.png")
    wrote("attention_heads.png")
    page.add(
        "The same graphs as matrices, every head of every layer",
        "Row <i>i</i> is query <i>i</i>, column <i>j</i> key <i>j</i>; the upper triangle is "
        "empty because the model is causal. A Laplacian head has an attention graph just "
        "like an attention head; only what it does with it differs (section 4). Heads "
        "specialize: some look at the previous character, some at the start of the line, "
        "some spread out.",
        "attention_heads.png",
    )
    # 2. spectrum
    _draw_spectra(data.spectra, save=out / "spectrum.png")
    wrote("spectrum.png")
    page.add(
        "Its Laplacian spectrum",
        "The random-walk Laplacian of an attention graph is <code>L = I − P</code>. Its "
        "eigenvalue 0 belongs to the constant signal (<code>P 1 = 1</code>): smooth signals "
        "have small eigenvalues, rough ones large. A directed graph usually has complex "
        "eigenvalues, inside the disk <code>|λ − 1| ≤ 1</code>; but a causal "
        "<code>P</code> is lower-triangular, so here they are its diagonal, "
        "<code>1 − P[i, i]</code>, real and in [0, 1]. The symmetric normalization (of "
        "<code>W<sub>s</sub> = (W + Wᵀ)/2</code>) has real eigenvalues in [0, 2]. The "
        "combinatorial Laplacian <code>D − W</code> equals <code>I − P</code> here, since "
        "every out-degree of an attention graph is 1.",
        "spectrum.png",
    )
    # 3. heat flow
    src_label = tokens[source] if tokens[source].strip() else repr(tokens[source])
    _draw_heat_strip(
        graph, data.heat_times, data.heat, label="heat exp(−tL) x  (rw)", tokens=tokens,
        save=out / "heat_flow.png",
    )  # fmt: skip
    wrote("heat_flow.png")
    shown = ["heat_flow.png"]
    if gif:
        path = out / "heat_flow.gif"
        _write_heat_gif(graph, data.animation_times, data.animation, path=path, tokens=tokens)
        wrote("heat_flow.gif")
        shown.append("heat_flow.gif")
    page.add(
        "Heat flow of a one-hot signal",
        f"A drop of heat on token {source} (<code>{html.escape(src_label)}</code>), then the "
        "heat equation <code>du/dt = −L u</code> on this graph: <code>u(t) = exp(−tL) "
        "e<sub>j</sub></code>, the output of a heat head with time <i>t</i>. Entry <i>i</i> "
        "is how much of token <i>j</i>'s value has reached token <i>i</i>'s output. At "
        "<i>t</i> = 0 nothing has moved; the heat only reaches later tokens (causal), along "
        "the strong edges first; as <i>t</i> grows every token ends at a weighted average "
        "(heat is low-pass: it smooths). heatformer computes <code>exp(−tL) x</code> "
        "without any matrix, as the positive series <code>e<sup>−t</sup> Σ<sub>k</sub> "
        "t<sup>k</sup>/k! P<sup>k</sup> x</code>.",
        *shown,
    )
    # 4. Laplacian head vs attention head
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
        "A Laplacian head is high-pass, an attention head low-pass",
        "Left: an operator <code>f(L)</code> multiplies the part of a signal along a "
        "Laplacian eigenvector with eigenvalue λ by <code>f(λ)</code>. Attention "
        "<code>P = I − L</code> has <code>f(λ) = 1 − λ</code>: it keeps the smooth part "
        "(λ near 0) and damps the rough part (low-pass, like heat). A Laplacian head "
        "outputs <code>(I − P) v = v − P v</code>, <code>f(λ) = λ</code>: it removes the "
        "common part and keeps what makes a token differ from its neighbours (high-pass). "
        "The ticks are the real parts of this head's eigenvalues. Right: one channel of "
        "the head's values <code>v</code> and both outputs; the two outputs add up to "
        "<code>v</code>.",
        "laplacian_vs_attention.png",
    )
    # 5. top-k pruning
    kept = [(title, DenseGraph(w)) for title, w in data.topk.items()]
    _draw_topk_pruning(kept, tokens=tokens, layout="arc", save=out / "topk.png")
    wrote("topk.png")
    page.add(
        "Top-k pruning",
        "Each query keeps only its <i>k</i> heaviest edges, renormalized to sum 1. The graph "
        "then has <i>N k</i> edges instead of about <i>N²</i>/2, so a diffusion step costs "
        "<i>O(N k)</i>: this is how heatformer runs heat and Laplacian heads on long "
        "sequences (a sparse matrix product per step). Most of the structure survives.",
        "topk.png",
    )
    # 6. token geometry per layer
    if data.per_layer:
        plot_per_layer(
            data.per_layer, ylabel="within-sequence share of variance", first_layer=0,
            title="how far apart the tokens of a sequence stay", save=out / "geometry.png",
        )  # fmt: skip
        wrote("geometry.png")
        page.add(
            "Token geometry across layers",
            "The share of the token variance that lies within a sequence (the rest is "
            "between sequences), after the embedding (layer 0) and after each block, on "
            "held-out windows. Averaging (attention, heat) pulls the tokens of a sequence "
            "together; Laplacian heads push them apart (Zhang &amp; Papyan, 2026). Tiny "
            "models trained for seconds: measure, don't assume.",
            "geometry.png",
        )
    loss_text = "; ".join(
        f"<code>{html.escape(k)}</code> training loss {a:.2f} → {b:.2f} nats/byte"
        for k, (a, b) in data.losses.items()
    )
    bar.close()
    index = out / "index.html"
    _write_page(
        index,
        "heatformer: attention as a graph",
        f"What a small transformer's attention looks like as a graph, on the sentence "
        f"<code>{html.escape(data.text)}</code>. Pictures of layer {layer_no}; the attention "
        f"head is head {att}" + (f", the Laplacian head head {lap}." if lap is not None else "."),
        page,
        " ".join(p for p in (html.escape(data.meta), loss_text) if p),
    )
    return DemoResult(
        out_dir=out,
        index_html=index,
        files=tuple(out / f for f in files),
        losses=dict(data.losses),
        seconds=time.perf_counter() - start,
    )
