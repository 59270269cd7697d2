"""MkDocs hooks: generate the figures before a build, render the notebooks, tidy Sphinx roles
in docstrings.

Registered in mkdocs.yml (``hooks:``). The figures come from ``docs/gen_figures.py``, which
skips the work when nothing changed (so ``mkdocs serve`` does not loop). Every notebook
``docs/**/NAME.ipynb`` becomes the page ``NAME.md`` beside it (``docs/notebooks.py``: its
markdown, its code and the outputs it stored), and stays downloadable as it is.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.heatformer")

DOCS = Path(__file__).resolve().parent
# pages other people write; the site builds (with a note in the log) while they are missing
OPTIONAL_PAGES = ("benchmarks.md", "reproducing.md")
# ":func:`x`" in a docstring renders as ":func:<code>x</code>"; keep the code, drop the role
_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(<code>)~?")


def _load(name: str, file: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, DOCS / file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {DOCS / file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gen_figures() -> Any:
    return _load("heatformer_docs_figures", "gen_figures.py")


def _google_example_sections() -> None:
    """Parse ``Example:`` like ``Examples:`` in Google docstrings (code, not Markdown).

    heatformer's docstrings use both spellings; griffe only knows the plural, and renders the
    singular as an admonition whose ``>>>`` lines become Markdown (nested quotes).
    """
    try:
        from griffe._internal.docstrings import google
        from griffe._internal.enumerations import DocstringSectionKind
    except ImportError:  # another griffe layout: the pages still build, just less pretty
        log.info("heatformer docs: cannot teach griffe 'Example:' sections")
        return
    google._section_kind.setdefault("example", DocstringSectionKind.examples)


def on_config(config: Any) -> Any:
    """Drop nav entries of optional pages that do not exist yet; see ``Example:``."""
    _google_example_sections()

    def keep(item: Any) -> bool:
        target = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(target, str) and target in OPTIONAL_PAGES and not (DOCS / target).exists():
            log.info("heatformer docs: %s is not written yet; leaving it out of the nav", target)
            return False
        return True

    if config.nav:
        config.nav = [item for item in config.nav if keep(item)]
    return config


def on_pre_build(config: Any) -> None:
    """Generate docs/figures (skipped when the figures are up to date)."""
    paths = _gen_figures().generate()
    log.info("heatformer docs: %d figures in %s", len(paths), paths[0].parent)


def on_files(files: Any, config: Any) -> Any:
    """Add the page of every notebook (the notebook itself stays a file to download)."""
    from mkdocs.structure.files import File

    notebooks = _load("heatformer_docs_notebooks", "notebooks.py")
    for path in notebooks.notebooks():
        page = path.relative_to(DOCS).with_suffix(".md").as_posix()
        files.append(File.generated(config, page, content=notebooks.to_markdown(path)))
    return files


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Unlink links to optional pages that do not exist yet (keeps their text)."""
    for name in OPTIONAL_PAGES:
        if not (DOCS / name).exists():
            markdown = re.sub(
                r"\[([^\]]+)\]\((?:\.\./)*" + re.escape(name) + r"(?:#[^)]*)?\)",
                r"\1 (not written yet)",
                markdown,
            )
    return markdown


def on_page_content(html: str, **kwargs: Any) -> str:
    """Strip Sphinx roles (``:func:``, ``:class:`` ...) left in rendered docstrings."""
    return _ROLE.sub(r"\1", html)
