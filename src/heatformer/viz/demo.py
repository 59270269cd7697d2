"""The teaching demo: attention graphs of a small trained transformer, as pictures and a page.

:func:`build_demo` trains two tiny byte-level GPTs for a few hundred steps on a built-in
corpus (the source code of a few Python standard-library modules, so it needs no download),
one with four attention heads and one with two attention and two Laplacian heads, reads the
attention graphs of the second on a sentence, and :func:`render_demo` writes PNG pictures, an
animated GIF and an ``index.html`` that explains what each picture teaches:

1. attention is a graph (and a matrix), one per head and layer;
2. its Laplacian spectrum, for each normalization;
3. heat flow of a one-hot signal over time;
4. how a Laplacian head differs from an attention head (high-pass vs low-pass);
5. top-k pruning;
6. token geometry across layers, attention-only vs with Laplacian heads.

The whole demo runs in well under a minute on one CPU core. ``heatformer demo`` is the command.
"""

from __future__ import annotations

import html
import importlib
import inspect
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer._progress import Progress
from heatformer.analysis import LayerSnapshot, snapshot_attention
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    DiffusionOperator,
    Graph,
    HeatKernel,
    Laplacian,
    spectrum,
)
from heatformer.viz._common import PathLike, new_figure, require_matplotlib, save_figure
from heatformer.viz.diffusion import animate_heat_diffusion, plot_heat_diffusion
from heatformer.viz.graphs import draw_attention_graph, plot_attention_matrix, plot_topk_pruning
from heatformer.viz.layers import plot_per_layer
from heatformer.viz.spectra import plot_frequency_responses, plot_operator_outputs, plot_spectra

__all__ = [
    "DEFAULT_TEXT",
    "DEMO_LAYERS",
    "DemoResult",
    "LayerSnapshot",
    "build_demo",
    "demo_corpus",
    "render_demo",
    "snapshot_attention",
    "train_tiny_gpt",
]

#: The sentence the demo looks at (the corpus is Python source, so a line of Python).
DEFAULT_TEXT = "def add(a, b): return a + b"

#: Standard-library modules whose source is the demo's training corpus.
CORPUS_MODULES = (
    "argparse", "collections", "dataclasses", "enum", "functools", "json.decoder", "string",
    "textwrap", "typing",
)  # fmt: skip

#: The two model configurations trained by the demo: name -> head spec.
DEMO_HEADS = {"attention:4": "attention:4", "attention:2,laplacian:2": "attention:2,laplacian:2"}

#: Layers of the demo GPTs (the ``layer`` of :func:`build_demo` indexes them).
DEMO_LAYERS = 2


def demo_corpus(modules: Sequence[str] = CORPUS_MODULES, max_bytes: int = 400_000) -> bytes:
    """The demo's built-in training text: the source code of a few stdlib modules (UTF-8).

    Args:
        modules: importable module names whose source is concatenated.
        max_bytes: cap on the returned length.

    Raises:
        ValueError: the sources could not be read (e.g. a Python without ``.py`` files).
    """
    chunks = []
    for name in modules:
        try:
            chunks.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError):
            continue
    text = "".join(chunks).encode("utf-8")[:max_bytes]
    if len(text) < 10_000:
        raise ValueError(
            f"modules: expected readable Python sources of at least 10000 bytes, got "
            f"{len(text)} from {list(modules)}"
        )
    return text


def _byte_ids(text: str | bytes) -> Tensor:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return torch.tensor(list(data), dtype=torch.long)


def train_tiny_gpt(
    corpus: str | bytes,
    *,
    heads: str,
    steps: int = 200,
    seed: int = 0,
    block_size: int = 64,
    batch_size: int = 16,
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 64,
    lr: float = 3e-3,
    max_seconds: float | None = None,
    progress: bool = False,
) -> tuple[nn.Module, list[float]]:
    """Train a tiny byte-level :class:`~heatformer.models.GPT` with AdamW (a plain loop).

    Args:
        corpus: training text (bytes or str, read as UTF-8 bytes; vocabulary 256).
        heads: the head spec, e.g. ``"attention:2,laplacian:2"``.
        steps: optimizer steps.
        seed: seeds the initialization and the batches.
        block_size, batch_size, n_layer, n_head, n_embd: model and batch sizes.
        lr: learning rate.
        max_seconds: stop early after this much wall time (``None``: no limit).
        progress: report the steps on stderr (:mod:`heatformer._progress`: a bar on a
            terminal, one line per 10 % otherwise), as ``demo <heads>``.

    Returns:
        ``(model in eval mode, training loss of every step)``.
    """
    from heatformer.models import GPT, GPTConfig

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    data = _byte_ids(corpus)
    if data.numel() <= block_size + 1:
        raise ValueError(f"corpus: expected more than {block_size + 1} bytes, got {data.numel()}")
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            vocab_size=256, block_size=block_size, n_layer=n_layer, n_head=n_head,
            n_embd=n_embd, heads=heads,
        )
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(block_size + 1)  # (N+1,)
    losses: list[float] = []
    start = time.perf_counter()
    bar = Progress(steps, f"demo {heads}", enabled=progress, leave=False)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - block_size - 1, (batch_size, 1), generator=gen)
        window = data[starts + offsets]  # (B, N+1)
        x, y = window[:, :-1], window[:, 1:]  # (B, N) each
        logits = model(x)  # (B, N, 256)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        bar.update(1, loss=losses[-1])
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            break
    bar.close()
    model.eval()
    return model, losses


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


def _first_head(ops: Sequence[DiffusionOperator], kind: type) -> int | None:
    for h, op in enumerate(ops):
        if type(op) is kind:
            return h
    return None


def _op_label(op: DiffusionOperator) -> str:
    return op.name


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


def render_demo(
    out_dir: PathLike,
    layers: Sequence[LayerSnapshot],
    *,
    text: str,
    layer: int = 0,
    source: int | None = None,
    per_layer: Mapping[str, Sequence[float]] | None = None,
    losses: Mapping[str, tuple[float, float]] | None = None,
    meta: str = "",
    gif: bool = True,
    progress: bool = False,
) -> DemoResult:
    """Write the demo's pictures and ``index.html`` for given attention snapshots.

    Args:
        out_dir: output folder (created).
        layers: one :class:`LayerSnapshot` per layer, e.g. from :func:`snapshot_attention`
            (or random graphs, to try the pictures without a model).
        text: the sentence (one token per character; ``len(text)`` must be ``N``).
        layer: which layer the single-head pictures use.
        source: the token that receives the drop of heat (default ``N // 3``).
        per_layer: ``{config: [within-sequence variance share per layer]}`` for the last
            picture (skipped when ``None``).
        losses: ``{config: (first, last)}`` training losses, shown on the page.
        meta: a line of HTML-escaped text about the run, shown under the title.
        gif: also write the animated GIF of the heat flow.
        progress: report the pictures written on stderr (:mod:`heatformer._progress`).

    Returns:
        The :class:`DemoResult`.
    """
    require_matplotlib()
    start = time.perf_counter()
    if not layers:
        raise ValueError("layers: expected at least one LayerSnapshot")
    if not -len(layers) <= layer < len(layers):
        raise ValueError(f"layer: expected an index into {len(layers)} layers, got {layer}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    snap = layers[layer]
    n = snap.graph.num_nodes
    tokens = list(text)
    if len(tokens) != n:
        raise ValueError(f"text: expected {n} characters (one per node), got {len(tokens)}")
    heads = len(snap.operators)
    att = _first_head(snap.operators, Attention)
    att = 0 if att is None else att
    lap = _first_head(snap.operators, Laplacian)
    if source is None:  # the most attended token after the first (often a sink) and before the end
        received = snap.graph.in_degree()[att]  # (N,)
        source = 1 + int(received[1 : max(2, n - 2)].argmax()) if n > 3 else 0
    elif not -n <= source < n:
        raise ValueError(f"source: expected a token index in [0, {n}), got {source}")
    layer_no = layer % len(layers)
    files: list[str] = []
    page = _Page()
    bar = Progress(
        6 + bool(gif) + bool(per_layer), "demo pictures", unit="picture", enabled=progress
    )

    def wrote(name: str) -> None:
        files.append(name)
        bar.update(1)

    def name_of(h: int) -> str:
        return f"head {h} ({_op_label(snap.operators[h])})"

    # 1. attention is a graph
    draw_attention_graph(
        snap.graph, att, tokens=tokens, layout="arc",
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
    fig = new_figure((3.0 * heads + 0.5, 3.0 * len(layers) + 0.4))
    for li, s in enumerate(layers):
        for h in range(heads):
            ax = fig.add_subplot(len(layers), heads, li * heads + h + 1)
            plot_attention_matrix(
                s.graph, h, tokens=tokens, ax=ax, colorbar=False,
                title=f"layer {li}, head {h}: {_op_label(s.operators[h])}",
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
    plot_spectra(snap.graph, att, save=out / "spectrum.png")
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
    plot_heat_diffusion(
        snap.graph, source, (0.0, 0.5, 1.0, 2.0, 4.0), index=att, tokens=tokens,
        save=out / "heat_flow.png",
    )  # fmt: skip
    wrote("heat_flow.png")
    shown = ["heat_flow.png"]
    if gif:
        animate_heat_diffusion(
            snap.graph, source, torch.linspace(0.0, 6.0, 25), index=att, tokens=tokens,
            save=out / "heat_flow.gif",
        )  # fmt: skip
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
    lap_head = lap if lap is not None else att
    ev = spectrum(_one(snap.graph, lap_head), "rw")
    fig = new_figure((12.5, 4.2))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ops = {"attention head: P = I − L": Attention(), "Laplacian head: L = I − P": Laplacian()}
    plot_frequency_responses(
        {**ops, "heat head t=1: exp(−L)": HeatKernel(t=1.0)}, eigenvalues=ev, ax=ax1,
        title="what each head does to each frequency",
    )  # fmt: skip
    channel = snap.values[lap_head, :, 0]  # (N,)
    plot_operator_outputs(
        snap.graph, channel, ops, index=lap_head, tokens=tokens, ax=ax2,
        title=f"one value channel on layer {layer_no}, head {lap_head}",
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
    plot_topk_pruning(snap.graph, att, ks=(None, 4, 2), tokens=tokens, save=out / "topk.png")
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
    if per_layer:
        plot_per_layer(
            per_layer, ylabel="within-sequence share of variance", first_layer=0,
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
        for k, (a, b) in (losses or {}).items()
    )
    bar.close()
    index = out / "index.html"
    _write_page(
        index,
        "heatformer: attention as a graph",
        f"What a small transformer's attention looks like as a graph, on the sentence "
        f"<code>{html.escape(text)}</code>. Pictures of layer {layer_no}; the attention "
        f"head is head {att}" + (f", the Laplacian head head {lap}." if lap is not None else "."),
        page,
        " ".join(p for p in (html.escape(meta), loss_text) if p),
    )
    return DemoResult(
        out_dir=out,
        index_html=index,
        files=tuple(out / f for f in files),
        losses=dict(losses or {}),
        seconds=time.perf_counter() - start,
    )


def _one(graph: Graph, h: int) -> Graph:
    return DenseGraph(graph.to_dense()[h].detach().to(torch.float64))


def _within_share(model: nn.Module, corpus: bytes, block_size: int) -> list[float]:
    """Within-sequence share of the token variance after the embedding and each block."""
    from heatformer.analysis import collect_token_states, within_sequence_variance

    data = _byte_ids(corpus[-(32 * block_size + 1) :])
    windows = data[: (data.numel() // block_size) * block_size].view(-1, block_size)[:32]
    names = [f"blocks.{i}" for i in range(len(model.blocks))]  # type: ignore[arg-type]
    states = collect_token_states(model, windows, ["drop", *names])
    shares = []
    for h in states.values():
        h = h.to(torch.float64)
        total = ((h - h.mean((0, 1))) ** 2).sum(-1).mean()
        shares.append(float(within_sequence_variance(h) / total))
    return shares


def _check_writable(out: Path) -> None:
    """Create ``out`` and write a scratch file there, or raise ``ValueError``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ValueError(
            f"out_dir: expected a folder that can be created and written, got {out} "
            f"({err.strerror or err})"
        ) from None


def build_demo(
    out_dir: PathLike,
    *,
    text: str = DEFAULT_TEXT,
    steps: int = 200,
    seed: int = 0,
    layer: int = 0,
    corpus: str | bytes | None = None,
    compare: bool = True,
    gif: bool = True,
    max_train_seconds: float | None = 15.0,
    num_threads: int | None = 1,
    progress: bool = False,
) -> DemoResult:
    """Train small GPTs briefly, look at their attention on ``text``, write the pictures + page.

    Args:
        out_dir: output folder (created); ``index.html`` is the page.
        text: the sentence, 2 to 64 bytes of UTF-8 (one token per byte).
        steps: training steps per model.
        seed: seeds training and batches.
        layer: the layer shown in the single-head pictures.
        corpus: training text (default :func:`demo_corpus`).
        compare: also train an attention-only model and plot the token geometry of both.
        gif: also write the heat-flow GIF.
        max_train_seconds: stop training a model early after this many seconds.
        num_threads: torch CPU threads while the demo runs (1 is fastest for these tiny
            models; restored afterwards); ``None`` leaves the setting alone.
        progress: report the training steps and the pictures on stderr
            (:mod:`heatformer._progress`; ``heatformer demo`` turns it on).

    Returns:
        The :class:`DemoResult`.

    Raises:
        ValueError: ``text`` of the wrong length, ``layer`` not an index into the
            :data:`DEMO_LAYERS` layers, ``steps`` not positive, or an ``out_dir`` that
            cannot be created or written (all checked before any training).
    """
    require_matplotlib()
    start = time.perf_counter()
    raw = text.encode("utf-8")
    if not 2 <= len(raw) <= 64:
        raise ValueError(f"text: expected 2 to 64 bytes of UTF-8, got {len(raw)}")
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer: expected an int, got {type(layer).__name__}")
    if not -DEMO_LAYERS <= layer < DEMO_LAYERS:
        raise ValueError(f"layer: expected an index into {DEMO_LAYERS} layers, got {layer}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    _check_writable(Path(out_dir))
    labels = [chr(b) if b < 128 else "·" for b in raw]
    data = demo_corpus() if corpus is None else corpus
    data_bytes = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        configs = DEMO_HEADS if compare else {"attention:2,laplacian:2": "attention:2,laplacian:2"}
        models: dict[str, nn.Module] = {}
        losses: dict[str, tuple[float, float]] = {}
        done = steps
        for name, heads in configs.items():
            model, curve = train_tiny_gpt(
                data_bytes, heads=heads, steps=steps, seed=seed, n_layer=DEMO_LAYERS,
                max_seconds=max_train_seconds, progress=progress,
            )  # fmt: skip
            models[name] = model
            losses[name] = (curve[0], float(sum(curve[-10:]) / len(curve[-10:])))
            done = min(done, len(curve))
        main = models["attention:2,laplacian:2"]
        layers = snapshot_attention(main, _byte_ids(raw).unsqueeze(0))
        per_layer = (
            {name: _within_share(m, data_bytes, 64) for name, m in models.items()}
            if compare
            else None
        )
        result = render_demo(
            out_dir, layers, text="".join(labels), layer=layer, per_layer=per_layer,
            losses=losses, gif=gif, progress=progress,
            meta=f"Two-layer byte-level GPTs (4 heads, width 64) trained for {done} steps "
            f"(seed {seed}) on the source of {len(CORPUS_MODULES)} standard-library modules.",
        )  # fmt: skip
    finally:
        torch.set_num_threads(previous)
    return DemoResult(
        out_dir=result.out_dir,
        index_html=result.index_html,
        files=result.files,
        losses=result.losses,
        seconds=time.perf_counter() - start,
    )
