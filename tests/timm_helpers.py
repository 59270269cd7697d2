"""timm for the tests, where torchvision cannot be installed.

timm (1.0) imports torchvision at import time, for names its vision transformers never call:
``FrozenBatchNorm2d`` (ResNets), the data transforms and datasets, the FX feature extractor.
The only torchvision wheel for the CPU torch of this project's machines is a CUDA build that
replaces torch, so CI installs timm without its dependencies and :func:`import_timm` puts a
placeholder ``torchvision`` in ``sys.modules`` while timm is imported: every name timm binds
from it is an inert class that raises when called. The ViT and DeiT-3 code the tests run is
timm's own. With a real torchvision installed, the placeholder is not used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SUBMODULES = {
    "datasets", "feature_extraction", "functional", "misc", "models", "ops", "transforms", "utils",
}  # fmt: skip


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__qualname__}.{name}"  # enum members (InterpolationMode.BICUBIC)


class _Placeholder(metaclass=_PlaceholderMeta):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            f"{type(self).__qualname__} is a test placeholder: torchvision is not installed"
        )


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _SUBMODULES:
            return importlib.import_module(f"{self.__name__}.{name}")
        return _PlaceholderMeta(name, (_Placeholder,), {"__qualname__": f"{self.__name__}.{name}"})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object, target: object = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _forget(prefixes: tuple[str, ...]) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in prefixes]:
        del sys.modules[name]


@contextmanager
def import_timm() -> Iterator[types.ModuleType | None]:
    """timm (None when it is not installed), with the placeholder when torchvision is missing;
    afterwards timm and the placeholder are removed from ``sys.modules``."""
    if importlib.util.find_spec("timm") is None:
        yield None
        return
    try:
        importlib.import_module("torchvision")
        placeholder = None
    except Exception:  # missing, or a build that does not match torch
        _forget(("torchvision",))
        placeholder = _Finder()
        sys.meta_path.insert(0, placeholder)
    try:
        yield importlib.import_module("timm")
    finally:
        if placeholder is not None:
            sys.meta_path.remove(placeholder)
            _forget(("timm", "torchvision"))
