"""The docs' notebooks: run them in one namespace (one "kernel", offline) and render them.

heatformer's tutorial notebooks (``docs/**/*.ipynb``, nbformat 4) are plain Python: no magics,
no shell escapes. :func:`execute` runs their code cells in order in one namespace, in this
process, and returns the outputs of every cell as nbformat outputs: printed text
(``stream``), and the value of a cell's last expression (``execute_result``; a matplotlib
figure becomes a PNG ``display_data``). ``python docs/notebooks.py`` stores those outputs in
the notebooks; ``tests/test_notebooks.py`` runs them again and checks that the stored text is
what the code prints today. :func:`to_markdown` renders a notebook as a MkDocs page (the
markdown cells, the code, the stored outputs), which ``docs/hooks.py`` adds to the site.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent


def notebooks() -> list[Path]:
    """The notebooks of the docs, sorted."""
    return sorted(p for p in DOCS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def read(path: Path) -> dict[str, Any]:
    """A notebook as a dict; refuses anything but nbformat 4 with code and markdown cells."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    if nb.get("nbformat") != 4:
        raise ValueError(f"{path}: expected nbformat 4, got {nb.get('nbformat')!r}")
    for cell in nb["cells"]:
        if cell["cell_type"] not in ("code", "markdown"):
            raise ValueError(f"{path}: expected code and markdown cells, got {cell['cell_type']}")
    return nb


def _source(cell: dict[str, Any]) -> str:
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _figure_png(fig: Any) -> str:
    """The figure as a base64 PNG, 72 dpi, 256 colours (a few times smaller than RGBA)."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=72, facecolor="white")
    buffer.seek(0)
    with Image.open(buffer) as image:
        small = image.convert("RGB").quantize(colors=256)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


def _run_cell(code: str, namespace: dict[str, Any], name: str) -> list[dict[str, Any]]:
    tree = ast.parse(code, filename=name)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, name, "exec"), namespace)
        value = eval(compile(last, name, "eval"), namespace) if last is not None else None
    outputs: list[dict[str, Any]] = []
    if out.getvalue():
        outputs.append({"output_type": "stream", "name": "stdout", "text": _lines(out.getvalue())})
    if value is None:
        return outputs
    from matplotlib.figure import Figure

    if isinstance(value, Figure):
        outputs.append({
            "output_type": "display_data", "metadata": {},
            "data": {"image/png": _figure_png(value), "text/plain": [repr(value)]},
        })  # fmt: skip
    else:
        outputs.append({
            "output_type": "execute_result", "execution_count": None, "metadata": {},
            "data": {"text/plain": _lines(repr(value))},
        })  # fmt: skip
    return outputs


def execute(path: Path) -> list[list[dict[str, Any]]]:
    """Run the code cells of a notebook in order, in one namespace; their outputs, per cell.

    Raises:
        Exception: whatever a cell raises (with the cell's number in the traceback's name).
    """
    import matplotlib

    matplotlib.use("Agg")
    nb = read(path)
    namespace: dict[str, Any] = {"__name__": "__notebook__"}
    results = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            results.append(_run_cell(_source(cell), namespace, f"{path.name}[cell {i}]"))
    return results


def text_of(outputs: list[dict[str, Any]]) -> str:
    """The text a cell printed or returned (its images left out)."""
    parts = []
    for output in outputs:
        if output["output_type"] == "stream":
            parts.append("".join(output["text"]))
        elif output["output_type"] == "execute_result":
            parts.append("".join(output["data"]["text/plain"]))
    return "".join(parts)


def store(path: Path) -> None:
    """Execute a notebook and write its outputs into it (execution counts 1, 2, ...)."""
    nb = read(path)
    results = iter(execute(path))
    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            count += 1
            cell["outputs"] = next(results)
            cell["execution_count"] = count
            for output in cell["outputs"]:
                if output["output_type"] == "execute_result":
                    output["execution_count"] = count
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def to_markdown(path: Path) -> str:
    """A notebook as a MkDocs page: its markdown cells, its code and its stored outputs."""
    nb = read(path)
    parts = [
        f"!!! note \"A notebook\"\n    This page is the notebook [`{path.name}`]({path.name}) "
        "(download it and run it with Jupyter, or read it here with the outputs it stored); "
        "the tests run every cell.\n"
    ]
    for cell in nb["cells"]:
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            parts.append(source)
            continue
        parts.append(f"```python\n{source.rstrip()}\n```")
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                png = data["image/png"]
                png = "".join(png) if isinstance(png, list) else png
                parts.append(f'<img alt="output" src="data:image/png;base64,{png.strip()}">')
            elif output["output_type"] in ("stream", "execute_result"):
                text = text_of([output]).rstrip()
                parts.append(f"```text\n{text}\n```")
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    for notebook in (Path(a) for a in sys.argv[1:]) if sys.argv[1:] else notebooks():
        store(notebook)
