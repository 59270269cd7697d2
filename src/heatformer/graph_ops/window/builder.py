"""The window graph kind for layers: ``"window[w=W,global=G]"``, :class:`WindowBuilder`.

It builds window graphs (:class:`~heatformer.graph_ops.WindowGraph`) after checking a layer's
arguments once (:func:`~heatformer.graph_ops.window.graph.trusted_window_graph`), decodes with
a rolling KV cache, and splits a sequence over processes
(:class:`~heatformer.graph_ops.window.sharding.ShardedWindowBuilder`). It is registered in
:data:`~heatformer.graph_ops.GRAPHS` with the other kinds (:mod:`~heatformer.graph_ops.builders`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer._torch_compat import sdpa
from heatformer.graph_ops._arrays import check_key_mask
from heatformer.graph_ops.kind import GraphBuilder
from heatformer.graph_ops.protocol import Graph
from heatformer.graph_ops.window.graph import check_qk, trusted_window_graph
from heatformer.graph_ops.window.layout import window_allowed
from heatformer.graph_ops.window.shard import SequenceShard

__all__ = ["WindowBuilder"]


class WindowBuilder(GraphBuilder):
    """``"window[w=W,global=G]"``: a sliding window of ``W`` keys (causal) or a band of
    half-width ``W`` (bidirectional), plus ``G`` global tokens (default 0).

    Built in ``O(N (min(W, N) + G))`` (:class:`~heatformer.graph_ops.WindowGraph`: a window
    past the sequence is the full graph, at its cost). Decoding keeps the first ``G`` and the
    last ``W`` tokens' keys (a rolling cache) and equals recomputation.

    Args:
        w: the window, a positive int.
        num_global: global tokens, an int >= 0 (``global=`` in a spec).
    """

    name = "window"
    incremental = True
    shards = True
    examples = ({"w": 3}, {"w": 2, "global": 2})
    #: spec names that are not Python identifiers -> constructor arguments
    spec_aliases: ClassVar[dict[str, str]] = {"global": "num_global"}

    def __init__(self, w: int, num_global: int = 0) -> None:
        V.check_positive_int("w", w)
        if isinstance(num_global, bool) or not isinstance(num_global, int) or num_global < 0:
            raise V.bad_value("global", f"expected an int >= 0, got {num_global!r}")
        params: dict[str, Any] = {"w": w} if not num_global else {"w": w, "global": num_global}
        super().__init__(**params)
        self.w, self.num_global = w, num_global

    def check_nodes(self, max_nodes: int) -> None:
        if self.num_global > max_nodes:
            raise V.bad_value(
                "graph",
                f"{self.spec}: expected at most the {max_nodes} tokens a sequence can hold as "
                f"global tokens, got {self.num_global}",
            )

    def edges_per_row(self, num_nodes: int, *, causal: bool = False) -> int:
        band = self.w if causal else 2 * self.w + 1  # the w most recent keys, or a band
        return min(band + self.num_global, num_nodes)

    def saved_bytes_per_edge(self, itemsize: int) -> int:
        return itemsize  # weights in a band; the keys' positions follow from the row

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
        # checked here once: w and num_global when the builder was made, the call's arguments
        # now; the graph is made without the public constructor's checks
        batch = check_qk(q, k)
        if key_mask is not None:
            check_key_mask(key_mask, batch, q.shape[-2])
        V.check_bool("causal", causal)
        V.check_bool("drop_masked_queries", drop_masked_queries)
        V.check_positive_int("row_block", row_block, optional=True)
        return trusted_window_graph(
            q, k, window=self.w, causal=causal, num_global=min(self.num_global, q.shape[-2]),
            key_mask=key_mask, drop_masked_queries=drop_masked_queries, row_block=row_block,
        )  # fmt: skip

    def decode(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int) -> Tensor:
        rows = (past + torch.arange(q.shape[-2], device=q.device)).unsqueeze(-1)  # (n, 1)
        allowed = window_allowed(
            rows, positions, window=self.w, causal=True, num_global=self.num_global
        )
        return sdpa(q, k, v, attn_mask=allowed)

    def cache_keep(self) -> tuple[int, int | None]:
        return self.num_global, self.w

    def sharded(self, shard: SequenceShard) -> GraphBuilder:
        """The window over a sequence split by ``shard``: a
        :class:`~heatformer.graph_ops.window.sharding.ShardedWindowBuilder` (the same :attr:`spec`;
        halo and global rows exchanged inside the products; no incremental decoding)."""
        # imported here: the sharded kind builds on this one (it wraps a WindowBuilder)
        from heatformer.graph_ops.window.sharding import ShardedWindowBuilder

        return ShardedWindowBuilder(self, shard)
