"""This process's block of a sequence split over a :mod:`torch.distributed` group.

:class:`SequenceShard` says which contiguous block of positions a rank holds (the first
``N % P`` ranks one more), takes it from a full tensor, and gathers the full tensor back
(differentiably). The graphs over such a block are in :mod:`heatformer.graph_ops.window.sharding`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops.window.halo import CommStats, all_reduce_sum, block_bounds

__all__ = ["SequenceShard"]


def _check_count(name: str, value: object, minimum: int) -> int:
    return V.check_int(name, value, minimum=minimum)


@dataclasses.dataclass(frozen=True)
class SequenceShard:
    """This process's contiguous block of a sequence of ``num_nodes`` tokens split over a
    process group.

    Blocks are contiguous and in rank order; the first ``num_nodes % world_size`` ranks hold
    one row more (:meth:`bounds_of`). A block may be empty (``N < P``) or shorter than a window.

    Attributes:
        num_nodes: ``N`` of the whole sequence.
        rank: index of this process in ``group``.
        world_size: ``P``.
        group: a :mod:`torch.distributed` process group; None = the default group.
        comm: what this rank sent in the products of graphs built on this shard
            (:class:`~heatformer.graph_ops.window.halo.CommStats`: bytes, messages, bytes per kind);
            not part of equality.

    Example:
        >>> import torch
        >>> shard = SequenceShard(num_nodes=10, rank=1, world_size=3)
        >>> shard.start, shard.stop, shard.local_nodes
        (4, 7, 3)
        >>> [SequenceShard.bounds_of(10, 3, r) for r in range(3)]
        [(0, 4), (4, 7), (7, 10)]
        >>> shard.take(torch.arange(10.).unsqueeze(-1)).squeeze(-1)
        tensor([4., 5., 6.])
    """

    num_nodes: int
    rank: int
    world_size: int
    group: Any = None
    comm: CommStats = dataclasses.field(default_factory=CommStats, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_count("num_nodes", self.num_nodes, 0)
        _check_count("world_size", self.world_size, 1)
        _check_count("rank", self.rank, 0)
        if self.rank >= self.world_size:
            raise V.bad_value(
                "rank", f"expected a rank below world_size = {self.world_size}, got {self.rank}"
            )

    @staticmethod
    def bounds_of(num_nodes: int, world_size: int, rank: int) -> tuple[int, int]:
        """``[start, stop)`` of ``rank``: contiguous blocks, the first ``num_nodes %
        world_size`` ranks hold one row more (shards may be empty when ``N < P``, and may be
        shorter than the window).

        Raises:
            ValueError: a negative ``num_nodes``, ``world_size < 1`` or ``rank`` outside
                ``[0, world_size)``, naming it.
        """
        _check_count("num_nodes", num_nodes, 0)
        _check_count("world_size", world_size, 1)
        _check_count("rank", rank, 0)
        if rank >= world_size:
            raise V.bad_value(
                "rank", f"expected a rank below world_size = {world_size}, got {rank}"
            )
        return block_bounds(num_nodes, world_size, rank)

    @property
    def start(self) -> int:
        """First position of this rank's block."""
        return block_bounds(self.num_nodes, self.world_size, self.rank)[0]

    @property
    def stop(self) -> int:
        """One past the last position of this rank's block."""
        return block_bounds(self.num_nodes, self.world_size, self.rank)[1]

    @property
    def local_nodes(self) -> int:
        """Rows of this rank's block, ``stop - start``."""
        start, stop = block_bounds(self.num_nodes, self.world_size, self.rank)
        return stop - start

    @classmethod
    def current(cls, num_nodes: int, group: Any = None) -> SequenceShard:
        """This process's block, from :mod:`torch.distributed`'s rank and world size in
        ``group``.

        Raises:
            ValueError: naming ``group``, when :mod:`torch.distributed` is not available or
                not initialized (``torch.distributed.init_process_group``, or ``torchrun``).
        """
        if not (dist.is_available() and dist.is_initialized()):
            raise V.bad_value(
                "group",
                "expected an initialized torch.distributed process group "
                "(init_process_group, or a launch by torchrun), got none",
            )
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise V.bad_value("group", "expected a process group this process belongs to")
        return cls(num_nodes, rank, size, group)

    def _check_rows(self, x: object, dim: int, rows: int, what: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise V.bad_type("x", f"expected a tensor, got {type(x).__name__}")
        if not -x.dim() <= dim < x.dim():
            raise V.bad_value("dim", f"expected a dim of a {x.dim()}-d tensor, got {dim}")
        if x.shape[dim] != rows:
            raise V.bad_value(
                "x", f"expected {rows} rows ({what}) in dim {dim}, got shape {tuple(x.shape)}"
            )
        return x

    def take(self, x: Tensor, dim: int = -2) -> Tensor:
        """This rank's rows of a full tensor (``x.narrow(dim, start, local_nodes)``, a view)."""
        x = self._check_rows(x, dim, self.num_nodes, "the whole sequence")
        return x.narrow(dim, self.start, self.local_nodes)

    def gather(self, x_local: Tensor, dim: int = -2) -> Tensor:
        """The full tensor from every rank's rows, differentiable: the backward returns each
        rank its rows' gradient, summed over ranks. A sum over ranks of zero-padded copies
        (``O(N)`` per rank): for tests, logits and metrics, not for the hot path."""
        x_local = self._check_rows(x_local, dim, self.local_nodes, "this rank's block")
        d = dim % x_local.dim()
        pad = [0, 0] * (x_local.dim() - 1 - d) + [self.start, self.num_nodes - self.stop]
        return all_reduce_sum(F.pad(x_local, pad), self.group, self.comm, "gather", self.world_size)
