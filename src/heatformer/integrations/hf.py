r"""Hugging Face ``transformers`` models with heatformer's diffusion heads.

:func:`convert` switches a loaded model (GPT-2, Llama-family with grouped-query attention,
BERT, ViT, and any model that declares attention layers calling transformers'
``AttentionInterface``: see :func:`attention_modules`) to heatformer heads, in place: each
attention layer keeps its projections, rotary embeddings, KV cache and weights, and its heads
apply the operators of a head spec to the layer's own ``q``, ``k``, ``v``.
:func:`attention_graphs` returns the attention graph of every layer, for analysis and
teaching, on a converted or an unconverted model, and :func:`attention_snapshots` the same
with values and operators, as the teaching pictures take them (``heatformer demo --hf-model
DIR``). :func:`attention_stats` reduces every layer's graph, as the layer runs, to the
in-degree, row entropy and largest logit of every head (what ``output_attentions`` would be
read for, without its ``N x N`` maps).

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
their own spec in a per-module schedule. Modules that decide per call (one class for self-
and cross-attention, told apart by the call's arguments) are not told apart.

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

import os
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from heatformer import checks
from heatformer.analysis.hooks import LayerSnapshot
from heatformer.analysis.stats import AttentionStats
from heatformer.analysis.stats import attention_stats as graph_attention_stats
from heatformer.graph_ops import DenseGraph, Graph, GraphBuilder
from heatformer.integrations._convert import Adapter
from heatformer.integrations._heads import (
    CaptureSink,
    HeadOperators,
    head_width,
    heads_for,
    in_module,
)
from heatformer.integrations._hf_attention import (  # refuses a missing or old transformers
    CONFIG_ENTRY,
    HEADS_ATTRIBUTE,
    IMPLEMENTATION,
    MIN_TRANSFORMERS,
    attach,
    attention_modules,
    detach,
    heatformer_attention,
    heatformer_mask,
    is_converted,
    num_heads,
    register,
    restore_call,
    watch_output_attentions,
    write_record,
)
from heatformer.integrations._record import ModuleRecord, read_model_record

# isort: split
from transformers import AutoConfig, PreTrainedModel  # after the check of its version

__all__ = [
    "IMPLEMENTATION",
    "MIN_TRANSFORMERS",
    "attention_graphs",
    "attention_modules",
    "attention_snapshots",
    "attention_stats",
    "convert",
    "from_pretrained",
    "heatformer_attention",
    "heatformer_mask",
    "revert",
]


# ---- converting ------------------------------------------------------------------------------


def _heads_of(name: str, module: nn.Module, spec: str, kind: str) -> HeadOperators:
    """The heads of one attention module: its own when they were built from ``spec`` and
    ``kind``, else new ones in the dtype and on the device of its weights."""
    return heads_for(getattr(module, HEADS_ATTRIBUTE, None), spec, kind, num_heads(module), module)


def _new_heads(name: str, module: nn.Module, spec: str, kind: str) -> HeadOperators:
    """New heads for one attention module, in the dtype and on the device of its weights."""
    try:
        return heads_for(None, spec, kind, num_heads(module), module)
    except ValueError as err:
        raise in_module(name, err) from None


def _convertible(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules :func:`convert` gives heads to.

    Raises:
        ValueError: a model that declares no attention module calling the
            ``AttentionInterface`` (:func:`attention_modules`); a model saved converted and
            loaded without its heads.
    """
    modules = attention_modules(model)
    restore = restore_call(getattr(model, "config", None))
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
    attach(model, modules, made)
    write_record(model, modules)
    watch_output_attentions(model)
    return model


_ADAPTER = Adapter(find=_convertible, make=_heads_of, install=_install)


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
        ValueError: a model whose class does not declare attention modules that call the
            ``AttentionInterface`` (``_supports_attention_backend``, see
            :func:`attention_modules`); a head spec
            that does not fit a layer's head count; a model that cannot switch its attention
            implementation; a model saved converted and loaded without its heads (their
            learned parameters would be lost: use :func:`from_pretrained`).
    """
    return _ADAPTER.convert(model, heads, graph)


def revert(model: nn.Module) -> nn.Module:
    """Undo :func:`convert`: remove the heads and their record in the config, and restore the
    previous attention implementation (``"sdpa"`` if unknown); returns ``model``."""
    detach(model)
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
    register()
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
    write_record(model, modules)
    watch_output_attentions(model)
    return (model, info) if with_info else model


def _capturing(
    model: nn.Module, inputs: dict[str, Any], make_sink: Callable[[], CaptureSink]
) -> list[tuple[HeadOperators, CaptureSink]]:
    """One forward pass (no gradients, eval mode; the training flag restored) during which
    every attention module hands ``(graph, values)`` of each call to its own sink
    (``make_sink()``); returns ``(heads, sink)`` per attention module, in module order. A model
    that was not converted runs with all-attention heads (its own attention, the same SDPA
    call), removed afterwards (its config is left as it was)."""
    converted = is_converted(model)
    modules = attention_modules(model)
    if not converted:
        attach(model, modules, [_new_heads(n, m, "attention", "softmax") for n, m in modules])
    layers = [getattr(m, HEADS_ATTRIBUTE) for _, m in modules]
    sinks = [make_sink() for _ in layers]
    was_training = model.training
    try:
        for layer, sink in zip(layers, sinks, strict=True):
            layer._capture = sink
        model.eval()
        with torch.no_grad():
            model(**inputs)
    finally:
        for layer in layers:
            layer._capture = None
        model.train(was_training)
        if not converted:
            detach(model)
    return list(zip(layers, sinks, strict=True))


def _capture(model: nn.Module, inputs: dict[str, Any]) -> list[tuple[Graph, Tensor, HeadOperators]]:
    """``(graph, values, heads)`` of every attention module that ran (:func:`_capturing` into
    lists), in module order."""
    rows = _capturing(model, inputs, list)
    return [(g, v, layer) for layer, store in rows for g, v in cast(list, store)]


class _StatsSink:
    """A layer's sink for :func:`attention_stats`: each graph is reduced to its statistics as
    the layer runs, and only those are kept (the graph, which holds ``q`` and ``k``, goes with
    the layer's other activations)."""

    def __init__(self) -> None:
        self.stats: list[AttentionStats] = []

    def append(self, item: tuple[Graph, Tensor], /) -> None:
        self.stats.append(graph_attention_stats(item[0]))


def attention_stats(model: nn.Module, **inputs: Any) -> list[AttentionStats]:
    r"""Every layer's attention statistics for ``inputs``, per head, without ``N x N``.

    The counterpart of ``output_attentions=True`` that scales: transformers' eager path forms
    every ``(B, H, N, N)`` map (32 GiB per layer at 32k tokens in float32, one head); here the
    model runs its own fused attention (an unconverted model runs heatformer's all-attention
    heads for the pass: the SDPA call of its ``"sdpa"`` implementation) and a hook on each
    attention module reduces the layer's graph to
    :func:`heatformer.analysis.attention_stats` as the layer runs: the column sums of ``P``
    (how much each token is read), its row entropy and the largest logit of each row,
    computed from blocks of rows of the logits (the window kind's band; a top-k kind's kept
    weights, with no logits), so memory beyond the model's own is ``O(rows N)`` per block and
    ``O(B H N)`` per layer kept. One forward pass, no gradients, eval mode (the training flag
    is restored); a converted model keeps its graph kind and is left as it was.

    The statistics are those of the layer's attention graph ``P`` whatever its heads' operators
    (a Laplacian or heat head diffuses on the same ``P``). Without this call the converted
    attention's forward reads and stores nothing (no host sync; it traces under
    :func:`torch.compile`); with it, each layer pays one more pass over its logits.

    Args:
        model: a transformers model, converted or not.
        **inputs: the model's inputs (``input_ids``, ``attention_mask``, ``pixel_values``...).

    Returns:
        One :class:`~heatformer.analysis.AttentionStats` per attention module that ran (in
        module order; cross-attention and KV-cached calls, whose graphs are rectangular, are
        left out), each field ``(B, H, N)`` (``max_logit`` None for a top-k kind). A padded
        key is read by no query (in-degree 0); a padded query keeps the statistics of the real
        keys it attends.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2,
        ...                   num_attention_heads=4, intermediate_size=64))
        >>> stats = attention_stats(model, input_ids=torch.zeros(1, 5, dtype=torch.long))
        >>> len(stats), tuple(stats[0].entropy.shape)
        (2, (1, 4, 5))
        >>> torch.allclose(stats[0].in_degree.sum(-1), torch.full((1, 4), 5.0))
        True
    """
    rows = _capturing(model, inputs, _StatsSink)
    return [s for _, sink in rows for s in cast(_StatsSink, sink).stats]


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
