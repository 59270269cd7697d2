"""Device selection and data-parallel (DDP) set-up for the experiment runner.

Under ``torchrun`` (``WORLD_SIZE > 1`` in the environment) the runner joins a process
group: ``nccl`` when the processes use CUDA, ``gloo`` on the CPU. Every rank draws the
same *global* batch from the same seeded generator and keeps its own slice of
``batch_size / world_size`` examples, so the optimization is that of one process with
the full batch (DDP averages the gradients of the equal slices). Rank 0 alone writes
files and shows progress; the others wait at barriers. The run folder must be visible
to every rank (one machine, or a shared file system).

With sequence parallelism (``--sequence-parallel P``) the world splits into groups of ``P``
consecutive ranks: each group trains on one data-parallel slice of the global batch, and each
rank of a group holds a contiguous block of every sequence of it
(:class:`~heatformer.graph_ops.SequenceShard`); the ``world_size / P`` groups are the
data-parallel replicas. Parameters are replicated, so each rank's gradient is its tokens'
share: :meth:`DistContext.reduce_gradients` sums the gradients over the sequence group and
averages them over the replicas in one all-reduce over the world (instead of torch's DDP
wrapper, whose reducer would average over every rank and run during the sharded backward).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from heatformer.checks import bad_value, check_positive_int
from heatformer.graph_ops import SequenceShard

__all__ = ["DistContext", "resolve_device", "setup_distributed"]


@dataclass(frozen=True)
class DistContext:
    """Where this process runs and its place in the process group.

    Attributes:
        rank: global rank (0 without DDP).
        world_size: number of processes (1 without DDP).
        local_rank: rank on this machine (selects the CUDA device).
        device: the device this process computes on.
        owns_group: the process group was created by :func:`setup_distributed` (and
            is destroyed by :meth:`close`).
        sequence_parallel: ``P``, ranks that split every sequence (1: none); the world holds
            ``world_size / P`` data-parallel replicas of ``P`` consecutive ranks.
        sequence_group: the process group of this rank's ``P`` ranks (None when ``P = 1``).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False
    sequence_parallel: int = 1
    sequence_group: Any = None

    @property
    def data_rank(self) -> int:
        """Index of this rank's data-parallel replica (its slice of the global batch)."""
        return self.rank // self.sequence_parallel

    @property
    def data_world_size(self) -> int:
        """Number of data-parallel replicas (``world_size / sequence_parallel``)."""
        return self.world_size // self.sequence_parallel

    def shard(self, num_nodes: int) -> SequenceShard | None:
        """This rank's block of a sequence of ``num_nodes`` tokens (None without sequence
        parallelism)."""
        if self.sequence_parallel == 1:
            return None
        rank = self.rank % self.sequence_parallel
        return SequenceShard(num_nodes, rank, self.sequence_parallel, self.sequence_group)

    def reduce_gradients(self, model: nn.Module) -> None:
        """Sum the parameter gradients over the sequence group and average them over the
        data-parallel replicas: one all-reduce over the world of every gradient, flattened
        (a parameter without a gradient counts as zeros). A no-op without sequence
        parallelism (DDP reduces the gradients then)."""
        if self.sequence_parallel == 1:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # (total,)
        dist.all_reduce(flat)
        flat /= self.data_world_size
        for p, piece in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad = piece.view_as(p)

    @property
    def is_main(self) -> bool:
        """Whether this process writes files and shows progress (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait for every rank (no-op without DDP)."""
        if self.distributed:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (every rank gets the same answer, so every rank
        can take the same branch; ``flag`` itself without DDP)."""
        if not self.distributed:
            return flag
        box = torch.tensor(float(flag), device=self.device)
        dist.all_reduce(box)
        return bool(box > 0)

    def close(self) -> None:
        """Destroy the process group if this context created it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """Turn ``--device`` into a device.

    Args:
        name: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"`` or
            ``"cuda:N"``.
        local_rank: under DDP, the CUDA device index used for ``"auto"``/``"cuda"``.

    Returns:
        The device.

    Raises:
        ValueError: CUDA requested but not available, or an unknown name.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise bad_value(
                "device",
                f"{name!r} requested but CUDA is not available; use --device cpu",
            )
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    raise bad_value("device", f"expected 'auto', 'cpu' or 'cuda[:N]', got {name!r}")


def setup_distributed(
    device: str = "auto", *, sequence_parallel: int = 1, timeout_s: float | None = None
) -> DistContext:
    """Join the ``torchrun`` process group if there is one, and pick the device.

    Args:
        device: the ``--device`` value.
        sequence_parallel: ``P`` (``--sequence-parallel``): consecutive ranks that split every
            sequence; the world size must be a multiple of it.
        timeout_s: how long a collective waits for the other ranks before it fails
            (``--dist-timeout``; None: torch's default). A rank that dies makes the others
            fail at their next collective within it, instead of waiting for ever.

    Returns:
        The context; a single-process one when ``WORLD_SIZE`` is unset or 1.

    Raises:
        ValueError: CUDA requested but unavailable; ``sequence_parallel`` above 1 without
            ``torchrun``, or not dividing the world size (naming ``sequence_parallel``).
    """
    check_positive_int("sequence_parallel", sequence_parallel)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if sequence_parallel > 1 and world_size % sequence_parallel:
        launched = "" if "WORLD_SIZE" in os.environ else " (run it under torchrun)"
        raise bad_value(
            "sequence_parallel",
            f"expected a divisor of the number of torchrun processes{launched}, got "
            f"--sequence-parallel {sequence_parallel} with {world_size} process(es)",
        )
    resolved = resolve_device(device, local_rank)
    if world_size <= 1:
        return DistContext(device=resolved)
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
        options: dict[str, Any] = {}
        if timeout_s is not None:
            options["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, **options)
        owns = True
    rank, world_size = dist.get_rank(), dist.get_world_size()
    group = None
    if sequence_parallel > 1:  # every rank makes every group, in the same order
        for first in range(0, world_size, sequence_parallel):
            made = dist.new_group(list(range(first, first + sequence_parallel)))
            if first <= rank < first + sequence_parallel:
                group = made
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=resolved,
        owns_group=owns,
        sequence_parallel=sequence_parallel,
        sequence_group=group,
    )
