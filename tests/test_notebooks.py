"""The docs' notebooks run, offline, and say what they stored.

Every code cell of every ``docs/**/*.ipynb`` runs in order in one namespace, in this process
(``docs/notebooks.py``: one "kernel", no Jupyter needed), with every network connection
refused. The text a cell prints today must match the text stored in the notebook (numbers to
a few per cent, since the last digits of rounding errors differ between machines), and a cell
that stored a picture must still return a figure. The docs page rendered from a notebook holds
its markdown, its code and its pictures.
"""

from __future__ import annotations

import importlib.util
import math
import re
import socket
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the notebooks draw with heatformer.viz")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "heatformer_docs_notebooks", ROOT / "docs/notebooks.py"
)
assert _spec is not None and _spec.loader is not None
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)

NOTEBOOKS = notebooks.notebooks()
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def test_the_tutorial_notebook_is_there() -> None:
    assert [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS] == ["docs/tutorials/heat-flow.ipynb"]


def _same_text(stored: str, fresh: str) -> bool:
    if _NUMBER.sub("#", stored) != _NUMBER.sub("#", fresh):
        return False
    pairs = zip(_NUMBER.findall(stored), _NUMBER.findall(fresh))
    return all(math.isclose(float(a), float(b), rel_tol=0.05, abs_tol=1e-6) for a, b in pairs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_offline_and_matches_its_outputs(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("the notebooks run offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    fresh = notebooks.execute(path)
    cells = [c for c in notebooks.read(path)["cells"] if c["cell_type"] == "code"]
    assert len(fresh) == len(cells)
    for i, (cell, outputs) in enumerate(zip(cells, fresh)):
        stored = cell["outputs"]
        assert cell["execution_count"] == i + 1, "store the outputs: python docs/notebooks.py"
        assert [o["output_type"] for o in outputs] == [o["output_type"] for o in stored], i
        assert _same_text(notebooks.text_of(stored), notebooks.text_of(outputs)), (
            f"cell {i}: stored {notebooks.text_of(stored)!r}, now {notebooks.text_of(outputs)!r}"
        )
    texts = "".join(notebooks.text_of(o) for o in fresh)
    assert "mass total 1.000000000000" in texts  # the mass view conserves the total
    assert re.search(r"t = 4\.0: influence total (?!1\.0000)", texts)  # the influence view does not


def test_the_docs_page_of_a_notebook(tmp_path: Path) -> None:
    path = ROOT / "docs/tutorials/heat-flow.ipynb"
    page = notebooks.to_markdown(path)
    nb = notebooks.read(path)
    images = sum(
        "image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", [])
    )
    assert images >= 7 and page.count('<img alt="output" src="data:image/png;base64,') == images
    assert page.count("```python\n") == sum(c["cell_type"] == "code" for c in nb["cells"])
    assert "# Heat flow on an attention graph, step by step" in page
    assert "[`heat-flow.ipynb`](heat-flow.ipynb)" in page
    bad = tmp_path / "old.ipynb"
    bad.write_text('{"nbformat": 3, "cells": []}')
    with pytest.raises(ValueError, match="expected nbformat 4"):
        notebooks.read(bad)
