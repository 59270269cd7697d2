r"""Graph kinds: how an attention layer turns its queries and keys into a graph.

Every kind is a :class:`~heatformer.graph_ops.kind.GraphBuilder` subclass plus one entry of
:data:`GRAPHS`, resolved from a spec string at the boundary (a config, the command line) by
:func:`resolve_graph`:

==========================  =================================================================
``"softmax"``               the dense attention graph ``P = softmax(q k^T / sqrt(E))``
                            (:class:`~heatformer.graph_ops.SoftmaxGraph`, never ``N x N``)
``"topk[k=32]"``            its ``k`` strongest keys per query, renormalized
                            (:class:`~heatformer.graph_ops.SparseGraph`, ``N k`` memory)
``"window[w=128,global=1]"``  a sliding window (causal: the ``w`` most recent keys; else a
                            band of half-width ``w``) and ``g`` global tokens
                            (:class:`~heatformer.graph_ops.WindowGraph`, ``O(N (w + g))``)
==========================  =================================================================

An entry declares what it supports (:mod:`~heatformer.graph_ops.kind`) -- causal masking, key
masks, any dense mask pattern (:attr:`GraphBuilder.takes_dense_mask`), incremental decoding
(:meth:`GraphBuilder.decode`, which the KV cache calls), which past keys decoding needs
(:meth:`GraphBuilder.cache_keep`), a sequence split over processes (:meth:`GraphBuilder.sharded`,
:func:`shard_graph`), what a graph costs in memory (:meth:`GraphBuilder.edges_per_row`,
:meth:`GraphBuilder.saved_bytes_per_edge`, which the memory preflight of ``heatformer compare``
reads) -- and code that uses a kind asks the entry, never its class. This module holds the
registry and the ``softmax`` and ``topk`` kinds; the ``window`` kind is in its folder
(:mod:`~heatformer.graph_ops.window.builder`).
A new kind, from inside the library or outside it, is one subclass and one registration,
``GRAPHS.register(MyBuilder)``, which checks it once (see ``examples/custom_graph.py``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer._torch_compat import sdpa
from heatformer.graph_ops._arrays import check_key_mask
from heatformer.graph_ops._precision import accumulation_dtype, attention_scores
from heatformer.graph_ops.kind import GraphBuilder
from heatformer.graph_ops.protocol import Graph
from heatformer.graph_ops.softmax import SoftmaxGraph
from heatformer.graph_ops.sparse import trusted_sparse_graph_from_ell
from heatformer.graph_ops.sparsify import stable_topk_indices
from heatformer.graph_ops.window.builder import WindowBuilder
from heatformer.graph_ops.window.shard import SequenceShard
from heatformer.registry import Registry

__all__ = [
    "GRAPHS",
    "SoftmaxBuilder",
    "TopkBuilder",
    "decode_allowed",
    "key_mask_view",
    "resolve_graph",
    "shard_graph",
]


def decode_allowed(n: int, positions: Tensor, past: int) -> Tensor:
    """Bool ``(n, T)``: which cached keys (at absolute ``positions``) each of ``n`` new queries
    (at ``past ... past + n - 1``) may see in causal order."""
    rows = past + torch.arange(n, device=positions.device)
    return positions <= rows.unsqueeze(-1)  # (n, T)


def key_mask_view(key_mask: Tensor | None, batch_dims: int) -> Tensor | None:
    """A ``(B, N)`` key mask as an attention mask ``(B, 1, ..., 1, N)`` broadcasting against
    ``(*batch, N, N)`` scores with ``batch_dims`` leading dims."""
    if key_mask is None:
        return None
    lead = key_mask.shape[:-1]
    return key_mask.reshape(*lead, *([1] * (batch_dims - len(lead))), 1, key_mask.shape[-1])


def _softmax_graph(
    q: Tensor,
    k: Tensor,
    key_mask: Tensor | None,
    drop_masked_queries: bool,
    causal: bool,
    row_block: int | None,
) -> SoftmaxGraph:
    if key_mask is not None and isinstance(q, Tensor) and isinstance(k, Tensor):
        try:  # the graph's batch shape (q and k that do not broadcast: SoftmaxGraph says so)
            batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        except RuntimeError:
            batch = q.shape[:-2]
        check_key_mask(key_mask, batch, q.shape[-2])
    mask = key_mask_view(key_mask, q.dim() - 2)
    if mask is not None and drop_masked_queries:
        mask = mask & mask.transpose(-1, -2)  # (B, 1, N, N)
    return SoftmaxGraph(q, k, mask=mask, causal=causal, row_block=row_block)


class SoftmaxBuilder(GraphBuilder):
    """``"softmax"``: the dense attention graph (one fused SDPA call per ``propagate``)."""

    name = "softmax"
    incremental = True
    takes_dense_mask = True

    def saved_bytes_per_edge(self, itemsize: int) -> int:
        # propagate is one fused SDPA call: it saves its output and one log-sum-exp per row,
        # never the N x N weights (counted with the layer's activations)
        return 0

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
        return _softmax_graph(q, k, key_mask, drop_masked_queries, causal, row_block)

    def decode(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int) -> Tensor:
        allowed = decode_allowed(q.shape[-2], positions, past)
        return sdpa(q, k, v, attn_mask=allowed)


class TopkBuilder(GraphBuilder):
    """``"topk[k=K]"``: the ``K`` strongest allowed keys of every query, renormalized.

    A sequence shorter than ``K`` keeps all its keys (e.g. the first steps of generation);
    configs refuse a ``K`` above their longest sequence. Decoding ranks the new queries'
    scores against the cache exactly as building the full graph does, so it equals
    recomputation.

    Args:
        k: edges per query, a positive int.
    """

    name = "topk"
    incremental = True
    #: the selection writes each sequence's kept keys into one buffer, and the graph is one
    #: CSR matrix over the batch: neither has a batching rule (PyTorch refuses, naming an
    #: in-place write)
    vmaps = False
    examples = ({"k": 3},)

    def __init__(self, k: int) -> None:
        super().__init__(k=V.check_positive_int("k", k))
        self.k = k

    def check_nodes(self, max_nodes: int) -> None:
        if self.k > max_nodes:
            raise V.bad_value(
                "graph",
                f"{self.spec}: expected k at most the {max_nodes} tokens a sequence can hold, "
                f"got {self.k}",
            )

    def edges_per_row(self, num_nodes: int, *, causal: bool = False) -> int:
        return min(self.k, num_nodes)

    def saved_bytes_per_edge(self, itemsize: int) -> int:
        # two int32 indices (the selection's, which the kept scores' backward gathers again,
        # and the CSR column), the weight, and what the softmax over the kept scores keeps
        # (its float32 output, the clamp's input and the allowed-key mask byte)
        return 4 + 4 + itemsize + 4 + itemsize + 1

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
        graph = _softmax_graph(q, k, key_mask, drop_masked_queries, causal, row_block)
        if not graph.num_nodes:  # no keys to rank (topk refuses k_top = 0): no edges
            empty = q.new_zeros(*graph.batch_shape, 0, 0)  # (..., N = 0, k = 0)
            return trusted_sparse_graph_from_ell(empty.long(), empty, row_stochastic=True)
        return graph.topk(min(self.k, graph.num_nodes), row_block=row_block)

    def decode(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int) -> Tensor:
        allowed = decode_allowed(q.shape[-2], positions, past)
        # ranked and weighed as the full graph does: scores and softmax in float32 for half
        # inputs, the weights rounded to the input dtype, their sums in float32 (as the CSR
        # product of a half-precision top-k graph)
        scores = attention_scores(q, k, 1.0 / math.sqrt(q.shape[-1]))  # (B, H, n, T)
        scores = scores.masked_fill(~allowed, float("-inf"))
        idx = stable_topk_indices(scores, min(self.k, scores.shape[-1]))  # (B, H, n, K)
        kept = scores.gather(-1, idx)
        w = torch.softmax(kept, dim=-1).masked_fill(kept == float("-inf"), 0.0).to(v.dtype)
        v_kept = v.unsqueeze(-3).expand(*idx.shape[:-1], *v.shape[-2:])  # (B, H, n, T, C)
        v_kept = v_kept.gather(-2, idx.unsqueeze(-1).expand(*idx.shape, v.shape[-1]))
        acc = accumulation_dtype(v.dtype)
        return (w.unsqueeze(-1).to(acc) * v_kept).sum(-2).to(v.dtype)  # (B, H, n, C)


#: name -> graph kind; the one place a graph spec becomes a builder
#: (:class:`~heatformer.registry.Registry`: ``GRAPHS.register(cls)`` adds one, checked).
GRAPHS: Registry[type[GraphBuilder]] = Registry(
    "graph kind", argument="graph", base=GraphBuilder, case_insensitive=True, examples=True
)
for _kind in (SoftmaxBuilder, TopkBuilder, WindowBuilder):
    GRAPHS.register(_kind)


def resolve_graph(spec: str | GraphBuilder) -> GraphBuilder:
    """Turn a graph spec (``"softmax"``, ``"topk[k=32]"``) into a builder; a builder passes.

    :meth:`GRAPHS.resolve <heatformer.registry.Registry.resolve>`.

    Raises:
        ValueError: an unknown kind (the valid names are listed, the closest suggested), bad
            syntax or parameters.
        TypeError: ``spec`` of the wrong type.

    Example:
        >>> resolve_graph("topk[k=32]")
        TopkBuilder('topk[k=32]')
        >>> resolve_graph("topk[k=32]").incremental
        True
    """
    builder: GraphBuilder = GRAPHS.resolve(spec)
    return builder


def shard_graph(graph: str | GraphBuilder, shard: SequenceShard) -> GraphBuilder:
    """``resolve_graph(graph).sharded(shard)``: the graph kind over a sequence split by
    ``shard`` (:mod:`heatformer.graph_ops.window.sharding`).

    Raises:
        ValueError: naming ``graph``, for a kind that does not shard (dense softmax, exact
            top-k) or a bad spec.
        TypeError: ``shard`` not a :class:`~heatformer.graph_ops.SequenceShard`.
    """
    return resolve_graph(graph).sharded(shard)
