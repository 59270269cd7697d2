"""The spec grammar shared by head specs and graph specs: ``name[key=value,...]``.

Values are ints, floats, ``true``/``false``, space-separated number lists in parentheses
(``(0.5 -1 0.25)``) or bare strings. Parameters are separated by ``,`` or ``;`` inside the
brackets (``window[w=128,global=1]``, ``heat[t=0.5;tol=1e-8]``).

Example:
    >>> parse_entry("window[w=128,global=1]", what="graph")
    ('window', {'w': 128, 'global': 1})
    >>> parse_entry("polynomial[coeffs=(0.5 -1);learnable=true]", what="heads")
    ('polynomial', {'coeffs': [0.5, -1.0], 'learnable': True})
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from heatformer import checks as V

__all__ = ["format_entry", "parse_entry", "parse_params", "parse_value", "split_outside_brackets"]

_NAME_PARAMS = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*(?:\[([^\]]*)\])?\s*$")


def split_outside_brackets(spec: str, separators: str) -> list[str]:
    """Split ``spec`` on any of ``separators`` that is not inside ``[...]``."""
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch in separators and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(ch)
    entries.append("".join(current))
    return entries


def parse_value(text: str) -> object:
    """``"3"`` -> 3, ``"0.5"`` -> 0.5, ``"true"`` -> True, ``"(1 2)"`` -> [1.0, 2.0], else str."""
    text = text.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.startswith("(") and text.endswith(")"):
        return [float(v) for v in text[1:-1].split() if v]
    return text


def parse_params(text: str | None, spec: str, *, what: str) -> dict[str, object]:
    """The ``key=value`` pairs inside the brackets of ``spec`` (``what`` names the argument).

    Raises:
        ValueError: an item without ``=``, or a key given twice (``window[w=4,w=8]``).
    """
    params: dict[str, object] = {}
    for item in re.split(r"[,;]", text or ""):
        if not item.strip():
            continue
        if "=" not in item:
            raise V.bad_value(what, f"expected key=value inside [...] in {spec!r}, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if key in params:  # the last would silently win
            raise V.bad_value(what, f"expected each key once in {spec!r}, got {key!r} twice")
        params[key] = parse_value(value)
    return params


def parse_entry(spec: str, *, what: str) -> tuple[str, dict[str, object]]:
    """``"name[params]"`` -> ``(name, params)``; ``what`` is the argument named in errors."""
    match = _NAME_PARAMS.match(spec)
    if match is None:
        raise V.bad_value(what, f"expected 'name' or 'name[key=value,...]', got {spec!r}")
    name, params_text = match.groups()
    return name, parse_params(params_text, spec, what=what)


def format_entry(name: str, params: Mapping[str, object] | None = None, sep: str = ";") -> str:
    """The inverse of :func:`parse_entry`.

    Example:
        >>> format_entry("polynomial", {"coeffs": [0.5, -1.0], "learnable": True})
        'polynomial[coeffs=(0.5 -1.0);learnable=true]'
    """
    if not params:
        return name

    def text(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return "(" + " ".join(repr(float(v)) for v in value) + ")"
        return repr(value) if isinstance(value, float) else str(value)

    return f"{name}[" + sep.join(f"{key}={text(value)}" for key, value in params.items()) + "]"
