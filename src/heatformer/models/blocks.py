r"""The pieces of a model's stack: MLP, LayerScale, stochastic depth, the pre-LN block.

Read top to bottom in dependency order. A block is

.. math:: x \leftarrow x + \mathrm{dp}(\gamma_1 \odot \mathrm{attn}(\mathrm{LN}_1 x)), \qquad
          x \leftarrow x + \mathrm{dp}(\gamma_2 \odot \mathrm{mlp}(\mathrm{LN}_2 x)),

with LayerScale ``gamma`` (Touvron et al., 2021; identity unless ``layer_scale_init`` is given)
and stochastic depth ``dp`` (Huang et al., 2016; identity unless ``drop_path > 0``, and in
eval mode). :func:`_blocks` makes the ``n_layer`` blocks a config describes, with timm's
schedule of drop-path rates (linear from 0 in the first block to ``drop_path`` in the last).

References:
    Huang, G. et al. (2016). Deep networks with stochastic depth. ECCV.
    Touvron, H. et al. (2021). Going deeper with image transformers (CaiT). ICCV.
    Touvron, H., Cord, M. & Jégou, H. (2022). DeiT III: revenge of the ViT. ECCV.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from heatformer import checks
from heatformer.graph_ops import GraphBuilder, SequenceShard
from heatformer.models.attention import DiffusionAttention, KVCache
from heatformer.models.configs import _StackConfig
from heatformer.models.heads import parse_layer_heads

__all__ = ["MLP", "DropPath", "LayerScale", "TransformerBlock"]


class MLP(nn.Module):
    """Position-wise feed-forward: ``Linear(D, rD) -> GELU -> Linear(rD, D) -> dropout``."""

    def __init__(self, embed_dim: int, ratio: int = 4, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(embed_dim, ratio * embed_dim, bias=bias)
        self.proj = nn.Linear(ratio * embed_dim, embed_dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.dropout(self.proj(F.gelu(self.fc(x))))
        return out


class LayerScale(nn.Module):
    """A learned per-channel scale of a residual branch: ``x * gamma``, ``gamma = init * 1``.

    Shape:
        ``x``: ``(..., D)`` -> ``(..., D)``.
    """

    def __init__(self, embed_dim: int, init: float) -> None:
        super().__init__()
        self.init = float(init)
        self.gamma = nn.Parameter(torch.full((embed_dim,), self.init))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gamma, self.init)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"{self.gamma.numel()}, init={self.init:g}"


class DropPath(nn.Module):
    """Stochastic depth: in training, zero a whole residual branch per sample with probability
    ``p`` and scale the kept ones by ``1 / (1 - p)``; the identity in eval mode or at ``p = 0``.

    Shape:
        ``x``: ``(B, ...)`` -> ``(B, ...)``.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)  # (B, 1, ..., 1): one draw per sample
        mask = x.new_empty(shape).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p:g}"


class TransformerBlock(nn.Module):
    """Pre-LN block: ``x + attn(LN(x))`` then ``x + mlp(LN(x))`` (see the module docstring).

    Args:
        embed_dim: ``D``.
        num_heads: ``H``.
        operators: head spec or per-head operators (see :class:`DiffusionAttention`).
        graph, causal, qk_norm, zero_init: passed to :class:`DiffusionAttention`.
        dropout: on the attention head outputs, the MLP output and the residual branches.
        bias: biases in linear layers and LayerNorms.
        mlp_ratio: hidden width of the MLP in units of ``D``; ``0``: no MLP branch (an
            attention-only block, ``x + attn(LN(x))``: Zoology's ``state_mixer=Identity``).
        norm_eps: ``eps`` of both LayerNorms.
        qk_norm_eps: ``eps`` of the QK-norm LayerNorms.
        layer_scale_init: LayerScale on both residual branches, ``gamma`` initialized to it
            (DeiT-3: ``1e-6``); None: no LayerScale.
        drop_path: stochastic depth rate of both residual branches.
        activation_checkpointing: :func:`torch.utils.checkpoint.checkpoint` (non-reentrant)
            of both residual branches: in a forward with gradients each branch keeps only its
            input ``(B, N, D)`` for backward and is run again there. What backward keeps per
            token falls from about ``(12 + 2r) D`` values and the graph's edges to ``2 D``, at
            the cost of one more forward; the results and gradients are the same (dropout
            and drop-path draw the same masks again). Off without gradients (``no_grad``,
            inference) and with a KV cache; it follows autograd, not ``train()``/``eval()``.

    Shape:
        ``x``: ``(B, N, D)`` -> ``(B, N, D)``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        operators: Any = "attention",
        *,
        graph: str | GraphBuilder = "softmax",
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        qk_norm: bool = False,
        zero_init: bool = False,
        mlp_ratio: int = 4,
        norm_eps: float = 1e-5,
        qk_norm_eps: float = 1e-5,
        layer_scale_init: float | None = None,
        drop_path: float = 0.0,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.activation_checkpointing = bool(activation_checkpointing)
        self.ln1 = nn.LayerNorm(embed_dim, eps=norm_eps, bias=bias)
        self.attn = DiffusionAttention(
            embed_dim, num_heads, operators, graph=graph, causal=causal,
            dropout=dropout, bias=bias, qk_norm=qk_norm, zero_init=zero_init,
        )  # fmt: skip
        if self.attn.q_norm is not None and self.attn.k_norm is not None:
            self.attn.q_norm.eps = self.attn.k_norm.eps = float(qk_norm_eps)
        checks.check_int("mlp_ratio", mlp_ratio, minimum=0)
        # an attention-only block (mlp_ratio 0) has no MLP branch, and no norm before it
        self.ln2 = nn.LayerNorm(embed_dim, eps=norm_eps, bias=bias) if mlp_ratio else None
        self.mlp = MLP(embed_dim, mlp_ratio, dropout, bias) if mlp_ratio else None
        self.dropout = nn.Dropout(dropout)
        init = layer_scale_init
        self.ls1 = LayerScale(embed_dim, init) if init is not None else nn.Identity()
        self.ls2 = LayerScale(embed_dim, init) if init is not None else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: Tensor,
        key_mask: Tensor | None = None,
        cache: KVCache | None = None,
        shard: SequenceShard | None = None,
    ) -> Tensor:
        """The block; ``shard``: ``x`` is this process's block of a sequence split over
        processes (see :meth:`DiffusionAttention.forward`); the MLP acts on each token alone."""
        if self.activation_checkpointing and cache is None and torch.is_grad_enabled():
            x = x + checkpoint(self._attn_branch, x, key_mask, None, shard, use_reentrant=False)
            if self.mlp is None:
                return x
            out: Tensor = x + checkpoint(self._mlp_branch, x, use_reentrant=False)
            return out
        x = x + self._attn_branch(x, key_mask, cache, shard)
        return x if self.mlp is None else x + self._mlp_branch(x)

    def _attn_branch(
        self,
        x: Tensor,
        key_mask: Tensor | None,
        cache: KVCache | None = None,
        shard: SequenceShard | None = None,
    ) -> Tensor:
        a = self.attn(self.ln1(x), key_mask, cache=cache, shard=shard)
        out: Tensor = self.drop_path(self.ls1(self.dropout(a)))
        return out

    def _mlp_branch(self, x: Tensor) -> Tensor:
        assert self.mlp is not None and self.ln2 is not None  # forward skips the branch else
        out: Tensor = self.drop_path(self.ls2(self.mlp(self.ln2(x))))
        return out


def _init_weights(model: nn.Module, n_layer: int) -> None:
    """GPT-2 initialization: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv2d)):
            std = 0.02
            if name.endswith("attn.out_proj") or name.endswith("mlp.proj"):
                std = 0.02 / math.sqrt(2 * n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            bias = getattr(module, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)
    for module in model.modules():
        if isinstance(module, DiffusionAttention) and module.zero_init:
            nn.init.zeros_(module.out_proj.weight)


def _drop_path_rates(rate: float, n_layer: int) -> list[float]:
    """timm's schedule: ``rate * i / (n_layer - 1)`` for block ``i`` (0 in the first block)."""
    if n_layer == 1:
        return [0.0]
    return [rate * i / (n_layer - 1) for i in range(n_layer)]


def _blocks(config: _StackConfig, *, causal: bool) -> nn.ModuleList:
    """The ``n_layer`` blocks a config describes (one head spec and graph kind per layer); each
    block's operators are told its depth (:meth:`~heatformer.graph_ops.DiffusionOperator.
    set_depth`, 1-based).

    The DeiT-3 options (``norm_eps``, ``qk_norm_eps``, ``layer_scale_init``, ``drop_path``)
    are read from configs that have them (:class:`ViTConfig`); others get the defaults.
    """
    extra: dict[str, Any] = {
        name: getattr(config, name)
        for name in ("norm_eps", "qk_norm_eps", "layer_scale_init")
        if hasattr(config, name)
    }
    rates = _drop_path_rates(float(getattr(config, "drop_path", 0.0)), config.n_layer)
    blocks = [
        TransformerBlock(
            config.n_embd,
            config.n_head,
            spec,
            graph=graph,
            causal=causal,
            dropout=config.dropout,
            bias=config.bias,
            qk_norm=config.qk_norm,
            zero_init=config.zero_init,
            mlp_ratio=config.mlp_ratio,
            drop_path=rate,
            activation_checkpointing=config.activation_checkpointing,
            **extra,
        )
        for spec, graph, rate in zip(
            parse_layer_heads(config.heads, config.n_layer),
            config.graph_kinds,
            rates,
            strict=True,
        )
    ]
    for depth, block in enumerate(blocks, start=1):  # e.g. a differential head's lambda_init
        for op in block.attn.head_operators:
            op.set_depth(depth)
    return nn.ModuleList(blocks)
