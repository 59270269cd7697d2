"""What a Hugging Face model converted by :mod:`heatformer.integrations.hf` runs, and how
the heads are attached to it.

transformers looks up two functions by the model's attention implementation name: the mask
function (:func:`heatformer_mask`) and the attention function (:func:`heatformer_attention`),
registered here under :data:`IMPLEMENTATION`. The rest holds the adapter's grip on a model:
its attention modules, the heads attached to and detached from them, the conversion record in
its config, and the warning for ``output_attentions``. :mod:`heatformer.integrations.hf`
builds ``convert``, ``revert``, ``from_pretrained`` and ``attention_graphs`` on these and
re-exports the public names; this module is imported only through it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from heatformer import checks
from heatformer.integrations._heads import HeadOperators
from heatformer.integrations._record import ModuleRecord, model_record
from heatformer.models.masks import AttentionMask

#: the oldest transformers this module works with (the ``hf`` extra of setup.cfg declares it):
#: 5.0-5.3 call mask functions with ``cache_position`` instead of ``q_length``/``q_offset``
MIN_TRANSFORMERS = "5.4"


def check_transformers_version(version: str) -> None:
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
    from transformers import AttentionInterface, PreTrainedModel
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
check_transformers_version(transformers.__version__)

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
    ``(B, Nq, H, Dh)`` and no weights (use :func:`heatformer.integrations.hf.attention_graphs`
    for those; a converted model called with ``output_attentions=True`` warns once, saying
    so)."""
    heads = getattr(module, HEADS_ATTRIBUTE, None)
    if not isinstance(heads, HeadOperators):
        restore = restore_call(getattr(module, "config", None))
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


def register() -> None:
    """Register both functions under :data:`IMPLEMENTATION` (idempotent)."""
    AttentionInterface.register(IMPLEMENTATION, heatformer_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, heatformer_mask)


# ---- models ----------------------------------------------------------------------------------

#: a :func:`_recorders` entry: the class, the class name or name suffix, and the layer name of
#: the modules that one ``_can_record_outputs`` entry names
_Recorder = tuple[type | None, str | None, str | None]


def _declares_backend(model: nn.Module) -> bool:
    """Whether ``model``'s class declares that its attention layers call transformers'
    ``AttentionInterface``: ``_supports_attention_backend = True``, the flag
    ``PreTrainedModel.is_backend_compatible`` reads (``False`` on ``PreTrainedModel``)."""
    return getattr(type(model), "_supports_attention_backend", False) is True


def _recorders(model: nn.Module) -> list[_Recorder]:
    """The attention modules ``model``'s class declares in ``_can_record_outputs``: its
    ``"attentions"``, ``"cross_attentions"``, ... entries (each a class, a class name, an
    ``OutputRecorder`` or a list of them), the modules whose output ``[1]`` transformers
    returns as ``outputs.attentions``: what the attention function returned as weights."""
    declared = getattr(type(model), "_can_record_outputs", None) or {}
    found: list[_Recorder] = []
    for key, specs in declared.items():
        if not str(key).endswith("attentions"):
            continue
        for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
            if isinstance(spec, type):
                found.append((spec, None, None))
            elif isinstance(spec, str):
                found.append((None, spec, None))
            else:  # an OutputRecorder(target_class, index, layer_name, class_name)
                names = (getattr(spec, "class_name", None), getattr(spec, "layer_name", None))
                found.append((getattr(spec, "target_class", None), *names))
    return found


def _recorded(name: str, module: nn.Module, recorder: _Recorder) -> bool:
    """Whether the module ``name`` is one that ``recorder`` names: an instance of its class,
    or of its class name, or a module whose name ends with that name (as transformers reads a
    name), inside a layer of its layer name when it gives one."""
    cls, class_name, layer_name = recorder
    of_class = cls is not None and isinstance(module, cls)
    of_name = class_name is not None and (
        type(module).__name__ == class_name or name.endswith(class_name)
    )
    if not (of_class or of_name):
        return False
    return layer_name is None or f".{layer_name.strip('.')}." in f".{name}."


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every attention module of ``model``, in module order (one per
    layer in GPT-2, Llama, Mistral, BERT, ViT; GPT-2 and BERT decoders have cross-attention
    modules too): the modules that call transformers' ``AttentionInterface``, found by what the
    model declares, never by reading its source.

    Two declarations of transformers' models (>= 5) say it. The model's class sets
    ``_supports_attention_backend = True``: its attention layers call the attention function
    registered for ``config._attn_implementation`` (the flag vLLM and TGI read, through
    ``is_backend_compatible``). And ``_can_record_outputs`` names the classes of those layers
    (``"attentions"``, ``"cross_attentions"``): transformers records their second output
    (the attention function's weights) as ``outputs.attentions``. A submodel (a
    ``PreTrainedModel`` inside the model, as the ``transformer`` of ``GPT2LMHeadModel``)
    names the attention modules inside it, as transformers reads it.

    Raises:
        TypeError: ``model`` is not a module.
        ValueError: ``model`` is not a transformers model, its class does not declare
            ``_supports_attention_backend = True``, or it declares no attention module.
    """
    if not isinstance(model, nn.Module):
        raise checks.bad_type("model", f"expected a transformers model, got {type(model).__name__}")
    name_of = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        reason = f"{name_of} is not a transformers model (a PreTrainedModel)"
    elif not _declares_backend(model):
        reason = (
            f"{name_of} does not declare it: its class does not set "
            "_supports_attention_backend = True, which transformers sets on the models that "
            "take custom attention functions (GPT-2, Llama, Mistral, BERT, ViT, ...)"
        )
    else:
        reason = f"{name_of} names no attention module in _can_record_outputs"
        recorders: dict[str, list[_Recorder]] = {}
        found = []
        for name, module in model.named_modules():
            if isinstance(module, PreTrainedModel):  # the model, or a submodel: its own names
                recorders[name] = _recorders(module)
            else:
                recorders[name] = recorders[name.rpartition(".")[0]]
            if any(_recorded(name, module, r) for r in recorders[name]):
                found.append((name, module))
        if found:
            return found
    raise checks.bad_value(
        "model",
        f"found no attention module in {name_of} that calls transformers' AttentionInterface: "
        f"{reason}",
    )


def num_heads(module: nn.Module) -> int:
    for attr in ("num_heads", "num_attention_heads"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    config: Any = getattr(module, "config", None)
    return int(config.num_attention_heads)


def is_converted(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == IMPLEMENTATION


def restore_call(config: object) -> str | None:
    """The call that loads a saved converted model, when ``config`` records a conversion."""
    entry = getattr(config, CONFIG_ENTRY, None)
    if entry is None:
        return None
    restore = entry.get("restore") if isinstance(entry, dict) else None
    return str(restore or "heatformer.integrations.hf.from_pretrained(model_class, path)")


def attach(
    model: nn.Module, modules: Sequence[tuple[str, nn.Module]], made: Sequence[HeadOperators]
) -> None:
    """Give every attention module its heads and switch the model to :data:`IMPLEMENTATION`."""
    for (_, module), layer_heads in zip(modules, made, strict=True):
        setattr(module, HEADS_ATTRIBUTE, layer_heads)
    register()
    hf_model: Any = model  # a PreTrainedModel: config, set_attn_implementation
    if not is_converted(model):
        hf_model._heatformer_previous = getattr(hf_model.config, "_attn_implementation", "sdpa")
        hf_model.set_attn_implementation(IMPLEMENTATION)
    if not is_converted(model):
        raise checks.bad_value(
            "model",
            f"{type(model).__name__} did not switch to attn_implementation={IMPLEMENTATION!r} "
            "(transformers refuses models that do not use the AttentionInterface)",
        )


class _NoAttentionWeights:
    """A forward pre-hook of a converted model: ``output_attentions`` (the call's, or the
    config's) gets one :class:`UserWarning` per model, pointing to
    :func:`~heatformer.integrations.hf.attention_graphs`.

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
        if requested and not self.warned and is_converted(model):
            self.warned = True
            warnings.warn(
                f"output_attentions=True on {type(model).__name__} converted to heatformer "
                "heads: its attention function returns no weights, so `attentions` is (); "
                "heatformer.integrations.hf.attention_graphs(model, **inputs) returns every "
                "layer's attention graph (dense=True: the (B, H, N, N) weights)",
                UserWarning,
                stacklevel=3,
            )


def watch_output_attentions(model: nn.Module) -> None:
    """Install :class:`_NoAttentionWeights` on ``model`` (once; :func:`detach` removes it)."""
    if getattr(model, "_heatformer_attentions_hook", None) is None:
        hook = model.register_forward_pre_hook(_NoAttentionWeights(), with_kwargs=True)
        model._heatformer_attentions_hook = hook  # type: ignore[assignment]


def detach(model: nn.Module) -> None:
    """Remove the heads and restore the previous attention implementation."""
    hook = getattr(model, "_heatformer_attentions_hook", None)
    if hook is not None:
        hook.remove()
        del model._heatformer_attentions_hook
    for _, module in attention_modules(model):
        if isinstance(getattr(module, HEADS_ATTRIBUTE, None), HeadOperators):
            delattr(module, HEADS_ATTRIBUTE)
    if is_converted(model):
        hf_model: Any = model
        previous = getattr(hf_model, "_heatformer_previous", "sdpa")
        hf_model.set_attn_implementation(previous if previous != IMPLEMENTATION else "sdpa")


def write_record(model: nn.Module, modules: Sequence[tuple[str, nn.Module]]) -> None:
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
