"""The gradient-layout contract of the window kernels (``heatformer.graph_ops.window.packed``):
the parts of a fused ``(1, N, 3, H, Dh)`` projection are recognised as such, the kernels'
backward writes their three gradients as the parts of one buffer in that layout, and
``projection_gradient`` finds that buffer -- equal to the stacked gradients, which are the
dense graph's -- and nothing else."""

from __future__ import annotations

import pytest
import torch

from graph_helpers import band_mask
from heatformer.graph_ops import SoftmaxGraph, WindowGraph
from heatformer.graph_ops.window.packed import (
    gradient_buffers,
    holds_values,
    projection_gradient,
    projection_of,
)

F64 = torch.float64


def _heads(qkv: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The parts of ``qkv`` ``(B, N, 3, H, Dh)`` as a layer unbinds them, ``(B, N, H, Dh)``,
    and their heads ``(B, H, N, Dh)``."""
    parts = list(qkv.unbind(2))
    return parts, [p.transpose(1, 2) for p in parts]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *t.shape[-2:])  # (Bf, N, Dh), as a window graph flattens its batch


def test_the_parts_of_one_projection_are_recognised() -> None:
    qkv = torch.randn(1, 9, 3, 2, 4, dtype=F64)
    q, k, v = (_flat(h) for h in _heads(qkv)[1])
    projection = projection_of(q, k)
    assert projection == (qkv.untyped_storage().data_ptr(), 0)
    assert holds_values(projection, v) and not holds_values(projection, k)
    assert projection_of(k, q) is None  # order
    assert projection_of(q, k.clone()) is None  # another storage
    two = torch.randn(2, 9, 3, 2, 4, dtype=F64)  # heads of two sequences: not token-major
    assert projection_of(*(_flat(h) for h in _heads(two)[1][:2])) is None


def test_gradient_buffers_are_the_parts_of_the_projections_gradient() -> None:
    like = torch.zeros(2, 5, 4, dtype=F64)  # (Bf, N, E)
    dq, dk, dv = gradient_buffers(like, (7, 6, 6))  # padded rows beyond N
    assert [t.shape for t in (dq, dk, dv)] == [(2, 7, 4), (2, 6, 4), (2, 6, 4)]
    for i, t in enumerate((dq, dk, dv)):
        t[:, :5].copy_(torch.full((2, 5, 4), float(i + 1)))
    shape = torch.Size((1, 5, 3, 2, 4))  # (B, N, 3, H, Dh)
    grads = tuple(t[:, :5].unsqueeze(0).transpose(1, 2) for t in (dq, dk, dv))  # (1, N, H, Dh)
    found = projection_gradient(grads, shape)
    assert found is not None and found.data_ptr() == dq.data_ptr()
    torch.testing.assert_close(found, torch.stack(grads, dim=2), rtol=0, atol=0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    ("causal", "g", "one_buffer"),
    [
        (True, 0, True),
        (True, 1, True),  # a causal global row is a row of its block: the kernels' too
        (False, 0, True),
        (False, 2, False),  # bidirectional global rows: dense rows by SDPA, gradients added
    ],
)
def test_the_kernels_write_the_projections_gradient_as_one_buffer(
    monkeypatch, fused: bool, causal: bool, g: int, one_buffer: bool
) -> None:
    from heatformer.graph_ops.window import kernels

    monkeypatch.setattr(kernels, "FUSED_CPU", fused)
    n, w = 13, 3
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(1, n, 3, 2, 4, generator=gen, dtype=F64, requires_grad=True)
    weights = torch.randn(1, 2, n, 4, generator=gen, dtype=F64)
    parts, (q, k, v) = _heads(qkv)
    seen: list[torch.Tensor] = [torch.empty(0)] * 3
    for i, part in enumerate(parts):
        part.register_hook(lambda grad, i=i: seen.__setitem__(i, grad))
    graph = WindowGraph(q, k, window=w, causal=causal, num_global=g, row_block=4)
    (graph.propagate(v) * weights).sum().backward()
    found = projection_gradient((seen[0], seen[1], seen[2]), qkv.shape)
    assert (found is not None) == one_buffer
    if found is not None:
        assert found.data_ptr() == seen[0].data_ptr()
        torch.testing.assert_close(found, torch.stack(seen, dim=2), rtol=0, atol=0)
    ref = qkv.detach().requires_grad_(True)  # the dense graph's gradient
    rq, rk, rv = _heads(ref)[1]
    dense = SoftmaxGraph(rq, rk, mask=band_mask(n, w, causal, g, None, False))
    (dense.propagate(rv) * weights).sum().backward()
    torch.testing.assert_close(qkv.grad, ref.grad, rtol=1e-10, atol=1e-12)


def test_values_read_twice_are_not_one_buffer() -> None:
    """A second use of the values (``I v`` beside ``P v``, as Laplacian heads read them) adds a
    gradient of its own: the sum is no part of the buffer, and it is stacked."""
    qkv = torch.randn(1, 11, 3, 2, 4, dtype=F64, requires_grad=True)
    parts, (q, k, v) = _heads(qkv)
    seen: list[torch.Tensor] = [torch.empty(0)] * 3
    for i, part in enumerate(parts):
        part.register_hook(lambda grad, i=i: seen.__setitem__(i, grad))
    (WindowGraph(q, k, window=3, causal=True).propagate(v) - v).square().sum().backward()
    assert projection_gradient((seen[0], seen[1], seen[2]), qkv.shape) is None
