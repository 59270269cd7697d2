"""The demo on the shortest texts its help allows (2 bytes): every picture is drawn.

``heatformer demo --text ab`` used to train for a minute and then fail with ``k_top: expected
1 <= k_top <= 2, got 4``: the top-k picture asked a 2-token graph for its 4 strongest edges.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heatformer.graph_ops import Attention, DenseGraph, Laplacian, SoftmaxGraph
from heatformer.lab.cli import _build_parsers, main
from heatformer.lab.demo import LayerSnapshot, demo_from_snapshots

pytest.importorskip("matplotlib")


def _causal_layers(n: int) -> list[LayerSnapshot]:
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(4, n, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    graph = DenseGraph(SoftmaxGraph(q, k, causal=True).to_dense())  # (H, N, N)
    return [LayerSnapshot(graph, v, (Attention(), Attention(), Laplacian(), Laplacian()))]


@pytest.mark.parametrize(("text", "ks"), [("ab", (1,)), ("abc", (2,)), ("abcd", (2,))])
def test_short_texts_prune_to_fewer_edges_than_tokens(text: str, ks: tuple[int, ...]) -> None:
    data = demo_from_snapshots(_causal_layers(len(text)), text=text)
    n = len(text)
    assert list(data.topk) == ["full attention", *(f"top-{k}" for k in ks)]
    head = data.attention[0, data.attention_head]  # (N, N)
    for k in ks:
        kept = data.topk[f"top-{k}"]
        # each query keeps its min(k, i + 1) heaviest keys, renormalized to sum 1
        assert (kept > 0).sum(-1).tolist() == torch.arange(1, n + 1).clamp(max=k).tolist()
        torch.testing.assert_close(kept.sum(-1), torch.ones(n, dtype=torch.float64))
        for i in range(n):
            heaviest = torch.topk(head[i, : i + 1], min(k, i + 1)).indices
            assert set(kept[i].nonzero().flatten().tolist()) == set(heaviest.tolist())


def test_cli_demo_of_two_bytes_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The help's minimum is the true one: 2 bytes draw every picture; 1 byte is refused."""
    monkeypatch.setenv("COLUMNS", "300")  # no line wrapping in the help page
    assert "sentence to look at, 2-64 bytes" in _build_parsers()[1]["demo"].format_help()
    out = tmp_path / "out"
    argv = ["demo", "--out", str(out), "--steps", "2", "--no-compare", "--no-gif", "--no-progress"]
    assert main([*argv, "--text", "ab"]) == 0
    assert "open " in capsys.readouterr().out
    assert (out / "topk.png").is_file() and (out / "explore.html").is_file()
    assert main([*argv, "--text", "a"]) == 2
    assert "--text: expected 2 to 64 bytes of UTF-8, got 1" in capsys.readouterr().err
