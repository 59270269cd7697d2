"""The documentation stays true: its code runs, its API pages and figures exist.

``make docs`` (part of ``make test``) runs ``mkdocs build --strict``; these tests check what
a build cannot: that every ```python block of the pages we write executes without a warning a
user would see, that every
``::: name`` of the API reference imports, that the nav covers the pages, and that the figure
script writes every picture the pages show.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# pages other people write (their code blocks are theirs to test)
OPTIONAL_PAGES = {"benchmarks.md", "reproducing.md"}
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() not in OPTIONAL_PAGES
)
BLOCKS = [
    (page, i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]


def test_pages_have_code() -> None:
    assert len(PAGES) >= 15
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize(
    ("page", "index", "code"), BLOCKS, ids=[f"{p.relative_to(DOCS)}[{i}]" for p, i, _ in BLOCKS]
)
def test_python_blocks_run(page: Path, index: int, code: str) -> None:
    pytest.importorskip("matplotlib") if "heatformer.viz" in code else None
    pytest.importorskip("transformers") if "transformers" in code else None
    where = f"{page.relative_to(ROOT)}[{index}]"
    if "timm" in code:  # in a fresh interpreter, as a user runs it (no timm imported before)
        if importlib.util.find_spec("timm") is None:
            pytest.skip("timm is not installed")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 0, f"{where} failed:\n{done.stderr}"
        assert "Warning" not in done.stderr, f"{where} warns:\n{done.stderr}"
        return
    namespace: dict[str, object] = {"__name__": "__docs__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(code, where, "exec"), namespace)
    shown = [w for w in caught if _a_user_sees(w, where)]
    assert not shown, f"{where} warns: " + "; ".join(
        f"{w.category.__name__}: {w.message}" for w in shown
    )


def _a_user_sees(w: warnings.WarningMessage, where: str) -> bool:
    """Whether Python's default filters show ``w`` to a user who runs the block as a script:
    deprecations only where the script itself triggers them (a library's own deprecated calls
    at import, e.g. PyG's ``torch.jit.script``, stay silent), every other warning."""
    if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, ImportWarning)):
        return w.filename == where
    return not issubclass(w.category, ResourceWarning)


def _resolve(name: str) -> object:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def _api_entries() -> list[tuple[str, list[str]]]:
    entries = []
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, flags=re.M):
            members = re.search(r"members: \[([^\]]*)\]", match.group(2))
            names = [m.strip() for m in members.group(1).split(",")] if members else []
            entries.append((match.group(1), names))
    return entries


def test_api_reference_names_import() -> None:
    pytest.importorskip("matplotlib")
    entries = _api_entries()
    assert {name.split(".")[1] for name, _ in entries} >= {
        "graph_ops", "models", "analysis", "viz", "lab",
    }  # fmt: skip
    for name, members in entries:
        obj = _resolve(name)
        for member in members:
            assert hasattr(obj, member), f"{name} has no {member}"


def test_public_viz_api_is_documented() -> None:
    pytest.importorskip("matplotlib")
    import heatformer.viz

    page = (DOCS / "api" / "viz.md").read_text()
    missing = [
        n for n in heatformer.viz.__all__
        if f"heatformer.viz.{n}" not in page and n not in {"INSTALL_HINT", "LAYOUTS"}
    ]  # fmt: skip
    assert not missing


def test_nav_covers_every_page() -> None:
    yaml = pytest.importorskip("yaml")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !!python tags
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def targets(items: list) -> list[str]:
        out: list[str] = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out.extend(targets(value) if isinstance(value, list) else [value])
        return out

    nav = targets(config["nav"])
    assert len(nav) == len(set(nav))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    # a notebook NAME.ipynb is the page NAME.md (docs/hooks.py renders it)
    pages |= {p.relative_to(DOCS).with_suffix(".md").as_posix() for p in DOCS.rglob("*.ipynb")}
    assert pages <= set(nav)
    assert {t for t in nav if t not in pages} <= OPTIONAL_PAGES
    assert config["strict"] is True
    assert config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["paths"] == ["src"]


def test_figure_script_writes_every_figure_the_pages_show(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    spec = importlib.util.spec_from_file_location("gen_figures", DOCS / "gen_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shown = {
        name for page in PAGES
        for name in re.findall(r"\]\((?:\.\./)*figures/([\w.-]+)\)", page.read_text())
    }  # fmt: skip
    paths = module.generate(tmp_path)
    assert shown <= {p.name for p in paths}
    assert len(shown) >= 8
    for path in paths:
        with Image.open(path) as image:
            assert image.format in {"PNG", "GIF"} and image.size[0] > 200
    stamp = (tmp_path / ".stamp").read_text()
    before = {p: p.stat().st_mtime_ns for p in paths}
    module.generate(tmp_path)  # up to date: nothing is rewritten
    assert {p: p.stat().st_mtime_ns for p in paths} == before
    assert (tmp_path / ".stamp").read_text() == stamp
