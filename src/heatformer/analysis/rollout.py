r"""Attention rollout through every head's operator: how much each input token reaches chosen
output tokens, layer after layer, without an ``N x N`` matrix.

Abnar & Zuidema (2020) follow information from the input tokens to the output tokens of a
transformer by multiplying the layers' attention matrices, each averaged over its heads and
mixed half and half with the identity of the residual connection. A heatformer head mixes its
tokens by a linear map of its values that need not be the attention matrix: head ``h`` of layer
``l`` outputs :math:`A^{(l)}_h V_h` on every channel of its values, with

- :math:`A = P` (attention), :math:`\mathrm{step}\,L` (Laplacian, :math:`L = I' - P` in the
  ``"rw"`` form), :math:`e^{-tL}` (heat), :math:`\alpha \sum_k (1-\alpha)^k A^k` (PPR),
  :math:`\sum_k c_k L^k` (polynomial), the uniform walk :math:`U` (mean) and
  :math:`I' - U` (centring), on the layer's graph kind (dense softmax, top-k, window), causal or
  not, with its key mask;
- for an operator that is not one map on every channel, the map it stands for
  (:meth:`~heatformer.graph_ops.DiffusionOperator.token_map`): :math:`P_1 - \lambda P_2` for a
  differential head (without its per-row RMSNorm), :math:`P + \bar c\, I'` for an untied skip
  head (:math:`\bar c = \mathrm{tr}(W_S) / D_h`, the mean over channels of its map).

**Convention** (Abnar & Zuidema's, with every head's own map in place of its attention):

.. math::

    M_l = \rho\, I + (1 - \rho)\, \frac{1}{H} \sum_{h=1}^{H} A^{(l)}_h, \qquad
    R = M_L M_{L-1} \cdots M_1, \qquad \rho = \tfrac12 \text{ by default},

``R[i, j]`` the influence of input token ``j`` on output token ``i`` after the ``L`` layers.
Only the rows of the chosen queries are computed, a ``(Q, N)`` block propagated backwards from
the last layer to the first:

.. math::

    r_L = [e_{i_1}; \dots; e_{i_Q}], \qquad r_{l-1} = r_l M_l
    = \rho\, r_l + \frac{1 - \rho}{H} \sum_h \bigl(A^{(l)\,T}_h r_l^T\bigr)^T,
    \qquad \text{returned: } r_0 = r_L R.

The rows are not renormalised: an attention-only model's rows sum to 1 (Abnar & Zuidema's
case), a Laplacian head's map has rows that sum to 0 and a differential head's rows sum to
:math:`1 - \lambda`. As in Abnar & Zuidema, ``M_l`` holds the token mixing only: value and
output projections, MLPs and layer norms are left out.

**How the transpose is applied.** Graphs offer ``W^T`` products
(:meth:`~heatformer.graph_ops.Graph.propagate_transpose`), but an operator is written forwards,
as propagations, degree scalings and identity terms. For a linear map ``y = A v`` the
vector-Jacobian product is ``A^T r``, so :math:`A^T_h r_l^T` is the gradient, by autograd, of
``<token_map(G, v), r_l^T>`` with respect to a ``(B, h, N, Q)`` signal ``v`` whose ``Q``
channels are the rows: the backward of each propagation is the transposed product (SDPA's
backward on dense attention, the transposed CSR product on a top-k graph, the window kernels'
backward). A layer costs one build of its graphs and one application of its heads' maps to a
``Q``-channel signal and its backward, per operator of the layer: ``O(B H N Q)`` memory of its
own, never an ``N x N`` tensor; the products are the graph kind's (fused SDPA on dense
attention; linear in ``N`` on top-k and window graphs), and an operator that picks a dense
method for a short sequence (heat, PPR) picks it here as in the model.

The layers' inputs are read with forward pre-hooks during one pass of the model (no gradient,
eval mode by default, hooks removed and training flags restored whatever happens, as
:func:`~heatformer.analysis.collect_token_states`); the graphs are rebuilt from them with each
layer's own graph kind, as :meth:`~heatformer.models.DiffusionAttention.graphs` does, in the
model's dtype (float32 for half models; ``model.double()`` for float64).

References:
    Abnar, S. & Zuidema, W. (2020). Quantifying attention flow in transformers. ACL.
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
    Ye, T. et al. (2024). Differential Transformer. arXiv:2410.05258.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from heatformer.analysis.hooks import forward_once
from heatformer.checks import bad_type, bad_value, check_bool
from heatformer.graph_ops import split_maps
from heatformer.models import DiffusionAttention
from heatformer.models.heads import group_heads
from heatformer.models.masks import AttentionMask

__all__ = ["rollout"]

#: what one layer's pre-hook keeps: its input ``(B, N, D)`` and key mask ``(B, N)`` (or None)
_LayerInput = tuple[Tensor, Tensor | None]


def _attention_layers(model: object) -> list[DiffusionAttention]:
    """``model.blocks[i].attn`` of every block, each a :class:`DiffusionAttention`."""
    blocks = getattr(model, "blocks", None) if isinstance(model, nn.Module) else None
    layers = [getattr(b, "attn", None) for b in blocks] if isinstance(blocks, nn.ModuleList) else []
    attns = [attn for attn in layers if isinstance(attn, DiffusionAttention)]
    if not attns or len(attns) != len(layers):
        raise bad_type(
            "model",
            f"expected a model whose blocks[i].attn are DiffusionAttention (GPT, ViT, "
            f"SequenceClassifier), got {type(model).__name__}",
        )
    return attns


def _key_mask_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The key mask (``True`` = real token) a layer was called with, from either polarity."""
    padding = kwargs.get("key_padding_mask")
    if isinstance(padding, Tensor):
        return ~padding
    mask = args[1] if len(args) > 1 else kwargs.get("key_mask")
    return mask if isinstance(mask, Tensor) else None


def _layer_inputs(
    model: nn.Module, inputs: Any, layers: Sequence[DiffusionAttention], eval_mode: bool
) -> list[_LayerInput]:
    """Run ``model`` once on ``inputs`` and keep each layer's input and key mask (detached
    copies); hooks removed and training flags restored, whatever happens."""
    seen: dict[int, _LayerInput] = {}

    def make_hook(i: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.get("x")
            if i in seen or not isinstance(x, Tensor):
                why = "ran more than once" if i in seen else "was called without a tensor"
                raise bad_value("model", f"attention layer blocks.{i}.attn {why} in one pass")
            mask = _key_mask_of(args, kwargs)
            seen[i] = (x.detach().clone(), None if mask is None else mask.detach().clone())

        return hook

    handles = [
        attn.register_forward_pre_hook(make_hook(i), with_kwargs=True)
        for i, attn in enumerate(layers)
    ]
    forward_once(model, inputs, handles, eval_mode=eval_mode)
    missing = [f"blocks.{i}.attn" for i in range(len(layers)) if i not in seen]
    if missing:
        raise bad_value("model", f"attention layers {missing} did not run during the pass")
    return [seen[i] for i in range(len(layers))]


def _check_queries(queries: object, n: int) -> Tensor:
    """``queries`` as a ``(Q,)`` LongTensor of positions in ``[0, N)`` (negative ones count
    from the end, as Python's indices)."""
    if isinstance(queries, Tensor):
        if queries.is_floating_point() or queries.is_complex() or queries.dim() > 1:
            raise bad_type(
                "queries",
                f"expected a 1-D integer tensor of token positions, got {queries.dtype} "
                f"{tuple(queries.shape)}",
            )
        values = [int(v) for v in queries.reshape(-1).tolist()]
    elif isinstance(queries, int) and not isinstance(queries, bool):
        values = [queries]
    elif isinstance(queries, Sequence) and not isinstance(queries, str):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in queries):
            raise bad_type("queries", f"expected int token positions, got {list(queries)!r}")
        values = [int(v) for v in queries]
    else:
        raise bad_type(
            "queries", f"expected token positions (ints or an int tensor), got {type(queries)}"
        )
    if not values:
        raise bad_value("queries", "expected at least one token position, got none")
    wrong = [v for v in values if not -n <= v < n]
    if wrong:
        raise bad_value(
            "queries",
            f"expected positions in [-{n}, {n}) (the layers' N = {n} tokens), got {wrong}",
        )
    return torch.tensor([v % n for v in values], dtype=torch.long)


def _check_residual(residual: object) -> float:
    """``residual`` as a float in ``[0, 1]``."""
    if isinstance(residual, bool) or not isinstance(residual, int | float):
        raise bad_type("residual", f"expected a float in [0, 1], got {type(residual).__name__}")
    if not 0.0 <= float(residual) <= 1.0:
        raise bad_value("residual", f"expected a float in [0, 1], got {residual}")
    return float(residual)


def _heads_transpose(attn: DiffusionAttention, layer_input: _LayerInput, rows: Tensor) -> Tensor:
    r""":math:`\frac{1}{H}\sum_h (A_h^T r^T)^T` of one layer for the row block ``rows``
    ``(B, Q, N)``: per operator of the layer, its heads' graph (the layer's kind, the maps of
    a head from the channels of its queries and keys), their token map applied to a
    ``(B, h, N, Q)`` signal, and its transpose by autograd (module docstring)."""
    x, key_mask = layer_input
    b, q_rows, n = rows.shape
    with torch.no_grad():
        q, k, _ = attn.project_qkv(x)  # (B, H, N, Dh) each
    q, k = q.to(rows.dtype), k.to(rows.dtype)
    mask = AttentionMask(key_mask, causal=attn.causal)
    cotangent = rows.transpose(-1, -2) / attn.num_heads  # (B, N, Q)
    total = torch.zeros_like(cotangent)  # (B, N, Q)
    for op, heads in group_heads(attn.head_operators):
        index = torch.tensor(heads, dtype=torch.long, device=q.device)
        qg, kg = q.index_select(1, index), k.index_select(1, index)  # (B, h, N, Dh)
        if op.maps > 1:  # (B, h, maps, N, Dh / maps): the maps as a batch dim, as the layer
            qg, kg = split_maps(qg, op.maps, name="q"), split_maps(kg, op.maps, name="k")
        graph = attn.router.graph(qg, kg, mask, symmetric_mask=op.reads_transpose)
        signal = rows.new_zeros(b, len(heads), n, q_rows, requires_grad=True)  # (B, h, N, Q)
        with torch.enable_grad():
            y = op.token_map(graph, signal)  # (B, h, N, Q)
            (grad,) = torch.autograd.grad(y, signal, cotangent.unsqueeze(1).expand_as(y))
        total = total + grad.sum(1)  # sum_h A_h^T r^T / H: (B, N, Q)
    return total.transpose(-1, -2)  # (B, Q, N)


def rollout(
    model: nn.Module,
    inputs: Any,
    *,
    queries: Sequence[int] | Tensor | int,
    residual: float = 0.5,
    eval_mode: bool = True,
) -> Tensor:
    r"""Rollout rows of ``queries``: how much each input token reaches each chosen output
    token through the layers' heads and residual connections.

    Abnar & Zuidema's rollout with each head's own map of its values,
    :math:`A^{(l)}_h` (its :meth:`~heatformer.graph_ops.DiffusionOperator.token_map`: ``P``,
    ``I - P``, ``exp(-tL)``, the PPR and polynomial series, ... on the layer's graph kind, mask
    and causal order; the module docstring lists them), and :math:`\rho` = ``residual``:

    .. math::

        M_l = \rho I + \frac{1 - \rho}{H} \sum_{h=1}^{H} A^{(l)}_h, \quad
        r_L = [e_{i_1}; \dots; e_{i_Q}], \quad r_{l-1} = r_l M_l, \quad
        \text{returned: } r_0 = r_L M_L \cdots M_1,

    rows ``i_q`` of the rollout :math:`R` (``R[i, j]``: the influence of input token ``j`` on
    output token ``i``; :math:`\rho = 1/2` is their :math:`\tfrac12 (A + I)`), each
    :math:`r_l A_h = (A_h^T r_l^T)^T` by autograd of the operator's apply on a ``Q``-channel
    signal, never ``N x N``. Rows are not renormalised (a Laplacian map's rows sum to 0).

    Args:
        model: ``blocks[i].attn`` of :class:`~heatformer.models.DiffusionAttention` (GPT, ViT).
        inputs: what ``model`` is called with: a tuple unpacked as positional arguments, a
            mapping as keyword arguments (a key mask among them is followed), else the one
            argument (a GPT's ``(B, N)`` token ids, a ViT's images).
        queries: positions of the output tokens along the layers' ``N`` tokens, ``-N <= p <
            N`` (negative from the end): an int, ints or a 1-D integer tensor (``range(N)``:
            the whole ``N x N`` rollout).
        residual: :math:`\rho` in ``[0, 1]`` (1/2: Abnar & Zuidema; 0: the heads alone).
        eval_mode: run the model in eval mode (no dropout) for the pass that reads the
            layers' inputs.

    Returns:
        ``(B, Q, N)``, no gradient, in the model's dtype (float32 for half models).

    Raises:
        TypeError: naming ``model``, ``queries``, ``residual`` or ``eval_mode``: wrong kind.
        ValueError: naming ``queries`` (empty, a position outside ``[-N, N)``), ``residual``
            (outside ``[0, 1]``), ``model`` (a layer that ran twice or not at all).

    Equivalent to (``A[l][h]`` the dense ``(B, N, N)`` maps)::

        r = torch.eye(N)[queries].expand(B, Q, N)
        for l in reversed(range(L)):
            r = residual * r + (1 - residual) * r @ (sum(A[l]) / H)

    Example:
        In a causal model token 0 reads only itself; with one attention and one Laplacian
        head the mean map's rows sum to 1/2, ``M``'s to 3/4, two layers' to 9/16.

        >>> from dataclasses import replace
        >>> from heatformer.models import GPT, GPTConfig
        >>> config = GPTConfig(vocab_size=8, block_size=8, n_layer=2, n_head=2, n_embd=8)
        >>> r = rollout(GPT(config), torch.tensor([[1, 2, 3, 4, 5]]), queries=[0, -1])
        >>> r.shape, r[0, 0], r.sum(-1)
        (torch.Size([1, 2, 5]), tensor([1., 0., 0., 0., 0.]), tensor([[1.0000, 1.0000]]))
        >>> mixed = GPT(replace(config, heads="attention:1,laplacian:1"))
        >>> rollout(mixed, torch.tensor([[1, 2, 3]]), queries=2).sum(-1)
        tensor([[0.5625]])
    """
    layers = _attention_layers(model)
    residual = _check_residual(residual)
    check_bool("eval_mode", eval_mode)
    with torch.inference_mode(False):  # the transposes need autograd
        captured = _layer_inputs(model, inputs, layers, eval_mode)
        x = captured[0][0]  # (B, N, D)
        index = _check_queries(queries, int(x.shape[1])).to(x.device)  # (Q,)
        eye = torch.eye(x.shape[1], dtype=torch.promote_types(x.dtype, torch.float32))
        rows = eye.to(x.device)[index].expand(x.shape[0], -1, -1)  # (B, Q, N): r_L
        for attn, layer_input in zip(reversed(layers), reversed(captured), strict=True):
            mixed = _heads_transpose(attn, layer_input, rows)  # (B, Q, N): r_l mean_h A_h
            rows = residual * rows + (1.0 - residual) * mixed  # r_{l-1} = r_l M_l
    return rows.detach()
