"""``docs/design.md`` stays true of ``src/heatformer``: the imports between packages, a line per
module, and every private name that one module imports from another (read from the AST)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "heatformer"
DESIGN = (ROOT / "docs" / "design.md").read_text()

#: top-level private helpers and the argument checks, which any package may import
HELPERS = {
    "checks",
    "registry",
    "_spec",
    "_atomic",
    "_suggest",
    "_optional",
    "_torch_compat",
    "heatformer",
}
#: what each package imports besides HELPERS: the table of design.md's "Dependencies"
ALLOWED = {
    "graph_ops": set(),
    "datasets": set(),
    "models": {"graph_ops"},
    "analysis": {"models", "graph_ops"},
    "viz": {"graph_ops"},
    "integrations": {"models", "graph_ops", "analysis"},
    "lab": {"models", "analysis", "graph_ops", "integrations", "viz", "datasets"},
    "__main__": {"lab"},
}


def _modules() -> dict[str, Path]:
    """Dotted name below ``heatformer`` (a package by its own name) -> file."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every ``from heatformer.module import name`` (``import
    heatformer.module``: name ``""``), module dotted below ``heatformer``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "heatformer" or node.module.startswith("heatformer."):
                module = node.module.removeprefix("heatformer").removeprefix(".")
                out += [(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "heatformer":
                    module = alias.name.removeprefix("heatformer").removeprefix(".")
                    out.append((module, "", node.lineno))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports() -> list[tuple[str, str, str]]:
    """``(importer, module, name)``: a private name imported from another module, a private
    module imported from outside the package that holds it, or ``alias._name`` read on an
    imported heatformer module or class."""
    hits = []
    for me, path in _modules().items():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        aliases: dict[str, str] = {}
        tree = ast.parse(path.read_text())
        for module, name, _ in _imports(path):
            parts = module.split(".") if module else []
            owners = [".".join(parts[:i]) for i, part in enumerate(parts) if _private(part)]
            outside = bool(owners) and not (  # "" owns it: a top-level private helper
                owners[0] in ("", package) or package.startswith(owners[0] + ".")
            )
            if _private(name) or outside:
                hits.append((me, module, name))
            if name:
                aliases[name] = f"{module}.{name}".strip(".")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                hits.append((me, aliases[node.value.id], node.attr))
    return sorted(set(hits))


#: what makes an ``__init__`` more than re-exports: a public function or class, a registry
_DEFINES = re.compile(r"^(def [a-z]|class [A-Z]|[A-Z_]+: dict)", flags=re.M)


def _section(title: str) -> str:
    start = DESIGN.index(title)
    end = DESIGN.find("\n#", start + len(title))
    return DESIGN[start : end if end >= 0 else None]


def test_packages_import_downwards() -> None:
    wrong = []
    for me, path in _modules().items():
        package = me.split(".")[0]
        for module, name, line in _imports(path):
            target = (module or name or "heatformer").split(".")[0]
            if target == package or target in HELPERS:
                continue
            if target not in ALLOWED.get(package, set()):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports heatformer.{module}")
    assert not wrong, "imports against docs/design.md's Dependencies:\n" + "\n".join(wrong)


def test_the_dependency_table_is_the_tested_one() -> None:
    table = _section("### Dependencies")
    for package, allowed in ALLOWED.items():
        if package.startswith("_"):
            continue
        row = re.search(rf"^\| `{package}` \| (.*) \|$", table, flags=re.M)
        assert row is not None, f"no row for {package}"
        named = set(re.findall(r"`(\w+)[`.]", row.group(1)))
        assert allowed <= named, f"{package}: the table names {named}, the code {allowed}"


def test_every_module_has_a_line() -> None:
    """Each module appears in the first cell of a row of design.md's module table, by its path
    or by its last part after a path of the same package."""
    lines = _section("### Modules").splitlines()
    rows = [line.split("|")[1] for line in lines if line.startswith("| `")]
    missing = []
    for path in _modules().values():
        rel = path.relative_to(SRC).with_suffix("").as_posix()
        if path.name == "__init__.py" and not _DEFINES.search(path.read_text()):
            continue  # a package's re-exports
        package, _, leaf = rel.rpartition("/")
        if not any(
            f"`{rel}`" in cell or (cell.strip().startswith(f"`{package}/") and f"`{leaf}`" in cell)
            for cell in rows
        ):
            missing.append(rel)
    assert not missing, f"modules without a line in docs/design.md: {missing}"


@pytest.mark.parametrize(("importer", "module", "name"), _private_imports())
def test_private_names_across_modules_are_listed(importer: str, module: str, name: str) -> None:
    """A private name used across modules is named, with its reason, in design.md."""
    listed = _section("### Private names shared across modules")
    private_part = name if _private(name) else next(p for p in module.split(".") if _private(p))
    assert re.search(rf"`[\w.]*\b{private_part}\b", listed), f"{importer}: {module}.{name}"


def test_importing_the_graphs_and_models_does_not_import_dynamo() -> None:
    """``torch._dynamo`` (1.5 s, 70 MB) is imported by compiling, or by ``torch.optim``, not by
    heatformer's graphs and layers: every rank of a split sequence and every eager user pays
    only for what it runs."""
    import subprocess
    import sys

    code = (
        "import sys, heatformer, heatformer.graph_ops, heatformer.models, heatformer.integrations; "
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "[]"


#: issue 22's bounds: a module's lines, and a function's unless its docstring says why
MODULE_LINES, FUNCTION_LINES = 550, 80


@pytest.mark.parametrize("module", sorted(_modules()))
def test_modules_and_functions_stay_short(module: str) -> None:
    """No module over ``MODULE_LINES`` lines; no function over ``FUNCTION_LINES`` unless its
    docstring gives the reason ("Over 80 lines ...")."""
    path = _modules()[module]
    text = path.read_text()
    assert text.count("\n") <= MODULE_LINES, f"{module}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            why = f"Over {FUNCTION_LINES} lines" in (ast.get_docstring(node) or "")
            assert length <= FUNCTION_LINES or why, f"{module}.{node.name}: {length} lines"
