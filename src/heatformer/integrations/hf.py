r"""Hugging Face ``transformers`` models with heatformer's diffusion heads.

:func:`convert` switches a loaded model (GPT-2, Llama-family with grouped-query attention,
BERT, ViT, and any model whose attention layers call transformers' ``AttentionInterface``)
to heatformer heads, in place: each attention layer keeps its projections, rotary embeddings,
KV cache and weights, and its heads apply the operators of a head spec to the layer's own
``q``, ``k``, ``v``. :func:`attention_graphs` returns the attention graph of every layer, for
analysis and teaching, on a converted or an unconverted model, and
:func:`attention_snapshots` the same with values and operators, as the teaching pictures take
them (``heatformer demo --hf-model DIR``).

How it plugs in: transformers looks up two functions by the model's attention implementation
name, one that builds the attention mask and one that attends. This module registers both
under ``"heatformer"``:

- the **mask function** returns an :class:`~heatformer.models.masks.AttentionMask`:
  the padding mask ``(B, T)`` and the causal flag with the positions of queries and keys, so
  causal, padding and bidirectional masks arrive intact and nothing ``N x N`` is formed;
  any other pattern (sliding windows, packed sequences) arrives as transformers' own dense
  boolean mask, which only the dense ``"softmax"`` graph kind takes. Without a registered
  mask function, transformers passes no mask at all to a custom attention function, and
  padded batches come out silently wrong;
- the **attention function** repeats grouped keys and values per query head, then hands
  ``q``, ``k``, ``v`` and the mask to the layer's heads. With every head ``"attention"`` it
  makes the very SDPA call of transformers' ``"sdpa"`` implementation.

Decoding with the KV cache (``model.generate()``) is exact for attention and ``"rw"``
Laplacian heads (affine in ``P v``: ``a P v + b v``, ``v`` the new token's own value); other
heads refuse a cache and ask for ``generate(..., use_cache=False)``.

Cross-attention (keys from an encoder) has a rectangular graph without ``I' v``: it is
recognized when the module says so (``is_cross_attention``, as GPT-2's) or its class is a
``*CrossAttention``; attention heads work there, other heads are refused, so give such modules
their own spec in a per-module schedule. Models that decide per call (BART) are not told apart.

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64))
    >>> model = convert(model, "attention:3,laplacian:1")
    >>> model.config._attn_implementation
    'heatformer'
    >>> graphs = attention_graphs(model, input_ids=torch.zeros(1, 5, dtype=torch.long))
    >>> len(graphs), tuple(graphs[0].batch_shape), graphs[0].num_nodes
    (2, (1, 4), 5)
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from heatformer import checks
from heatformer.analysis.hooks import LayerSnapshot
from heatformer.graph_ops import DenseGraph, Graph, GraphBuilder
from heatformer.integrations._heads import (
    HeadOperators,
    convert_modules,
    head_width,
    heads_for,
    in_module,
    layer_specs,
)
from heatformer.integrations._record import ModuleRecord, model_record, read_model_record
from heatformer.models.masks import AttentionMask

#: the oldest transformers this module works with (the ``hf`` extra of setup.cfg declares it):
#: 5.0-5.3 call mask functions with ``cache_position`` instead of ``q_length``/``q_offset``
MIN_TRANSFORMERS = "5.4"


def _check_transformers_version(version: str) -> None:
    """Raise ImportError, naming the floor, for a transformers older than
    :data:`MIN_TRANSFORMERS` (its calls would fail later with an unrelated TypeError)."""
    from packaging.version import Version

    if Version(version) < Version(MIN_TRANSFORMERS):
        raise ImportError(
            f"heatformer.integrations.hf needs transformers >= {MIN_TRANSFORMERS}, found "
            f"{version}: pip install --upgrade 'heatformer[hf]'"
        )


try:
    import transformers
    from transformers import AttentionInterface, AutoConfig, PreTrainedModel
    from transformers.masking_utils import (
        AttentionMaskInterface,
        bidirectional_mask_function,
        causal_mask_function,
        prepare_padding_mask,
        sdpa_mask,
    )
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError(
        f"heatformer.integrations.hf needs transformers >= {MIN_TRANSFORMERS}: "
        "pip install 'heatformer[hf]'"
    ) from err
_check_transformers_version(transformers.__version__)

__all__ = [
    "IMPLEMENTATION",
    "attention_graphs",
    "attention_modules",
    "attention_snapshots",
    "convert",
    "from_pretrained",
    "revert",
]

#: the attention implementation name heatformer registers with transformers
IMPLEMENTATION = "heatformer"
#: the attribute of a converted attention module that holds its heads
HEADS_ATTRIBUTE = "heatformer"
#: the config attribute (a ``config.json`` entry) that records a conversion
CONFIG_ENTRY = "heatformer"


# ---- the two functions transformers calls ----------------------------------------------------


def heatformer_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int | Tensor = 0,
    mask_function: Any = causal_mask_function,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> AttentionMask:
    """transformers' mask function for ``"heatformer"`` (the ``sdpa_mask`` signature).

    Returns the padding mask ``(B, kv_length)`` and the causal flag when the model asks for a
    plain causal or bidirectional mask; otherwise transformers' dense boolean mask
    (``sdpa_mask`` with no shortcut) inside the :class:`AttentionMask`.
    """
    q_off, kv_off = int(q_offset), int(kv_offset)
    if mask_function is causal_mask_function or mask_function is bidirectional_mask_function:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_off)
        key_mask = None
        if padding is not None:
            key_mask = padding[:, kv_off : kv_off + kv_length].to(torch.bool)  # (B, T)
            if bool(key_mask.all()):
                key_mask = None
        return AttentionMask(
            key_mask, causal=mask_function is causal_mask_function, q_offset=q_off,
            kv_offset=kv_off,
        )  # fmt: skip
    options = {k: v for k, v in kwargs.items() if k in ("device", "use_vmap")}
    dense = sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_off,
        kv_offset=kv_off, mask_function=mask_function, attention_mask=attention_mask,
        allow_is_causal_skip=False, allow_is_bidirectional_skip=False, **options,
    )  # fmt: skip
    return AttentionMask(dense=dense, q_offset=q_off, kv_offset=kv_off)


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, Hkv, T, D)`` -> ``(B, Hkv * n_rep, T, D)``: each key/value head serves ``n_rep``
    consecutive query heads (grouped-query attention)."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def _as_mask(
    mask: object, module: nn.Module, is_causal: bool | None, q: Tensor, k: Tensor
) -> AttentionMask:
    """What transformers passed as ``attention_mask``, as an :class:`AttentionMask`."""
    n_q, n_k = int(q.shape[-2]), int(k.shape[-2])
    if isinstance(mask, AttentionMask):
        return mask
    if mask is None:  # as transformers' sdpa: causal only with several queries
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        causal = causal and n_q > 1
        return AttentionMask(causal=causal, q_offset=0 if causal else n_k - n_q)
    if isinstance(mask, Tensor) and mask.dim() == 4 and tuple(mask.shape[-2:]) == (n_q, n_k):
        if mask.dtype == torch.bool or mask.is_floating_point():
            shape = (int(q.shape[0]), int(q.shape[1]), n_q, n_k)
            return AttentionMask.from_additive(
                mask, shape=shape, argument="attention_mask", q_offset=n_k - n_q
            )
    got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
    raise checks.bad_value(
        "attention_mask",
        f"expected None, heatformer's mask or a 4D mask ending in ({n_q}, {n_k}), got {got}",
    )


def heatformer_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: object,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention function for ``"heatformer"`` (the ``sdpa_attention_forward``
    signature): ``(B, H, Nq, Dh)`` queries, ``(B, Hkv, T, Dh)`` keys and values ->
    ``(B, Nq, H, Dh)`` and no weights (use :func:`attention_graphs` for those; a converted
    model called with ``output_attentions=True`` warns once, saying so)."""
    heads = getattr(module, HEADS_ATTRIBUTE, None)
    if not isinstance(heads, HeadOperators):
        restore = _restore_call(getattr(module, "config", None))
        if restore is not None:
            raise checks.bad_value(
                "model",
                f"{type(module).__name__} runs with attn_implementation={IMPLEMENTATION!r} "
                "without the heads its config records: the model was loaded without them "
                "(their learned parameters were not loaded) or they were removed; load it with "
                f"{restore}",
            )
        raise checks.bad_value(
            "model",
            f"{type(module).__name__} runs with attn_implementation={IMPLEMENTATION!r} but was "
            "not converted; call heatformer.integrations.hf.convert(model, heads)",
        )
    for name in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            raise checks.bad_value(
                "model",
                f"{type(module).__name__} passes {name!r}, which heatformer heads do not apply",
            )
    n_rep = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)  # (B, H, T, Dh)
    mask = _as_mask(attention_mask, module, is_causal, query, key)
    n_q, n_k = int(query.shape[-2]), int(key.shape[-2])
    own = None
    cross = bool(getattr(module, "is_cross_attention", False)) or (
        "CrossAttention" in type(module).__name__
    )  # keys from other tokens (an encoder): no I' v
    if not cross and (n_q != n_k or mask.q_offset != mask.kv_offset):
        start = mask.q_offset - mask.kv_offset
        if start < 0 or start + n_q > n_k:
            raise checks.bad_value(
                "model",
                f"queries at positions {mask.q_offset}..{mask.q_offset + n_q - 1} are not among "
                f"the {n_k} cached keys from position {mask.kv_offset}",
            )
        own = value[:, :, start : start + n_q]  # (B, H, Nq, Dh): the new tokens' own values
    capture = heads._capture
    if capture is not None and own is None and not cross:
        capture.append((heads.graph(query, key, mask, scale=scaling), value))
    y = heads(query, key, value, mask, scale=scaling, dropout=dropout, own_values=own, cross=cross)
    return y.transpose(1, 2).contiguous(), None  # (B, Nq, H, Dh)


def _register() -> None:
    """Register both functions under :data:`IMPLEMENTATION` (idempotent)."""
    AttentionInterface.register(IMPLEMENTATION, heatformer_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, heatformer_mask)


# ---- models ----------------------------------------------------------------------------------


def _calls_attention_interface(cls: type[nn.Module]) -> bool:
    """Whether ``cls.forward`` looks its attention function up in ``ALL_ATTENTION_FUNCTIONS``."""
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every attention module of ``model`` that calls transformers'
    ``AttentionInterface`` (one per layer in GPT-2, Llama, BERT, ViT), in module order."""
    if not isinstance(model, nn.Module):
        raise checks.bad_type("model", f"expected a transformers model, got {type(model).__name__}")
    known: dict[type[nn.Module], bool] = {}
    found = []
    for name, module in model.named_modules():
        cls = type(module)
        if cls not in known:
            known[cls] = _calls_attention_interface(cls)
        if known[cls]:
            found.append((name, module))
    return found


def _num_heads(module: nn.Module) -> int:
    for attr in ("num_heads", "num_attention_heads"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    config: Any = getattr(module, "config", None)
    return int(config.num_attention_heads)


def _is_converted(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == IMPLEMENTATION


def _restore_call(config: object) -> str | None:
    """The call that loads a saved converted model, when ``config`` records a conversion."""
    entry = getattr(config, CONFIG_ENTRY, None)
    if entry is None:
        return None
    restore = entry.get("restore") if isinstance(entry, dict) else None
    return str(restore or "heatformer.integrations.hf.from_pretrained(model_class, path)")


def _heads_of(name: str, module: nn.Module, spec: str, kind: str) -> HeadOperators:
    """The heads of one attention module: its own when they were built from ``spec`` and
    ``kind``, else new ones in the dtype and on the device of its weights."""
    return heads_for(getattr(module, HEADS_ATTRIBUTE, None), spec, kind, _num_heads(module), module)


def _new_heads(name: str, module: nn.Module, spec: str, kind: str) -> HeadOperators:
    """New heads for one attention module, in the dtype and on the device of its weights."""
    try:
        return heads_for(None, spec, kind, _num_heads(module), module)
    except ValueError as err:
        raise in_module(name, err) from None


def _attach(
    model: nn.Module, modules: Sequence[tuple[str, nn.Module]], made: Sequence[HeadOperators]
) -> None:
    """Give every attention module its heads and switch the model to :data:`IMPLEMENTATION`."""
    for (_, module), layer_heads in zip(modules, made, strict=True):
        setattr(module, HEADS_ATTRIBUTE, layer_heads)
    _register()
    hf_model: Any = model  # a PreTrainedModel: config, set_attn_implementation
    if not _is_converted(model):
        hf_model._heatformer_previous = getattr(hf_model.config, "_attn_implementation", "sdpa")
        hf_model.set_attn_implementation(IMPLEMENTATION)
    if not _is_converted(model):
        raise checks.bad_value(
            "model",
            f"{type(model).__name__} did not switch to attn_implementation={IMPLEMENTATION!r} "
            "(transformers refuses models that do not use the AttentionInterface)",
        )


class _NoAttentionWeights:
    """A forward pre-hook of a converted model: ``output_attentions`` (the call's, or the
    config's) gets one :class:`UserWarning` per model, pointing to :func:`attention_graphs`.

    heatformer's attention function returns no weights (it never forms ``P``; for a Laplacian
    or heat head ``P`` is not what the head applies either), and transformers learns nothing
    of ``output_attentions`` in the attention function, so ``outputs.attentions`` is ``()``.
    """

    def __init__(self) -> None:
        self.warned = False

    def __call__(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        requested = kwargs.get("output_attentions")
        if requested is None:
            requested = getattr(getattr(model, "config", None), "output_attentions", False)
        if requested and not self.warned and _is_converted(model):
            self.warned = True
            warnings.warn(
                f"output_attentions=True on {type(model).__name__} converted to heatformer "
                "heads: its attention function returns no weights, so `attentions` is (); "
                "heatformer.integrations.hf.attention_graphs(model, **inputs) returns every "
                "layer's attention graph (dense=True: the (B, H, N, N) weights)",
                UserWarning,
                stacklevel=3,
            )


def _watch_output_attentions(model: nn.Module) -> None:
    """Install :class:`_NoAttentionWeights` on ``model`` (once; :func:`_detach` removes it)."""
    if getattr(model, "_heatformer_attentions_hook", None) is None:
        hook = model.register_forward_pre_hook(_NoAttentionWeights(), with_kwargs=True)
        model._heatformer_attentions_hook = hook  # type: ignore[assignment]


def _detach(model: nn.Module) -> None:
    """Remove the heads and restore the previous attention implementation."""
    hook = getattr(model, "_heatformer_attentions_hook", None)
    if hook is not None:
        hook.remove()
        del model._heatformer_attentions_hook
    for _, module in attention_modules(model):
        if isinstance(getattr(module, HEADS_ATTRIBUTE, None), HeadOperators):
            delattr(module, HEADS_ATTRIBUTE)
    if _is_converted(model):
        hf_model: Any = model
        previous = getattr(hf_model, "_heatformer_previous", "sdpa")
        hf_model.set_attn_implementation(previous if previous != IMPLEMENTATION else "sdpa")


def _write_record(model: nn.Module, modules: Sequence[tuple[str, nn.Module]]) -> None:
    """Record the heads in the config, as ``save_pretrained`` writes it to ``config.json``:
    ``"attn_implementation": "heatformer"`` (so that ``from_pretrained`` does not build the
    model with another attention) and the ``"heatformer"`` entry."""
    config: Any = model.config
    records = {name: ModuleRecord.of(getattr(m, HEADS_ATTRIBUTE)) for name, m in modules}
    restore = (
        f"heatformer.integrations.hf.from_pretrained(transformers.{type(model).__name__}, path)"
    )
    setattr(config, CONFIG_ENTRY, model_record(records, restore))
    config.attn_implementation = IMPLEMENTATION  # read back by the config's __init__


def _convertible(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules :func:`convert` gives heads to.

    Raises:
        ValueError: no attention module; a model saved converted and loaded without its heads.
    """
    modules = attention_modules(model)
    if not modules:
        raise checks.bad_value(
            "model",
            f"found no attention module in {type(model).__name__} that calls transformers' "
            "AttentionInterface (models written for transformers >= 5 do)",
        )
    restore = _restore_call(getattr(model, "config", None))
    if restore is not None and not all(hasattr(m, HEADS_ATTRIBUTE) for _, m in modules):
        raise checks.bad_value(
            "model",
            f"{type(model).__name__} was saved converted (its config records heatformer heads) "
            "and loaded without them, so their learned parameters were not loaded; load it "
            f"with {restore}, or call heatformer.integrations.hf.revert(model) first to drop "
            "the record and convert the model as it is",
        )
    return modules


def _install(
    model: nn.Module, modules: Sequence[tuple[str, nn.Module]], made: list[HeadOperators]
) -> nn.Module:
    """Attach the heads, record them in the config and watch ``output_attentions``."""
    _attach(model, modules, made)
    _write_record(model, modules)
    _watch_output_attentions(model)
    return model


def convert(
    model: nn.Module,
    heads: str | Sequence[str],
    *,
    graph: str | GraphBuilder | Sequence[str] = "softmax",
) -> nn.Module:
    """Switch a loaded transformers model to heatformer heads, in place; returns ``model``.

    Every attention module keeps its projections and weights; its heads apply the operators
    of ``heads`` to its own ``q``, ``k``, ``v`` (see :mod:`heatformer.models.heads`). Learnable
    operator parameters become parameters of the model. Calling it again replaces the heads
    of every layer whose spec or graph kind changes (new parameters, as the spec sets them);
    a layer given the spec and graph kind it has keeps its heads, learned parameters included.

    The conversion is recorded in ``model.config`` (``attn_implementation`` and a
    ``heatformer`` entry: every layer's head spec, graph kind and head count), so that
    ``model.save_pretrained(path)`` writes it to ``config.json`` and :func:`from_pretrained`
    loads the model converted.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` (GPT-2, Llama-family, BERT, ViT, ...).
        heads: one head spec for every attention layer (``"attention:10,laplacian:2"``), or
            one per layer (``"attention:12;attention:10,laplacian:2;..."`` or a list).
        graph: the graph kind of every layer (``"softmax"``, ``"topk[k=32]"``), or one per
            layer with the same syntax.

    Returns:
        ``model``, with ``config._attn_implementation == "heatformer"``.

    Raises:
        ValueError: no attention module that calls the ``AttentionInterface``; a head spec
            that does not fit a layer's head count; a model that cannot switch its attention
            implementation; a model saved converted and loaded without its heads (their
            learned parameters would be lost: use :func:`from_pretrained`).
    """
    modules = _convertible(model)
    plan = layer_specs(heads, graph, len(modules))
    return convert_modules(model, modules, plan, make=_heads_of, install=_install)


def revert(model: nn.Module) -> nn.Module:
    """Undo :func:`convert`: remove the heads and their record in the config, and restore the
    previous attention implementation (``"sdpa"`` if unknown); returns ``model``."""
    _detach(model)
    config = getattr(model, "config", None)
    for attr in (CONFIG_ENTRY, "attn_implementation"):
        if config is not None and attr in vars(config):
            delattr(config, attr)
    return model


# ---- saved converted models ------------------------------------------------------------------

#: ``from_pretrained`` arguments that say where ``config.json`` is
_HUB_KWARGS = (
    "cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder",
    "token", "trust_remote_code",
)  # fmt: skip


def _model_class(model_class: Any, config: Any) -> type[PreTrainedModel]:
    """The model class that ``model_class`` (a model class or an Auto class) loads
    ``config`` with, as the Auto classes choose it."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:  # an Auto class
        try:
            found = mapping[type(config)]
        except KeyError:
            raise checks.bad_value(
                "model_class",
                f"{model_class.__name__} has no model for {type(config).__name__}",
            ) from None
        if isinstance(found, (list, tuple)):
            named = {cls.__name__: cls for cls in found}
            found = next(
                (named[a] for a in getattr(config, "architectures", None) or [] if a in named),
                found[0],
            )
        return found
    if isinstance(model_class, type) and issubclass(model_class, PreTrainedModel):
        return model_class
    raise checks.bad_type(
        "model_class",
        f"expected a transformers model class or Auto class, got {model_class!r}",
    )


def _matched(
    model: nn.Module, records: dict[str, ModuleRecord], where: str
) -> list[tuple[str, nn.Module, ModuleRecord]]:
    """Every attention module of ``model`` with the record of its saved counterpart (the
    names may differ by the base model's prefix: a head model loaded as its base model)."""
    modules = attention_modules(model)
    prefix = str(getattr(model, "base_model_prefix", "") or "")

    def bare(name: str) -> str:
        return name.removeprefix(prefix + ".") if prefix else name

    saved = list(records)
    if len(saved) != len(modules) or any(
        bare(name) != bare(other) for (name, _), other in zip(modules, saved, strict=False)
    ):
        raise checks.bad_value(
            "path",
            f"{where} records heads for the attention modules {saved}; "
            f"{type(model).__name__} has {[name for name, _ in modules]}",
        )
    return [(name, module, records[other]) for (name, module), other in zip(modules, saved)]


def _with_heads(cls: type[PreTrainedModel], records: dict[str, ModuleRecord], where: str) -> Any:
    """``cls`` whose ``__init__`` ends by giving every attention module the heads of its
    record: ``from_pretrained`` then finds the heads' parameters in the model and loads them
    from the checkpoint as any other weight."""

    def __init__(self: PreTrainedModel, config: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, config, *args, **kwargs)
        for name, module, record in _matched(self, records, where):
            head_dim = head_width(module, record.num_heads)
            setattr(module, HEADS_ATTRIBUTE, record.build(name, head_dim=head_dim))

    namespace = {"__init__": __init__, "__module__": cls.__module__, "__doc__": cls.__doc__,
                 "__qualname__": cls.__qualname__}  # fmt: skip
    return type(cls.__name__, (cls,), namespace)


def from_pretrained(
    model_class: Any, path: str | os.PathLike[str], *model_args: Any, **kwargs: Any
) -> Any:
    """Load a converted model saved with ``save_pretrained``, converted as it was saved.

    :func:`convert` records the conversion in the config, which ``save_pretrained`` writes
    to ``config.json``: ``"attn_implementation": "heatformer"`` and a ``"heatformer"`` entry
    with every attention module's head spec, graph kind and head count. This call builds the
    model with those heads in place, so that transformers loads their learned parameters
    (a learnable time ``log_t``) from the checkpoint with every other weight: the model equals
    the one saved to the last bit. ::

        hf.convert(model, "attention:2,heat[t=0.5;learnable=true]:2")
        ...                                           # train
        model.save_pretrained(path)
        model = hf.from_pretrained(AutoModelForCausalLM, path)    # in any process

    A plain ``AutoModelForCausalLM.from_pretrained(path)`` refuses the folder: transformers
    does not know ``attn_implementation="heatformer"`` until heatformer registers it; after
    that (in a process that converted a model), it builds the model without its heads, and
    its first forward pass raises, naming this call.

    Args:
        model_class: what would load the unconverted model: an Auto class
            (``AutoModelForCausalLM``) or a model class (``GPT2LMHeadModel``); the base model
            of a saved head model (``AutoModel`` for a saved ``GPT2LMHeadModel``) works too.
        path: the folder written by ``save_pretrained`` (or a Hub id).
        *model_args, **kwargs: passed on to ``model_class.from_pretrained`` (``dtype``,
            ``device_map``, ``output_loading_info``, ...).

    Returns:
        The converted model (with ``output_loading_info=True``, also the loading info).

    Raises:
        ValueError: ``config.json`` records no conversion (load the model with
            ``model_class.from_pretrained(path)``), or attention modules other than the
            recorded ones; weights without the heads' parameters; an ``attn_implementation``
            other than ``"heatformer"``.
    """
    implementation = kwargs.pop("attn_implementation", IMPLEMENTATION)
    if implementation != IMPLEMENTATION:
        raise checks.bad_value(
            "attn_implementation",
            f"expected {IMPLEMENTATION!r} (the saved model's heads), got {implementation!r}",
        )
    with_info = bool(kwargs.pop("output_loading_info", False))
    config = kwargs.pop("config", None)
    if config is None:
        hub = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
        config = AutoConfig.from_pretrained(path, **hub)
    where = f"{os.fspath(path)}/config.json"
    if getattr(config, CONFIG_ENTRY, None) is None:
        name = getattr(model_class, "__name__", "model_class")
        raise checks.bad_value(
            "path",
            f"{where} records no heatformer conversion (no 'heatformer' entry): the model was "
            f"saved unconverted; load it with {name}.from_pretrained(path)",
        )
    records = read_model_record(getattr(config, CONFIG_ENTRY), where)
    cls = _model_class(model_class, config)
    _register()
    model, info = _with_heads(cls, records, where).from_pretrained(
        path, *model_args, config=config, attn_implementation=IMPLEMENTATION,
        output_loading_info=True, **kwargs,
    )  # fmt: skip
    model.__class__ = cls
    lost = sorted(key for key in info["missing_keys"] if f".{HEADS_ATTRIBUTE}." in key)
    if lost:
        raise checks.bad_value(
            "path", f"{os.fspath(path)}: the weights lack {lost}, which the heads it records own"
        )
    modules = attention_modules(model)
    for name, module in modules:  # fresh heads on the loaded weights' device, loaded values
        loaded: HeadOperators = getattr(module, HEADS_ATTRIBUTE)
        fresh = _new_heads(name, module, str(loaded.source), loaded.graph_kind.spec)
        fresh.load_state_dict(loaded.state_dict())
        setattr(module, HEADS_ATTRIBUTE, fresh)
    _write_record(model, modules)
    _watch_output_attentions(model)
    return (model, info) if with_info else model


def _capture(model: nn.Module, inputs: dict[str, Any]) -> list[tuple[Graph, Tensor, HeadOperators]]:
    """One forward pass (no gradients, eval mode; the training flag restored) that collects
    ``(graph, values, heads)`` of every attention module that ran, in module order; a model
    that was not converted runs with all-attention heads, removed afterwards (its config is
    left as it was)."""
    converted = _is_converted(model)
    modules = attention_modules(model)
    if not converted:
        _attach(model, modules, [_new_heads(n, m, "attention", "softmax") for n, m in modules])
    layers = [getattr(m, HEADS_ATTRIBUTE) for _, m in modules]
    captured: list[list[tuple[Graph, Tensor]]] = [[] for _ in layers]
    was_training = model.training
    try:
        for layer, store in zip(layers, captured, strict=True):
            layer._capture = store
        model.eval()
        with torch.no_grad():
            model(**inputs)
    finally:
        for layer in layers:
            layer._capture = None
        model.train(was_training)
        if not converted:
            _detach(model)
    return [(g, v, layer) for layer, store in zip(layers, captured, strict=True) for g, v in store]


def attention_graphs(model: nn.Module, *, dense: bool = False, **inputs: Any) -> list[Graph]:
    """The attention graph of every layer for ``inputs``, batched over ``(B, H)``.

    Runs one forward pass (no gradients, eval mode; the training flag is restored) and
    returns, per attention module in module order, the graph its heads diffuse on: the
    layer's graph kind built from its own queries and keys (grouped keys repeated per query
    head), with the model's scaling and mask. On the dense kind that is an implicit
    :class:`~heatformer.graph_ops.SoftmaxGraph`: it holds ``q``, ``k`` and a ``(B, N)`` padding
    mask, never ``N x N``, so memory grows as ``B H N Dh``. A model that was not converted is
    read with all-attention heads (its own attention) and left as it was.

    Args:
        model: a transformers model, converted or not.
        dense: return :class:`~heatformer.graph_ops.DenseGraph` s (``N x N`` per head).
        **inputs: the model's inputs (``input_ids``, ``attention_mask``, ``pixel_values``...).

    Returns:
        One graph per attention module that ran.
    """
    graphs = [g for g, _, _ in _capture(model, inputs)]
    if dense:
        return [DenseGraph(g.to_dense()) for g in graphs]
    return graphs


def attention_snapshots(model: nn.Module, **inputs: Any) -> list[LayerSnapshot]:
    """Every layer's attention on one input, as the snapshots the teaching pictures draw.

    The counterpart of :func:`heatformer.analysis.snapshot_attention` for a transformers model:
    one :class:`~heatformer.analysis.LayerSnapshot` per attention module that ran, holding the
    dense float64 graphs ``(H, N, N)`` (and ``source_dtype``, the dtype the model computed them
    in), the values ``(H, N, Dh)`` (grouped values repeated per query head) and the operator of
    every head (all ``attention`` for a model that was not converted).
    :func:`heatformer.viz.demo.demo_from_snapshots` and ``heatformer demo --hf-model DIR`` draw
    them.

    Args:
        model: a transformers model, converted or not.
        **inputs: the model's inputs for one sequence (batch size 1).

    Returns:
        One snapshot per attention module that ran.

    Raises:
        ValueError: the inputs hold more than one sequence.
    """
    rows = _capture(model, inputs)
    snapshots = []
    for graph, values, heads in rows:
        if graph.batch_shape[0] != 1:
            raise checks.bad_value(
                "inputs", f"expected one sequence (batch size 1), got {graph.batch_shape[0]}"
            )
        weights = graph.to_dense()[0]  # (H, N, N), the model's dtype
        snapshots.append(
            LayerSnapshot(
                graph=DenseGraph(weights.to(torch.float64)),
                values=values[0].to(torch.float64),  # (H, N, Dh)
                operators=tuple(heads.head_operators),
                source_dtype=weights.dtype,
            )
        )
    return snapshots
