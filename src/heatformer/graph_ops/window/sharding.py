r"""A sequence split over processes: each rank holds a contiguous block of the rows.

Past one machine's memory, a long sequence is split over the ``P`` processes of a
:mod:`torch.distributed` group (gloo on the CPU, nccl on CUDA): rank ``r`` holds the queries,
keys and values of positions ``[start, stop)`` (:class:`SequenceShard`), and a graph kind that
shards (:attr:`GraphBuilder.shards <heatformer.graph_ops.GraphBuilder.shards>`) builds, from the
local blocks only, a graph over the rank's rows whose products equal the rows of the
single-process graph's (:func:`~heatformer.graph_ops.shard_graph`). Every operator works on it
unchanged, because it only calls the graph protocol; the messages happen inside the products.

Which kinds shard:

- ``window[w=W,global=G]`` (causal or not, key padding, ``drop_masked_queries``): yes,
  :class:`ShardedWindowGraph`. Row ``i`` reads the keys within ``w`` of it and the ``g`` global
  keys, so a rank needs only the **halo** (``w - 1`` positions before its block when causal,
  ``w`` before and after when bidirectional; a block shorter than ``w`` takes its halo from
  several ranks) and the global positions. Keys are exchanged once per graph, values once per
  product. A bidirectional global row attends every key of the sequence: it is a softmax
  distributed over the ranks (each rank's partial sums over its own keys, combined by one
  log-sum-exp per row, computed once per graph), ``O(g C)`` per product. A causal global row
  attends global keys only. Communication per product and rank: ``(w + g) C`` values (``2 w``
  bidirectional, plus ``g C`` for the global rows' sums), counted in :attr:`SequenceShard.comm`.
- ``softmax`` (dense attention) and ``topk[k=K]`` (exact global top-k): no, every row needs
  every key. ``GraphBuilder.sharded`` refuses them with a ``ValueError`` naming ``graph``.
  (Top-k *inside* a window would shard like the window; it is not offered yet.)

Memory per rank is ``O((N / P + w + g) C)`` (the window products work block by block on the
extended block ``[start - halo, stop + halo)`` and the global keys, with the recomputing
backward of :class:`~heatformer.graph_ops.WindowGraph`), plus ``O(g N / P)`` for the global
rows' weights over the local keys. On a rank that receives a halo each product's input is a
fresh copy of the extended block; what the window kernels save of it for their backward is
kept as the block (saved anyway, as the previous product's output) and the ``O(w)`` received
rows (:func:`~heatformer.graph_ops.window.halo.saved_as_parts`), so a series of ``K`` products holds
no more per term than one process does (``benchmarks/bench_sharded.py`` measures each rank).

Rules of use (as for any collective code):

- every rank builds the same graph kind on its block and calls the same products in the same
  order (an empty block still calls them: ``N < P`` is allowed);
- the graph is built in the grad mode of its products (its keys' messages are recorded then);
- a choice made from the size of a signal must be the same on every rank: the series read
  :meth:`Graph.signal_elements <heatformer.graph_ops.Graph.signal_elements>`, which a sharded
  graph answers for the whole sequence (whether to recompute steps in the backward);
- the dense views of a sharded graph (:meth:`~heatformer.graph_ops.Graph.to_dense`, top-k and
  thresholding, the ``"exact"`` heat method and the ``"solve"`` PageRank method) are refused:
  they need every row of ``W`` on one rank. Gather the queries and keys
  (:meth:`SequenceShard.gather`) and build the single-process graph to inspect one.

Example (with ``torch.distributed`` initialized, e.g. under ``torchrun``)::

    shard = SequenceShard.current(num_nodes=q.shape[-2])        # this rank's block
    q_loc, k_loc, v_loc = (shard.take(t) for t in (q, k, v))    # (B, H, n_local, E)
    graph = shard_graph("window[w=128,global=1]", shard).build(q_loc, k_loc, causal=True)
    y_loc = HeatKernel(t=1.0)(graph, v_loc)                     # rows start ... stop - 1
    y = shard.gather(y_loc)                                     # the whole (B, H, N, E)
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops._arrays import check_key_mask, fold, numel
from heatformer.graph_ops._precision import attention_scores
from heatformer.graph_ops.kind import GraphBuilder
from heatformer.graph_ops.protocol import UNIFORM_DIM, Graph
from heatformer.graph_ops.window.builder import WindowBuilder
from heatformer.graph_ops.window.graph import check_qk, trusted_window_graph
from heatformer.graph_ops.window.halo import (
    GlobalRows,
    HaloPlan,
    all_reduce_max,
    all_reduce_sum,
    saved_as_parts,
)
from heatformer.graph_ops.window.layout import check_window, flat_key_mask, window_allowed
from heatformer.graph_ops.window.shard import SequenceShard

__all__ = ["ShardedWindowBuilder", "ShardedWindowGraph"]


def _check_shard(shard: object) -> SequenceShard:
    if not isinstance(shard, SequenceShard):
        raise V.bad_type("shard", f"expected a SequenceShard, got {type(shard).__name__}")
    return shard


class ShardedWindowBuilder(GraphBuilder):
    """A window kind over a sequence split by ``shard`` (from
    :meth:`WindowBuilder.sharded <heatformer.graph_ops.GraphBuilder.sharded>`).

    Its :attr:`spec` is the window's; :meth:`build` takes this rank's queries, keys and key
    mask and gives a :class:`ShardedWindowGraph`; there is no incremental decoding (a KV cache
    of a split sequence is not supported).
    """

    name = "window"
    shards = True
    incremental = False

    def __init__(self, base: WindowBuilder, shard: SequenceShard) -> None:
        if not isinstance(base, WindowBuilder):
            raise V.bad_type("graph", f"expected a window kind, got {type(base).__name__}")
        super().__init__(**base.params)
        self.base, self.shard = base, _check_shard(shard)

    def sharded(self, shard: SequenceShard) -> GraphBuilder:
        return self.base.sharded(shard)

    def build(
        self,
        q: Tensor,
        k: Tensor,
        *,
        key_mask: Tensor | None = None,
        drop_masked_queries: bool = False,
        causal: bool = False,
        row_block: int | None = None,
    ) -> Graph:
        return ShardedWindowGraph(
            q, k, shard=self.shard, window=self.base.w, causal=causal,
            num_global=min(self.base.num_global, self.shard.num_nodes), key_mask=key_mask,
            drop_masked_queries=drop_masked_queries, row_block=row_block,
        )  # fmt: skip

    def decode(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int) -> Tensor:
        raise V.bad_value(
            "graph", f"{self.spec}: a sequence split over processes has no incremental decoding"
        )

    def check_nodes(self, max_nodes: int) -> None:
        self.base.check_nodes(max_nodes)

    def edges_per_row(self, num_nodes: int, *, causal: bool = False) -> int:
        return self.base.edges_per_row(num_nodes, causal=causal)

    def saved_bytes_per_edge(self, itemsize: int) -> int:
        return self.base.saved_bytes_per_edge(itemsize)

    def cache_keep(self) -> tuple[int, int | None]:
        return self.base.cache_keep()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, {self.shard!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ShardedWindowBuilder)
            and self.spec == other.spec
            and self.shard == other.shard
        )

    def __hash__(self) -> int:
        return hash((self.spec, self.shard))


@dataclasses.dataclass(frozen=True, eq=False)
class _Layout:
    """What a sharded window graph's variants (:meth:`ShardedWindowGraph.to`, the uniform walk)
    share: the shard, the messages' plans, the ints of the window and the flat key masks."""

    shard: SequenceShard
    halo: HaloPlan
    glob: GlobalRows
    window: int
    causal: bool
    num_global: int
    drop_masked_queries: bool
    scale: float
    row_block: int | None
    batch_shape: torch.Size
    ext_mask: Tensor | None  # (Bf, ext_nodes) real keys of the extended block
    global_query_mask: Tensor | None  # (Bf, g) real global queries (dense rows only)

    @property
    def dense_global(self) -> bool:
        """Whether the global rows attend every key (bidirectional): a distributed softmax."""
        return not self.causal and self.num_global > 0


class ShardedWindowGraph(Graph):
    r"""This rank's rows of a window graph (and global tokens) over a sequence split by
    ``shard``: its products equal the rows ``start ... stop - 1`` of
    :class:`~heatformer.graph_ops.WindowGraph`'s on the whole sequence.

    Args:
        q, k: ``(..., n_local, E)`` this rank's queries and keys (``n_local =
            shard.local_nodes``).
        shard: the split (:class:`SequenceShard`).
        window, causal, num_global, drop_masked_queries, scale, row_block: as
            :class:`~heatformer.graph_ops.WindowGraph` (``window`` and ``num_global`` of the
            whole sequence).
        key_mask: bool ``(B, n_local)``, this rank's part of the key mask.

    How: the rank's **extended block** (its rows, the halo of ``w`` positions around them and
    the global positions; :class:`~heatformer.graph_ops.window.halo.HaloPlan`) is a short sequence
    whose window graph (a :class:`~heatformer.graph_ops.WindowGraph`, with the global keys in
    front when they are not next to the block) holds the block's rows exactly. Its keys are
    received once, at construction; :meth:`propagate` receives the values of the extended
    block, :meth:`propagate_transpose` sends the contributions to positions of other ranks back
    to them. Bidirectional global rows (dense rows over all ``N`` keys) are a softmax
    distributed over the ranks: the maximum and the sum of exponentials of each row are summed
    over the ranks once (a log-sum-exp per row), then every product sums each rank's
    ``(g, C)`` partial product over the ranks.

    Shape:
        ``propagate(x)``: ``x`` ``(..., n_local, C)`` -> ``(..., n_local, C)``.

    Raises:
        ValueError: a dense view (:meth:`to_dense`, top-k), naming ``graph``.
    """

    row_stochastic = True

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        *,
        shard: SequenceShard,
        window: int,
        causal: bool = False,
        num_global: int = 0,
        key_mask: Tensor | None = None,
        drop_masked_queries: bool = False,
        scale: float | None = None,
        row_block: int | None = None,
    ) -> None:
        shard = _check_shard(shard)
        batch = check_qk(q, k)
        n, total = int(q.shape[-2]), shard.num_nodes
        if n != shard.local_nodes:
            raise V.bad_value(
                "q",
                f"expected this rank's {shard.local_nodes} rows (positions {shard.start} to "
                f"{shard.stop} of {total}) in dim -2, got shape {tuple(q.shape)}",
            )
        check_window(total, window, num_global, causal, drop_masked_queries, row_block)
        w, drop = min(window, max(total, 1)), drop_masked_queries
        if key_mask is not None:
            check_key_mask(key_mask, batch, n)
        bf, e = numel(batch), q.shape[-1]
        flat_mask = flat_key_mask(key_mask, batch, n)  # (Bf, n)
        s = float(scale) if scale is not None else 1.0 / math.sqrt(e)
        halo = HaloPlan(
            total, shard.world_size, shard.rank, shard.group,
            before=w - 1 if causal else w, after=0 if causal else w, num_global=num_global,
            stats=shard.comm, device=q.device,
        )  # fmt: skip
        glob = GlobalRows(
            num_global, shard.start, shard.stop, shard.group, shard.world_size, shard.comm
        )
        qf = q.expand(*batch, n, e).reshape(bf, n, e)  # (Bf, n, E)
        kf = k.expand(*batch, n, e).reshape(bf, n, e)
        k_ext = halo.gather(kf, "keys")  # (Bf, n_ext, E)
        ext_mask = q_mask = None
        dense = not causal and num_global > 0
        if flat_mask is not None:
            with torch.no_grad():  # a mask travels as 0/1 in the keys' dtype
                as_float = flat_mask.to(q.dtype).unsqueeze(-1)  # (Bf, n, 1)
                ext_mask = halo.gather(as_float, "keys").squeeze(-1) > 0  # (Bf, n_ext)
                if dense and drop:
                    q_mask = glob.gather(as_float, "keys").squeeze(-1) > 0  # (Bf, g)
        layout = _Layout(
            shard, halo, glob, w, causal, num_global, drop, s, row_block, batch, ext_mask, q_mask
        )
        q_glob = glob.gather(qf, "queries") if dense else None  # (Bf, g, E)
        self._init(layout, qf, k_ext, q_glob)

    def _init(self, layout: _Layout, q: Tensor, k_ext: Tensor, q_glob: Tensor | None) -> None:
        """The graph of ``layout`` on this rank's queries ``q`` ``(Bf, n, E)``, the extended
        block's keys ``k_ext`` ``(Bf, n_ext, E)`` and the global rows' queries ``q_glob``."""
        self.layout = layout
        self.shard = layout.shard
        #: what this rank sent (the shard's counter, shared by every graph built on it)
        self.comm = layout.shard.comm
        self.window, self.causal, self.num_global = layout.window, layout.causal, layout.num_global
        self.q, self.k_ext, self.q_glob = q, k_ext, q_glob
        self._tensor = q
        self.rows_nonempty = layout.ext_mask is None  # a row always keeps its own key
        halo = layout.halo
        #: the window graph of the extended block: its rows offset ... offset + n_local - 1 are
        #: this rank's, whose queries are q; the other rows' (the halo's) are never read, so q
        #: is not copied into an extended block (their outputs are dropped)
        self.ext = trusted_window_graph(
            q, k_ext, window=layout.window, causal=layout.causal,
            num_global=min(layout.num_global, halo.ext_nodes), key_mask=layout.ext_mask,
            drop_masked_queries=layout.drop_masked_queries, scale=layout.scale,
            row_block=layout.row_block, q_offset=halo.offset,
        )  # fmt: skip
        self._dense: tuple[bool, Tensor, Tensor] | None = None  # (grad mode, weights, has)

    def _dense_weights(self) -> tuple[Tensor, Tensor] | None:
        """The bidirectional global rows' weights over this rank's keys ``(Bf, g, n_local)``
        and whether each row has a key ``(Bf, g)`` (None without such rows): a softmax over
        all ranks' keys, its maximum and sum of exponentials summed over the ranks (one
        all-reduce each). Made at the first product of each grad mode (every rank makes its
        first product at the same call), so that a dense view refused on some ranks before any
        product (:meth:`to`, then :meth:`to_dense`) leaves no message unanswered."""
        q_glob = self.q_glob
        if q_glob is None:
            return None
        grad = torch.is_grad_enabled()
        if self._dense is None or self._dense[0] != grad:
            self._dense = (grad, *self._make_dense_weights(q_glob))
        return self._dense[1], self._dense[2]

    def _make_dense_weights(self, q_glob: Tensor) -> tuple[Tensor, Tensor]:
        lay, halo = self.layout, self.layout.halo
        n, at, g = halo.local_nodes, halo.offset, lay.num_global
        k_loc = self.k_ext[:, at : at + n]  # (Bf, n, E)
        start = lay.shard.start
        rows = torch.arange(g, device=q_glob.device).unsqueeze(-1)  # (g, 1)
        cols = torch.arange(start, start + n, device=q_glob.device)  # (n,)
        allowed = window_allowed(
            rows, cols, window=lay.window, causal=lay.causal, num_global=g
        ).unsqueeze(0)  # (1, g, n)
        if lay.ext_mask is not None:
            allowed = allowed & lay.ext_mask[:, None, at : at + n]
            if lay.global_query_mask is not None:
                allowed = allowed & lay.global_query_mask[..., None]
        s = attention_scores(q_glob, k_loc, lay.scale)  # (Bf, g, n), float32 for half inputs
        with torch.no_grad():
            masked = s.masked_fill(~allowed, float("-inf"))
            local_max = masked.amax(-1) if n else s.new_full(s.shape[:-1], float("-inf"))  # (Bf, g)
            top = all_reduce_max(local_max, lay.shard.group, lay.shard.world_size)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        e = torch.where(allowed, torch.exp(s - top.unsqueeze(-1)), 0.0)  # (Bf, g, n)
        total = all_reduce_sum(
            e.sum(-1), lay.shard.group, lay.shard.comm, "global-stats", lay.shard.world_size
        )
        has = total > 0  # (Bf, g)
        inv = torch.where(has, 1.0 / torch.where(has, total, torch.ones_like(total)), 0.0)
        return (e * inv.unsqueeze(-1)).to(q_glob.dtype), has.detach()

    def _with_qk(self, q: Tensor, k_ext: Tensor, q_glob: Tensor | None) -> ShardedWindowGraph:
        """The same layout (plans, masks) on other queries and extended keys (no message but
        the global rows' sums)."""
        graph = object.__new__(ShardedWindowGraph)
        graph._init(self.layout, q, k_ext, q_glob)
        return graph

    # ---- protocol ------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """This rank's rows (``shard.local_nodes``)."""
        return self.layout.halo.local_nodes

    @property
    def batch_shape(self) -> torch.Size:
        return self.layout.batch_shape

    def to(self, dtype: torch.dtype) -> ShardedWindowGraph:
        if dtype == self.dtype:
            return self
        q_glob = None if self.q_glob is None else self.q_glob.to(dtype)
        return self._with_qk(self.q.to(dtype), self.k_ext.to(dtype), q_glob)

    def uniform(self, x: Tensor) -> Tensor:
        """``U x`` (see :meth:`Graph.uniform <heatformer.graph_ops.Graph.uniform>`): the
        graph of constant queries and keys, every row uniform over its allowed keys."""
        z = self.k_ext.new_zeros(*self.k_ext.shape[:-1], UNIFORM_DIM)  # (Bf, n_ext, 8)
        zq = z[:, : self.q.shape[1]]  # (Bf, n, 8)
        zg = None if self.q_glob is None else self.q_glob.new_zeros(*self.q_glob.shape[:-1], 8)
        return self._with_qk(zq, z, zg).propagate(x)

    def propagate(self, x: Tensor) -> Tensor:
        xf, unfold = fold(self._check_x(x), self.batch_shape)  # (Bf, n, C)
        halo, glob = self.layout.halo, self.layout.glob
        x_ext = halo.gather(xf, "values")  # (Bf, n_ext, C): a copy, unless no halo
        with saved_as_parts(x_ext, xf, halo.offset):  # the kernels keep xf, not the copy
            y = self.ext._propagate_rows(x_ext)  # (Bf, n, C): this rank's rows only
        dense = self._dense_weights()
        if dense is not None:  # the global rows: sums over every rank's keys
            rows = glob.scatter(dense[0] @ xf, "global")  # (Bf, own global rows, C)
            y = torch.cat([rows, y[:, glob.local_rows :]], dim=1)
        return unfold(y)

    def propagate_transpose(self, x: Tensor) -> Tensor:
        xf, unfold = fold(self._check_x(x), self.batch_shape)  # (Bf, n, C)
        halo, glob, n = self.layout.halo, self.layout.glob, self.num_nodes
        x_win = xf
        dense = self._dense_weights()
        if dense is not None:  # the global rows' out-edges are the dense part's
            x_win = torch.cat(
                [torch.zeros_like(xf[:, : glob.local_rows]), xf[:, glob.local_rows :]], 1
            )
        pad = [0, 0, halo.offset, halo.ext_nodes - halo.offset - n]
        x_ext = F.pad(x_win, pad)  # (Bf, n_ext, C)
        with saved_as_parts(x_ext, x_win, halo.offset):
            y_ext = self.ext.propagate_transpose(x_ext)  # (Bf, n_ext, C)
        y = halo.scatter(y_ext, "transpose")  # (Bf, n, C)
        if dense is not None:
            xg = glob.gather(xf, "global")  # (Bf, g, C)
            y = y + dense[0].transpose(-1, -2) @ xg
        return unfold(y)

    def out_degree(self) -> Tensor:
        halo, n = self.layout.halo, self.num_nodes
        has = self.ext.row_has_edge()[:, halo.offset : halo.offset + n]  # (Bf, n)
        dense = self._dense_weights()
        if dense is not None:
            glob = self.layout.glob
            has = torch.cat([dense[1][:, glob.first : glob.last], has[:, glob.local_rows :]], 1)
        return has.reshape(*self.batch_shape, n).to(self.dtype)

    def signal_elements(self, x: Tensor) -> int:
        """Elements of ``x`` ``(..., n_local, C)`` over the whole sequence (``N`` rows): the
        same on every rank, so size-based choices (a series' recomputed segments) agree."""
        return numel(x.shape[:-2]) * self.shard.num_nodes * int(x.shape[-1])

    def in_degree(self) -> Tensor:
        ones = torch.ones(
            *self.batch_shape, self.num_nodes, 1, dtype=self.dtype, device=self.device
        )
        return self.propagate_transpose(ones).squeeze(-1)

    def weight_rows(self, start: int, stop: int) -> Tensor:
        raise V.bad_value(
            "graph",
            "a graph over a sequence split over processes has no dense rows on one rank "
            "(to_dense, top-k, thresholding, the exact heat and PageRank methods need every "
            "key); gather q and k (SequenceShard.gather) and build the single-process graph",
        )

    def to_dense(self) -> Tensor:
        """Refused: see :meth:`weight_rows` (``ValueError`` naming ``graph``)."""
        return self.weight_rows(0, 0)
