"""The teaching demo: it runs in under a minute, and its page shows files that exist.

The default demo is built once per session (the ``demo`` fixture of ``conftest.py``) and
shared by these tests and the browser test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from heatformer.cli import main
from heatformer.graph_ops import Attention, DenseGraph, Laplacian
from heatformer.viz import build_demo, render_demo
from heatformer.viz.demo import LayerSnapshot, snapshot_attention, train_tiny_gpt


def test_demo_runs_in_under_a_minute(demo) -> None:
    result, seconds = demo
    assert seconds < 60.0, f"the demo took {seconds:.1f} s"
    assert result.seconds <= seconds


def test_index_references_existing_pictures(demo, vh) -> None:
    result, _ = demo
    page = result.index_html.read_text(encoding="utf-8")
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert sources == [f.name for f in result.files]
    assert len(sources) == 8
    for name in sources:
        path = result.out_dir / name
        if name.endswith(".gif"):
            assert vh.gif_frames(path) > 1
        else:
            width, height = vh.assert_png(path)
            assert width > 300 and height > 150
    headings = re.findall(r"<h2>\d+\. ([^<]+)</h2>", page)
    assert headings[0] == "Attention is a graph"
    assert any("top-k" in h.lower() for h in headings)
    assert any("laplacian head" in h.lower() for h in headings)
    assert "def add(a, b): return a + b" in page


def test_training_reduces_the_loss(demo) -> None:
    result, _ = demo
    assert set(result.losses) == {"attention:4", "attention:2,laplacian:2"}
    for first, last in result.losses.values():
        assert first > 5.0  # about log(256) = 5.55 at initialization
        assert last < first - 1.5


def test_demo_training_reports_progress(capsys: pytest.CaptureFixture[str]) -> None:
    corpus = b"abcdefgh" * 64
    kwargs = {"heads": "attention:1,laplacian:1", "steps": 20, "n_head": 2, "n_embd": 16,
              "block_size": 16}  # fmt: skip
    _, losses = train_tiny_gpt(corpus, progress=True, **kwargs)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == 10  # one line per 10 %, stderr is not a terminal
    assert [int(re.search(r"step (\d+)/20", line)[1]) for line in lines] == list(range(2, 21, 2))
    assert lines[-1].startswith(
        f"demo attention:1,laplacian:1: step 20/20 (100%), loss {losses[-1]:.4g}, "
    )
    train_tiny_gpt(corpus, **kwargs)  # progress is off by default (library use)
    assert capsys.readouterr().err == ""


def test_snapshot_reads_every_layer_and_head() -> None:
    model, losses = train_tiny_gpt(b"abcdefgh" * 64, heads="attention:1,laplacian:1", steps=3,
                                   n_head=2, n_embd=16, block_size=16)  # fmt: skip
    assert len(losses) == 3
    idx = torch.tensor([list(b"abcabc")])
    layers = snapshot_attention(model, idx)
    assert len(layers) == 2
    for snap in layers:
        assert tuple(snap.graph.batch_shape) == (2,) and snap.graph.num_nodes == 6
        dense = snap.graph.to_dense()
        torch.testing.assert_close(dense.sum(-1), torch.ones(2, 6, dtype=torch.float64))
        assert bool((dense.triu(1) == 0).all())  # causal
        assert snap.values.shape == (2, 6, 8)
        assert [type(op) for op in snap.operators] == [Attention, Laplacian]


def test_render_checks_its_input(tmp_path: Path) -> None:
    snap = LayerSnapshot(
        DenseGraph(torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)),
        torch.zeros(1, 3, 2, dtype=torch.float64),
        (Attention(),),
    )
    with pytest.raises(ValueError, match="text: expected 3 characters"):
        render_demo(tmp_path, [snap], text="abcd")
    with pytest.raises(ValueError, match="layers: expected at least one"):
        render_demo(tmp_path, [], text="abc")
    with pytest.raises(ValueError, match="text: expected 2 to 64 bytes"):
        build_demo(tmp_path, text="x" * 65)


def test_cli_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    argv = [
        "demo",
        "--out",
        str(out),
        "--steps",
        "5",
        "--no-compare",
        "--no-gif",
        "--text",
        "ab cd",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert f"open {(out / 'index.html').resolve()}" in printed
    progress = captured.err.splitlines()  # training steps, then the pictures
    assert [line.split(", ")[0] for line in progress] == [
        *(f"demo attention:2,laplacian:2: step {n}/5 ({20 * n}%)" for n in range(1, 6)),
        *(f"demo pictures: picture {n}/6 ({100 * n / 6:.0f}%)" for n in range(1, 7)),
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        "attention_graph.png", "attention_heads.png", "heat_flow.png", "index.html",
        "laplacian_vs_attention.png", "spectrum.png", "topk.png",
    ]  # fmt: skip
    assert main(["demo", "--out", str(out), "--text", "x"]) == 2
    assert "text: expected 2 to 64 bytes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layer", "2"], "--layer: expected an index into 2 layers, got 2"),
        (["--layer", "-3"], "--layer: expected an index into 2 layers, got -3"),
        (["--steps", "0"], "--steps: expected a positive int, got 0"),
        (["--out", "{blocker}/out"], "--out: expected a folder that can be created and written"),
    ],
)
def test_cli_demo_refuses_bad_input_before_training(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import heatformer.viz.demo as demo_module

    trained: list[str] = []
    monkeypatch.setattr(demo_module, "train_tiny_gpt", lambda *a, **k: trained.append("x"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "out"
    argv = [a.format(blocker=blocker) for a in argv]
    code = main(["demo", "--out", str(out), *argv] if "--out" not in argv else ["demo", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"heatformer demo: error: {message}")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert trained == []  # refused before minutes of training, so nothing is lost
    assert not out.exists()
