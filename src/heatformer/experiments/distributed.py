"""Device selection and data-parallel (DDP) set-up for the experiment runner.

Under ``torchrun`` (``WORLD_SIZE > 1`` in the environment) the runner joins a process
group: ``nccl`` when the processes use CUDA, ``gloo`` on the CPU. Every rank draws the
same *global* batch from the same seeded generator and keeps its own slice of
``batch_size / world_size`` examples, so the optimization is that of one process with
the full batch (DDP averages the gradients of the equal slices). Rank 0 alone writes
files and shows progress; the others wait at barriers. The run folder must be visible
to every rank (one machine, or a shared file system).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from heatformer.checks import bad_value

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
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False

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


def setup_distributed(device: str = "auto") -> DistContext:
    """Join the ``torchrun`` process group if there is one, and pick the device.

    Args:
        device: the ``--device`` value.

    Returns:
        The context; a single-process one when ``WORLD_SIZE`` is unset or 1.

    Raises:
        ValueError: CUDA requested but unavailable.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if world_size <= 1:
        return DistContext(device=resolved)
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
        dist.init_process_group(backend=backend)
        owns = True
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=resolved,
        owns_group=owns,
    )
