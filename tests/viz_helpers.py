"""Shared helpers of the viz tests: small graphs and image-file checks.

Test modules import it directly (``import viz_helpers as vh``; ``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

from pathlib import Path

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
