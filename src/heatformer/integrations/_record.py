r"""The conversion record: which heads and graph kind each converted module has, as JSON.

A converted model keeps its weights under their keys and computes something else: a
checkpoint of it must say so, or it loads into an unconverted model without a word (heads
with no parameters of their own, such as Laplacian heads, leave no key behind). Every adapter
therefore records, for each converted module, a :class:`ModuleRecord` -- the head spec the
heads were built from, operator parameters included (``"attention:2,heat[t=0.5;learnable=
true]:2"``), the graph kind (``"topk[k=8]"``) and the head count -- where its library keeps
model structure:

- Hugging Face: ``config.json`` holds ``"attn_implementation": "heatformer"`` and a
  ``"heatformer"`` entry, :func:`model_record` (``{"format": 1, "restore": ..., "modules":
  {name: record}}``);
- timm and ``torch.nn``: the state dict holds one ``<module>.heatformer_record`` entry per
  converted module (:class:`RecordedHeads`), a ``uint8`` tensor of the record's UTF-8 JSON
  (a tensor, so that ``torch.save`` with ``weights_only`` and safetensors both take it).

A record says how to rebuild the heads; what they learned (a learnable time ``log_t``) is in
the weights, loaded as they are, so a rebuilt model equals the saved one to the last bit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from heatformer import checks
from heatformer.integrations._heads import HeadOperators

__all__ = [
    "FORMAT",
    "RECORD_KEY",
    "ModuleRecord",
    "RecordedHeads",
    "model_record",
    "read_model_record",
    "recorded",
    "records_in_state_dict",
]

#: the version of the record's layout
FORMAT = 1
#: the state-dict entry (after the module's prefix) that holds a timm or torch module's record
RECORD_KEY = "heatformer_record"


@dataclass(frozen=True)
class ModuleRecord:
    """How one converted module's heads are built.

    Attributes:
        heads: the head spec, parameters included; None for heads built from operator
            instances (they cannot be rebuilt from a record).
        graph: the graph kind's spec (``"softmax"``, ``"topk[k=8]"``).
        num_heads: ``H``.
    """

    heads: str | None
    graph: str
    num_heads: int

    @classmethod
    def of(cls, heads: HeadOperators) -> ModuleRecord:
        """The record of built heads."""
        return cls(heads.source, heads.graph_kind.spec, heads.num_heads)

    def to_json(self) -> dict[str, Any]:
        return {"heads": self.heads, "graph": self.graph, "num_heads": self.num_heads}

    @classmethod
    def from_json(cls, data: object, where: str, argument: str) -> ModuleRecord:
        """The record in ``data`` (read from ``where``); ``argument`` names the input in errors.

        Raises:
            ValueError: ``data`` is not a record of this format.
        """
        fields = ("heads", "graph", "num_heads")
        if not isinstance(data, dict) or any(name not in data for name in fields):
            raise checks.bad_value(
                argument, f"{where}: expected a heatformer record with {list(fields)}, got {data!r}"
            )
        heads, graph, num_heads = (data[name] for name in fields)
        if (
            not (heads is None or isinstance(heads, str))
            or not isinstance(graph, str)
            or isinstance(num_heads, bool)
            or not isinstance(num_heads, int)
            or num_heads < 1
        ):
            raise checks.bad_value(
                argument,
                f"{where}: expected heads (a spec or null), graph (a spec) and num_heads (a "
                f"positive int), got {data!r}",
            )
        return cls(heads, graph, num_heads)

    def spec(self, where: str, argument: str) -> str:
        """The head spec that rebuilds the heads of module ``where``.

        Raises:
            ValueError: a record of heads built from operator instances.
        """
        if self.heads is None:
            raise checks.bad_value(
                argument,
                f"module {where!r} had heads built from operator instances, which a record "
                "cannot rebuild; build the module the same way, then load its state dict",
            )
        return self.heads

    def build(
        self,
        where: str,
        *,
        head_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> HeadOperators:
        """New heads from the record (their parameters as the spec sets them; ``head_dim``
        for operators with per-head parameters)."""
        return HeadOperators(self.spec(where, "path"), self.num_heads, graph=self.graph,
                             head_dim=head_dim, device=device, dtype=dtype)  # fmt: skip


# ---- a whole model's record (Hugging Face config.json) --------------------------------------


def model_record(records: Mapping[str, ModuleRecord], restore: str) -> dict[str, Any]:
    """The JSON record of a model: ``restore`` (the call that loads it converted) and one
    record per converted module name, in module order."""
    return {
        "format": FORMAT,
        "restore": restore,
        "modules": {name: record.to_json() for name, record in records.items()},
    }


def read_model_record(data: object, where: str) -> dict[str, ModuleRecord]:
    """The module records of a model's record (inverse of :func:`model_record`).

    Raises:
        ValueError: ``data`` is not a record of this format.
    """
    if not isinstance(data, dict) or not isinstance(data.get("modules"), dict):
        raise checks.bad_value(
            "path", f"{where}: expected a heatformer entry with 'modules', got {data!r}"
        )
    if data.get("format") != FORMAT:
        raise checks.bad_value(
            "path",
            f"{where}: expected a heatformer record of format {FORMAT}, got format "
            f"{data.get('format')!r} (written by another heatformer version)",
        )
    return {
        str(name): ModuleRecord.from_json(value, f"{where}: module {name!r}", "path")
        for name, value in data["modules"].items()
    }


# ---- one module's record in a state dict (timm, torch.nn) ------------------------------------


def _encode(record: ModuleRecord) -> Tensor:
    """``(L,)`` uint8: the UTF-8 JSON of the record."""
    text = json.dumps({"format": FORMAT, **record.to_json()}, sort_keys=True)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)


def _decode(value: object, key: str) -> ModuleRecord:
    """The record held by the state-dict entry ``key``.

    Raises:
        ValueError: not a record of this format.
    """
    if not isinstance(value, Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, Tensor) else value
        raise checks.bad_value(
            "state_dict", f"{key!r}: expected a uint8 vector (a heatformer record), got {got!r}"
        )
    try:
        data = json.loads(bytes(value.tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise checks.bad_value("state_dict", f"{key!r}: not a heatformer record ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise checks.bad_value(
            "state_dict",
            f"{key!r}: expected a heatformer record of format {FORMAT}, got {data!r}",
        )
    return ModuleRecord.from_json(data, repr(key), "state_dict")


def records_in_state_dict(state_dict: Mapping[str, object]) -> dict[str, ModuleRecord]:
    """``{module name: record}`` of every converted module a state dict records."""
    found = {}
    for key, value in state_dict.items():
        if key == RECORD_KEY or key.endswith("." + RECORD_KEY):
            found[key[: -len(RECORD_KEY)].rstrip(".")] = _decode(value, key)
    return found


def recorded(
    found: Sequence[tuple[str, nn.Module]], state_dict: Mapping[str, object]
) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, str]]]:
    """``(name, module)`` of every module in ``found`` (a model's convertible modules) that
    ``state_dict`` records, and the ``(head spec, graph kind)`` of each: how to convert the
    model before the state dict loads (see
    :meth:`~heatformer.integrations._convert.Adapter.apply`).

    Raises:
        ValueError: a record of a module the model does not have, or of heads built from
            operator instances.
    """
    records = records_in_state_dict(state_dict)
    names = [name for name, _ in found]
    unknown = [name for name in records if name not in names]
    if unknown:
        raise checks.bad_value(
            "state_dict",
            f"records converted modules {unknown} that this model does not have (its "
            f"attention modules: {names}); expected the state dict of this architecture",
        )
    targets = [(name, module) for name, module in found if name in records]
    plan = [(records[name].spec(name, "state_dict"), records[name].graph) for name, _ in targets]
    return targets, plan


class RecordedHeads(nn.Module):
    """A module with diffusion heads (``self.heads``) that records them in its state dict.

    ``state_dict()`` adds ``<prefix>heatformer_record`` (see the module docstring) unless every
    head is plain attention on the dense softmax graph: the module then computes what the
    module it replaced computes, and its state dict is that module's. ``load_state_dict``
    takes a state dict without a record (the weights of the unconverted module: the heads are
    kept) and refuses one whose record differs from this module's heads, naming
    :attr:`restore`; a model that was not converted refuses the record as an unexpected key.
    """

    heads: HeadOperators
    #: the call that rebuilds the converted modules and loads a state dict into them
    restore: ClassVar[str] = ""

    def _record(self) -> ModuleRecord | None:
        """This module's record, None when the module computes the unconverted attention."""
        heads = self.heads
        plain = all(op.name == "attention" for op in heads.head_operators)
        if plain and heads.graph_kind.spec == "softmax":
            return None
        return ModuleRecord.of(heads)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        record = self._record()
        if record is not None:
            destination[prefix + RECORD_KEY] = _encode(record)

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        key = prefix + RECORD_KEY
        saved = _decode(state_dict[key], key) if key in state_dict else None
        mine = self._record()
        if saved is not None and not _same(saved, mine or ModuleRecord.of(self.heads)):
            have = mine or ModuleRecord.of(self.heads)
            raise checks.bad_value(
                "state_dict",
                f"{key!r} records heads {saved.heads!r} on graph {saved.graph!r}; this module "
                f"has heads {have.heads!r} on graph {have.graph!r}; load the state dict with "
                f"{self.restore}, which converts the modules as recorded",
            )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if key in unexpected_keys:
            unexpected_keys.remove(key)


def _same(saved: ModuleRecord, mine: ModuleRecord) -> bool:
    """Whether two records describe the same heads (a spec that is not known -- heads built
    from operator instances -- matches any spec)."""
    heads_agree = saved.heads is None or mine.heads is None or saved.heads == mine.heads
    return heads_agree and saved.graph == mine.graph and saved.num_heads == mine.num_heads
