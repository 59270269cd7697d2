"""Collect per-layer token states from any :class:`torch.nn.Module` with forward hooks.

The hooks live only for one forward pass: they are removed in a ``finally`` block, the
pass runs under :func:`torch.no_grad`, and every submodule's ``training`` flag is put
back as it was, whatever happens inside the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["collect_token_states"]

_DEFAULT_CONTAINERS = ("blocks", "layers")
_MAX_LISTED_NAMES = 12


def _default_layers(model: nn.Module) -> list[str]:
    for attr in _DEFAULT_CONTAINERS:
        container = getattr(model, attr, None)
        if isinstance(container, nn.Module):
            names = [f"{attr}.{name}" for name, _ in container.named_children()]
            if names:
                return names
    raise ValueError(
        f"layers: expected a list of submodule names, got None and {type(model).__name__} "
        f"has no non-empty {' or '.join(repr(a) for a in _DEFAULT_CONTAINERS)} container "
        f"to default to; pass names from model.named_modules()"
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
        raise TypeError(f"layers: expected a list of submodule names, got {type(layers)}")
    else:
        names = list(layers)
    modules: dict[str, nn.Module] = {}
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"layers: expected str names, got {type(name)} ({name!r})")
        if name in modules:
            raise ValueError(f"layers: expected distinct names, got {name!r} twice")
        try:
            modules[name] = model.get_submodule(name)
        except AttributeError:
            raise ValueError(
                f"layers: unknown submodule {name!r}; {_valid_names_hint(model)}"
            ) from None
    return modules


def _first_tensor(output: Any, name: str) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, Tensor):
                return item
    raise TypeError(
        f"layers: expected submodule {name!r} to return a tensor or a tuple holding one, "
        f"got {type(output)}"
    )


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
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model)}")
    modules = _resolve_layers(model, layers)
    states: dict[str, Tensor] = {}

    def make_hook(name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if name in states:
                raise ValueError(
                    f"layers: submodule {name!r} ran more than once in one forward pass; "
                    f"its states would be ambiguous"
                )
            state = _first_tensor(output, name).detach()
            states[name] = state.to("cpu", copy=True) if to_cpu else state.clone()

        return hook

    flags = [(module, module.training) for module in model.modules()]
    handles = [module.register_forward_hook(make_hook(n)) for n, module in modules.items()]
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
    missing = [name for name in modules if name not in states]
    if missing:
        raise ValueError(f"layers: submodules {missing} did not run during the forward pass")
    return {name: states[name] for name in modules}
