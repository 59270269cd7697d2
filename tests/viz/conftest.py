"""Helpers for the viz tests: skip without matplotlib, small graphs, image-file checks.

Tests get the helpers through the session-scoped ``vh`` fixture (``--import-mode=importlib``
means test modules cannot import one another or this file).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("matplotlib", reason="heatformer.viz needs the viz extra (matplotlib)")

from heatformer.graph_ops import DenseGraph, SoftmaxGraph
from heatformer.viz import DemoResult, build_demo

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


@pytest.fixture(scope="session")
def vh() -> SimpleNamespace:
    """The helpers above: ``random_attention``, ``random_symmetric``, ``assert_png``,
    ``gif_frames``."""
    return SimpleNamespace(
        random_attention=random_attention,
        random_symmetric=random_symmetric,
        assert_png=assert_png,
        gif_frames=gif_frames,
    )


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, float]:
    """The default teaching demo, built once: ``(result, wall seconds)``."""
    start = time.perf_counter()
    result = build_demo(tmp_path_factory.mktemp("demo"))
    return result, time.perf_counter() - start
