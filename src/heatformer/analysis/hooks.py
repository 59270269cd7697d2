"""Read a model's inside with forward hooks: per-layer token states, attention graphs.

:func:`collect_token_states` stores the output of named submodules of any
:class:`torch.nn.Module`; :func:`snapshot_attention` stores the input of every attention
layer of a heatformer model and rebuilds its graphs and values (:class:`LayerSnapshot`).
Both run the model through one routine: the hooks live only for one forward pass (removed in
a ``finally`` block), the pass runs under :func:`torch.no_grad`, and every submodule's
``training`` flag is put back as it was, whatever happens inside the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from heatformer.checks import bad_type, bad_value
from heatformer.graph_ops import DenseGraph, DiffusionOperator, Graph

__all__ = ["LayerSnapshot", "collect_token_states", "forward_once", "snapshot_attention"]

_DEFAULT_CONTAINERS = ("blocks", "layers")
_MAX_LISTED_NAMES = 12


def _default_layers(model: nn.Module) -> list[str]:
    for attr in _DEFAULT_CONTAINERS:
        container = getattr(model, attr, None)
        if isinstance(container, nn.Module):
            names = [f"{attr}.{name}" for name, _ in container.named_children()]
            if names:
                return names
    raise bad_value(
        "layers",
        f"expected a list of submodule names, got None and {type(model).__name__} has no "
        f"non-empty {' or '.join(repr(a) for a in _DEFAULT_CONTAINERS)} container to default "
        f"to; pass names from model.named_modules()",
    )


def _valid_names_hint(model: nn.Module) -> str:
    names = [name for name, _ in model.named_modules() if name]
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED_NAMES])
    more = f", ... ({len(names)} in all)" if len(names) > _MAX_LISTED_NAMES else ""
    return f"valid names include {shown}{more}" if names else "the model has no submodules"


def _resolve_layers(model: nn.Module, layers: Sequence[str] | None) -> dict[str, nn.Module]:
    if layers is None:
        names = _default_layers(model)
    elif isinstance(layers, str) or not isinstance(layers, Sequence):
        raise bad_type("layers", f"expected a list of submodule names, got {type(layers)}")
    else:
        names = list(layers)
    modules: dict[str, nn.Module] = {}
    for name in names:
        if not isinstance(name, str):
            raise bad_type("layers", f"expected str names, got {type(name)} ({name!r})")
        if name in modules:
            raise bad_value("layers", f"expected distinct names, got {name!r} twice")
        try:
            modules[name] = model.get_submodule(name)
        except AttributeError:
            raise bad_value(
                "layers", f"unknown submodule {name!r}; {_valid_names_hint(model)}"
            ) from None
    return modules


def _first_tensor(value: Any) -> Tensor | None:
    """``value`` if it is a tensor, else the first tensor of a tuple or list (or None)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, Tensor):
                return item
    return None


def forward_once(model: nn.Module, inputs: Any, handles: Sequence[Any], *, eval_mode: bool) -> None:
    """One forward pass of ``model`` on ``inputs`` (a tensor, a tuple of positional arguments or
    a mapping of keyword arguments) without gradients, in eval mode when ``eval_mode``; then,
    whatever happens, the hook ``handles`` are removed and every module's training flag is
    restored. What the hooks of :func:`collect_token_states` and
    :func:`~heatformer.analysis.rollout` collect with."""
    flags = [(module, module.training) for module in model.modules()]
    try:
        if eval_mode:
            model.eval()
        with torch.no_grad():
            if isinstance(inputs, tuple):
                model(*inputs)
            elif isinstance(inputs, Mapping):
                model(**inputs)
            else:
                model(inputs)
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in flags:
            module.training = flag


def _run_hooked(
    model: nn.Module,
    inputs: Any,
    modules: Mapping[str, nn.Module],
    *,
    argument: str,
    read_inputs: bool = False,
    to_cpu: bool = False,
    eval_mode: bool = True,
) -> dict[str, Tensor]:
    """Call ``model`` once and store, for each named submodule, its output (or its first
    tensor argument, with ``read_inputs``) as a detached copy; errors name ``argument``."""
    states: dict[str, Tensor] = {}

    def store(name: str, value: Any) -> None:
        if name in states:
            raise bad_value(
                argument,
                f"submodule {name!r} ran more than once in one forward pass; its states would "
                f"be ambiguous",
            )
        state = _first_tensor(value)
        if state is None:
            what = "be called with" if read_inputs else "return"
            raise bad_type(
                argument,
                f"expected submodule {name!r} to {what} a tensor or a tuple holding one, "
                f"got {type(value)}",
            )
        state = state.detach()
        states[name] = state.to("cpu", copy=True) if to_cpu else state.clone()

    def make_hook(name: str) -> Any:
        if read_inputs:
            return lambda module, args: store(name, args)
        return lambda module, args, output: store(name, output)

    register = "register_forward_pre_hook" if read_inputs else "register_forward_hook"
    forward_once(
        model, inputs, [getattr(module, register)(make_hook(n)) for n, module in modules.items()],
        eval_mode=eval_mode,
    )  # fmt: skip
    missing = [name for name in modules if name not in states]
    if missing:
        raise bad_value(argument, f"submodules {missing} did not run during the forward pass")
    return {name: states[name] for name in modules}


def collect_token_states(
    model: nn.Module,
    inputs: Any,
    layers: Sequence[str] | None = None,
    *,
    to_cpu: bool = False,
    eval_mode: bool = True,
) -> dict[str, Tensor]:
    """Run ``model`` once and return the output of each named layer.

    A forward hook on each requested submodule stores its output: a tensor as is, a
    tuple or list by its first tensor (attention modules often return
    ``(output, weights)``). Stored tensors are detached copies, so in-place updates later
    in the forward pass do not change them.

    The pass runs under :func:`torch.no_grad`, in eval mode when ``eval_mode`` is true
    (no dropout); afterwards every submodule's ``training`` flag is restored exactly and
    every hook removed, also when the forward pass raises.

    Args:
        model: any module.
        inputs: what to call ``model`` with: a tuple is unpacked as positional
            arguments, a mapping as keyword arguments, anything else (a tensor) is passed
            as the single argument.
        layers: submodule names as in ``model.named_modules()`` (``""`` is the model
            itself). ``None`` takes the children of ``model.blocks``, else of
            ``model.layers`` (the reference GPT and ViT have ``blocks``), named
            ``"blocks.0"``, ``"blocks.1"``, ...
        to_cpu: move the stored states to the CPU (copies on the fly, which frees
            accelerator memory for deep models).
        eval_mode: switch the model to eval mode for the pass.

    Returns:
        A dict from layer name to its output tensor, in the order of ``layers``.

    Raises:
        TypeError: ``model`` is not a module, ``layers`` is a string or holds non-strings,
            a layer returned no tensor.
        ValueError: ``layers`` is None and the model has no ``blocks``/``layers``
            container; an unknown or repeated name; a layer ran more than once or never
            during the pass.

    Examples:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> with torch.no_grad():
        ...     _ = model[0].weight.copy_(-torch.eye(2)), model[0].bias.zero_()
        >>> states = collect_token_states(model, torch.tensor([[1.0, -2.0]]), ["0", "1"])
        >>> states["0"], states["1"]
        (tensor([[-1.,  2.]]), tensor([[0., 2.]]))
    """
    if not isinstance(model, nn.Module):
        raise bad_type("model", f"expected a torch.nn.Module, got {type(model)}")
    modules = _resolve_layers(model, layers)
    return _run_hooked(
        model, inputs, modules, argument="layers", to_cpu=to_cpu, eval_mode=eval_mode
    )


@dataclass(frozen=True)
class LayerSnapshot:
    """The attention of one layer on one sequence: its graphs, values and operators.

    Attributes:
        graph: the attention graphs of the heads, a float64 :class:`DenseGraph` of batch
            shape ``(H,)`` (row ``i`` = query ``i``).
        values: the heads' values ``v``, float64, ``(H, N, Dh)``.
        operators: the operator of every head (``op(graph, values)`` is the head's output).
        source_dtype: the dtype the model computed the attention weights in (e.g.
            ``torch.float32``), before the copy to float64; ``None``: the graph's own dtype.
            What is "zero" or "one" in the weights is judged at its resolution (the teaching
            page's :mod:`~heatformer.lab.demo.facts`).
    """

    graph: Graph
    values: Tensor
    operators: tuple[DiffusionOperator, ...]
    source_dtype: torch.dtype | None = None

    @property
    def weight_dtype(self) -> torch.dtype:
        """:attr:`source_dtype`, else the dtype of :attr:`graph`."""
        return self.graph.dtype if self.source_dtype is None else self.source_dtype


def snapshot_attention(
    model: nn.Module, idx: Tensor, *, eval_mode: bool = True
) -> list[LayerSnapshot]:
    """Run ``model`` on one sequence and read each layer's attention graphs and values.

    Works for any model whose ``blocks[i].attn`` is a
    :class:`~heatformer.models.DiffusionAttention` (the reference GPT and ViT): a forward
    pre-hook stores the input of every ``attn`` during one pass (as
    :func:`collect_token_states` does: no grad, hooks removed, training flags restored), then
    ``attn.graphs`` and ``attn.project_qkv`` rebuild the graphs and values from it.

    Args:
        model: the model, e.g. a trained GPT.
        idx: ``(1, N)`` input of the model (token ids for a GPT).
        eval_mode: switch the model to eval mode for the pass (no dropout).

    Returns:
        One :class:`LayerSnapshot` per block, on the model's device.

    Raises:
        TypeError: ``model`` has no ``blocks`` whose ``attn`` are ``DiffusionAttention``.
        ValueError: ``idx`` is not a ``(1, N)`` tensor; an attention layer ran more than
            once or never.

    Examples:
        >>> from heatformer.models import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> gpt = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8,
        ...                     heads="attention:1,laplacian:1"))
        >>> layers = snapshot_attention(gpt, torch.tensor([[1, 2, 3]]))
        >>> len(layers), tuple(layers[0].graph.to_dense().shape), layers[0].values.shape
        (2, (2, 3, 3), torch.Size([2, 3, 4]))
        >>> [op.name for op in layers[1].operators]
        ['attention', 'laplacian']
    """
    from heatformer.models import DiffusionAttention

    blocks = getattr(model, "blocks", None)
    attns: dict[str, DiffusionAttention] = {}
    for i, block in enumerate(blocks if isinstance(blocks, nn.ModuleList) else []):
        attn = getattr(block, "attn", None)
        if isinstance(attn, DiffusionAttention):
            attns[f"blocks.{i}.attn"] = attn
    if not attns or len(attns) != len(blocks):  # type: ignore[arg-type]
        raise bad_type(
            "model",
            f"expected a model whose blocks[i].attn are DiffusionAttention, got "
            f"{type(model).__name__}",
        )
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.shape[0] != 1:
        raise bad_value("idx", f"expected a (1, N) input, got {getattr(idx, 'shape', idx)}")
    inputs = _run_hooked(model, idx, attns, argument="model", read_inputs=True, eval_mode=eval_mode)
    snaps = []
    with torch.no_grad():
        for name, attn in attns.items():
            x = inputs[name]  # (1, N, D)
            weights = attn.graphs(x).to_dense()[0]  # (H, N, N), the model's dtype
            _, _, v = attn.project_qkv(x)  # (1, H, N, Dh)
            snaps.append(
                LayerSnapshot(
                    DenseGraph(weights.to(torch.float64)),
                    v[0].to(torch.float64),
                    tuple(attn.head_operators),
                    source_dtype=weights.dtype,
                )
            )
    return snaps
