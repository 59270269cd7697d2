r"""The layout of a fused ``q, k, v`` projection, in which the window kernels' backward writes
the three gradients: the contract between :mod:`~heatformer.graph_ops.window.kernels` and a
layer that unbinds its projection (:func:`heatformer.models._packed.unbind_packed`).

A layer projects its tokens once, ``qkv`` ``(B, N, 3, H, Dh)``, and takes its heads as
``qkv.unbind(2)``, each ``(B, N, H, Dh)`` transposed to ``(B, H, N, Dh)``. Autograd's backward
of that unbind stacks the three gradients into a fresh tensor of the projection's size (201 MB
first touched and copied per layer at 65k tokens, ``D = 256``). For one sequence (``B = 1``)
the ``Bf = H`` heads of a part, flattened as a window graph flattens its batch, are ``(Bf, N,
Dh)`` tensors laid out token-major: ``(N, 3, Bf, Dh)`` in memory, part ``i`` starting ``i Bf
Dh`` elements after part 0 (:func:`part_offset`). The two sides of the contract:

- **the window kernels** ask, when a graph is made, whether its ``q`` and ``k`` are parts 0
  and 1 of one such projection (:func:`projection_of`), and in the backward whether the values
  of a product are its part 2 (:func:`holds_values`). Then the backward sums the three
  gradients into the parts of one zeroed buffer in that layout (:func:`gradient_buffers`),
  instead of into three buffers of their own;
- **the layer's unbind** asks whether the three gradients it receives are the parts of one
  buffer in the projection's layout (:func:`projection_gradient`), and then hands that buffer
  to the projection, viewed as its ``(B, N, 3, H, Dh)`` gradient, instead of stacking.

Each side reads only shapes, strides, storage offsets and storages, never the other's objects:
a gradient written otherwise (two sequences, values read twice, as by Laplacian heads, a heat
series' later terms, another graph kind) is stacked, as autograd would, and the result is the
same either way (``tests/graph_ops/test_packed.py`` checks the two sides against each other,
``tests/models/test_packed_gradients.py`` the layer against autograd's unbind).

Measured (``benchmarks/bench_versions.py --threads 1 --only "window layer" --clock cpu``: a
window(128) + 1 global token layer of 4 attention heads, ``Dh = 64``, ``N = 65536``, fwd + bwd,
one thread; docs/benchmarks.md, issue 39): without this contract the layer took 1.7-6.9 % more
CPU time in four runs (the larger figures while other jobs loaded the machine).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

__all__ = [
    "gradient_buffers",
    "holds_values",
    "part_offset",
    "projection_gradient",
    "projection_of",
]

#: Where a projection's parts lie: its storage's address and the storage offset of part 0.
Projection = tuple[int, int]


def part_offset(t: Tensor, part: int) -> int | None:
    """Elements from part 0 to part ``part`` when ``t`` ``(Bf, N, E)`` is a part of a token-major
    fused projection, ``(N, 3, Bf, E)`` in memory (the heads of one batch element, as a ``(B=1,
    N, 3, H, Dh)`` projection gives them), or None when ``t`` is not laid out so."""
    bf, _, e = t.shape
    if t.stride(1) != 3 * bf * e or t.stride(2) != 1 or (bf > 1 and t.stride(0) != e):
        return None
    return part * bf * e


def _storage(t: Tensor) -> int | None:
    """The address of ``t``'s storage; None for a tensor without one (a ``torch.func``
    transform's wrapper)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None


def projection_of(q: Tensor, k: Tensor) -> Projection | None:
    """The projection whose parts 0 and 1 ``q`` and ``k`` ``(Bf, N, E)`` are (one storage,
    ``k`` one part after ``q``, both laid out as :func:`part_offset` says), else None."""
    one = part_offset(q, 1)
    if (
        one is None or q.shape != k.shape or q.stride() != k.stride() or q.dtype != k.dtype
        or k.storage_offset() != q.storage_offset() + one
        or _storage(q) is None or _storage(k) != _storage(q)
    ):  # fmt: skip
        return None
    return cast(int, _storage(q)), int(q.storage_offset())


def holds_values(projection: Projection, x: Tensor) -> bool:
    """Whether ``x`` ``(Bf, N, C)`` is part 2 (the values) of ``projection``."""
    storage, offset = projection
    third = part_offset(x, 2)
    return third is not None and x.storage_offset() == offset + third and _storage(x) == storage


def gradient_buffers(like: Tensor, rows: tuple[int, int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """Three zeroed gradients ``(Bf, rows[i], E)`` for the parts of a projection of ``like``'s
    ``(Bf, N, E)``, dtype and device: the parts of one ``(max(rows), 3, Bf, E)`` buffer in the
    projection's layout, row ``r`` of each at row ``r`` of the buffer (rows beyond ``N`` are
    padding, as the kernels sum gradients by padded slab position; the caller's rows of the
    projection must be the same rows of all three)."""
    bf, e = like.shape[0], like.shape[-1]
    buf = like.new_zeros(max(rows), 3, bf, e)
    dq, dk, dv = (buf[:r, i].transpose(0, 1) for i, r in enumerate(rows))  # (Bf, rows[i], E)
    return dq, dk, dv


def projection_gradient(grads: tuple[Tensor, Tensor, Tensor], shape: torch.Size) -> Tensor | None:
    """The ``shape`` ``(B, N, 3, H, Dh)`` gradient of a projection whose parts along dim 2 are
    ``grads`` (each ``(B, N, H, Dh)``), as a view of their common buffer, when they are laid out
    as its parts (one storage, the parts' strides, one part of ``H Dh`` elements after the
    other: what :func:`gradient_buffers` makes); None otherwise (the caller stacks them).
    """
    first = grads[0]
    part = shape[3] * shape[4]
    try:  # a tensor without storage (a torch.func transform's wrapper) is stacked
        storages = {g.untyped_storage().data_ptr() for g in grads}
    except (RuntimeError, NotImplementedError):
        return None
    offsets = [g.storage_offset() - first.storage_offset() for g in grads]
    same = len(storages) == 1 and all(
        g.dtype == first.dtype and g.stride() == first.stride() for g in grads
    )
    b_stride, n_stride, h_stride, d_stride = first.stride()
    if not (same and offsets == [0, part, 2 * part] and n_stride == 3 * part):
        return None
    if (h_stride, d_stride) != (shape[4], 1) or (shape[0] > 1 and b_stride < n_stride * shape[1]):
        return None
    strides = (b_stride, n_stride, part, h_stride, d_stride)
    return first.as_strided(shape, strides, first.storage_offset())
