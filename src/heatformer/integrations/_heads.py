r"""The diffusion heads of one attention layer of another library's model.

Every adapter of this package hands its layer's queries, keys and values to a
:class:`HeadOperators` module, with an :class:`AttentionMask` saying which keys each query may
attend. The module applies one diffusion operator per head, as
:class:`~heatformer.models.DiffusionAttention` does for heatformer's own layers, and asks its
parts what they can do:

- heads whose operator is affine in one propagation
  (:meth:`~heatformer.graph_ops.DiffusionOperator.affine_coefficients`: ``y = a P v + b I' v``,
  attention and ``"rw"`` Laplacian heads) share one propagation of one graph -- on the dense
  ``"softmax"`` kind one :func:`~torch.nn.functional.scaled_dot_product_attention` call, the
  call the host library makes itself -- and they are the only heads a KV cache can serve;
- other heads (heat, PPR, polynomial) build the layer's graph kind and propagate repeatedly;
- an operator that reads ``W^T`` is refused when the mask is causal.

Queries may be fewer than keys (a KV cache holds the past, or cross-attention): the graph is
then rectangular, only affine heads are exact, and ``I' v`` needs the queries' own values.

No ``N x N`` tensor is formed unless the host library passes one (a dense mask).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer import checks
from heatformer.graph_ops import (
    DiffusionOperator,
    Graph,
    GraphBuilder,
    GraphLaplacian,
    SoftmaxGraph,
    resolve_graph,
)
from heatformer.models.heads import (
    adds_identity,
    format_heads,
    group_heads,
    parse_heads,
    parse_layer_graphs,
    parse_layer_heads,
)

__all__ = ["AttentionMask", "HeadOperators", "in_module", "layer_specs"]


def in_module(name: str, err: ValueError) -> checks.ArgumentValueError:
    """``err`` (raised for one module of a model) with the module's name in its detail,
    naming the same argument."""
    argument = err.argument if isinstance(err, checks.ArgumentError) else "heads"
    detail = err.detail if isinstance(err, checks.ArgumentError) else str(err)
    return checks.bad_value(argument, f"module {name!r}: {detail}")


def layer_specs(
    heads: str | Sequence[str], graph: str | GraphBuilder | Sequence[str], n_layer: int
) -> list[tuple[str, str]]:
    """``(head spec, graph kind)`` of each of ``n_layer`` attention modules, from a
    ``convert`` call's ``heads`` and ``graph`` (one for every module, or one per module)."""
    specs = parse_layer_heads(heads, n_layer)
    kinds = parse_layer_graphs(graph.spec if isinstance(graph, GraphBuilder) else graph, n_layer)
    return list(zip(specs, kinds, strict=True))


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may attend, in the compact form graph kinds take.

    Query ``i`` sits at absolute position ``q_offset + i``, key ``j`` at ``kv_offset + j``.
    Query ``i`` may attend key ``j`` when ``key_mask[b, j]`` (a real token), and, when
    ``causal``, ``kv_offset + j <= q_offset + i``. ``dense`` is any other pattern, given by the
    host library as it is; only the dense ``"softmax"`` graph kind takes it.

    Attributes:
        key_mask: ``(B, T)`` bool, ``True`` = a real key; None = every key.
        causal: forbid keys after the query.
        q_offset, kv_offset: absolute positions of the first query and the first key.
        dense: ``(B or 1, H or 1, Nq, T)`` bool, ``True`` = may attend (SDPA polarity); when
            given, it is the whole mask (``key_mask`` and ``causal`` are ignored).
    """

    key_mask: Tensor | None = None
    causal: bool = False
    q_offset: int = 0
    kv_offset: int = 0
    dense: Tensor | None = None

    def allowed(self, n_q: int, n_k: int, device: torch.device) -> Tensor | None:
        """Bool ``(B or 1, 1 or H, n_q, n_k)``, ``True`` = may attend; None = every key.

        Forms ``n_q x n_k`` for a causal mask: used where queries are few (decoding) or where
        SDPA needs the whole mask (attention dropout).
        """
        if self.dense is not None:
            return self.dense
        allowed: Tensor | None = None
        if self.causal:
            rows = self.q_offset + torch.arange(n_q, device=device)
            cols = self.kv_offset + torch.arange(n_k, device=device)
            allowed = (cols <= rows.unsqueeze(-1))[None, None]  # (1, 1, n_q, n_k)
        if self.key_mask is not None:
            keys = self.key_mask[:, None, None, :]  # (B, 1, 1, n_k)
            allowed = keys if allowed is None else allowed & keys
        return allowed


class HeadOperators(nn.Module):
    r"""One diffusion operator per head, applied to another library's ``q``, ``k``, ``v``.

    Holds the operators (so learnable ones, such as a heat head's time, are parameters of the
    host model) and the graph kind; owns no projection.

    Args:
        heads: a head spec (``"attention:10,laplacian:2"``) or ``num_heads`` operators.
        num_heads: ``H``.
        graph: the graph kind (``"softmax"``, ``"topk[k=32]"``, ...; see
            :data:`~heatformer.graph_ops.GRAPHS`).
        device, dtype: factory kwargs for operators made from names.

    Shape:
        ``forward(q, k, v, mask)``: ``q`` ``(B, H, Nq, Dh)``, ``k`` ``(B, H, T, Dh)``, ``v``
        ``(B, H, T, C)`` -> ``(B, H, Nq, C)``.

    Equivalent to::

        P = softmax(q k^T * scale, masked as mask says)    # (B, H, Nq, T), never formed
        y[:, h] = op_h(P[:, h], v[:, h])                   # a P v + b v for affine heads
    """

    def __init__(
        self,
        heads: str | Sequence[DiffusionOperator | str],
        num_heads: int,
        *,
        graph: str | GraphBuilder = "softmax",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        checks.check_positive_int("num_heads", num_heads)
        head_ops = parse_heads(heads, num_heads, device=device, dtype=dtype)
        self.num_heads = num_heads
        #: a short summary (``"attention:2,heat:2"``, no operator parameters), for reprs
        self.spec = format_heads(head_ops)
        #: the head spec the heads were built from, parameters included (None when built
        #: from operator instances); what :mod:`~heatformer.integrations._record` records
        self.source: str | None = heads.strip() if isinstance(heads, str) else None
        self.graph_kind = resolve_graph(graph)
        self._groups = group_heads(head_ops)
        self.operators = nn.ModuleList([op for op, _ in self._groups])  # registers parameters
        self._fused = sorted(
            h for op, hs in self._groups for h in hs if op.affine_coefficients() is not None
        )
        # runs of consecutive fused heads sharing an operator: (operator, start, stop) as
        # positions in ``_fused``
        self._runs: list[tuple[DiffusionOperator, int, int]] = []
        op_of = {h: op for op, hs in self._groups for h in hs}
        for pos, head in enumerate(self._fused):
            op = op_of[head]
            if self._runs and self._runs[-1][0] is op and self._runs[-1][2] == pos:
                self._runs[-1] = (op, self._runs[-1][1], pos + 1)
            else:
                self._runs.append((op, pos, pos + 1))
        #: ``(graph, values)`` of each pass, collected by
        #: :func:`heatformer.integrations.hf.attention_graphs` (None: off)
        self._capture: list[tuple[Graph, Tensor]] | None = None

    @property
    def head_operators(self) -> list[DiffusionOperator]:
        """The operator of every head, in head order."""
        ops = {h: op for op, hs in self._groups for h in hs}
        return [ops[h] for h in range(self.num_heads)]

    @property
    def all_affine(self) -> bool:
        """Whether every head is affine in one propagation (what a KV cache needs)."""
        return len(self._fused) == self.num_heads

    def extra_repr(self) -> str:
        return f"heads={self.spec!r}, graph={self.graph_kind.spec!r}"

    # ---- graphs ----------------------------------------------------------------------------

    def graph(
        self,
        q: Tensor,
        k: Tensor,
        mask: AttentionMask,
        *,
        scale: float | None = None,
        symmetric_mask: bool = False,
    ) -> Graph:
        """The layer's graph for square ``q``, ``k`` ``(..., N, Dh)`` (batch ``(B, H)``).

        A compact mask goes to the graph kind; a dense one (any other pattern) to a
        :class:`~heatformer.graph_ops.SoftmaxGraph`, for the ``"softmax"`` kind only.
        """
        dh = q.shape[-1]
        kind = self.graph_kind
        if mask.dense is not None:
            if not kind.takes_dense_mask:
                raise checks.bad_value(
                    "graph",
                    f"graph kind {kind.spec!r} takes key masks and causal order only; this "
                    "layer got another mask pattern (e.g. a sliding window or packed "
                    "sequences), which only the dense 'softmax' kind takes",
                )
            dense = mask.dense
            if symmetric_mask:
                dense = dense & dense.transpose(-1, -2)
            return SoftmaxGraph(q, k, scale=scale, mask=dense)
        if mask.causal and not kind.supports_causal:
            raise checks.bad_value("graph", f"graph kind {kind.spec!r} does not take causal masks")
        if mask.key_mask is not None and not kind.supports_key_mask:
            raise checks.bad_value("graph", f"graph kind {kind.spec!r} takes no key mask")
        if scale is not None and scale != 1.0 / math.sqrt(dh):
            q = q * (scale * math.sqrt(dh))  # the kinds scale by 1/sqrt(Dh)
        return kind.build(
            q, k, key_mask=mask.key_mask, drop_masked_queries=symmetric_mask, causal=mask.causal
        )

    # ---- forward ---------------------------------------------------------------------------

    def _uses_v(self) -> bool:
        """Whether a fused head adds ``b I' v`` (decided on the host: no read per call)."""
        return any(adds_identity(op) for op, _, _ in self._runs)

    def _mix(self, pv: Tensor, ident: Tensor | None) -> Tensor:
        """``a P v + b I' v`` of every fused head from ``pv`` ``(B, Hf, N, C)`` and ``ident``
        (``I' v``, None when no head needs it). Plain attention runs stay ``pv`` untouched, so
        elementwise work is paid only by the heads that mix."""
        pieces = []
        # split, not slices: the backward of a split is one concatenation, where each slice's
        # backward would fill a full-size tensor of zeros
        parts = pv.split([stop - start for _, start, stop in self._runs], dim=1)
        for (op, start, stop), piece in zip(self._runs, parts, strict=True):
            pair = op.affine_coefficients()
            if pair is None:  # pragma: no cover - runs hold affine heads only
                raise RuntimeError("a fused run without coefficients")
            a, b = (c.to(device=pv.device, dtype=pv.dtype) for c in pair)
            # the fixed cases are decided on the host (affine_constants), never by a read
            constants = op.affine_constants()
            a_is_one = constants is not None and constants[0] == 1.0
            if constants is not None and constants[1] == 0.0:
                piece = piece if a_is_one else piece * a
            else:
                own = cast(Tensor, ident)[:, start:stop]
                if constants == (-1.0, 1.0):  # the Laplacian step: v - P v
                    piece = own - piece
                else:
                    piece = torch.addcmul(piece if a_is_one else piece * a, own, b)
            pieces.append(piece)
        return _cat_heads(pieces)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        *,
        scale: float | None = None,
        dropout: float = 0.0,
        own_values: Tensor | None = None,
        cross: bool = False,
    ) -> Tensor:
        """Apply each head's operator.

        Args:
            q, k, v: ``(B, H, Nq, Dh)``, ``(B, H, T, Dh)``, ``(B, H, T, C)``.
            mask: which keys each query may attend.
            scale: logit scale (default ``1 / sqrt(Dh)``).
            dropout: attention dropout (training), applied to ``P`` inside the fused SDPA call
                as the host library does; refused for heads that are not affine.
            own_values: ``(B, H, Nq, C)`` the queries' own values when ``Nq < T`` (``I' v``
                of a rectangular graph); None for cross-attention.
            cross: the keys are other tokens than the queries (cross-attention): the graph
                is rectangular even when ``Nq == T``, and there is no ``I' v``.

        Returns:
            ``(B, H, Nq, C)``.
        """
        b, h, n_q, _ = q.shape
        n_k = int(k.shape[-2])
        if h != self.num_heads:
            raise checks.bad_value(
                "q", f"expected {self.num_heads} heads (the head spec), got {h} in {tuple(q.shape)}"
            )
        square = not cross and n_q == n_k and mask.q_offset == mask.kv_offset
        reads_t = [op.name for op, _ in self._groups if op.reads_transpose]
        if reads_t and mask.causal:
            raise checks.bad_value(
                "heads",
                f"expected heads that read only the past in a causal layer, got heads {reads_t} "
                "that read W^T (the 'sym' normalization), which would let earlier tokens see "
                "later ones",
            )
        if not square:
            return self._rectangular(q, k, v, mask, scale, dropout, own_values)
        outs: list[tuple[list[int], Tensor]] = []
        if self._fused:
            fi = _index(self._fused)
            vf = v[:, fi]
            uses_v = self._uses_v()
            if dropout > 0.0:
                pv, has = self._sdpa(q[:, fi], k[:, fi], vf, mask, scale, dropout)
                ident = None if not uses_v else vf if has is None else vf * has
            else:
                walk = GraphLaplacian(self.graph(q[:, fi], k[:, fi], mask, scale=scale), "rw")
                pv = walk.adjacency(vf)  # P v for every fused head: one propagation
                ident = walk.identity(vf) if uses_v else None
            outs.append((self._fused, self._mix(pv, ident)))
        for op, heads in self._groups:
            if op.affine_coefficients() is not None:
                continue
            if dropout > 0.0:
                raise checks.bad_value(
                    "dropout",
                    f"attention dropout ({dropout}) has no counterpart for {op.name!r} heads; "
                    "set the model's attention dropout to 0 or call model.eval()",
                )
            idx = _index(heads)
            graph = self.graph(
                q[:, idx], k[:, idx], mask, scale=scale, symmetric_mask=op.reads_transpose
            )
            outs.append((heads, op(graph, v[:, idx])))
        outs.sort(key=lambda item: item[0][0])
        if [hh for heads, _ in outs for hh in heads] == list(range(self.num_heads)):
            return _cat_heads([y for _, y in outs])
        out = v.new_empty(b, h, n_q, v.shape[-1])
        for heads, y in outs:
            out[:, _index(heads)] = y
        return out

    def _sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        scale: float | None,
        dropout: float,
    ) -> tuple[Tensor, Tensor | None]:
        """``P v`` by one SDPA call (as the host library makes it), and the rows with an edge
        ``(B or 1, 1 or H, Nq, 1)`` (None: every row)."""
        n_q, n_k = int(q.shape[-2]), int(k.shape[-2])
        plain = mask.dense is None and mask.key_mask is None
        if plain and mask.causal and n_q == n_k and mask.q_offset == mask.kv_offset:
            pv = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scale
            )
            return pv, None
        allowed = mask.allowed(n_q, n_k, q.device)
        if allowed is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale), None
        has = allowed.any(-1, keepdim=True)  # (.., Nq, 1)
        pv = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed | ~has, dropout_p=dropout, scale=scale
        )
        return pv * has, has

    def _rectangular(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        scale: float | None,
        dropout: float,
        own_values: Tensor | None,
    ) -> Tensor:
        """Fewer queries than keys (a KV cache, cross-attention): affine heads only."""
        if not self.all_affine:
            others = sorted({op.name for op, _ in self._groups if op.affine_coefficients() is None})
            raise checks.bad_value(
                "heads",
                f"{others} heads need the full square graph, and this call has "
                f"{q.shape[-2]} queries against {k.shape[-2]} keys (a KV cache or "
                "cross-attention); recompute without a cache (generate(..., use_cache=False)) "
                "or use attention / 'rw' Laplacian heads there",
            )
        kind = self.graph_kind
        if kind.takes_dense_mask:
            pv, has = self._sdpa(q, k, v, mask, scale, dropout)
        else:
            plain_causal = mask.dense is None and mask.causal and mask.key_mask is None
            if not (kind.incremental and plain_causal) or dropout > 0.0:
                raise checks.bad_value(
                    "graph",
                    f"graph kind {kind.spec!r} decodes causal sequences without padding or "
                    "attention dropout only; this call had another mask",
                )
            dh = q.shape[-1]
            if scale is not None and scale != 1.0 / math.sqrt(dh):
                q = q * (scale * math.sqrt(dh))
            positions = mask.kv_offset + torch.arange(k.shape[-2], device=k.device)
            pv = kind.decode(q, k, v, positions=positions, past=mask.q_offset)
            has = None
        ident = None
        if self._uses_v():
            if own_values is None:
                raise checks.bad_value(
                    "heads",
                    f"heads {self.spec!r} add the queries' own values (b I' v), which "
                    "cross-attention does not have (its keys are other tokens); use attention "
                    "heads there",
                )
            ident = own_values if has is None else own_values * has
        return self._mix(pv, ident)


def _cat_heads(pieces: Sequence[Tensor]) -> Tensor:
    """``(B, h_i, N, C)`` pieces -> ``(B, H, N, C)``, concatenated in the ``(B, N, H, C)``
    memory layout that the host libraries transpose the heads back to (their transpose is then
    free); one piece is returned as it is."""
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat([p.transpose(1, 2) for p in pieces], dim=2).transpose(1, 2)


def _index(heads: Sequence[int]) -> slice | Tensor:
    """A slice when the heads are contiguous (a view, no copy), else an index tensor."""
    if list(heads) == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0], heads[0] + len(heads))
    return torch.tensor(list(heads), dtype=torch.long)
