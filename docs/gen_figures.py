"""Generate the documentation's figures with heatformer.viz (run by the mkdocs hook).

    python docs/gen_figures.py [OUT_DIR]      # default: docs/figures

Every figure is drawn by the library from a fixed seed, so the pictures in the docs are what
the code does. The folder is generated, not committed (see .gitignore); a stamp file holds a
hash of this script and of heatformer.viz, so an unchanged build skips the work.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import heatformer.viz
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    SoftmaxGraph,
    spectrum,
)
from heatformer.viz import (
    animate_heat_diffusion,
    draw_attention_graph,
    plot_attention_matrix,
    plot_frequency_responses,
    plot_heat_diffusion,
    plot_operator_outputs,
    plot_spectra,
    plot_topk_pruning,
)

DOCS = Path(__file__).resolve().parent
SENTENCE = "attention is a graph"


def sentence_graph(causal: bool = True) -> SoftmaxGraph:
    """A fixed random attention graph on the sentence's characters, batch shape (1,)."""
    gen = torch.Generator().manual_seed(3)
    n = len(SENTENCE)
    q = 1.6 * torch.randn(1, n, 8, generator=gen, dtype=torch.float64)
    k = 1.6 * torch.randn(1, n, 8, generator=gen, dtype=torch.float64)
    return SoftmaxGraph(q, k, causal=causal)


def path_graph(n: int = 12) -> DenseGraph:
    """A symmetric path 0 - 1 - ... - (n-1) with unit weights."""
    w = torch.zeros(n, n, dtype=torch.float64)
    idx = torch.arange(n - 1)
    w[idx, idx + 1] = w[idx + 1, idx] = 1.0
    return DenseGraph(w)


def _attention_graph(out: Path) -> None:
    draw_attention_graph(sentence_graph(), 0, tokens=SENTENCE, save=out / "attention_graph.png")


def _attention_circle(out: Path) -> None:
    draw_attention_graph(
        sentence_graph(causal=False), 0, tokens=SENTENCE, layout="circular", top_k=3,
        save=out / "attention_circular.png",
    )  # fmt: skip


def _attention_matrix(out: Path) -> None:
    plot_attention_matrix(sentence_graph(), 0, tokens=SENTENCE, save=out / "attention_matrix.png")


def _spectra(out: Path) -> None:
    plot_spectra(sentence_graph(causal=False), 0, save=out / "spectra.png")


def _heat_path(out: Path) -> None:
    plot_heat_diffusion(
        path_graph(), 3, (0.0, 1.0, 4.0, 16.0), normalization="combinatorial", top_k=None,
        save=out / "heat_path.png",
    )  # fmt: skip


def _heat_sentence(out: Path) -> None:
    plot_heat_diffusion(
        sentence_graph(), 4, (0.0, 1.0, 3.0), index=0, tokens=SENTENCE,
        save=out / "heat_sentence.png",
    )  # fmt: skip
    animate_heat_diffusion(
        sentence_graph(), 4, torch.linspace(0.0, 5.0, 16), index=0, tokens=SENTENCE,
        save=out / "heat_sentence.gif",
    )  # fmt: skip


def _responses(out: Path) -> None:
    plot_frequency_responses(
        {
            "attention  1 − λ": Attention(),
            "laplacian  λ": Laplacian(),
            "heat t=1": HeatKernel(t=1.0),
            "heat t=4": HeatKernel(t=4.0),
            "ppr α=0.15": PersonalizedPageRank(alpha=0.15),
            "polynomial (1 − λ/2)²": Polynomial([1.0, -1.0, 0.25]),
        },
        eigenvalues=spectrum(DenseGraph(sentence_graph(causal=False).to_dense()[0]), "sym"),
        save=out / "frequency_responses.png",
    )  # fmt: skip


def _outputs(out: Path) -> None:
    x = torch.randn(len(SENTENCE), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    plot_operator_outputs(
        sentence_graph(), x, {"attention P x": Attention(), "laplacian (I − P) x": Laplacian()},
        index=0, tokens=SENTENCE, save=out / "operator_outputs.png",
    )  # fmt: skip


def _topk(out: Path) -> None:
    plot_topk_pruning(sentence_graph(), 0, ks=(None, 3, 1), tokens=SENTENCE, save=out / "topk.png")


#: file name(s) -> the function that writes them
FIGURES: dict[tuple[str, ...], Callable[[Path], None]] = {
    ("attention_graph.png",): _attention_graph,
    ("attention_circular.png",): _attention_circle,
    ("attention_matrix.png",): _attention_matrix,
    ("spectra.png",): _spectra,
    ("heat_path.png",): _heat_path,
    ("heat_sentence.png", "heat_sentence.gif"): _heat_sentence,
    ("frequency_responses.png",): _responses,
    ("operator_outputs.png",): _outputs,
    ("topk.png",): _topk,
}


def _fingerprint() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(Path(heatformer.viz.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def generate(out: Path | None = None, *, force: bool = False) -> list[Path]:
    """Write every figure into ``out`` (default ``docs/figures``); skip when up to date.

    Returns:
        The paths of all figures.
    """
    out = DOCS / "figures" if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for names in FIGURES for name in names]
    stamp = out / ".stamp"
    fingerprint = _fingerprint()
    fresh = stamp.exists() and stamp.read_text() == fingerprint
    if force or not fresh or not all(p.exists() for p in paths):
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for write in FIGURES.values():
                write(out)
        finally:
            torch.set_num_threads(previous)
        stamp.write_text(fingerprint)
    return paths


if __name__ == "__main__":
    written = generate(Path(sys.argv[1]) if len(sys.argv) > 1 else None, force=True)
    print(f"wrote {len(written)} figures to {written[0].parent}")
