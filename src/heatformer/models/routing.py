r"""Head routing: one diffusion operator per head, applied to a layer's ``q``, ``k``, ``v``.

Every attention layer with diffusion heads -- heatformer's own
:class:`~heatformer.models.DiffusionAttention` and the adapters of
:mod:`heatformer.integrations`, which hand over another library's queries, keys and values --
routes its heads through one :class:`HeadRouter`, with an
:class:`~heatformer.models.masks.AttentionMask` saying which keys each query may attend.
The router asks its parts what they can do, and imports neither operator nor graph classes:

- heads whose operator is affine in one propagation
  (:meth:`~heatformer.graph_ops.DiffusionOperator.affine_coefficients`: ``y = a P v + b I' v``,
  attention and ``"rw"`` Laplacian heads) share one propagation of one graph -- on the dense
  kind one fused :func:`~torch.nn.functional.scaled_dot_product_attention` call -- and they
  are the only heads a KV cache can serve;
- other heads (heat, PPR, polynomial) build the layer's graph kind and propagate repeatedly;
- an operator of several attention maps per head (:attr:`~heatformer.graph_ops.
  DiffusionOperator.maps`: differential heads) gets one graph, its maps the last batch dim,
  from the channels of its heads' queries and keys (:func:`~heatformer.graph_ops.split_maps`);
  the KV cache serves it when it :attr:`~heatformer.graph_ops.DiffusionOperator.combines_maps`;
- an operator that reads ``W^T`` (:attr:`~heatformer.graph_ops.DiffusionOperator.
  reads_transpose`) is refused when the mask is causal;
- a mask beyond padding and causal order (a dense pattern) goes only to a graph kind that
  :attr:`~heatformer.graph_ops.GraphBuilder.takes_dense_mask`.

What the operators decide is decided once, on the host, when the router is built: the head
groups, the fused heads and their runs, which runs add ``b I' v`` and which coefficients are
fixed (:meth:`~heatformer.graph_ops.DiffusionOperator.affine_constants`). A call reads no
tensor value (no host sync): learnable coefficients are applied as tensors.

Queries may be fewer than keys (a KV cache holds the past, or cross-attention): the graph is
then rectangular, only heads served by one propagation per map are exact (affine heads and
heads that combine their maps), and ``I' v`` needs the queries' own values.
No ``N x N`` tensor is formed unless the caller passes one (a dense mask).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

import torch
from torch import Tensor

from heatformer import checks
from heatformer.graph_ops import (
    DiffusionOperator,
    Graph,
    GraphBuilder,
    GraphLaplacian,
    SequenceShard,
    SoftmaxGraph,
    resolve_graph,
    split_maps,
)
from heatformer.models._head_subsets import (
    cat_heads,
    check_maps,
    coefficients,
    head_index,
    heads_of,
    map_index,
    map_scale,
    maps_of,
    rescaled,
    sdpa_heads,
    shape_parameters,
)
from heatformer.models.heads import adds_identity, format_heads, group_heads, parse_heads
from heatformer.models.masks import AttentionMask

__all__ = ["HeadRouter", "head_index"]


class _Run(NamedTuple):
    """Consecutive fused heads that share an operator: positions ``start:stop`` among the
    fused heads, and the operator's fixed coefficients (None: learnable)."""

    op: DiffusionOperator
    start: int
    stop: int
    constants: tuple[float, float] | None


class _Group(NamedTuple):
    """Heads whose operator is not affine: they build their own graph, of ``maps`` maps per
    head (``map_where``: each head's index ``maps`` times, for a mask of one pattern per head)."""

    op: DiffusionOperator
    heads: list[int]
    where: slice | Tensor
    maps: int
    map_where: slice | Tensor


#: ``propagate(q, k, v, heads, maps) -> (P v, rows with an edge or None)`` of a subset of heads
_Propagate = Callable[[Tensor, Tensor, Tensor, slice | Tensor, int], tuple[Tensor, Tensor | None]]


class HeadRouter:
    r"""One diffusion operator per head, applied to a layer's ``q``, ``k``, ``v``.

    Holds the operators and the graph kind, owns no parameter: the module that uses it
    registers :attr:`operators` (so learnable ones, such as a heat head's time, are parameters
    of that module) and keeps the projections.

    Args:
        heads: a head spec (``"attention:6,laplacian:2"``, see :mod:`heatformer.models.heads`)
            or ``num_heads`` operators / names; heads sharing an operator instance run as one
            batched call.
        num_heads: ``H``.
        graph: the graph kind (``"softmax"``, ``"topk[k=32]"``; see
            :data:`~heatformer.graph_ops.GRAPHS`) or a
            :class:`~heatformer.graph_ops.GraphBuilder`.
        row_block: query rows per block when graphs are built in blocks (None: the kind's
            default).
        head_dim: ``Dh``, the width of the values: every operator is asked to shape its
            parameters for the heads it serves (:meth:`~heatformer.graph_ops.
            DiffusionOperator.shape_parameters`, e.g. an untied skip's ``(h, Dh, Dh)``
            weight); None refuses operators that need it.
        device, dtype: factory kwargs for operators made from names.

    Raises:
        ValueError: naming ``heads``, an operator that needs ``head_dim`` when none is given.

    Shape:
        :meth:`diffuse`: ``q`` ``(B, H, Nq, Dh)``, ``k`` ``(B, H, T, Dh)``, ``v``
        ``(B, H, T, C)`` -> ``(B, H, Nq, C)``.

    Equivalent to::

        P = graph_kind.build(q, k, mask)                   # (B, H, Nq, T), never formed
        y[:, h] = op_h(P[:, h], v[:, h])                   # a P v + b I' v for affine heads

    Example:
        >>> router = HeadRouter("attention:2,laplacian:1,heat:1", 4)
        >>> router.fused_heads, router.spec
        ((0, 1, 2), 'attention:2,laplacian:1,heat:1')
        >>> q = k = v = torch.randn(1, 4, 5, 8)
        >>> router.diffuse(q, k, v, AttentionMask(causal=True)).shape
        torch.Size([1, 4, 5, 8])
    """

    def __init__(
        self,
        heads: str | Sequence[DiffusionOperator | str],
        num_heads: int,
        *,
        graph: str | GraphBuilder = "softmax",
        row_block: int | None = None,
        head_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        checks.check_positive_int("num_heads", num_heads)
        checks.check_positive_int("head_dim", head_dim, optional=True)
        head_ops = parse_heads(heads, num_heads, device=device, dtype=dtype)
        self.num_heads = num_heads
        self.graph_kind = resolve_graph(graph)
        self.row_block = row_block
        #: a short summary (``"attention:2,heat:2"``, no operator parameters), for reprs
        self.spec = format_heads(head_ops)
        groups = group_heads(head_ops)
        check_maps(groups, head_dim)
        shape_parameters(groups, head_dim)
        #: the distinct operators, in order of first appearance (register them once)
        self.operators: list[DiffusionOperator] = [op for op, _ in groups]
        self._op_of = list(head_ops)  # the operator of every head
        fused = sorted(h for op, hs in groups for h in hs if op.affine_coefficients() is not None)
        self._fused = fused
        self._fused_index = head_index(fused) if fused else None
        self._runs: list[_Run] = []
        for pos, head in enumerate(fused):  # consecutive fused heads sharing an operator
            op = head_ops[head]
            if self._runs and self._runs[-1].op is op and self._runs[-1].stop == pos:
                self._runs[-1] = self._runs[-1]._replace(stop=pos + 1)
            else:
                self._runs.append(_Run(op, pos, pos + 1, op.affine_constants()))
        self._run_sizes = [run.stop - run.start for run in self._runs]
        #: whether a fused head adds ``b I' v``
        self._uses_identity = any(adds_identity(run.op) for run in self._runs)
        self._groups = [
            _Group(op, hs, head_index(hs), op.maps, map_index(hs, op.maps))
            for op, hs in groups
            if op.affine_coefficients() is None
        ]
        # the order in which diffuse produces its pieces (fused heads first), and the order
        # that sorts them by their first head
        pieces = ([fused] if fused else []) + [g.heads for g in self._groups]
        self._order = sorted(range(len(pieces)), key=lambda i: pieces[i][0])
        self._in_order = [h for i in self._order for h in pieces[i]] == list(range(num_heads))
        self._piece_index = [head_index(heads) for heads in pieces]
        self._reads_transpose = [op.name for op in self.operators if op.reads_transpose]

    # ---- what the heads are ----------------------------------------------------------------

    @property
    def head_operators(self) -> list[DiffusionOperator]:
        """The operator of every head, in head order."""
        return list(self._op_of)

    @property
    def fused_heads(self) -> tuple[int, ...]:
        """The heads served by one propagation (operators affine in ``P v``), in head order."""
        return tuple(self._fused)

    @property
    def all_affine(self) -> bool:
        """Whether every head is affine in one propagation."""
        return len(self._fused) == self.num_heads

    @property
    def all_one_step(self) -> bool:
        """Whether every head is served by one propagation per map (what a KV cache and
        rectangular calls need): affine heads, and heads whose operator ``combines_maps``."""
        return all(group.op.combines_maps for group in self._groups)

    def check_causal(self, argument: str = "heads") -> None:
        """Refuse heads that read ``W^T`` in a causal layer.

        Raises:
            ValueError: naming ``argument``, when a head's operator reads ``W^T``.
        """
        if self._reads_transpose:
            raise checks.bad_value(
                argument,
                f"expected heads that read only the past in a causal layer, got heads "
                f"{self._reads_transpose} that read W^T (e.g. the 'sym' normalization "
                f"symmetrizes the attention graph (W + W^T)/2), which would let earlier tokens "
                f"see later ones (use 'rw' or 'combinatorial')",
            )

    # ---- graphs ----------------------------------------------------------------------------

    def graph(
        self,
        q: Tensor,
        k: Tensor,
        mask: AttentionMask,
        *,
        scale: float | None = None,
        symmetric_mask: bool = False,
        shard: SequenceShard | None = None,
    ) -> Graph:
        """The layer's graph for square ``q``, ``k`` ``(..., N, Dh)`` (batch ``(B, H)``).

        A compact mask goes to the graph kind; a dense one (any other pattern) to a
        :class:`~heatformer.graph_ops.SoftmaxGraph`, for a kind that
        :attr:`~heatformer.graph_ops.GraphBuilder.takes_dense_mask` only.

        Args:
            q, k: ``(B, h, N, Dh)`` queries and keys of the heads built (``h <= H``); with a
                ``shard``, this process's ``n_local`` rows of them.
            mask: which keys each query may attend (a dense mask of those heads); with a
                ``shard``, its key mask holds this process's ``(B, n_local)`` columns.
            scale: logit scale (default ``1 / sqrt(Dh)``).
            symmetric_mask: masked queries lose their out-edges too, so that ``W^T`` cannot
                carry them to real tokens (for operators that read it).
            shard: this process's block of a sequence split over processes: the graph is the
                kind's :meth:`~heatformer.graph_ops.GraphBuilder.sharded` one, over the local
                query rows (None: the whole sequence is here).

        Returns:
            The graph, batch shape ``(B, h)``, ``N`` nodes (``n_local`` with a shard).

        Raises:
            ValueError: a mask the graph kind does not take; a kind that does not shard
                (naming ``graph``).
        """
        kind = self.graph_kind if shard is None else self.graph_kind.sharded(shard)
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
            return SoftmaxGraph(q, k, scale=scale, mask=dense, row_block=self.row_block)
        if mask.causal and not kind.supports_causal:
            raise checks.bad_value("graph", f"graph kind {kind.spec!r} does not take causal masks")
        if mask.key_mask is not None and not kind.supports_key_mask:
            raise checks.bad_value("graph", f"graph kind {kind.spec!r} takes no key mask")
        return kind.build(
            rescaled(q, scale), k, key_mask=mask.key_mask, drop_masked_queries=symmetric_mask,
            causal=mask.causal, row_block=self.row_block,
        )  # fmt: skip

    # ---- diffusion -------------------------------------------------------------------------

    def mix(self, pv: Tensor, ident: Tensor | None) -> Tensor:
        """``a P v + b I' v`` of every fused head from ``pv`` ``(B, Hf, N, C)`` and ``ident``
        (``I' v`` of the fused heads, None when no head adds it).

        Plain attention runs stay ``pv`` untouched and fixed coefficients are applied as the
        host knows them (``v - P v`` for the Laplacian step), so elementwise work is paid only
        by the heads that mix.

        Args:
            pv: ``(B, Hf, N, C)``: ``P v`` of the fused heads, in head order.
            ident: ``(B, Hf, N, C)``: ``I' v`` of the same heads; None when no fused head
                adds ``b I' v``.

        Returns:
            ``(B, Hf, N, C)``.
        """
        pieces = []
        # split, not slices (each slice's backward would fill a full-size tensor of zeros);
        # one run is pv itself (the concatenation of a split's one part copies its gradient)
        parts = pv.split(self._run_sizes, dim=1) if len(self._runs) > 1 else (pv,)
        for run, piece in zip(self._runs, parts, strict=True):
            constants = run.constants
            a_is_one = constants is not None and constants[0] == 1.0
            if constants is not None and constants[1] == 0.0:  # a P v
                pieces.append(piece if a_is_one else piece * coefficients(run.op, piece)[0])
                continue
            own = cast(Tensor, ident)[:, run.start : run.stop]
            if constants == (-1.0, 1.0):  # the Laplacian step: v - P v
                pieces.append(own - piece)
            else:
                a, b = coefficients(run.op, piece)
                pieces.append(torch.addcmul(piece if a_is_one else piece * a, own, b))
        return cat_heads(pieces)

    def diffuse(
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
        shard: SequenceShard | None = None,
    ) -> Tensor:
        """Apply each head's operator.

        Args:
            q, k, v: ``(B, H, Nq, Dh)``, ``(B, H, T, Dh)``, ``(B, H, T, C)``.
            mask: which keys each query may attend.
            scale: logit scale (default ``1 / sqrt(Dh)``).
            dropout: attention dropout (training), applied to ``P`` inside the fused SDPA call
                as host libraries do; refused for heads that are not affine.
            own_values: ``(B, H, Nq, C)`` the queries' own values when ``Nq < T`` (``I' v``
                of a rectangular graph); None for cross-attention.
            cross: the keys are other tokens than the queries (cross-attention): the graph
                is rectangular even when ``Nq == T``, and there is no ``I' v``.
            shard: this process's block of a sequence split over processes (``q``, ``k``,
                ``v`` and the key mask hold its ``n_local`` tokens; see :meth:`graph`); every
                head then goes through the sharded graph, so attention dropout (one fused
                SDPA call over every key) and rectangular calls are refused.

        Returns:
            ``(B, H, Nq, C)``.

        Raises:
            ValueError: another head count than the router's; heads that read ``W^T`` under a
                causal mask; a mask the graph kind does not take; attention dropout for heads
                that are not affine; non-affine heads on a rectangular graph; with a shard,
                attention dropout, a rectangular call or a kind that does not shard.
        """
        _, h, n_q, _ = q.shape
        if h != self.num_heads:
            raise checks.bad_value(
                "q", f"expected {self.num_heads} heads (the head spec), got {h} in {tuple(q.shape)}"
            )
        if mask.causal:
            self.check_causal()
        square = not cross and n_q == int(k.shape[-2]) and mask.q_offset == mask.kv_offset
        if shard is not None:
            _check_sharded_call(shard, square, dropout)
        if not square:
            return self._rectangular(q, k, v, mask, scale, dropout, own_values)
        outs: list[Tensor] = []
        if self._fused_index is not None:
            fi = self._fused_index
            qf, kf, vf, mf = heads_of(q, fi), heads_of(k, fi), heads_of(v, fi), mask.heads(fi)
            if dropout > 0.0:
                pv, has = sdpa_heads(qf, kf, vf, mf, scale, dropout)
                ident = None if not self._uses_identity else vf if has is None else vf * has
            else:
                graph = self.graph(qf, kf, mf, scale=scale, shard=shard)
                walk = GraphLaplacian(graph, "rw")
                pv = walk.adjacency(vf)  # P v for every fused head: one propagation
                ident = walk.identity(vf) if self._uses_identity else None
            outs.append(self.mix(pv, ident))
        for group in self._groups:
            if dropout > 0.0:
                raise checks.bad_value(
                    "dropout",
                    f"attention dropout ({dropout}) has no counterpart for {group.op.name!r} "
                    "heads; set the model's attention dropout to 0 or call model.eval()",
                )
            idx, maps = group.where, group.maps
            qg, kg, mg = maps_of(heads_of(q, idx), heads_of(k, idx), mask.heads(idx), maps)
            graph = self.graph(
                qg, kg, mg, scale=map_scale(scale, maps),
                symmetric_mask=group.op.reads_transpose, shard=shard,
            )  # fmt: skip
            outs.append(group.op(graph, heads_of(v, idx)))
        return self._in_head_order(outs, v, n_q)

    def _in_head_order(self, outs: list[Tensor], v: Tensor, n_q: int) -> Tensor:
        """The outputs of :meth:`diffuse`'s pieces (fused heads first, then each group) as one
        ``(B, H, Nq, C)`` tensor in head order (``v``: the values): concatenated when the
        pieces cover the heads in order, else written into a new tensor."""
        if self._in_order:
            return cat_heads([outs[i] for i in self._order])
        b, h, _, c = v.shape
        out = v.new_empty(b, h, n_q, c)
        for index, y in zip(self._piece_index, outs, strict=True):
            out[:, index] = y
        return out

    def decode(
        self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int, own_values: Tensor
    ) -> Tensor:
        """New queries of a causal sequence against the cached keys and values, by the graph
        kind's :meth:`~heatformer.graph_ops.GraphBuilder.decode` (every head affine).

        Args:
            q: ``(B, H, n, Dh)`` queries at positions ``past ... past + n - 1``.
            k, v: ``(B, H, T, Dh)``, ``(B, H, T, C)``: the cached keys and values.
            positions: ``(T,)`` absolute position of every cached key.
            past: tokens before the new ones.
            own_values: ``(B, H, n, C)`` the new tokens' own values (they always see
                themselves: ``I' v = v``).

        Returns:
            ``(B, H, n, C)``.
        """
        return self._one_step(q, k, v, own_values, self._decoder(positions, past))

    def _decoder(self, positions: Tensor, past: int, scale: float | None = None) -> _Propagate:
        """``P v`` of a subset of heads by the kind's ``decode`` (logit ``scale`` per map)."""

        def propagate(
            qs: Tensor, ks: Tensor, vs: Tensor, heads: slice | Tensor, maps: int
        ) -> tuple[Tensor, Tensor | None]:
            qs = rescaled(qs, map_scale(scale, maps))
            return self.graph_kind.decode(qs, ks, vs, positions=positions, past=past), None

        return propagate

    def _one_step(
        self, q: Tensor, k: Tensor, v: Tensor, own_values: Tensor | None, propagate: _Propagate
    ) -> Tensor:
        """Every head by ``propagate``, once per map (:attr:`all_one_step`): the fused heads'
        ``a P v + b I' v`` (``I' v``: ``own_values``), each group's ``combine`` of its maps."""
        n_q = int(q.shape[-2])
        outs: list[Tensor] = []
        if self._fused_index is not None:
            fi = self._fused_index
            pv, has = propagate(heads_of(q, fi), heads_of(k, fi), heads_of(v, fi), fi, 1)
            ident = None
            if self._uses_identity:
                if own_values is None:
                    raise checks.bad_value(
                        "heads",
                        f"heads {self.spec!r} add the queries' own values (b I' v), which "
                        "cross-attention does not have (its keys are other tokens); use "
                        "attention heads there",
                    )
                own = heads_of(own_values, fi)
                ident = own if has is None else own * has
            outs.append(self.mix(pv, ident))
        for group in self._groups:  # every one combines its maps (all_one_step)
            maps, idx = group.maps, group.where
            qg, kg, vg = (heads_of(t, idx) for t in (q, k, v))
            b, h, t, c = vg.shape
            if maps > 1:  # the heads' maps flattened: (B, h * maps, ., Dh / maps)
                qg = split_maps(qg, maps, name="q").flatten(1, 2)
                kg = split_maps(kg, maps, name="k").flatten(1, 2)
                vg = vg.unsqueeze(2).expand(b, h, maps, t, c).flatten(1, 2)  # (B, h*maps, T, C)
            pv, _ = propagate(qg, kg, vg, group.map_where, maps)  # (B, h * maps, Nq, C)
            outs.append(group.op.combine(pv.unflatten(1, (h, maps))))  # (B, h, Nq, C)
        return self._in_head_order(outs, v, n_q)

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
        """Fewer queries than keys (a KV cache, cross-attention): heads served by one
        propagation per map only (:attr:`all_one_step`)."""
        if not self.all_one_step:
            others = sorted({g.op.name for g in self._groups if not g.op.combines_maps})
            raise checks.bad_value(
                "heads",
                f"{others} heads need the full square graph, and this call has "
                f"{q.shape[-2]} queries against {k.shape[-2]} keys (a KV cache or "
                "cross-attention); recompute without a cache (generate(..., use_cache=False)) "
                "or use attention / 'rw' Laplacian / diff heads there",
            )
        if dropout > 0.0 and self._groups:
            raise checks.bad_value(
                "dropout",
                f"attention dropout ({dropout}) has no counterpart for "
                f"{sorted({g.op.name for g in self._groups})} heads; set the model's attention "
                "dropout to 0 or call model.eval()",
            )
        kind = self.graph_kind
        if kind.takes_dense_mask:

            def propagate(
                qs: Tensor, ks: Tensor, vs: Tensor, heads: slice | Tensor, maps: int
            ) -> tuple[Tensor, Tensor | None]:
                return sdpa_heads(qs, ks, vs, mask.heads(heads), map_scale(scale, maps), dropout)

            return self._one_step(q, k, v, own_values, propagate)
        plain_causal = mask.dense is None and mask.causal and mask.key_mask is None
        if not (kind.incremental and plain_causal) or dropout > 0.0:
            raise checks.bad_value(
                "graph",
                f"graph kind {kind.spec!r} decodes causal sequences without padding or "
                "attention dropout only; this call had another mask",
            )
        positions = mask.kv_offset + torch.arange(k.shape[-2], device=k.device)
        return self._one_step(q, k, v, own_values, self._decoder(positions, mask.q_offset, scale))


def _check_sharded_call(shard: SequenceShard, square: bool, dropout: float) -> None:
    """Refuse what bypasses the sharded graph: attention dropout (one fused SDPA call over
    every key) and rectangular calls (a KV cache, cross-attention)."""
    if not isinstance(shard, SequenceShard):
        raise checks.bad_type("shard", f"expected a SequenceShard, got {type(shard).__name__}")
    if dropout > 0.0:
        raise checks.bad_value(
            "dropout",
            f"expected 0 with a sharded sequence (attention dropout is one fused SDPA call over "
            f"every key, which a sharded graph does not hold), got {dropout}",
        )
    if not square:
        raise checks.bad_value(
            "shard",
            "expected this process's queries and keys of one sequence (a square graph), got a "
            "rectangular call (a KV cache or cross-attention), which a sharded sequence refuses",
        )
