"""Library hygiene of heatformer.viz: no pyplot, no print, a clear message without matplotlib."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import heatformer.viz
from heatformer.viz import require_matplotlib, token_labels

VIZ = Path(heatformer.viz.__file__).parent


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match=r"pip install heatformer\[viz\]"):
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
    for path in VIZ.glob("*.py"):
        if path.name == "_cli.py":  # the command-line front end prints by design
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                assert name not in {"print", "show"}, f"{path.name}:{node.lineno} calls {name}"


def test_token_labels() -> None:
    assert token_labels(b"a \t", 3) == ["a", "␣", "⇥"]
    assert token_labels(None, 3) == ["0", "1", "2"]
    assert token_labels(["", "\x00"], 2) == ["∅", "·"]
    with pytest.raises(ValueError, match="tokens: expected 2 labels"):
        token_labels("abc", 2)
