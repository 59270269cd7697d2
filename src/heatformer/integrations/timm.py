r"""timm vision transformers with heatformer's diffusion heads.

:func:`convert` replaces every timm ``Attention`` of a timm model (``vit_*``, ``deit3_*``, ...
created with ``pretrained=False``, or loaded) by a :class:`TimmDiffusionAttention` that keeps
the original module's own layers -- ``qkv``, ``q_norm``/``k_norm`` (QK-norm), ``norm`` and
``gate`` where the timm version has them, ``proj`` -- so the weights are the same tensors under
the same state-dict keys, and applies one diffusion operator per head where timm calls
:func:`~torch.nn.functional.scaled_dot_product_attention`. Attention and ``"rw"`` Laplacian
heads keep the fused path (one SDPA call, attention dropout inside it). With every head
``"attention"`` the model computes what it computed before; ``"attention:3,laplacian:3"`` on
a 6-head model makes the trailing three heads Laplacian heads, as the "kL" models of
Zhang & Papyan (2026) do.

timm's ``Attention`` is ``timm.layers.Attention`` from timm 1.0.17 on and
``timm.models.vision_transformer.Attention`` before (the same class where both exist); the
scale norm ``norm`` came in 1.0.17 and the output ``gate`` later: a module without them is
converted as it computes (no norm, no gate). ``fused_attn`` (timm's switch between its SDPA
call and its explicit softmax) does not matter: the heads compute the same either way.

Saving and loading: a converted model's state dict records each converted module's heads
under ``<module>.heatformer_record`` (see :mod:`heatformer.integrations._record`), so it
does not load into an unconverted model (``strict`` loading refuses the unexpected key);
:func:`load_state_dict` converts a model as a state dict records and loads it.

timm imports torchvision at import time, for names its vision transformers never call; where
no torchvision matches your torch (the CPU builds), install timm without its dependencies and
import it with :func:`import_timm` (``docs/integrations/timm.md``).

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from heatformer import checks
from heatformer.graph_ops import DiffusionOperator, GraphBuilder
from heatformer.integrations._convert import Adapter
from heatformer.integrations._heads import HeadOperators, heads_for
from heatformer.integrations._record import RecordedHeads
from heatformer.models.masks import AttentionMask

__all__ = ["MIN_TIMM", "TimmDiffusionAttention", "convert", "import_timm", "load_state_dict"]

#: the oldest timm the adapter supports (the floor ``make test-oldest`` runs)
MIN_TIMM = "1.0.9"
#: the install line for a CPU torch: timm without its torchvision (docs/integrations/timm.md)
_INSTALL_HINT = (
    f"pip install 'heatformer[timm]' && pip install --no-deps 'timm>={MIN_TIMM}' "
    "(timm without torchvision, which has no wheel for the CPU torch)"
)
# the torchvision subpackages timm imports from (`torchvision.ops.misc`, ...)
_TORCHVISION_SUBMODULES = frozenset(
    {"datasets", "feature_extraction", "functional", "misc", "models", "ops", "transforms", "utils"}
)


class _PlaceholderMeta(type):
    """The type of the placeholder classes; its attributes are strings (enum members such as
    ``InterpolationMode.BICUBIC``, read when timm's modules define their defaults)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__qualname__}.{name}"


class _Placeholder(metaclass=_PlaceholderMeta):
    """A torchvision name timm binds at import time; creating one raises."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            f"{type(self).__qualname__} is heatformer's placeholder: torchvision is not "
            "installed (heatformer.integrations.timm.import_timm imported timm without it)"
        )


class _PlaceholderModule(types.ModuleType):
    """A placeholder ``torchvision`` (sub)module: every public name is a placeholder class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _TORCHVISION_SUBMODULES:
            return importlib.import_module(f"{self.__name__}.{name}")
        return _PlaceholderMeta(name, (_Placeholder,), {"__qualname__": f"{self.__name__}.{name}"})


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchvision`` and its submodules as placeholder modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] != "torchvision":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _forget_torchvision() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
        del sys.modules[name]


def _check_timm_version(version: str) -> None:
    """Raise ImportError, naming the floor, for a timm older than :data:`MIN_TIMM`."""
    from packaging.version import Version

    if Version(version) < Version(MIN_TIMM):
        raise ImportError(
            f"heatformer.integrations.timm needs timm >= {MIN_TIMM}, found {version}: "
            f"{_INSTALL_HINT}"
        )


def _torchvision_missing() -> bool:
    """Whether torchvision cannot be imported (warns when it is installed but fails)."""
    if "torchvision" in sys.modules:
        return False
    if importlib.util.find_spec("torchvision") is None:
        return True
    try:
        importlib.import_module("torchvision")
    except Exception as err:  # a build for another torch: it fails at import in many ways
        _forget_torchvision()
        warnings.warn(
            f"torchvision is installed but does not import ({type(err).__name__}: {err}); "
            "importing timm with heatformer's placeholder for it",
            RuntimeWarning,
            stacklevel=3,
        )
        return True
    return False


def import_timm() -> types.ModuleType:
    """Import timm and return it, also where torchvision is not installed.

    timm (1.0) imports torchvision when it is imported, for names its vision transformers never
    call: ``FrozenBatchNorm2d`` (ResNets), the data transforms and datasets, the FX feature
    extractor. The CPU builds of torch have no matching torchvision wheel on PyPI (its wheel
    is a CUDA build that replaces torch), so timm is installed without its dependencies::

        pip install 'heatformer[timm]'            # timm's dependencies other than torchvision
        pip install --no-deps 'timm>=1.0.9'

    What this function does:

    - timm already imported: returns ``sys.modules["timm"]``.
    - torchvision imports: ``import timm``, nothing else.
    - torchvision is not installed (or is installed and fails to import, with a
      :class:`RuntimeWarning` saying why): while timm is imported, a finder on
      ``sys.meta_path`` answers ``import torchvision...`` with placeholder modules in which
      every name is a class that raises :class:`RuntimeError` when instantiated (its
      attributes, read as enum members such as ``InterpolationMode.BICUBIC``, are strings).
      Afterwards the finder and the placeholder modules are removed: ``import torchvision``
      fails as before, timm's own modules keep the placeholder names they bound, and the model
      code heatformer converts (``timm.create_model``, ``vit_*``, ``deit3_*``) is timm's own.
      What needs torchvision (timm's data pipeline, ``timm.data`` transforms, FX feature
      extraction, models with frozen batch norm) raises when it is used.

    After it, ``import timm`` returns the same module.

    Returns:
        The ``timm`` module.

    Raises:
        ModuleNotFoundError: timm is not installed.
        ImportError: a timm older than :data:`MIN_TIMM`.
    """
    timm = sys.modules.get("timm")
    if timm is None:
        if importlib.util.find_spec("timm") is None:
            raise ModuleNotFoundError(
                f"heatformer.integrations.timm needs timm: {_INSTALL_HINT}", name="timm"
            )
        finder = _PlaceholderFinder() if _torchvision_missing() else None
        if finder is not None:
            sys.meta_path.insert(0, finder)
        try:
            timm = importlib.import_module("timm")
        finally:
            if finder is not None:
                sys.meta_path.remove(finder)
                _forget_torchvision()
    _check_timm_version(str(timm.__version__))
    return timm


class TimmDiffusionAttention(RecordedHeads):
    r"""A timm ``Attention`` module with diffusion heads, with timm's forward signature.

    Args:
        attn: the timm ``Attention`` to replace; its ``qkv``, ``q_norm``, ``k_norm``,
            ``attn_drop``, ``norm`` and ``gate`` (where it has them), ``proj`` and
            ``proj_drop`` are reused as they are.
        heads: a head spec or one operator per head.
        graph: the graph kind.

    Shape:
        ``forward(x, attn_mask=None, is_causal=False)``: ``(B, N, D)`` -> ``(B, N, D)``.
        ``attn_mask`` as timm passes it to SDPA: boolean (``True`` = may attend) or additive
        float of 0 and -inf (or ``finfo.min``), broadcastable to ``(B, H, N, N)``; a
        ``(B, 1, 1, N)`` mask is a key mask, which every graph kind takes.

    Equivalent to timm's ``Attention.forward`` with the SDPA call replaced by::

        y[:, h] = op_h(P_h, v[:, h])        # P_h = softmax(q_h k_h^T / sqrt(Dh), masked)
    """

    restore = "heatformer.integrations.timm.load_state_dict(model, state_dict)"

    def __init__(
        self,
        attn: nn.Module,
        heads: str | Sequence[DiffusionOperator | str] = "attention",
        *,
        graph: str | GraphBuilder = "softmax",
    ) -> None:
        super().__init__()
        timm_attn: Any = attn  # timm's Attention: read by attribute
        qkv = timm_attn.qkv
        if not isinstance(qkv, nn.Linear):
            raise checks.bad_type("attn", "expected a timm Attention with an nn.Linear qkv")
        self.num_heads, self.head_dim = int(timm_attn.num_heads), int(timm_attn.head_dim)
        self.attn_dim = self.num_heads * self.head_dim
        self.scale = float(timm_attn.scale)
        self.qkv: nn.Module = qkv
        self.q_norm: nn.Module = timm_attn.q_norm
        self.k_norm: nn.Module = timm_attn.k_norm
        self.attn_drop: nn.Dropout = timm_attn.attn_drop
        norm = getattr(timm_attn, "norm", None)  # timm >= 1.0.17
        self.norm: nn.Module = nn.Identity() if norm is None else norm
        self.gate: nn.Module | None = getattr(timm_attn, "gate", None)  # newer timm only
        self.proj: nn.Module = timm_attn.proj
        self.proj_drop: nn.Module = timm_attn.proj_drop
        w = qkv.weight
        self.heads = HeadOperators(
            heads, self.num_heads, graph=graph, head_dim=self.head_dim, device=w.device,
            dtype=w.dtype,
        )  # fmt: skip

    @property
    def spec(self) -> str:
        """The head spec, e.g. ``"attention:3,laplacian:3"``."""
        return self.heads.spec

    def _mask(self, attn_mask: Tensor | None, is_causal: bool, b: int, n: int) -> AttentionMask:
        """timm's ``attn_mask`` as SDPA takes it (``(B, 1, 1, N)``: a key mask)."""
        if attn_mask is None:
            return AttentionMask(causal=bool(is_causal))
        shape = (b, self.num_heads, n, n)
        return AttentionMask.from_additive(attn_mask, bool(is_causal), shape=shape)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        b, n, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, Dh) each
        q, k = self.q_norm(q), self.k_norm(k)
        mask = self._mask(attn_mask, is_causal, b, n)
        dropout = self.attn_drop.p if self.training else 0.0
        y = self.heads(q, k, v, mask, scale=self.scale, dropout=dropout)  # (B, H, N, Dh)
        y = self.norm(y.transpose(1, 2).reshape(b, n, self.attn_dim))  # (B, N, H Dh)
        if gate is not None:
            y = y * gate
        out: Tensor = self.proj_drop(self.proj(y))
        return out

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, heads={self.spec!r}"


def _attention_classes() -> tuple[type[nn.Module], ...]:
    """timm's self-attention classes: ``timm.layers.Attention`` (timm >= 1.0.17) and
    ``timm.models.vision_transformer.Attention`` (the same class from 1.0.17 on, its own
    before)."""
    timm = import_timm()
    found = [getattr(timm.models.vision_transformer, "Attention", None)]
    try:
        from timm.layers import Attention

        found.append(Attention)
    except ImportError:  # timm < 1.0.17
        pass
    return tuple({cls for cls in found if isinstance(cls, type)})


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every timm ``Attention`` of ``model``, converted or not."""
    if not isinstance(model, nn.Module):
        raise checks.bad_type("model", f"expected a timm model, got {type(model).__name__}")
    classes = _attention_classes()
    found = [
        (n, m)
        for n, m in model.named_modules()
        if type(m) in classes or isinstance(m, TimmDiffusionAttention)
    ]
    if not found:
        raise checks.bad_value(
            "model",
            f"found no timm Attention (timm.layers.Attention) inside {type(model).__name__}",
        )
    return found


def _converted(name: str, attn: nn.Module, spec: str, kind: str) -> nn.Module:
    """The converted module for ``attn``: a :class:`TimmDiffusionAttention`, or for a
    converted one the :class:`HeadOperators` to give it (its own when they were built from
    ``spec`` and ``kind``)."""
    if isinstance(attn, TimmDiffusionAttention):
        return heads_for(attn.heads, spec, kind, attn.num_heads, attn)
    return TimmDiffusionAttention(attn, spec, graph=kind)


def _install(
    model: nn.Module, found: Sequence[tuple[str, nn.Module]], made: list[nn.Module]
) -> nn.Module:
    """Put the converted modules in place; returns ``model``."""
    for (name, attn), new in zip(found, made, strict=True):
        if isinstance(new, HeadOperators):
            attn.heads = new
            continue
        new.train(attn.training)
        model.set_submodule(name, new)
    return model


_ADAPTER = Adapter(find=_attention_modules, make=_converted, install=_install)


def convert(
    model: nn.Module,
    heads: str | Sequence[str],
    *,
    graph: str | GraphBuilder | Sequence[str] = "softmax",
) -> nn.Module:
    """Replace every timm ``Attention`` of ``model`` (in place); returns ``model``.

    Blocks converted before keep their layers and get the new heads; a block whose heads
    were built from the same spec and graph kind keeps them, learned parameters included.

    Args:
        model: a timm model (``timm.create_model("deit3_small_patch16_224")``, ...).
        heads: one head spec for every block (``"attention:3,laplacian:3"``), or one per block.
        graph: the graph kind of every block, or one per block.

    Raises:
        ValueError: no timm ``Attention`` inside ``model``; a spec that does not fit a block.
    """
    return _ADAPTER.convert(model, heads, graph)


def load_state_dict(
    model: nn.Module, state_dict: Mapping[str, Any], *, strict: bool = True
) -> nn.Module:
    """Load a converted timm model's state dict, converting ``model`` as it records.

    Every block the state dict records (``blocks.<i>.attn.heatformer_record``) is converted
    to the recorded heads and graph kind first; then ``model.load_state_dict(state_dict,
    strict=strict)`` loads every weight, learned head parameters included, so the model
    equals the one saved to the last bit::

        torch.save(converted.state_dict(), "vit.pt")
        model = timm.create_model("deit3_small_patch16_224", pretrained=False, ...)
        load_state_dict(model, torch.load("vit.pt"))      # converted as saved

    Args:
        model: a timm model of the saved architecture, converted or not.
        state_dict: from ``converted.state_dict()`` (``torch.load``, safetensors'
            ``load_file``); without records it loads as into an unconverted model.
        strict: as in :meth:`torch.nn.Module.load_state_dict`.

    Returns:
        ``model``.

    Raises:
        ValueError: a recorded module that ``model`` does not have, or one that cannot be
            rebuilt from its record.
    """
    return _ADAPTER.load_state_dict(model, state_dict, strict=strict)
