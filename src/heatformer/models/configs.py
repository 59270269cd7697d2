"""Model configs: frozen dataclasses with commented defaults, checked when they are made.

Every model is built from one (``Model.from_config(cfg)``). The fields every stack of blocks
shares live in :class:`_StackConfig`; ``heads`` is a head spec for every layer, ``'|'``/``';'``-
separated per-layer specs, or a tuple (see :mod:`heatformer.models.heads`); ``graph`` is a
graph kind (``"softmax"``, ``"topk[k=32]"``, see :data:`heatformer.graph_ops.GRAPHS`) in the
same schedule syntax. A config a model cannot use (a size below 1, an unknown graph kind, a
graph kind that cannot hold the longest sequence: ``"topk[k=33]"`` with 32 tokens) is refused
when it is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from heatformer import checks
from heatformer.graph_ops import GraphBuilder, resolve_graph
from heatformer.models.heads import parse_layer_graphs

__all__ = ["GPTConfig", "SequenceClassifierConfig", "ViTConfig"]


@dataclass(frozen=True, kw_only=True)
class _StackConfig:
    """Fields every model's stack of blocks shares; configs are built with keywords."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    heads: str | tuple[str, ...] = "attention"  # head spec(s), e.g. "attention:2,laplacian:2"
    # graph kind(s): "softmax", "topk[k=32]", or one per layer ("topk[k=8];softmax")
    graph: str | tuple[str, ...] = "softmax"
    dropout: float = 0.0
    bias: bool = True
    qk_norm: bool = False
    zero_init: bool = False  # zero the attention output projections (no-op at init)
    mlp_ratio: int = 4  # 0: attention-only blocks (no MLP branch; Zoology's MQAR models)
    # activation checkpointing of every block's two residual branches (TransformerBlock):
    # backward keeps 2 D values per token and layer instead of ~(12 + 2 mlp_ratio) D and the
    # graph's edges, for one more forward
    activation_checkpointing: bool = False

    #: size fields of the config, each a positive int (subclasses add theirs)
    _sizes: ClassVar[tuple[str, ...]] = ("n_layer", "n_head", "n_embd")

    def __post_init__(self) -> None:
        for name in self._sizes:
            checks.check_positive_int(name, getattr(self, name))
        checks.check_int("mlp_ratio", self.mlp_ratio, minimum=0)
        if self.n_embd % self.n_head != 0:
            raise checks.bad_value(
                "n_embd", f"expected a multiple of n_head ({self.n_head}), got {self.n_embd}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise checks.bad_type("dropout", f"expected a float in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise checks.bad_value(
                "dropout", f"expected a probability in [0, 1), got {self.dropout}"
            )
        checks.check_bool("activation_checkpointing", self.activation_checkpointing)
        for name, example in (("heads", "'attention:2,laplacian:2'"), ("graph", "'softmax'")):
            spec = getattr(self, name)
            if not isinstance(spec, str) and not (
                isinstance(spec, (tuple, list)) and all(isinstance(g, str) for g in spec)
            ):
                raise checks.bad_type(
                    name,
                    f"expected a spec (a str such as {example}) or one per layer (a tuple of "
                    f"str), got {spec!r} of type {type(spec).__name__}",
                )
        tokens = self.max_tokens()
        for kind in dict.fromkeys(self.graph_kinds):
            kind.check_nodes(tokens)

    def layer_graphs(self) -> list[str]:
        """One graph spec per layer."""
        return parse_layer_graphs(self.graph, self.n_layer)

    @cached_property
    def graph_kinds(self) -> tuple[GraphBuilder, ...]:
        """The graph kind of every layer, parsed once, when the config is made (the blocks
        get these; layers with the same spec share one)."""
        specs = self.layer_graphs()
        kinds = {spec: resolve_graph(spec) for spec in dict.fromkeys(specs)}
        return tuple(kinds[spec] for spec in specs)

    @classmethod
    def upgraded(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """The fields of a config as an older heatformer saved it (``dataclasses.asdict``), in
        today's: a field added since with a default other than what such a model computed
        gets that old value (:func:`~heatformer.models.load_model` reads configs through it).
        Here: ``fields`` as they are."""
        return fields

    def max_tokens(self) -> int:
        """The most tokens one attention graph of this model can have."""
        raise NotImplementedError  # pragma: no cover - every config defines it

    def cls_index(self) -> int | None:
        """Where the cls token sits among the tokens the blocks see (``0`` first, ``-1``
        last), or ``None`` for a model without one."""
        return None


@dataclass(frozen=True, kw_only=True)
class GPTConfig(_StackConfig):
    """Configuration of :class:`GPT` (a causal byte/char/token language model, or with
    ``causal=False`` a bidirectional encoder of the same layout: a masked-token model)."""

    vocab_size: int = 256  # byte-level by default
    block_size: int = 256  # longest context (learned absolute positions)
    causal: bool = True  # False: every token attends to every token (masked-token models)
    # the output layer's weight is the token embedding's (Press & Wolf 2017; Zoology's models)
    tie_embeddings: bool = False

    _sizes = (*_StackConfig._sizes, "vocab_size", "block_size")

    def __post_init__(self) -> None:
        checks.check_bool("causal", self.causal)
        checks.check_bool("tie_embeddings", self.tie_embeddings)
        super().__post_init__()

    def max_tokens(self) -> int:
        return self.block_size


@dataclass(frozen=True, kw_only=True)
class ViTConfig(_StackConfig):
    """Configuration of :class:`ViT` (image classification from patches)."""

    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    pool: str = "cls"  # "cls" token, or the "mean" of the tokens ("avg": timm's name of it)
    # with mean pooling, the final norm "after" the mean (timm's fc_norm, its global_pool="avg"
    # default) or "before" it, on every token (the order of configs saved without this field)
    pool_norm: str = "after"
    # ---- the DeiT-3 recipe (Touvron et al., 2022): 1e-6, 1e-6, 1e-6, False --------------------
    layer_scale_init: float | None = None  # LayerScale on both residual branches; None: none
    norm_eps: float = 1e-5  # eps of every LayerNorm (blocks and final norm)
    qk_norm_eps: float = 1e-5  # eps of the QK-norm LayerNorms (with qk_norm=True)
    pos_embed_cls: bool = True  # False: position embedding on the patches only (no_embed_class)
    drop_path: float = 0.0  # stochastic depth, linear from 0 (first block) to this (last)

    _sizes = (*_StackConfig._sizes, "image_size", "patch_size", "in_channels", "num_classes")

    def __post_init__(self) -> None:
        for name in self._sizes:  # max_tokens needs them
            checks.check_positive_int(name, getattr(self, name))
        if self.image_size % self.patch_size != 0:
            raise checks.bad_value(
                "patch_size",
                f"expected a divisor of image_size ({self.image_size}), got {self.patch_size}",
            )
        if self.pool not in ("cls", "mean", "avg"):
            raise checks.bad_value("pool", f"expected 'cls', 'mean' or 'avg', got {self.pool!r}")
        checks.check_choice("pool_norm", self.pool_norm, ("after", "before"))
        if self.layer_scale_init is not None:
            _check_finite_float("layer_scale_init", self.layer_scale_init, "or None")
        for name in ("norm_eps", "qk_norm_eps"):
            value = _check_finite_float(name, getattr(self, name))
            if not value > 0:
                raise checks.bad_value(name, f"expected a float > 0, got {value}")
        checks.check_bool("pos_embed_cls", self.pos_embed_cls)
        rate = _check_finite_float("drop_path", self.drop_path)
        if not 0.0 <= rate < 1.0:
            raise checks.bad_value("drop_path", f"expected a probability in [0, 1), got {rate}")
        super().__post_init__()

    @classmethod
    def upgraded(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """A saved config without ``pool_norm`` (before the field) and with ``pool="mean"``
        normalized every token before the mean: ``pool_norm="before"``."""
        if "pool_norm" not in fields and fields.get("pool") == "mean":
            return {**fields, "pool_norm": "before"}
        return fields

    def max_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + (1 if self.pool == "cls" else 0)

    def cls_index(self) -> int | None:
        return 0 if self.pool == "cls" else None


def _check_finite_float(name: str, value: object, also: str = "") -> float:
    """A finite int or float (not a bool): ``TypeError`` for another kind, ``ValueError`` for
    inf/NaN, both naming ``name``."""
    expected = f"a finite float{' ' + also if also else ''}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise checks.bad_type(name, f"expected {expected}, got {value!r}")
    if not math.isfinite(value):
        raise checks.bad_value(name, f"expected {expected}, got {value}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class SequenceClassifierConfig(_StackConfig):
    """Configuration of :class:`SequenceClassifier` (one label per token sequence)."""

    vocab_size: int = 256
    num_classes: int = 2
    block_size: int = 256
    n_layer: int = 2
    pool: str = "last"  # "last" token, "mean" over real tokens, or a "cls" token
    # (in front; at the end when causal, so that it sees the whole sequence)
    causal: bool = True

    _sizes = (*_StackConfig._sizes, "vocab_size", "num_classes", "block_size")

    def __post_init__(self) -> None:
        if self.pool not in ("last", "mean", "cls"):
            raise checks.bad_value("pool", f"expected 'last', 'mean' or 'cls', got {self.pool!r}")
        checks.check_bool("causal", self.causal)
        super().__post_init__()

    def max_tokens(self) -> int:
        return self.block_size + (1 if self.pool == "cls" else 0)

    def cls_index(self) -> int | None:
        return (-1 if self.causal else 0) if self.pool == "cls" else None
