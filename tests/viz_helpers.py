"""Shared helpers of the viz tests: small graphs, image-file checks, numpy references.

Test modules import it directly (``import viz_helpers as vh``; ``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from heatformer.graph_ops import DenseGraph, SoftmaxGraph

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def random_attention(
    n: int = 9, heads: int = 2, *, causal: bool = False, seed: int = 0
) -> SoftmaxGraph:
    """A float64 attention graph of batch shape ``(heads,)``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(heads, n, 4, generator=gen, dtype=torch.float64)
    return SoftmaxGraph(q, k, causal=causal)


def random_symmetric(n: int = 7, seed: int = 0) -> DenseGraph:
    """An unbatched symmetric graph with positive weights and no self-loops."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(n, n, generator=gen, dtype=torch.float64)
    w = (w + w.T) * (1 - torch.eye(n, dtype=torch.float64))
    return DenseGraph(w)


def stationary_reference(p) -> np.ndarray:
    """TokenRank of a row-stochastic ``p`` ``(N, N)`` from numpy alone: the eigenvector of
    ``Pᵀ`` for the eigenvalue nearest 1 (``numpy.linalg.eig``), summing to 1."""
    values, vectors = np.linalg.eig(np.asarray(p, dtype=np.float64).T)
    v = vectors[:, np.argmin(np.abs(values - 1))].real
    return v / v.sum()


def second_eigenvector_reference(p) -> tuple[np.ndarray, complex]:
    """``(v₂, λ₂)`` of ``p`` ``(N, N)`` from ``numpy.linalg.eig``: ``λ₂`` second in the order
    of decreasing modulus (then real part, then + imaginary part first), ``v₂`` its right
    eigenvector at unit length with its largest entry made real and positive."""
    values, vectors = np.linalg.eig(np.asarray(p, dtype=np.float64))
    order = np.lexsort((-values.imag, -values.real, -np.abs(values).round(12)))
    v = vectors[:, order[1]].astype(np.complex128)
    v = v / np.linalg.norm(v)
    top = v[np.argmax(np.abs(v).round(12))]
    return v * abs(top) / top, complex(values[order[1]])


def assert_png(path: Path) -> tuple[int, int]:
    """``path`` is a PNG that Pillow decodes; returns its size."""
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def gif_frames(path: Path) -> int:
    """Number of frames of the GIF at ``path`` (checked to be a GIF)."""
    from PIL import Image

    assert path.read_bytes()[:6] in (b"GIF87a", b"GIF89a")
    with Image.open(path) as image:
        assert image.format == "GIF"
        return int(image.n_frames)


def page_text(path: Path) -> dict[str, str]:
    """The words of a demo ``index.html``, tags removed: ``{"intro", "meta", section id: text}``."""
    import html
    import re

    page = path.read_text(encoding="utf-8")

    def plain(fragment: str) -> str:
        return html.unescape(re.sub(r"<[^>]+>", "", fragment))

    words = {
        "intro": plain(re.search(r"</h1>\s*<p>(.*?)</p>", page, re.S).group(1)),
        "meta": plain(re.search(r'<p class="meta">(.*?)</p>', page, re.S).group(1)),
    }
    for key, body in re.findall(r'<section id="([^"]+)">(.*?)</section>', page, re.S):
        words[key] = plain(re.search(r"<p>(.*?)</p>", body, re.S).group(1))
    return words


def wcag_contrast(a, b) -> float:
    """The WCAG 2 contrast ratio of two sRGB colours, channels in [0, 1] (1 to 21), written
    out here from the standard so that the library's own function is not its own oracle."""

    def luminance(c) -> float:
        r, g, b = (v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c[:3])
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def node_labels(ax, *, draw: bool = True) -> list[tuple[str, float, bool]]:
    """``(label, contrast with its node, halo in the node's colour)`` for every node label of
    a :func:`~heatformer.viz.draw_attention_graph` axes, from the colours as drawn (the figure
    is drawn first unless ``draw`` is false, e.g. right after a GIF frame was grabbed)."""
    from matplotlib.colors import to_rgb, to_rgba

    from heatformer.viz import find_collection

    if draw:
        ax.figure.canvas.draw()  # face colours are mapped from the values at draw time
    faces = find_collection(ax, "nodes").get_facecolors()  # (N, 4)
    assert len(ax.texts) == len(faces), "one label per node"
    out = []
    for text, face in zip(ax.texts, faces):
        halos = [getattr(e, "_gc", {}).get("foreground") for e in text.get_path_effects()]
        halo = any(h is not None and to_rgba(h) == tuple(face) for h in halos)
        out.append((text.get_text(), wcag_contrast(to_rgb(text.get_color()), face), halo))
    return out
