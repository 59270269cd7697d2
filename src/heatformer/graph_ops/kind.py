r"""What a graph kind is: :class:`GraphBuilder`, the class every kind subclasses.

A graph kind turns an attention layer's queries and keys into a graph
(:meth:`~GraphBuilder.build`) and declares what it supports and costs, so that code using a
kind asks it, never tests its class: causal masking, key masks, any dense mask pattern
(:attr:`~GraphBuilder.takes_dense_mask`), incremental decoding (:meth:`~GraphBuilder.decode`),
a sequence split over processes (:meth:`~GraphBuilder.sharded`), the edges and bytes of a
graph. The kinds themselves and their registry, :data:`~heatformer.graph_ops.builders.GRAPHS`,
are in :mod:`~heatformer.graph_ops.builders` (``softmax``, ``topk``) and
:mod:`~heatformer.graph_ops.window.builder` (``window``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from heatformer import checks as V
from heatformer._spec import format_entry
from heatformer.graph_ops.protocol import Graph

if TYPE_CHECKING:
    from heatformer.graph_ops.window.shard import SequenceShard

__all__ = ["GraphBuilder"]


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
        :func:`~heatformer.graph_ops.builders.resolve_graph`)."""
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
            >>> from heatformer.graph_ops import resolve_graph
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
