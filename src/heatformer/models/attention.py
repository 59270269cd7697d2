r"""Multi-head attention in which every head applies a graph-diffusion operator to its values.

Head ``h`` builds its attention graph ``P_h`` (by the layer's graph kind: dense ``"softmax"``,
``"topk[k=32]"``, ...; masked or causal) and outputs ``op_h(P_h, v_h)``: ``P_h v_h`` for an
attention head, ``(I - P_h) v_h`` for a Laplacian head (Zhang & Papyan, 2026),
``exp(-t L) v_h`` for a heat head, and so on. Heads are concatenated and projected as in
:class:`torch.nn.MultiheadAttention`.

The layer is its projections and a :class:`~heatformer.models.routing.HeadRouter`, which
asks the parts what they can do and imports neither operator nor graph classes:

- every head whose operator is affine in one propagation
  (:meth:`~heatformer.graph_ops.DiffusionOperator.affine_coefficients`, ``y = a P v + b v``:
  attention, ``"rw"`` Laplacian heads, user operators that declare it) is served by one
  propagation of one graph -- on the dense kind, one fused
  :func:`~torch.nn.functional.scaled_dot_product_attention` call -- and by the KV cache;
- other heads (heat, PPR, polynomial) use repeated propagation;
- an operator that reads ``W^T`` (:attr:`~heatformer.graph_ops.DiffusionOperator.
  reads_transpose`) is refused in a causal layer;
- the graph kind (:class:`~heatformer.graph_ops.GraphBuilder`) builds the graphs and, when it
  is ``incremental``, decodes from the KV cache.

No ``N x N`` tensor is formed unless the caller asks for the weights.

References:
    Vaswani, A. et al. (2017). Attention is all you need. NeurIPS.
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer import checks
from heatformer.graph_ops import (
    DiffusionOperator,
    Graph,
    GraphBuilder,
    SequenceShard,
    resolve_graph,
)
from heatformer.models._packed import unbind_packed
from heatformer.models.cache import KVCache
from heatformer.models.masks import AttentionMask
from heatformer.models.routing import HeadRouter

__all__ = ["DiffusionAttention", "KVCache"]


def _autocasting(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (it then mixes dtypes on purpose)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


class DiffusionAttention(nn.Module):
    r"""Multi-head attention with one diffusion operator per head.

    Args:
        embed_dim: model dim ``D``.
        num_heads: ``H``; ``D`` must be divisible by ``H``.
        operators: a spec such as ``"attention:6,laplacian:2"`` (see
            :mod:`heatformer.models.heads`) or a list of ``H`` operator objects / names.
            Heads sharing an operator instance run as one batched call.
        graph: the graph kind, a spec (``"softmax"``, ``"topk[k=32]"``; see
            :data:`~heatformer.graph_ops.GRAPHS`) or a :class:`~heatformer.graph_ops.
            GraphBuilder`. ``"topk[k=32]"`` keeps the 32 strongest keys per query (a
            sequence shorter than ``k`` keeps all its keys).
        causal: forbid attending to later positions.
        dropout: dropout on the head outputs before the output projection (training only).
            Unlike :class:`torch.nn.MultiheadAttention`, which drops attention weights, this
            applies uniformly to every operator.
        bias: biases in the projections.
        qk_norm: LayerNorm on each head's queries and keys (QK-norm).
        zero_init: zero the output projection, so the layer is a no-op at initialization.
        row_block: query rows per block when graphs are built in blocks (top-k, dense rows).
        device, dtype: factory kwargs.

    Shape:
        - ``x``: ``(B, N, D)``, any ``N >= 0`` (``N = 0``: an empty output); ``key_mask``:
          ``(B, N)`` bool, ``True`` = a real token that may be attended (SDPA polarity); or
          ``key_padding_mask``, the same mask in :class:`~torch.nn.MultiheadAttention`'s
          polarity (``True`` = padding, ignored; ``key_mask = ~key_padding_mask``), one of the
          two. What padded positions hold changes no real row while it is finite; a
          NaN there reaches every row, as in SDPA: zero them first,
          ``x.masked_fill(~key_mask[..., None], 0)``.
        - output: ``(B, N, D)``; with ``need_weights=True`` also ``(B, H, N, N)`` weights.

    Equivalent to::

        q, k, v = self.project_qkv(x)                      # (B, H, N, Dh) each
        P = graph_kind.build(q, k, key_mask, causal)        # (B, H, N, N), never formed
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
        graph: str | GraphBuilder = "softmax",
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        qk_norm: bool = False,
        zero_init: bool = False,
        row_block: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_layer_sizes(embed_dim, num_heads, dropout)
        checks.check_bool("causal", causal)
        self.graph_kind = resolve_graph(graph)
        if causal and not self.graph_kind.supports_causal:
            raise checks.bad_value(
                "graph", f"expected a graph kind that supports causal=True, got {self.graph_kind}"
            )
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.dropout = bool(causal), float(dropout)
        self.row_block = row_block
        self.zero_init = zero_init
        # the heads' operators (names made in dtype), their groups and fused runs: decided
        # here, on the host, never per call
        self.router = HeadRouter(
            operators, num_heads, graph=self.graph_kind, row_block=self.row_block,
            head_dim=self.head_dim, **factory,
        )  # fmt: skip
        self.spec = self.router.spec
        if self.causal:
            self.router.check_causal("operators")
        given = [] if isinstance(operators, str) else list(operators)
        for op in self.router.operators:  # instances the caller made move to the layer's
            if any(op is item for item in given):  # device and dtype
                op.to(**factory)
        self.operators = nn.ModuleList(self.router.operators)  # registers parameters
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
        return self.router.head_operators

    @property
    def fused_heads(self) -> tuple[int, ...]:
        """The heads served by one propagation (operators affine in ``P v``), in head order."""
        return self.router.fused_heads

    # ---- projections -----------------------------------------------------------------------

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, each ``(B, H, N, Dh)`` (QK-norm applied if enabled)."""
        if not isinstance(x, Tensor):
            raise checks.bad_type("x", f"expected a Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise checks.bad_value(
                "x", f"expected shape (B, N, {self.embed_dim}), got {tuple(x.shape)}"
            )
        if x.dtype != self.in_proj.weight.dtype and not _autocasting(x.device.type):
            raise checks.bad_type(
                "x",
                f"expected dtype {self.in_proj.weight.dtype} (the layer's parameters), got "
                f"{x.dtype}",
            )
        b, n, _ = x.shape
        qkv = self.in_proj(x).view(b, n, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, Dh)
        # unbound along the projection's own dim, then transposed: the three gradients come
        # back in the (B, N, 3, H, Dh) layout, stacked once, or not at all when the graph's
        # backward wrote them as its parts (unbind_packed; unbinding a permuted view stacked
        # them as (3, B, H, N, Dh) and copied that back: two fresh (B, N, 3D) tensors)
        q, k, v = (t.transpose(1, 2) for t in unbind_packed(qkv))  # (B, H, N, Dh) each
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

    def _mask(
        self, key_mask: Tensor | None, b: int, n: int, *, name: str = "key_mask"
    ) -> Tensor | None:
        if key_mask is None:
            return None
        if not self.graph_kind.supports_key_mask:
            raise checks.bad_value(
                name, f"expected None: graph kind {self.graph_kind.spec!r} takes no key mask"
            )
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            meaning = "padding" if name == "key_padding_mask" else "real token"
            raise checks.bad_type(
                name,
                f"expected a bool tensor (True = {meaning}), got "
                f"{getattr(key_mask, 'dtype', type(key_mask).__name__)}",
            )
        if tuple(key_mask.shape) != (b, n):
            raise checks.bad_value(name, f"expected shape ({b}, {n}), got {tuple(key_mask.shape)}")
        return key_mask  # (B, N)

    def _key_mask(
        self, x: Tensor, key_mask: Tensor | None, key_padding_mask: Tensor | None
    ) -> Tensor | None:
        """The key mask in SDPA's polarity (``True`` = real token), from either argument."""
        if key_padding_mask is None:
            return key_mask
        if key_mask is not None:
            raise checks.bad_value(
                "key_padding_mask",
                "expected key_mask (True = real token, SDPA's polarity) or key_padding_mask "
                "(True = padding, nn.MultiheadAttention's), got both",
            )
        padding = self._mask(key_padding_mask, x.shape[0], x.shape[1], name="key_padding_mask")
        return None if padding is None else ~padding

    def _attention_mask(self, key_mask: Tensor | None) -> AttentionMask:
        """The router's mask: the checked key mask and the layer's causal order."""
        return AttentionMask(key_mask, causal=self.causal)

    def graphs(
        self,
        x: Tensor,
        key_mask: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
    ) -> Graph:
        """The attention graph of every head for input ``x`` (batch shape ``(B, H)``), as the
        layer's graph kind builds it (e.g. a :class:`~heatformer.graph_ops.SoftmaxGraph` for
        ``"softmax"``); for analysis and teaching (``graphs(x).to_networkx((0, h))``). The
        masks as in :meth:`forward`."""
        key_mask = self._key_mask(x, key_mask, key_padding_mask)
        q, k, _ = self.project_qkv(x)
        mask = self._mask(key_mask, x.shape[0], x.shape[1])
        return self.router.graph(q, k, self._attention_mask(mask))

    # ---- forward ---------------------------------------------------------------------------

    def diffuse(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_mask: Tensor | None = None,
        *,
        shard: SequenceShard | None = None,
    ) -> Tensor:
        """Apply each head's operator: ``(B, H, N, Dh)`` -> ``(B, H, N, Dh)`` (the layer's
        :class:`~heatformer.models.routing.HeadRouter`, with the key mask and the shard as in
        :meth:`forward` and the layer's causal order)."""
        b, _, n, _ = q.shape
        mask = self._mask(key_mask, b, n)
        return self.router.diffuse(q, k, v, self._attention_mask(mask), shard=shard)

    def forward(
        self,
        x: Tensor,
        key_mask: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        shard: SequenceShard | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend and diffuse.

        Args:
            x: ``(B, N, D)`` input; with a ``shard``, this process's ``(B, n_local, D)``
                block of the sequence.
            key_mask: ``(B, N)`` bool, ``True`` = real token (SDPA polarity).
            key_padding_mask: ``(B, N)`` bool, ``True`` = padding, ignored
                (:class:`torch.nn.MultiheadAttention`'s polarity): ``~key_mask``. Give one of
                the two.
            need_weights: also return the dense per-head weights ``(B, H, N, N)`` (forms
                ``N x N``; for analysis and teaching).
            cache: a :class:`KVCache` for incremental causal decoding (:attr:`supports_cache`):
                ``x`` holds the new tokens; their keys and values are appended to the cache,
                and the graph kind decodes them against every cached token.
            shard: this process's block of a sequence split over processes
                (:class:`~heatformer.graph_ops.SequenceShard`, sequence parallelism): ``x``
                and the masks hold its ``n_local = shard.local_nodes`` tokens, the graph is the
                kind's :meth:`~heatformer.graph_ops.GraphBuilder.sharded` one (it exchanges
                what its rows need with the other processes), and the output holds the same
                rows of what one process computes on the whole sequence. Every process of
                the group calls the layer together. Not with ``cache`` or ``need_weights``.

        Returns:
            ``(B, N, D)``, and the weights when ``need_weights``.

        Raises:
            ValueError: both ``key_mask`` and ``key_padding_mask``; a mask of the wrong shape,
                or one the graph kind does not take; with a ``shard``: a cache, weights, a
                graph kind that does not shard (naming ``graph``), or ``x`` of another length
                than the shard.
            TypeError: a mask that is not a bool tensor; a shard that is not a
                :class:`~heatformer.graph_ops.SequenceShard`.
        """
        key_mask = self._key_mask(x, key_mask, key_padding_mask)
        q, k, v = self.project_qkv(x)
        if shard is not None:
            check_shard(shard, x.shape[1], "x")
            if cache is not None or need_weights:
                name = "cache" if cache is not None else "need_weights"
                raise checks.bad_value(
                    name,
                    f"expected {'None' if cache is not None else 'False'} with a sharded "
                    "sequence (no process holds every key: no KV cache, no dense weights)",
                )
        if cache is not None:
            return self._forward_cached(q, k, v, cache, key_mask)
        y = self.diffuse(q, k, v, key_mask, shard=shard)
        out = self.merge_heads(y)
        if need_weights:
            mask = self._mask(key_mask, x.shape[0], x.shape[1])
            return out, self.router.graph(q, k, self._attention_mask(mask)).to_dense()
        return out

    @property
    def supports_cache(self) -> bool:
        """Whether :class:`KVCache` decoding is exact for this layer: causal, a graph kind that
        decodes incrementally, and every head served by one propagation per map (affine
        heads, differential heads: :attr:`~heatformer.models.routing.HeadRouter.
        all_one_step`)."""
        return self.causal and self.graph_kind.incremental and self.router.all_one_step

    def _forward_cached(
        self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache, key_mask: Tensor | None
    ) -> Tensor:
        if not self.supports_cache:
            raise checks.bad_value(
                "cache",
                f"KV caching needs a causal layer whose graph kind decodes incrementally and "
                f"whose heads are all served by one propagation per map (attention, 'rw' "
                f"Laplacian, diff); this layer has "
                f"heads {self.spec!r}, graph {self.graph_kind.spec!r}, causal={self.causal}. "
                "Recompute the full sequence instead.",
            )
        if key_mask is not None:
            raise checks.bad_value("key_mask", "expected None together with cache, got a mask")
        if not isinstance(cache, KVCache):
            raise checks.bad_type("cache", f"expected a KVCache, got {type(cache).__name__}")
        cache.claim(self)  # one cache per layer
        past = cache.position
        cache.append(k, v)
        keys, values = cast(Tensor, cache.k), cast(Tensor, cache.v)  # set by append
        positions = cast(Tensor, cache.positions)
        # new tokens always see themselves: I' v = v
        y = self.router.decode(q, keys, values, positions=positions, past=past, own_values=v)
        cache.trim(*self.graph_kind.cache_keep())  # keys no later token can attend
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
        check_multihead_attention(mha)
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
        """An equivalent :class:`torch.nn.MultiheadAttention` (every head plain attention).

        Raises:
            ValueError: if a head is not plain attention (``y = P v``), or the layer is not on
                the dense ``"softmax"`` graph or is QK-normed.
        """
        plain = all(
            (pair := op.affine_coefficients()) is not None
            and float(pair[0]) == 1.0
            and float(pair[1]) == 0.0
            for op in self.router.operators
        )
        if not plain:
            raise checks.bad_value("to_mha", f"expected every head 'attention', got {self.spec!r}")
        if self.graph_kind.spec != "softmax" or self.q_norm is not None:
            raise checks.bad_value(
                "to_mha",
                f"expected the dense 'softmax' graph and no QK-norm, got graph "
                f"{self.graph_kind.spec!r}, qk_norm={self.q_norm is not None}",
            )
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
            f"graph={self.graph_kind.spec!r}, causal={self.causal}, dropout={self.dropout}"
        )


def check_shard(shard: object, n_local: int, name: str) -> None:
    """Refuse a shard that is not a :class:`~heatformer.graph_ops.SequenceShard` (TypeError)
    or whose block is not the ``n_local`` tokens given in ``name`` (ValueError)."""
    if not isinstance(shard, SequenceShard):
        raise checks.bad_type("shard", f"expected a SequenceShard, got {type(shard).__name__}")
    if n_local != shard.local_nodes:
        raise checks.bad_value(
            name,
            f"expected the shard's {shard.local_nodes} tokens (rows {shard.start}:{shard.stop} "
            f"of {shard.num_nodes}), got {n_local}",
        )


def check_layer_sizes(embed_dim: object, num_heads: object, dropout: object) -> None:
    """The checks of an attention layer's ``embed_dim``, ``num_heads`` and ``dropout``, the
    same for :class:`DiffusionAttention` and the ``torch.nn`` adapter's layer.

    Raises:
        TypeError: naming the argument, a size that is not an int or a ``dropout`` that is not
            a float.
        ValueError: naming the argument, a size below 1, an ``embed_dim`` that is not a
            multiple of ``num_heads``, a ``dropout`` outside ``[0, 1)``.
    """
    embed_dim = checks.check_positive_int("embed_dim", embed_dim)
    num_heads = checks.check_positive_int("num_heads", num_heads)
    if embed_dim % num_heads != 0:
        raise checks.bad_value(
            "embed_dim", f"expected a multiple of num_heads ({num_heads}), got {embed_dim}"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise checks.bad_type(
            "dropout", f"expected a float in [0, 1), got {type(dropout).__name__}"
        )
    if not 0.0 <= dropout < 1.0:
        raise checks.bad_value("dropout", f"expected a probability in [0, 1), got {dropout}")


def check_multihead_attention(mha: object) -> None:
    """Refuse what a heatformer layer cannot copy from an :class:`torch.nn.MultiheadAttention`.

    Raises:
        TypeError: ``mha`` is not one.
        ValueError: ``kdim``/``vdim`` different from ``embed_dim``, ``add_bias_kv``,
            ``add_zero_attn``.
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise checks.bad_type("mha", f"expected nn.MultiheadAttention, got {type(mha).__name__}")
    if not mha._qkv_same_embed_dim:
        raise checks.bad_value("mha", "kdim/vdim different from embed_dim are not supported")
    if mha.bias_k is not None or mha.add_zero_attn:
        raise checks.bad_value("mha", "add_bias_kv and add_zero_attn are not supported")
