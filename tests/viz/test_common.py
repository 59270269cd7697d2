"""Library hygiene of heatformer.viz: no pyplot, no print, a clear message without matplotlib."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import heatformer.lab.demo
import heatformer.viz
from heatformer.checks import ArgumentError
from heatformer.lab.demo import build_demo, demo_from_snapshots
from heatformer.viz import (
    animate_heat_diffusion,
    draw_attention_graph,
    find_collection,
    new_figure,
    plot_frequency_responses,
    plot_heat_diffusion,
    plot_per_layer,
    plot_spectra,
    plot_topk_pruning,
    require_matplotlib,
    save_figure,
    token_labels,
)

VIZ = Path(heatformer.viz.__file__).parent
DEMO = Path(heatformer.lab.demo.__file__).parent


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match=r"pip install 'heatformer\[viz\]'"):
        require_matplotlib()


def test_plots_use_agg_without_pyplot() -> None:
    code = (
        "import sys, torch\n"
        "from heatformer.viz import draw_attention_graph\n"
        "fig = draw_attention_graph(torch.rand(4, 4))\n"
        "fig.canvas.draw()\n"
        "print(type(fig.canvas).__name__, 'matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["FigureCanvasAgg", "False"]


def test_no_print_or_show_in_the_library() -> None:
    paths = sorted([*VIZ.rglob("*.py"), *DEMO.rglob("*.py")])
    assert DEMO / "page.py" in paths
    for path in paths:
        if path.name == "_cli.py":  # the command-line front end prints by design
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                assert name not in {"print", "show"}, f"{path.name}:{node.lineno} calls {name}"


def test_a_figure_of_ones_own_is_saved_by_suffix(tmp_path) -> None:
    fig = new_figure((2.0, 1.5))
    assert type(fig.canvas).__name__ == "FigureCanvasAgg" and fig.axes == []
    fig.add_subplot().plot([0, 1], [1, 0])
    save_figure(fig, None)  # nothing to write
    assert list(tmp_path.iterdir()) == []
    save_figure(fig, tmp_path / "new" / "f.svg")
    assert (tmp_path / "new" / "f.svg").read_text().lstrip().startswith("<?xml")
    save_figure(fig, tmp_path / "f.png", dpi=50)
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_token_labels() -> None:
    assert token_labels(b"a \t", 3) == ["a", "␣", "⇥"]
    assert token_labels(None, 3) == ["0", "1", "2"]
    assert token_labels(["", "\x00"], 2) == ["∅", "·"]
    with pytest.raises(ValueError, match="tokens: expected 2 labels"):
        token_labels("abc", 2)


_W = torch.full((3, 3), 1 / 3)


@pytest.mark.parametrize(
    ("call", "argument", "kind"),
    [
        (lambda: draw_attention_graph(_W, layout="grid"), "layout", ValueError),
        (lambda: draw_attention_graph(_W, min_weight=-1.0), "min_weight", ValueError),
        (lambda: draw_attention_graph(_W, node_values=[1.0]), "node_values", ValueError),
        (lambda: draw_attention_graph(_W, 0), "index", ValueError),
        (lambda: draw_attention_graph([[1.0]]), "graph", TypeError),
        (lambda: draw_attention_graph(_W, tokens="ab"), "tokens", ValueError),
        (lambda: find_collection(draw_attention_graph(_W), "legend"), "gid", ValueError),
        (lambda: plot_topk_pruning(_W, ks=()), "ks", ValueError),
        (lambda: plot_heat_diffusion(_W, True), "signal", TypeError),
        (lambda: plot_heat_diffusion(_W, 0, times=[]), "times", ValueError),
        (lambda: animate_heat_diffusion(_W, 0, save="heat.png"), "save", ValueError),
        (lambda: animate_heat_diffusion(_W, 0, save="heat.gif", fps=0), "fps", ValueError),
        (lambda: plot_spectra(_W, normalizations=()), "normalizations", ValueError),
        (lambda: plot_frequency_responses(num=1), "num", ValueError),
        (lambda: plot_per_layer({}), "values", ValueError),
        (lambda: plot_per_layer({"a": [1.0, 0.0]}, logy=True), "values", ValueError),
        (lambda: demo_from_snapshots([], text="ab"), "layers", ValueError),
        (lambda: build_demo("unused", text="x"), "text", ValueError),
        (lambda: build_demo("unused", layer=1.0), "layer", TypeError),
    ],
)  # fmt: skip
def test_errors_carry_the_argument_name(call, argument: str, kind: type) -> None:
    with pytest.raises(kind) as info:
        call()
    assert isinstance(info.value, ArgumentError)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: ")
