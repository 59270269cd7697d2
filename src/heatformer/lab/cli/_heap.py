"""The ``heatformer`` command's heap: large CPU tensors are returned to the system when freed.

glibc's ``malloc`` serves a request of at least ``M_MMAP_THRESHOLD`` bytes from its own
``mmap`` (unmapped again by ``free``) and smaller ones from the heap, whose free holes stay
in the process's resident memory. The threshold starts at 128 KiB but is *dynamic*: each
freed ``mmap`` chunk raises it to that chunk's size (up to 32 MiB). A training step frees many
temporaries of 1-64 MiB (score slabs, activations), so after the first step they all come from
the heap, and the holes they leave between long-lived tensors (saved activations, optimizer
state) add up. Measured on one training step of the top-k recall model (4 layers, k = 32;
``benchmarks/bench_topk_train.py``, ``docs/benchmarks.md``): at N = 2048, batch 2, a threshold
fixed at 4 MiB cut the resident peak from 338-357 MB to 272-277 MB; at N = 4096, batch 2,
with activation checkpointing (whose recomputed layers allocate many 1-4 MiB blocks), 1 MiB
cuts it from 133-141 MB (4 MiB) to 106-114 MB, three rounds each. It costs time, because
every large block is mapped and zero-filled afresh: 10.8-11.6 s a step against 8.9-10.3 s
there. The command takes memory over speed, since a run that no longer fits is killed, not
slowed.

:func:`fix_mmap_threshold` fixes it (``mallopt(M_MMAP_THRESHOLD, 1 MiB)``, which also turns the
dynamic adjustment off). The command calls it at start; a library never changes a process's
allocator, so scripts that import heatformer choose for themselves, e.g. with glibc's
environment variable ``MALLOC_MMAP_THRESHOLD_=1048576``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold"]

#: Bytes from which an allocation gets its own mapping (returned to the system when freed).
MMAP_THRESHOLD = 1 << 20

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``threshold`` bytes for this process.

    Nothing happens where the C library is not glibc (macOS, musl, Windows) or where the
    environment already sets ``MALLOC_MMAP_THRESHOLD_`` (the user's choice wins).

    Args:
        threshold: bytes, ``0 < threshold <= 32 MiB`` (glibc's maximum on 64-bit systems).

    Returns:
        Whether the threshold was set.

    Example:
        >>> import sys
        >>> fix_mmap_threshold() or not sys.platform.startswith("linux") or _libc() is None
        True
    """
    if not 0 < threshold <= 32 << 20:
        from heatformer.checks import bad_value

        raise bad_value("threshold", f"expected 1 to {32 << 20} bytes, got {threshold}")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))


def _libc() -> ctypes.CDLL | None:
    """glibc, or None when this process's C library is another one."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None
