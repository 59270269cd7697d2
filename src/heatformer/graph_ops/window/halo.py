r"""The communication of a sequence split over processes: halo exchanges and global rows.

A sequence of ``N`` positions is split over the ``P`` processes of a group into contiguous
blocks (:func:`block_bounds`). A window graph's rows on one rank read the keys and values of a
few positions held by other ranks: the **halo** (the ``w`` positions before the block, and
after it when bidirectional; a block shorter than ``w`` takes its halo from several ranks) and
the ``g`` **global** positions. Every rank can compute from the block bounds which of its rows
every other rank wants, so an exchange needs no handshake:

- :class:`HaloPlan`: the positions a rank reads, in order (its *extended* block, a few
  intervals), and per pair of ranks the overlap of one's wanted intervals with the other's
  block; :meth:`HaloPlan.gather` assembles the extended block from point-to-point messages
  (``isend``/``irecv``, which gloo and nccl both have in torch 2.5 and 2.13; gloo has no
  ``all_to_all`` with uneven splits), and :meth:`HaloPlan.scatter` is its adjoint: the
  contributions to the extended block sent back to the owners of the positions and summed
  there (what ``W^T x`` needs).
- :class:`GlobalRows`: the ``g`` global rows as one ``(Bf, g, F)`` tensor on every rank
  (:meth:`GlobalRows.gather`, a sum over ranks of zero-padded pieces) and its adjoint, a sum
  over ranks delivered to the owners (:meth:`GlobalRows.scatter`): ``O(g F)`` per rank.

Both directions are differentiable (autograd functions whose backward is the adjoint message),
so gradients reach the owners of halo and global positions. Every rank must call the same
exchanges in the same order: the graph code never branches on a rank's own sizes around a
message (an empty block still takes part, with empty tensors), and autograd runs the backward
nodes in the reverse order of their creation, which is then the same on every rank.

Every byte a rank sends is counted in a :class:`CommStats` (payload bytes; an all-reduce counts
its input once, whatever the backend's algorithm sends).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = [
    "CommStats",
    "GlobalRows",
    "HaloPlan",
    "all_reduce_sum",
    "block_bounds",
    "saved_as_parts",
]

Interval = tuple[int, int]


def block_bounds(num_nodes: int, world_size: int, rank: int) -> Interval:
    """``[start, stop)`` of ``rank``'s block: contiguous blocks in rank order, the first
    ``num_nodes % world_size`` ranks hold one position more (unchecked)."""
    base, extra = divmod(num_nodes, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclasses.dataclass
class CommStats:
    """What one rank sent: payload bytes and messages, and bytes per kind of message.

    Attributes:
        sent_bytes: bytes this rank sent (point-to-point payloads, and the input of each
            all-reduce once).
        messages: messages (sends and all-reduces).
        by_kind: bytes per kind: ``"keys"``, ``"values"``, ``"values-grad"``,
            ``"transpose"``, ``"global"``, ... (a ``-grad`` suffix: sent by a backward pass).
    """

    sent_bytes: int = 0
    messages: int = 0
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, kind: str, nbytes: int) -> None:
        """Count one message of ``nbytes`` of kind ``kind``."""
        self.sent_bytes += nbytes
        self.messages += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + nbytes

    def reset(self) -> None:
        """Start counting again from zero."""
        self.sent_bytes, self.messages = 0, 0
        self.by_kind.clear()


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


# ---- differentiable messages ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Messages:
    """Who sends how many rows to whom (group ranks; ``peers`` maps them to global ranks)."""

    group: Any
    rank: int
    peers: tuple[int, ...]
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    stats: CommStats
    kind: str

    def reversed(self) -> _Messages:
        """The adjoint messages: every count the other way, the kind suffixed ``-grad``
        unless it already is."""
        kind = self.kind[: -len("-grad")] if self.kind.endswith("-grad") else self.kind + "-grad"
        return dataclasses.replace(
            self, send_counts=self.recv_counts, recv_counts=self.send_counts, kind=kind
        )

    def run(self, t: Tensor) -> Tensor:
        """Send rows of ``t`` ``(Bf, sum(send_counts), F)`` (grouped by destination in rank
        order) and return the rows received, ``(Bf, sum(recv_counts), F)`` (grouped by source
        in rank order)."""
        bf, width = t.shape[0], t.shape[2]
        works, outs, keep = [], [], []
        for p, count in enumerate(self.recv_counts):
            if count and p != self.rank:
                buf = t.new_empty(bf, count, width)
                works.append(dist.irecv(buf, self.peers[p], group=self.group))
                outs.append(buf)
        offset = 0
        for p, count in enumerate(self.send_counts):
            if count and p != self.rank:
                chunk = t[:, offset : offset + count].contiguous()  # (Bf, count, F)
                keep.append(chunk)
                works.append(dist.isend(chunk, self.peers[p], group=self.group))
                self.stats.add(self.kind, _nbytes(chunk))
            offset += count
        for work in works:
            if work is not None:  # None: this process is not in the group (never here)
                work.wait()
        if not outs:
            return t.new_empty(bf, 0, width)
        return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


class _AllReduceSum(torch.autograd.Function):
    """The sum over the group, on every rank; its backward is the sum of the gradients."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, group: Any, stats: CommStats, kind: str) -> Tensor:
        ctx.group, ctx.stats, ctx.kind = group, stats, kind
        out = t.clone(memory_format=torch.contiguous_format)
        stats.add(kind, _nbytes(out))
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        out = grad.clone(memory_format=torch.contiguous_format)
        ctx.stats.add(ctx.kind + "-grad", _nbytes(out))
        dist.all_reduce(out, group=ctx.group)
        return out, None, None, None


def all_reduce_sum(t: Tensor, group: Any, stats: CommStats, kind: str, world_size: int) -> Tensor:
    """The differentiable sum of ``t`` over the ``world_size`` ranks of ``group`` (counted in
    ``stats``); ``t`` itself for one rank (no process group needed)."""
    if world_size == 1:
        return t
    out: Tensor = _AllReduceSum.apply(t, group, stats, kind)
    return out


def all_reduce_max(t: Tensor, group: Any, world_size: int) -> Tensor:
    """The element-wise maximum over the group (not differentiable: a stabilizing shift)."""
    out = t.detach().clone(memory_format=torch.contiguous_format)
    if world_size > 1:
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out


def global_ranks(group: Any, world_size: int) -> tuple[int, ...]:
    """The global rank of each rank of ``group`` (point-to-point calls take global ranks)."""
    if group is None or group is dist.group.WORLD:
        return tuple(range(world_size))
    return tuple(dist.get_global_rank(group, r) for r in range(world_size))


# ---- the plans --------------------------------------------------------------------------------


def _intersect(intervals: list[Interval], lo: int, hi: int) -> list[Interval]:
    """The parts of sorted disjoint ``intervals`` inside ``[lo, hi)``, in order."""
    out = [(max(a, lo), min(b, hi)) for a, b in intervals]
    return [(a, b) for a, b in out if a < b]


def _length(intervals: list[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def wanted(
    num_nodes: int, world_size: int, rank: int, *, before: int, after: int, num_global: int
) -> list[Interval]:
    """The positions ``rank`` reads, as sorted disjoint intervals: its block, ``before``
    positions before it and ``after`` after it (inside ``[0, N)``), and the global positions
    ``[0, g)``; nothing for an empty block. Where the halo reaches the global positions the
    two merge into ``[0, stop + after)``."""
    start, stop = block_bounds(num_nodes, world_size, rank)
    if start == stop:
        return []
    lo, hi = max(start - before, 0), min(stop + after, num_nodes)
    if num_global and lo > num_global:
        return [(0, num_global), (lo, hi)]
    return [(0 if num_global else lo, hi)]


class HaloPlan:
    """Which positions each rank reads from which other rank, for one layout of a sequence.

    Args:
        num_nodes, world_size, rank: the sequence and this rank (a group rank).
        group: the process group (None: the default one).
        before, after: halo sizes (positions before and after a block).
        num_global: the global positions ``[0, g)`` every non-empty block reads.
        stats: where the bytes sent are counted.

    Attributes:
        intervals: this rank's wanted positions (:func:`wanted`), the extended block.
        local_nodes: rows of this rank's block.
        ext_nodes: positions of the extended block.
        offset: index of the block's first row in the extended block.
        send_index: ``(sum of sends,)`` rows of the block sent to each other rank, in rank order.
    """

    def __init__(
        self,
        num_nodes: int,
        world_size: int,
        rank: int,
        group: Any,
        *,
        before: int,
        after: int,
        num_global: int,
        stats: CommStats,
        device: torch.device,
    ) -> None:
        def want(r: int) -> list[Interval]:
            return wanted(
                num_nodes, world_size, r, before=before, after=after, num_global=num_global
            )

        start, stop = block_bounds(num_nodes, world_size, rank)
        mine = want(rank)
        self.intervals = mine
        self.local_nodes = stop - start
        self.ext_nodes = _length(mine)
        self.offset = _length(_intersect(mine, 0, start))
        recv = [0] * world_size
        send = [0] * world_size
        index: list[Tensor] = []
        for p in range(world_size):
            if p == rank:
                continue
            lo, hi = block_bounds(num_nodes, world_size, p)
            recv[p] = _length(_intersect(mine, lo, hi))
            pieces = _intersect(want(p), start, stop)
            send[p] = _length(pieces)
            index += [torch.arange(a - start, b - start, device=device) for a, b in pieces]
        self.send_index = (
            torch.cat(index) if index else torch.zeros(0, dtype=torch.long, device=device)
        )
        self.messages = _Messages(
            group, rank, global_ranks(group, world_size), tuple(send), tuple(recv), stats, ""
        )

    def _gather(self, x: Tensor, kind: str) -> Tensor:
        """:meth:`gather` without autograd."""
        messages = dataclasses.replace(self.messages, kind=kind)
        received = messages.run(x.index_select(1, self.send_index))  # (Bf, R, F), by source
        if self.ext_nodes == self.local_nodes:  # no halo (one rank, or the first when causal)
            return x
        at = self.offset
        return torch.cat([received[:, :at], x, received[:, at:]], dim=1)

    def _scatter(self, y: Tensor, kind: str) -> Tensor:
        """:meth:`scatter` without autograd."""
        n, at = self.local_nodes, self.offset
        remote = torch.cat([y[:, :at], y[:, at + n :]], dim=1)  # (Bf, R, F), by source rank
        messages = dataclasses.replace(self.messages.reversed(), kind=kind)
        back = messages.run(remote)  # (Bf, sum of sends, F), by destination
        if not back.shape[1]:  # nothing sent, nothing comes back: the block's rows, no copy
            return y[:, at : at + n]
        return y[:, at : at + n].index_add(1, self.send_index, back)

    def gather(self, x: Tensor, kind: str) -> Tensor:
        """The extended block ``(Bf, ext_nodes, F)`` of the block ``x`` ``(Bf, local_nodes,
        F)``: the other ranks' rows received, this rank's in place (a copy, unless nothing is
        received). Differentiable: the backward sends the halo rows' gradients back to their
        owners (:meth:`scatter`); one autograd node, whose backward every rank runs."""
        out: Tensor = _Gather.apply(x, self, kind)
        return out

    def scatter(self, y: Tensor, kind: str) -> Tensor:
        """The adjoint of :meth:`gather`: contributions ``y`` ``(Bf, ext_nodes, F)`` to the
        extended block, summed onto the owners' rows -> ``(Bf, local_nodes, F)``
        (differentiable: its backward is :meth:`gather`)."""
        out: Tensor = _Scatter.apply(y, self, kind)
        return out


class _Gather(torch.autograd.Function):
    """:meth:`HaloPlan.gather`, with :meth:`HaloPlan.scatter` of the gradient as backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, plan: HaloPlan, kind: str) -> Tensor:
        ctx.plan, ctx.kind = plan, kind
        out = plan._gather(x, kind)
        return out.view_as(out) if out is x else out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return ctx.plan._scatter(grad, ctx.kind + "-grad"), None, None


class _Scatter(torch.autograd.Function):
    """:meth:`HaloPlan.scatter`, with :meth:`HaloPlan.gather` of the gradient as backward."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, plan: HaloPlan, kind: str) -> Tensor:
        ctx.plan, ctx.kind = plan, kind
        return plan._scatter(y, kind)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return ctx.plan._gather(grad.contiguous(), ctx.kind + "-grad"), None, None


class GlobalRows:
    """The global positions ``[0, g)`` of a split sequence, on every rank.

    Attributes:
        num_global: ``g``.
        first, last: this rank's global rows are ``[first, last)`` (absolute), its block's
            rows ``0 ... last - first - 1``.
    """

    def __init__(
        self, num_global: int, start: int, stop: int, group: Any, world_size: int, stats: CommStats
    ) -> None:
        self.num_global = num_global
        self.first, self.last = min(start, num_global), min(stop, num_global)
        self.group, self.world_size, self.stats = group, world_size, stats

    @property
    def local_rows(self) -> int:
        """How many of this rank's rows are global rows."""
        return self.last - self.first

    def gather(self, x: Tensor, kind: str) -> Tensor:
        """``(Bf, g, F)``: the global rows of the sequence whose block ``x`` ``(Bf, n, F)`` this
        rank holds (a differentiable sum over ranks of zero-padded pieces)."""
        pad = [0, 0] * (x.dim() - 2) + [self.first, self.num_global - self.last]
        piece = F.pad(x[:, : self.local_rows], pad)  # (Bf, g, F)
        return all_reduce_sum(piece, self.group, self.stats, kind, self.world_size)

    def scatter(self, parts: Tensor, kind: str) -> Tensor:
        """The adjoint of :meth:`gather`: every rank's contributions ``parts`` ``(Bf, g, F)``
        summed, this rank's global rows of the sum ``(Bf, last - first, F)``."""
        total = all_reduce_sum(parts, self.group, self.stats, kind, self.world_size)
        return total[:, self.first : self.last]


# ---- what a product keeps of its extended block ------------------------------------------------


@contextlib.contextmanager
def saved_as_parts(ext: Tensor, block: Tensor, offset: int) -> Iterator[None]:
    """Within this scope, autograd keeps a tensor saved for the backward that views ``ext``
    ``(Bf, n_ext, F)`` as its parts: the rows before ``offset`` and after ``offset + n`` (a
    copy, ``O(halo)`` rows) and ``block`` ``(Bf, n, F)``, which holds the same values as
    ``ext[:, offset : offset + n]``; the backward rebuilds the view from them.

    Why: on a rank that receives a halo, each product's input is a fresh copy of the extended
    block (the received rows around the block), and the window kernels save their input for
    the backward. The block itself is the previous product's output (saved by that product's
    kernel) or the caller's signal, so keeping the copy too would hold every term of a series
    twice. A ``block`` modified in place after the product raises at the backward, as autograd
    does for a saved tensor.
    """
    if ext.untyped_storage().data_ptr() == block.untyped_storage().data_ptr():
        yield  # no halo: the product saves the block itself
        return
    storage, n = ext.untyped_storage().data_ptr(), int(block.shape[1])
    version = block._version
    # the halo rows (O(w)); the hooks live as long as what they saved, so they must not hold
    # ext itself
    before, after = ext[:, :offset].detach().clone(), ext[:, offset + n :].detach().clone()

    def pack(t: Tensor) -> Any:
        if t.untyped_storage().data_ptr() != storage:
            return t
        return (t.size(), t.stride(), t.storage_offset())

    def unpack(packed: Any) -> Tensor:
        if isinstance(packed, Tensor):
            return packed
        size, stride, storage_offset = packed
        if block._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                "inplace operation: the signal of a product on a sequence split over processes"
            )
        whole = torch.cat([before, block, after], dim=1)  # (Bf, n_ext, F), as ext was
        return whole.as_strided(size, stride, storage_offset)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
