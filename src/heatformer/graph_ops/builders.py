r"""Graph kinds: how an attention layer turns its queries and keys into a graph.

Every kind is a :class:`GraphBuilder` subclass plus one entry of :data:`GRAPHS`, resolved from
a spec string at the boundary (a config, the command line) by :func:`resolve_graph`:

==========================  =================================================================
``"softmax"``               the dense attention graph ``P = softmax(q k^T / sqrt(E))``
                            (:class:`~heatformer.graph_ops.SoftmaxGraph`, never ``N x N``)
``"topk[k=32]"``            its ``k`` strongest keys per query, renormalized
                            (:class:`~heatformer.graph_ops.SparseGraph`, ``N k`` memory)
``"window[w=128,global=1]"``  a sliding window (causal: the ``w`` most recent keys; else a
                            band of half-width ``w``) and ``g`` global tokens
                            (:class:`~heatformer.graph_ops.WindowGraph`, ``O(N (w + g))``)
==========================  =================================================================

An entry declares what it supports -- causal masking, key masks, any dense mask pattern
(:attr:`GraphBuilder.takes_dense_mask`), incremental decoding
(:meth:`GraphBuilder.decode`, which the KV cache calls), which past keys decoding needs
(:meth:`GraphBuilder.cache_keep`), what a graph costs in memory (:meth:`GraphBuilder.edges_per_row`,
:meth:`GraphBuilder.saved_bytes_per_edge`, which the memory preflight of ``heatformer compare``
reads) -- and code that uses a kind asks the entry, never its class.
A new kind, from inside the library or outside it, is one subclass and one registration,
``GRAPHS.register(MyBuilder)``, which checks it once (see ``examples/custom_graph.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer._spec import format_entry
from heatformer._torch_compat import sdpa
from heatformer.graph_ops._arrays import check_key_mask
from heatformer.graph_ops._precision import accumulation_dtype, attention_scores
from heatformer.graph_ops.protocol import Graph
from heatformer.graph_ops.softmax import SoftmaxGraph
from heatformer.graph_ops.sparse import trusted_sparse_graph_from_ell
from heatformer.graph_ops.sparsify import stable_topk_indices
from heatformer.graph_ops.window import check_qk
from heatformer.graph_ops.window.graph import trusted_window_graph
from heatformer.graph_ops.window.layout import window_allowed
from heatformer.registry import Registry

if TYPE_CHECKING:
    from heatformer.graph_ops.window import SequenceShard

__all__ = [
    "GRAPHS",
    "GraphBuilder",
    "SoftmaxBuilder",
    "TopkBuilder",
    "WindowBuilder",
    "decode_allowed",
    "key_mask_view",
    "resolve_graph",
]


class GraphBuilder:
    """One graph kind, with its parameters (``TopkBuilder(k=32)``).

    Subclasses set :attr:`name` and the capability flags, implement :meth:`build` and, when
    :attr:`incremental`, :meth:`decode`. Parameters are constructor keyword arguments, kept in
    :attr:`params` so that :attr:`spec` writes the kind back as a string.
    """

    #: registry name, the head of the spec (``"topk"`` in ``"topk[k=32]"``)
    name: ClassVar[str] = ""
    #: builds causal graphs (``causal=True``)
    supports_causal: ClassVar[bool] = True
    #: takes a key mask (padding)
    supports_key_mask: ClassVar[bool] = True
    #: :meth:`decode` serves KV-cache decoding, equal to recomputing the full graph
    incremental: ClassVar[bool] = False
    #: the kind is the dense attention graph ``softmax(q k^T * scale)`` itself, so it takes
    #: any boolean mask pattern as a dense ``(..., Nq, T)`` mask (sliding windows, packed
    #: sequences: what a host library passes beyond padding and causal order), built as a
    #: :class:`~heatformer.graph_ops.SoftmaxGraph` with that mask or one SDPA call with it;
    #: other kinds take key masks and causal order only
    takes_dense_mask: ClassVar[bool] = False
    #: the kind can split a sequence over processes (:meth:`sharded`)
    shards: ClassVar[bool] = False
    #: its graphs run under :func:`torch.func.vmap` (per-sample gradients, ``vmap(grad(f))``);
    #: every kind runs under the other :mod:`torch.func` transforms (``grad``, ``vjp``,
    #: ``jacrev``; ``jvp`` in SDPA's math backend)
    vmaps: ClassVar[bool] = True
    #: parameter sets worth testing, the defaults first (the combination matrix runs them)
    examples: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = params

    @property
    def spec(self) -> str:
        """The kind as a spec string, e.g. ``"topk[k=32]"`` (parsed back by
        :func:`resolve_graph`)."""
        return format_entry(self.name, self.params, sep=",")

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
        """The graph of queries ``q`` and keys ``k`` (``(..., N, E)`` each).

        Args:
            q, k: queries and keys, batch dims usually ``(B, H)``.
            key_mask: bool ``(B, N)`` (leading batch dims of ``q``), ``True`` = a real key;
                refused (``ValueError`` naming it) when it does not fit ``q``. A NaN in a
                masked key still reaches real rows, as in SDPA: zero padded keys first.
            drop_masked_queries: padded queries lose their out-edges too (for operators that
                read ``W^T``, so that padding cannot reach real tokens through it).
            causal: forbid attending to later positions.
            row_block: query rows per block in chunked work (None: the default slab).
        """
        raise NotImplementedError  # pragma: no cover - every kind defines it

    def decode(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int) -> Tensor:
        """``P v`` for new queries of a causal sequence, from the cached keys and values.

        Args:
            q: ``(B, H, n, E)`` queries at positions ``past ... past + n - 1``.
            k, v: ``(B, H, T, E)``, ``(B, H, T, C)``: the cached keys and values, the new
                tokens' included.
            positions: ``(T,)`` absolute position of every cached key (the cache keeps what
                :meth:`cache_keep` asks for).
            past: tokens before the new ones.

        Returns:
            ``(B, H, n, C)``: rows ``past ... past + n - 1`` of ``P v`` for the full sequence.
        """
        raise NotImplementedError(f"graph kind {self.name!r} has no incremental decoding")

    def sharded(self, shard: SequenceShard) -> GraphBuilder:
        """This kind over a sequence split by ``shard``
        (:class:`~heatformer.graph_ops.SequenceShard`): its :meth:`build` takes this
        rank's ``q``, ``k`` ``(..., n_local, E)`` and key mask ``(B, n_local)`` and gives a
        graph over this rank's ``n_local`` rows (``propagate(x_local) -> (..., n_local, C)``,
        :meth:`~heatformer.graph_ops.Graph.propagate_transpose` and the degrees over the
        local rows; the messages happen inside), equal to those rows of the single-process
        graph (:mod:`heatformer.graph_ops.window.sharding`).

        Raises:
            ValueError: naming ``graph``, for a kind that does not shard (:attr:`shards` is
                False; the default): dense softmax and exact global top-k need every key.
        """
        raise V.bad_value(
            "graph",
            f"{self.spec!r} cannot split a sequence over processes: every query of this kind "
            f"may need every key (dense softmax, exact global top-k); a window kind shards, "
            f"e.g. 'window[w=128,global=1]'",
        )

    def cache_keep(self) -> tuple[int, int | None]:
        """``(first, last)``: decoding needs the first ``first`` tokens and the last ``last``
        (None: all of them)."""
        return 0, None

    def check_nodes(self, max_nodes: int) -> None:
        """Refuse parameters that no graph of at most ``max_nodes`` nodes can honour (a config
        calls this with its longest sequence)."""

    def edges_per_row(self, num_nodes: int, *, causal: bool = False) -> int:
        """The most edges (allowed keys) one query row has in a graph of ``num_nodes`` nodes.

        The default is every key (a dense graph); sparse kinds say how many they keep.

        Example:
            >>> resolve_graph("window[w=4,global=1]").edges_per_row(100, causal=True)
            5
        """
        return num_nodes

    def saved_bytes_per_edge(self, itemsize: int) -> int:
        """Bytes a graph of this kind keeps per edge for the backward pass, for values of
        ``itemsize`` bytes (4: float32).

        The default is a weight and an int64 key index per edge (an explicit edge list);
        a kind that recomputes its edges in backward (the fused SDPA path) says 0. Memory
        estimates multiply this by :meth:`edges_per_row`, the rows and the heads.
        """
        return itemsize + 8

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GraphBuilder) and self.spec == other.spec

    def __hash__(self) -> int:
        return hash(self.spec)


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
        from heatformer.graph_ops.window.sharding import ShardedWindowBuilder

        return ShardedWindowBuilder(self, shard)


#: name -> graph kind; the one place strings become graph builders.
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
