r"""Multi-head attention in which every head applies a graph-diffusion operator to its values.

Head ``h`` builds its attention graph ``P_h = softmax(q_h k_h^T / sqrt(Dh))`` (optionally
masked, causal, or top-k sparsified) and outputs ``op_h(P_h, v_h)``: ``P_h v_h`` for an
attention head, ``(I - P_h) v_h`` for a Laplacian head (Zhang & Papyan, 2026), ``exp(-t L) v_h``
for a heat head, and so on. Heads are concatenated and projected as in
:class:`torch.nn.MultiheadAttention`.

Dense path: one fused :func:`~torch.nn.functional.scaled_dot_product_attention` call serves
every attention head and every ``"rw"`` Laplacian head (a Laplacian head is ``V - P V``); heat,
PPR and polynomial heads use repeated propagation. No ``N x N`` tensor is formed unless the
caller asks for the weights. Sparse path (``topk=k``): per-group top-k graphs built in query
blocks, gradients into ``q`` and ``k`` through the kept scores; with ``k = N`` it equals the
dense path.

References:
    Vaswani, A. et al. (2017). Attention is all you need. NeurIPS.
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer.graph_ops import (
    Attention,
    DiffusionOperator,
    Graph,
    Laplacian,
    SoftmaxGraph,
)
from heatformer.models.heads import format_heads, parse_heads

__all__ = ["DiffusionAttention", "KVCache"]


def _fused(op: DiffusionOperator) -> bool:
    """Operators served by the single SDPA call: attention and rw Laplacian heads."""
    return isinstance(op, Attention) or (isinstance(op, Laplacian) and op.normalization == "rw")


def _fused_output(op: DiffusionOperator, pv: Tensor, v: Tensor) -> Tensor:
    """A fused head's output from ``P v``: ``P v`` (attention) or ``step * (v - P v)``."""
    if isinstance(op, Laplacian):
        return (v - pv) * op.step.to(v.dtype)
    return pv


def check_size(name: str, value: object, *, optional: bool = False) -> None:
    """A positive int (or None if ``optional``): ``TypeError`` for another type, ``ValueError``
    below 1; the messages name ``name``."""
    if optional and value is None:
        return
    what = "None or a positive int" if optional else "a positive int"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected {what}, got {value!r}")


def _autocasting(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (it then mixes dtypes on purpose)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def _heads_index(heads: Sequence[int]) -> slice | Tensor:
    """A slice when the heads are contiguous (a view, no copy), else an index tensor."""
    if list(heads) == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0], heads[0] + len(heads))
    return torch.tensor(list(heads), dtype=torch.long)


@dataclass
class KVCache:
    """Keys and values of the tokens seen so far, for incremental decoding.

    Attributes:
        k: ``(B, H, T, Dh)`` keys, or None before the first call.
        v: ``(B, H, T, Dh)`` values, or None.
    """

    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of cached positions ``T``."""
        return 0 if self.k is None else int(self.k.shape[-2])


class DiffusionAttention(nn.Module):
    r"""Multi-head attention with one diffusion operator per head.

    Args:
        embed_dim: model dim ``D``.
        num_heads: ``H``; ``D`` must be divisible by ``H``.
        operators: a spec such as ``"attention:6,laplacian:2"`` (see
            :mod:`heatformer.models.heads`) or a list of ``H`` operator objects / names.
            Heads sharing an operator instance run as one batched call.
        topk: keep the ``topk`` strongest keys per query (sparse path); None = dense.
        causal: forbid attending to later positions.
        dropout: dropout on the head outputs before the output projection (training only).
            Unlike :class:`torch.nn.MultiheadAttention`, which drops attention weights, this
            applies uniformly to every operator.
        bias: biases in the projections.
        qk_norm: LayerNorm on each head's queries and keys (QK-norm).
        zero_init: zero the output projection, so the layer is a no-op at initialization.
        topk_block_size: query rows per block when building top-k graphs.
        device, dtype: factory kwargs.

    Shape:
        - ``x``: ``(B, N, D)``; ``key_mask``: ``(B, N)`` bool, ``True`` = a real token that
          may be attended (SDPA polarity; note :class:`~torch.nn.MultiheadAttention`'s
          ``key_padding_mask`` uses the opposite polarity).
        - output: ``(B, N, D)``; with ``need_weights=True`` also ``(B, H, N, N)`` weights.

    Equivalent to (dense path)::

        q, k, v = self.project_qkv(x)                      # (B, H, N, Dh) each
        P = softmax(q k^T / sqrt(Dh) masked)                # (B, H, N, N), never formed
        y[:, h] = op_h(DenseGraph(P[:, h]), v[:, h])        # per head
        out = self.out_proj(y.transpose(1, 2).reshape(B, N, D))

    Example:
        >>> import torch
        >>> layer = DiffusionAttention(32, 4, "attention:2,laplacian:2", causal=True)
        >>> layer(torch.randn(2, 5, 32)).shape
        torch.Size([2, 5, 32])
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        operators: str | Sequence[DiffusionOperator | str] = "attention",
        *,
        topk: int | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        qk_norm: bool = False,
        zero_init: bool = False,
        topk_block_size: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_size("embed_dim", embed_dim)
        check_size("num_heads", num_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim: expected a multiple of num_heads ({num_heads}), got {embed_dim}"
            )
        check_size("topk", topk, optional=True)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout: expected a float in [0, 1), got {type(dropout).__name__}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.topk, self.causal, self.dropout = topk, bool(causal), float(dropout)
        self.topk_block_size = topk_block_size
        self.zero_init = zero_init
        head_ops = parse_heads(operators, num_heads, **factory)  # names: made in dtype
        self.spec = format_heads(head_ops)
        # unique operators (parameters register once) and the heads each one serves
        unique: list[DiffusionOperator] = []
        heads_of: list[list[int]] = []
        for h, op in enumerate(head_ops):
            for i, u in enumerate(unique):
                if u is op:
                    heads_of[i].append(h)
                    break
            else:
                unique.append(op)
                heads_of.append([h])
        if self.causal:
            sym = [op.name for op in unique if getattr(op, "normalization", None) == "sym"]
            if sym:
                raise ValueError(
                    f"operators: expected heads that read only the past in a causal layer, got "
                    f"'sym' heads {sym}: the 'sym' normalization symmetrizes the attention "
                    f"graph (W + W^T)/2, which would let earlier tokens see later ones (use "
                    f"'rw' or 'combinatorial')"
                )
        given = [] if isinstance(operators, str) else list(operators)
        for op in unique:  # instances the caller made move to the layer's device and dtype
            if any(op is item for item in given):
                op.to(**factory)
        self.operators = nn.ModuleList(unique)  # registers parameters
        self._groups: list[tuple[DiffusionOperator, list[int]]] = list(zip(unique, heads_of))
        fused_heads = sorted(h for op, hs in self._groups for h in hs if _fused(op))
        self._fused_heads = fused_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, **factory)  # [q; k; v]
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.q_norm = nn.LayerNorm(self.head_dim, **factory) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim, **factory) if qk_norm else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections as in :class:`torch.nn.MultiheadAttention`; zero biases;
        a zero output projection when ``zero_init``."""
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.in_proj.bias is not None:
            nn.init.zeros_(self.in_proj.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)
        if self.zero_init:
            nn.init.zeros_(self.out_proj.weight)

    @property
    def head_operators(self) -> list[DiffusionOperator]:
        """The operator of every head, in head order."""
        ops: dict[int, DiffusionOperator] = {h: op for op, hs in self._groups for h in hs}
        return [ops[h] for h in range(self.num_heads)]

    # ---- projections -----------------------------------------------------------------------

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, each ``(B, H, N, Dh)`` (QK-norm applied if enabled)."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x: expected a Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x: expected shape (B, N, {self.embed_dim}), got {tuple(x.shape)}")
        if x.dtype != self.in_proj.weight.dtype and not _autocasting(x.device.type):
            raise TypeError(
                f"x: expected dtype {self.in_proj.weight.dtype} (the layer's parameters), got "
                f"{x.dtype}"
            )
        b, n, _ = x.shape
        qkv = self.in_proj(x).view(b, n, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, Dh) each
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def merge_heads(self, y: Tensor) -> Tensor:
        """``(B, H, N, Dh)`` head outputs -> dropout -> ``out_proj`` -> ``(B, N, D)``."""
        b, _, n, _ = y.shape
        y = y.transpose(1, 2).reshape(b, n, self.embed_dim)  # (B, N, D)
        y = F.dropout(y, self.dropout, self.training)
        out: Tensor = self.out_proj(y)
        return out

    # ---- graphs ----------------------------------------------------------------------------

    def _mask(self, key_mask: Tensor | None, b: int, n: int) -> Tensor | None:
        if key_mask is None:
            return None
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            raise TypeError(
                f"key_mask: expected a bool tensor (True = real token), got "
                f"{getattr(key_mask, 'dtype', type(key_mask).__name__)}"
            )
        if tuple(key_mask.shape) != (b, n):
            raise ValueError(f"key_mask: expected shape ({b}, {n}), got {tuple(key_mask.shape)}")
        return key_mask[:, None, None, :]  # (B, 1, 1, N)

    def _graph(
        self, q: Tensor, k: Tensor, mask: Tensor | None, *, symmetric_mask: bool = False
    ) -> Graph:
        if mask is not None and symmetric_mask:
            # padded queries lose their out-edges too, so W^T cannot carry them to real tokens
            mask = mask & mask.transpose(-1, -2)  # (B, 1, N, N)
        graph = SoftmaxGraph(q, k, mask=mask, causal=self.causal, block_size=self.topk_block_size)
        if self.topk is not None:  # at most N keys per query (short sequences keep them all)
            return graph.topk(min(self.topk, q.shape[-2]), block_size=self.topk_block_size)
        return graph

    def graphs(self, x: Tensor, key_mask: Tensor | None = None) -> Graph:
        """The attention graph of every head for input ``x`` (batch shape ``(B, H)``).

        A :class:`~heatformer.graph_ops.SoftmaxGraph` on the dense path, the top-k
        :class:`~heatformer.graph_ops.SparseGraph` on the sparse path. For analysis and
        teaching (e.g. ``graphs(x).to_networkx((0, h))``).
        """
        q, k, _ = self.project_qkv(x)
        return self._graph(q, k, self._mask(key_mask, x.shape[0], x.shape[1]))

    # ---- forward ---------------------------------------------------------------------------

    def diffuse(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """Apply each head's operator: ``(B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        b, _, n, _ = q.shape
        mask = self._mask(key_mask, b, n)
        outs: list[tuple[list[int], Tensor]] = []
        if self._fused_heads:
            fi = _heads_index(self._fused_heads)
            graph = self._graph(q[:, fi], k[:, fi], mask)
            vf = v[:, fi]
            pv = graph.propagate(vf)  # P v for every attention and rw-Laplacian head
            if all(isinstance(op, Attention) for op, _ in self._groups if _fused(op)):
                outs.append((self._fused_heads, pv))
            else:  # y = a * P v + b * v: (1, 0) for attention, (-step, step) for Laplacian
                if mask is not None:  # L = I' - P: zero rows where every key is masked
                    vf = vf * graph.out_degree().unsqueeze(-1)  # (B, Hf, N, Dh)
                coef_pv, coef_v = self._fused_coefficients(v)
                outs.append((self._fused_heads, pv * coef_pv + vf * coef_v))
        for op, heads in self._groups:
            if not _fused(op):
                idx = _heads_index(heads)
                sym = getattr(op, "normalization", None) == "sym"
                graph = self._graph(q[:, idx], k[:, idx], mask, symmetric_mask=sym)
                outs.append((heads, op(graph, v[:, idx])))
        outs.sort(key=lambda item: item[0][0])
        order = [h for heads, _ in outs for h in heads]
        if order == list(range(self.num_heads)):  # groups are contiguous and in order
            return outs[0][1] if len(outs) == 1 else torch.cat([y for _, y in outs], dim=1)
        out = torch.empty_like(v)
        for heads, y in outs:
            out[:, _heads_index(heads)] = y
        return out

    def _fused_coefficients(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """Per fused head ``(a, b)`` with output ``a * P v + b * v``, each ``(Hf, 1, 1)``."""
        one, zero = v.new_ones(()), v.new_zeros(())
        coef: dict[int, tuple[Tensor, Tensor]] = {}
        for op, heads in self._groups:
            if isinstance(op, Laplacian):
                step = op.step.to(v.dtype)
                coef.update({h: (-step, step) for h in heads})
            elif _fused(op):
                coef.update({h: (one, zero) for h in heads})
        a = [coef[h][0] for h in self._fused_heads]
        b = [coef[h][1] for h in self._fused_heads]
        return torch.stack(a)[:, None, None], torch.stack(b)[:, None, None]

    def forward(
        self,
        x: Tensor,
        key_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend and diffuse.

        Args:
            x: ``(B, N, D)`` input.
            key_mask: ``(B, N)`` bool, ``True`` = real token (SDPA polarity).
            need_weights: also return the dense per-head weights ``(B, H, N, N)`` (forms
                ``N x N``; for analysis and teaching).
            cache: a :class:`KVCache` for incremental causal decoding (dense path, attention
                and rw-Laplacian heads only): ``x`` holds the new tokens; their keys and values
                are appended to the cache, and they attend to every cached token.

        Returns:
            ``(B, N, D)``, and the weights when ``need_weights``.
        """
        q, k, v = self.project_qkv(x)
        if cache is not None:
            return self._forward_cached(q, k, v, cache, key_mask)
        y = self.diffuse(q, k, v, key_mask)
        out = self.merge_heads(y)
        if need_weights:
            mask = self._mask(key_mask, x.shape[0], x.shape[1])
            return out, self._graph(q, k, mask).to_dense()
        return out

    @property
    def supports_cache(self) -> bool:
        """Whether :class:`KVCache` decoding is exact for this layer (causal, dense path, every
        head attention or rw-Laplacian)."""
        return self.causal and self.topk is None and len(self._fused_heads) == self.num_heads

    def _forward_cached(
        self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache, key_mask: Tensor | None
    ) -> Tensor:
        if not self.supports_cache:
            raise ValueError(
                "cache: KV caching needs a causal, dense layer whose heads are all attention or "
                f"rw-Laplacian heads; this layer has heads {self.spec!r}, topk={self.topk}, "
                f"causal={self.causal}. Recompute the full sequence instead."
            )
        if key_mask is not None:
            raise ValueError("key_mask: not supported together with cache")
        past = cache.length
        cache.k = k if cache.k is None else torch.cat([cache.k, k], dim=-2)
        cache.v = v if cache.v is None else torch.cat([cache.v, v], dim=-2)
        n_new, total = q.shape[-2], cache.length
        # new token i (absolute position past + i) attends to keys 0 .. past + i
        allowed = torch.arange(total, device=q.device) <= (
            past + torch.arange(n_new, device=q.device)
        ).unsqueeze(-1)  # (N_new, T)
        pv = F.scaled_dot_product_attention(q, cache.k, cache.v, attn_mask=allowed)
        y = torch.empty_like(pv)
        for op, heads in self._groups:
            idx = _heads_index(heads)
            y[:, idx] = _fused_output(op, pv[:, idx], v[:, idx])
        return self.merge_heads(y)

    # ---- interop with nn.MultiheadAttention ------------------------------------------------

    @classmethod
    def from_mha(
        cls,
        mha: nn.MultiheadAttention,
        operators: str | Sequence[DiffusionOperator | str] = "attention",
        **kwargs: object,
    ) -> DiffusionAttention:
        """Copy the weights of a :class:`torch.nn.MultiheadAttention` (``batch_first`` or not).

        Raises:
            ValueError: for MHA features with no counterpart here (``kdim``/``vdim`` different
                from ``embed_dim``, ``add_bias_kv``, ``add_zero_attn``).
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"mha: expected nn.MultiheadAttention, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim:
            raise ValueError("mha: kdim/vdim different from embed_dim are not supported")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("mha: add_bias_kv and add_zero_attn are not supported")
        w = mha.in_proj_weight
        layer = cls(
            mha.embed_dim, mha.num_heads, operators, bias=mha.in_proj_bias is not None,
            device=w.device, dtype=w.dtype, **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip
        with torch.no_grad():
            layer.in_proj.weight.copy_(w)
            layer.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None and layer.in_proj.bias is not None:
                layer.in_proj.bias.copy_(mha.in_proj_bias)
            if mha.out_proj.bias is not None and layer.out_proj.bias is not None:
                layer.out_proj.bias.copy_(mha.out_proj.bias)
        return layer

    def to_mha(self, *, batch_first: bool = True) -> nn.MultiheadAttention:
        """An equivalent :class:`torch.nn.MultiheadAttention` (every head must be attention).

        Raises:
            ValueError: if a head is not plain attention, or the layer is top-k or QK-normed.
        """
        if any(not isinstance(op, Attention) for op, _ in self._groups):
            raise ValueError(f"to_mha: every head must be 'attention', got {self.spec!r}")
        if self.topk is not None or self.q_norm is not None:
            raise ValueError("to_mha: top-k and QK-norm layers have no MultiheadAttention twin")
        w = self.in_proj.weight
        mha = nn.MultiheadAttention(
            self.embed_dim, self.num_heads, bias=self.in_proj.bias is not None,
            batch_first=batch_first, device=w.device, dtype=w.dtype,
        )  # fmt: skip
        with torch.no_grad():
            mha.in_proj_weight.copy_(w)
            mha.out_proj.weight.copy_(self.out_proj.weight)
            if self.in_proj.bias is not None:
                mha.in_proj_bias.copy_(self.in_proj.bias)
                mha.out_proj.bias.copy_(self.out_proj.bias)
        return mha

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, heads={self.spec!r}, "
            f"topk={self.topk}, causal={self.causal}, dropout={self.dropout}"
        )
