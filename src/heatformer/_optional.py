"""Optional dependencies: imported where a feature needs one, or one error naming its extra.

The library requires torch and numpy only. NetworkX, SciPy, PyTorch Geometric, matplotlib,
transformers and timm are extras, imported by the functions that use them; a user without one
gets one :class:`ImportError` that names the feature and the install line
(``pip install 'heatformer[networkx]'``), not a bare ``ModuleNotFoundError`` from inside the
library.

Example:
    >>> require("math", "none", feature="a doctest").sqrt(4.0)
    2.0
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["EXTRAS", "require", "toml_reader"]

#: the extra that brings each optional top-level module (setup.cfg's ``extras_require``)
EXTRAS = {
    "networkx": "networkx",
    "scipy": "scipy",
    "torch_geometric": "pyg",
    "matplotlib": "viz",
    "transformers": "hf",
    "tensorboard": "tensorboard",
}


def require(module: str, extra: str | None = None, *, feature: str) -> ModuleType:
    """``module`` imported, or an :class:`ImportError` naming ``feature`` and its extra.

    Args:
        module: the module to import (``"networkx"``, ``"scipy.sparse"``).
        extra: the extra that installs it (default: :data:`EXTRAS` of its top-level name).
        feature: what needs it, for the message (``"Graph.to_networkx"``).

    Raises:
        ImportError: ``module`` is not installed: ``"Graph.to_networkx needs networkx: pip
            install 'heatformer[networkx]'"``.
    """
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        name = extra or EXTRAS.get(top, top)
        raise ImportError(f"{feature} needs {top}: pip install 'heatformer[{name}]'") from err


def toml_reader(feature: str) -> ModuleType:
    """The TOML reader: the standard library's ``tomllib`` (Python 3.11+), else ``tomli`` (the
    ``lab`` extra installs it on 3.10), or an :class:`ImportError` naming ``feature``.

    Example:
        >>> toml_reader("a doctest").loads("a = 1")
        {'a': 1}
    """
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    return require("tomli", "lab", feature=feature)  # pragma: no cover - the floor Python
