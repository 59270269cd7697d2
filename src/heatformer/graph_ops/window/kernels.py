r"""``P x`` on a window graph's slabs, with a backward that recomputes instead of storing.

:meth:`WindowGraph.propagate <heatformer.graph_ops.WindowGraph.propagate>` multiplies by the
row-softmax ``P`` of a sliding-window graph. Autograd through a plain implementation would
keep every block's key and value slab (``(b + w) / b`` copies of ``k`` and ``x``, about two
each), the ``(b, g + L)`` weights or a float mask of that size: five to six tensors the size of
``x`` per call, and a heat series calls it once per term. :class:`WindowAttention` keeps its
inputs ``q``, ``k``, ``x`` (tensors the caller holds anyway), and rebuilds the slabs of each run
of blocks in the backward. On CPU, where the values are as wide as the keys, both passes are
PyTorch's fused flash-attention kernels per run of blocks, and the output and one log-sum-exp
per row are kept too (in a series the output is the next term's input, so nothing new); else
the weights are recomputed from plain products, as flash attention does:

.. math::

    P = \mathrm{softmax}(S),\quad
    \mathrm{d}x_{\text{slab}} = P^\top \mathrm{d}y,\quad
    \mathrm{d}S = P \odot (\mathrm{d}y\, x_{\text{slab}}^\top
        - \mathrm{rowsum}(P \odot \mathrm{d}y\, x_{\text{slab}}^\top)),

``dq = s dS k_slab`` and ``dk_slab = s dS^T q`` (``s`` the scale), the slab gradients folded back
onto positions. Memory is ``O(run)`` beyond the inputs and outputs: each run of blocks pads
and copies only its own rows, and an interior run's mask is one shared ``(b, g + L)`` pattern.
On the fused path an interior run (:meth:`~heatformer.graph_ops.window.layout.WindowLayout.
interior`) copies nothing: the kernel reads the overlapping slab views of ``k`` and ``x``, and
the ``g`` global keys, which every interior row attends, are merged in by the log-sum-exp
(:func:`_interior_forward`; the backward passes the merged output and log-sum-exp to the
kernel, :func:`_interior_backward`).
The gradients in ``q`` and ``k`` of all the products of one graph (a heat series makes one per
term) are summed in place into one buffer each (:class:`GradSink`), which autograd receives
once, from the :func:`shared` node that every product's ``q`` and ``k`` come from: not one
``q``-sized gradient per product plus autograd's running sums. When ``q``, ``k`` and the
values are the three parts of one token-major fused projection (a layer's heads, ``(N, 3, H,
Dh)`` in memory), the three gradients are written as the parts of one buffer in that layout,
which the layer's unbind hands to the projection without stacking them (a copy of the
projection's size): the contract of :mod:`~heatformer.graph_ops.window.packed`. A row with no
allowed key gives 0. On the generic path the forward is one SDPA call per run of blocks in the
input's dtype (for half-precision inputs SDPA forms the logits in float32 on the CPU from torch
2.5 on, and its fused CUDA kernels accumulate in float32), and the backward recomputes
half-precision inputs in float32 per chunk (the result is cast back), as the library's other
softmax paths do.

Second derivatives: with ``create_graph=True`` (a gradient penalty, ``gradgradcheck``) the
backward takes the generic path whatever the forward took -- the fused kernel's backward has
no derivative -- and autograd differentiates its plain products.

Measured (``benchmarks/bench_versions.py --threads 1 --only "window layer" --clock cpu``:
window(128) + 1 global token, causal, H = 4, Dh = 64, N = 65536, fwd + bwd, one thread, quiet
machine): 0.78-0.80 of the CPU time of the code before
:mod:`~heatformer.graph_ops.window.layout` (dense global row, slab copies, a stacked
projection gradient); each step's figures are in docs/benchmarks.md.

Measured earlier (``benchmarks/bench_long.py``, window(128) layer of heat heads, t = 1, tol 1e-6,
H = 4, Dh = 64, N = 262144, fwd + bwd): peak 3.94 GB, against 5.07 GB with whole padded copies,
per-product gradients and ``sqrt(K)`` equal series segments, and 7.64 GB through autograd of the
masked SDPA call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from heatformer._torch_compat import (
    flash_attention_cpu,
    flash_attention_cpu_backward,
    graph_task_id,
    softmax_backward,
)
from heatformer.graph_ops.window.layout import Spec, WindowLayout
from heatformer.graph_ops.window.packed import (
    Projection,
    gradient_buffers,
    holds_values,
    projection_of,
)

__all__ = ["GradSink", "WindowAttention", "shared", "window_attention"]

_HALF = (torch.float16, torch.bfloat16)


def _work(t: Tensor) -> Tensor:
    return t.float() if t.dtype in _HALF else t


class _Slabs:
    """The query blocks, key and value slabs of one call, made per run of blocks from the
    unpadded inputs (in the working dtype: float32 for half-precision inputs), so that no
    padded copy of a whole input is ever made."""

    def __init__(self, layout: WindowLayout, q: Tensor, k: Tensor, x: Tensor, work: bool) -> None:
        self.layout = layout
        self.q, self.k, self.x = (_work(q), _work(k), _work(x)) if work else (q, k, x)

    def queries(self, blocks: slice) -> Tensor:
        """``(Bf, nb', b, E)``, contiguous."""
        return self.layout.block_queries(self.q, blocks).contiguous()

    def keys(self, blocks: slice) -> Tensor:
        """``(Bf, nb', g + L, E)``, contiguous (a product with the overlapping view would copy
        each block apart)."""
        return self.layout.keys(self.k, blocks).contiguous()

    def values(self, blocks: slice) -> Tensor:
        """``(Bf, nb', g + L, C)``, contiguous."""
        return self.layout.keys(self.x, blocks).contiguous()

    def weights(self, blocks: slice, queries: Tensor, keys: Tensor) -> Tensor:
        """``P`` of the blocks, ``(Bf, nb', b, g + L)`` (rows without keys: 0), from their
        :meth:`queries` and :meth:`keys`."""
        _, disallowed, empty = self.layout.run_masks(blocks)
        s = queries @ keys.transpose(-1, -2)  # (Bf, nb', b, g + L)
        s = s.mul_(self.layout.scale).masked_fill_(disallowed, float("-inf"))
        if empty is None:
            return torch.softmax(s, dim=-1)
        # not in place: with create_graph, softmax's backward reads its output
        return torch.softmax(s.masked_fill_(empty, 0.0), dim=-1).masked_fill(empty, 0.0)


def _fold_add(out: Tensor, parts: Tensor, first_block: int, b: int) -> None:
    """Add slab contributions ``parts`` ``(Bf, nb', L, C)`` of blocks ``first_block ...`` into
    ``out`` ``(Bf, P', C)`` (``P'`` a multiple of ``b``), whose row ``m b + l`` is slab position
    ``l`` of block ``m``: slab piece ``j`` (positions ``j b ... j b + b - 1``) of every block
    lands on block ``m + j``, so ``ceil(L / b)`` strided additions do it."""
    bf, nb, slab, c = parts.shape
    by_block = out.view(bf, -1, b, c)  # (Bf, P' / b, b, C)
    for j in range(-(-slab // b)):
        piece = parts[:, :, j * b : (j + 1) * b]  # (Bf, nb', <= b, C)
        start = first_block + j
        by_block[:, start : start + nb, : piece.shape[2]].add_(piece)  # no setitem: see backward


def _add_blocks(
    dq: Tensor, dk: Tensor, dx: Tensor, layout: WindowLayout, blocks: slice,
    parts: tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None],
) -> None:  # fmt: skip
    """Add a run's ``(dq (Bf, nb', b, E), dk_slab (Bf, nb', L, E), dx_slab (Bf, nb', L, C),
    dk_global (Bf, g, E) or None, dx_global)`` into ``dq`` ``(Bf, nb, b, E)`` and the padded
    ``dk``, ``dx`` (row ``m b + l`` = slab position ``l`` of block ``m``)."""
    dqb, dks, dxs, dkg, dxg = parts
    dq[:, blocks].add_(dqb)
    start, b, before, g = blocks.start or 0, layout.row_block, layout.before, layout.num_global
    _fold_add(dk, dks, start, b)
    _fold_add(dx, dxs, start, b)
    if dkg is not None and dxg is not None:  # the global keys: the first g positions
        dk[:, before : before + g].add_(dkg)
        dx[:, before : before + g].add_(dxg)


#: Use the fused flash-attention kernels of PyTorch's CPU backend where they apply (CPU tensors,
#: values of the key width): the same algorithm, each run of blocks in one kernel call. False
#: (or another device) takes the generic recomputing path of plain tensor products.
FUSED_CPU = True


def _fused(q: Tensor, x: Tensor) -> bool:
    return FUSED_CPU and q.device.type == "cpu" and x.shape[-1] == q.shape[-1]


def _like_rows(x: Tensor, nb: int, b: int) -> Tensor:
    """An empty ``(Bf, nb, b, C)`` output for ``x`` ``(Bf, N, C)``, token-major (``(nb, b, Bf,
    C)`` in memory) when ``x`` is, as the heads of a fused projection are: a layer then merges
    the heads of the result by a view instead of a copy."""
    bf, c = x.shape[0], x.shape[-1]
    if bf > 1 and x.stride(0) < x.stride(1):
        return x.new_empty(nb, b, bf, c).permute(2, 0, 1, 3)
    return x.new_empty(bf, nb, b, c)


class GradSink:
    """The gradients in ``q`` and ``k`` of every :class:`WindowAttention` of one graph, summed
    in place per backward pass (one buffer each, instead of one per propagation plus autograd's
    running sums: a heat series propagates the same ``q``, ``k`` once per term) and handed to
    autograd once, by the :func:`shared` node they were made from, which runs after all of
    them. Keyed by the backward pass (:func:`heatformer._torch_compat.graph_task_id`), so that a
    pass that does not reach ``q`` and ``k`` cannot leak into a later one."""

    def __init__(
        self, layout: WindowLayout, q_rows: int, projection: Projection | None = None
    ) -> None:
        # the geometry only: a reference to the graph would make a cycle (the graph keeps the
        # sink), and the graph, with its q and k, would outlive the step until the next gc
        b, nb = layout.row_block, layout.num_blocks
        self._rows = (nb * b, (nb - 1 + -(-layout.slab // b)) * b)  # dq, dk (>= P) rows
        self._n, self._before = layout.n, layout.before
        self._q = (layout.q_offset, q_rows)  # the graph rows q holds
        self._projection = projection  # when q, k are parts 0, 1 of a fused projection
        self._by_pass: dict[int, tuple[Tensor, Tensor, list[Tensor]]] = {}

    def buffers(self, q: Tensor, k: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(dq (Bf, nb b, E), dk (Bf, rows, E))`` of the current backward pass, zeros at
        first: ``dq`` by query row, ``dk`` by padded slab position (``rows >= P``, a multiple
        of ``b``).

        When ``q`` and ``k`` are the first two parts of a fused projection (:func:`shared`
        found them so) and ``dtype`` is theirs, both are parts of one buffer in the
        projection's layout (:func:`~heatformer.graph_ops.window.packed.gradient_buffers`),
        whose third part :meth:`values` offers to the product of the values: the three
        gradients then reach the projection as one tensor, with no stacking copy."""
        task = graph_task_id()
        if task not in self._by_pass:
            bf, (q_rows, k_rows) = q.shape[0], self._rows
            if self._projection is not None and dtype == q.dtype:
                before = self._before
                dq, dk, dv = gradient_buffers(q, (before + q_rows, k_rows, k_rows))
                self._by_pass[task] = (dq[:, before:], dk, [dv])  # dq by query row
            else:
                self._by_pass[task] = (
                    q.new_zeros(bf, q_rows, q.shape[-1], dtype=dtype),
                    q.new_zeros(bf, k_rows, k.shape[-1], dtype=dtype),
                    [],
                )
        dq, dk, _ = self._by_pass[task]
        return dq, dk

    def values(self, x: Tensor, dtype: torch.dtype) -> Tensor | None:
        """The ``(Bf, rows, C)`` gradient buffer of :meth:`buffers`' third part for the values
        ``x`` of a product, by padded slab position, when ``x`` is that part of the projection
        (and ``dtype`` its dtype); once per pass (a second product of the same values sums
        into its own buffer, and autograd adds the two). None otherwise."""
        found = self._by_pass.get(graph_task_id())
        if found is None or not found[2] or self._projection is None or x.dtype != dtype:
            return None
        if not holds_values(self._projection, x):
            return None
        return found[2].pop()

    def pop(self) -> tuple[Tensor, Tensor] | None:
        """The current pass's ``(dq (Bf, R, E), dk (Bf, N, E))``, ``R`` the rows of ``q`` (None
        if nothing was added)."""
        found = self._by_pass.pop(graph_task_id(), None)
        if found is None:
            return None
        n, before, (off, rows) = self._n, self._before, self._q
        return found[0][:, off : off + rows], found[1][:, before : before + n]


class _Shared(torch.autograd.Function):
    """Identity on ``q``, ``k``, whose backward adds what the sink collected."""

    @staticmethod
    def forward(ctx: Any, sink: GradSink, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        ctx.sink, ctx.dtypes = sink, (q.dtype, k.dtype)
        ctx.set_materialize_grads(False)
        return q.view_as(q), k.view_as(k)

    @staticmethod
    def backward(
        ctx: Any, dq: Tensor | None, dk: Tensor | None
    ) -> tuple[None, Tensor | None, Tensor | None]:
        found = ctx.sink.pop()
        if found is None:
            return None, dq, dk
        sq, sk = (t.to(dtype) for t, dtype in zip(found, ctx.dtypes, strict=True))
        return None, sq if dq is None else dq + sq, sk if dk is None else dk + sk


def shared(layout: WindowLayout, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, GradSink]:
    """``q``, ``k`` for every product of a graph of ``layout`` in one forward pass, and the sink
    their :class:`WindowAttention` gradients are summed in."""
    whole = layout.q_offset == 0 and q.shape[1] == layout.n  # not an extended block's rows
    sink = GradSink(layout, q.shape[1], projection_of(q, k) if whole else None)
    qs, ks = _Shared.apply(sink, q, k)
    return qs, ks, sink


#: At most this many ``Bf g`` columns for :func:`_token_major`'s products (each wastes a factor
#: ``Bf`` in multiplications on the block-diagonal's zeros, small beside reading the rows).
_TOKEN_MAJOR_COLUMNS = 16


def _token_major(t: Tensor, small: int) -> Tensor | None:
    """The ``(R, Bf X)`` matrix of ``t`` ``(Bf, R, X)`` when ``t`` is token-major (``(R, Bf,
    X)`` in memory, rows at any stride: the heads of a fused projection, a token-major output)
    and ``Bf small`` is at most :data:`_TOKEN_MAJOR_COLUMNS`, as a view; else None. A batched
    product of such rows with ``(Bf, X, small)`` matrices is then one matrix product with their
    block diagonal, reading each row once: ``bmm`` on them reads every batch's rows apart, with
    the rows' stride (several times slower)."""
    bf, r, x = t.shape
    if bf == 1 or bf * small > _TOKEN_MAJOR_COLUMNS or t.stride(0) != x:
        return None
    if x > 1 and t.stride(2) != 1:
        return None
    return t.transpose(0, 1).view(r, bf * x)


def _rows_times(rows: Tensor, mats: Tensor) -> Tensor:
    """``rows @ mats``, ``(Bf, R, E) @ (Bf, E, G) -> (Bf, R, G)`` for a small ``G``: on
    token-major rows (:func:`_token_major`) one product ``diag(mats)^T rows^T``, which reads
    the rows in order (twice as fast as ``rows diag(mats)`` on strided rows)."""
    bf, r, _ = rows.shape
    tok = _token_major(rows, mats.shape[-1])
    if tok is None:
        return torch.bmm(rows, mats)
    cols = torch.block_diag(*mats.unbind(0)).T @ tok.T  # (Bf G, R)
    return cols.view(bf, -1, r).transpose(1, 2)


def _add_rows_times(out: Tensor, a: Tensor, mats: Tensor) -> None:
    """``out += a @ mats`` in place: ``(Bf, R, C) += (Bf, R, G) @ (Bf, G, C)``, small ``G``
    (``a`` is made ``(R, Bf G)``: a copy of a small tensor at most)."""
    (bf, r, g), tok_out = a.shape, _token_major(out, a.shape[-1])
    if tok_out is None:
        out.baddbmm_(a, mats)
    else:
        tok_out.addmm_(a.transpose(0, 1).reshape(r, bf * g), torch.block_diag(*mats.unbind(0)))


def _t_times_rows(a: Tensor, rows: Tensor) -> Tensor:
    """``a^T @ rows``: ``(Bf, R, G), (Bf, R, E) -> (Bf, G, E)``, small ``G``."""
    (bf, r, g), e = a.shape, rows.shape[-1]
    tok_rows = _token_major(rows, g)
    if tok_rows is None:
        return torch.bmm(a.transpose(1, 2), rows)
    every = (a.transpose(1, 2).reshape(bf * g, r) @ tok_rows).view(bf, g, bf, e)
    return every.diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (Bf, G, E): blocks (i, i)


def _global_scores(layout: WindowLayout, rows: Tensor, k: Tensor, dtype: torch.dtype) -> Tensor:
    """Scores ``(Bf, R, g)`` of the query rows ``rows`` ``(Bf, R, E)`` on the global keys: one
    product per run (a ``(Bf, nb', b, E)`` product with keys broadcast over the blocks would be
    ``Bf nb'`` tiny ones)."""
    kg = k[:, : layout.num_global].to(dtype)  # (Bf, g, E)
    return _rows_times(rows.to(dtype), kg.transpose(1, 2)).mul_(layout.scale)


def _interior_forward(
    layout: WindowLayout, q: Tensor, k: Tensor, x: Tensor, blocks: slice, out: Tensor
) -> Tensor:
    """The log-sum-exp ``(Bf, nb', b)`` of an interior run, its output written into ``out``
    ``(Bf, nb', b, C)``: by the fused kernel on the slab views of ``k``, ``x`` (no copies: the
    kernel takes their strides), merged with the ``g`` global keys by the log-sum-exp
    (``lse = log(e^{lse_slab} + sum_j e^{s_j})``), which every interior row attends."""
    g, qb = layout.num_global, layout.block_queries(q, blocks)
    y, lse = flash_attention_cpu(
        qb, layout.keys(k, blocks, glob=False), layout.keys(x, blocks, glob=False),
        layout.sdpa_mask(blocks, q.dtype)[..., g:], layout.scale,
    )  # fmt: skip
    if not g:
        out.copy_(y)
        return lse
    bf, dt = q.shape[0], lse.dtype
    sg = _global_scores(layout, qb.flatten(1, 2), k, dt)  # (Bf, R, g), R = nb' b rows
    total = torch.logaddexp(lse, sg.logsumexp(-1).view_as(lse))  # (Bf, nb', b)
    factor = (lse - total).exp().unsqueeze(-1)  # (Bf, nb', b, 1): the slab keys' share
    # in out's own rows when it has the working dtype (no run-sized copy into it)
    merged = torch.mul(y, factor, out=out) if out.dtype == dt else y.to(dt).mul_(factor)
    pg = (sg - total.reshape(bf, -1, 1)).exp_()  # (Bf, R, g): the global keys' weights
    _add_rows_times(merged.view(bf, -1, y.shape[-1]), pg, x[:, :g].to(dt))  # (Bf, R, C)
    if merged is not out:
        out.copy_(merged)
    return total


def _interior_backward(
    layout: WindowLayout, q: Tensor, k: Tensor, x: Tensor, dy: Tensor, out: Tensor,
    lse: Tensor, blocks: slice, dq_rows: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:  # fmt: skip
    """``(dq, dk_slab, dx_slab, dk_global, dx_global)`` of :func:`_interior_forward`: the
    kernel's backward with the merged ``out`` and ``lse`` gives the slab keys' part of the
    whole row's softmax gradient (its ``P = e^{s - lse}``, ``D = rowsum(dy * out)``), and
    ``dS_g = P_g (dy x_g^T - D)`` the global keys' (``(Bf, g, E)``, ``(Bf, g, C)``); their
    part of ``dq``, ``dS_g k_g``, is added into the run's rows of ``dq_rows`` ``(Bf, nb b, E)``
    here (the kernel's part, the returned ``dq``, is the caller's to add)."""
    g, qb = layout.num_global, layout.block_queries(q, blocks)
    dq, dk, dx = flash_attention_cpu_backward(
        dy, qb, layout.keys(k, blocks, glob=False), layout.keys(x, blocks, glob=False), out,
        lse, layout.sdpa_mask(blocks, q.dtype)[..., g:], layout.scale,
    )  # fmt: skip
    if not g:
        return dq, dk, dx, None, None
    bf, dt, b = q.shape[0], lse.dtype, layout.row_block
    rows = qb.flatten(1, 2).to(dt)  # (Bf, R, E)
    dyw = dy.to(dt).reshape(bf, -1, dy.shape[-1])  # (Bf, R, C)
    pg = (_global_scores(layout, rows, k, dt) - lse.reshape(bf, -1, 1)).exp_()  # (Bf, R, g)
    dsg = _rows_times(dyw, x[:, :g].to(dt).transpose(1, 2))  # (Bf, R, g): dy x_g^T
    dsg.sub_(torch.linalg.vecdot(dyw, out.to(dt).reshape(bf, -1, out.shape[-1])).unsqueeze(-1))
    dsg.mul_(pg).mul_(layout.scale)
    start, stop = layout.span(blocks)
    _add_rows_times(dq_rows[:, start * b : stop * b], dsg, k[:, :g].to(dt))  # the global keys'
    dkg = _t_times_rows(dsg, rows)  # (Bf, g, E)
    dxg = _t_times_rows(pg, dyw)  # (Bf, g, C)
    return dq, dk, dx, dkg, dxg


class WindowAttention(torch.autograd.Function):
    """``y = P x`` over a window graph's query blocks; see the module docstring. What the
    backward needs is saved by ``save_for_backward`` (``q``, ``k``, ``x``, the key mask, and on
    the fused path the output and log-sum-exp) and the layout's ints, so that activation
    checkpointing can drop and recompute all of it."""

    @staticmethod
    def forward(
        ctx: Any,
        layout: WindowLayout,
        sink: GradSink | None,
        rows: tuple[int, int],
        q: Tensor,
        k: Tensor,
        x: Tensor,
        key_mask: Tensor | None,
    ) -> Tensor:
        """``q``, ``k`` ``(Bf, N, E)``, ``x`` ``(Bf, N, C)``, ``key_mask`` the layout's ->
        the graph rows ``rows = (lo, hi)`` of ``P x``, ``(Bf, hi - lo, C)``: a view of the
        ``(Bf, nb b, C)`` output of the blocks, so that no caller slices it (a slice's backward
        would fill a zero copy of the whole output); with a ``sink`` (``q``, ``k`` from
        :func:`shared`), their gradients go there."""
        fused = _fused(q, x)
        nb, b = layout.num_blocks, layout.row_block
        out = _like_rows(x, nb, b)  # (Bf, nb, b, C), filled per run
        lse: Tensor | None = None  # (Bf, nb, b), in the kernel's dtype, made at the first run
        for blocks in layout.chunks(q.shape[0]):
            qb = layout.block_queries(q, blocks)
            empty = layout.run_masks(blocks)[2]
            if fused and layout.in_interior(blocks):  # written into out (no empty rows)
                lse_b = _interior_forward(layout, q, k, x, blocks, out[:, blocks])
            else:  # (Bf, nb', b, C), with the log-sum-exp of each row (Bf, nb', b) if fused
                k_run, x_run = layout.keys(k, blocks), layout.keys(x, blocks)
                if fused:
                    y, lse_b = flash_attention_cpu(
                        qb, k_run, x_run, layout.sdpa_mask(blocks, q.dtype), layout.scale
                    )
                else:
                    y = F.scaled_dot_product_attention(
                        qb, k_run, x_run, attn_mask=layout.sdpa_mask(blocks), scale=layout.scale
                    )
                out[:, blocks] = y if empty is None else y.masked_fill_(empty, 0.0)
                if not fused:
                    continue
            if lse is None:
                lse = lse_b.new_empty(q.shape[0], nb, b)
            lse[:, blocks] = lse_b
        ctx.spec, ctx.fused, ctx.sink, ctx.rows = layout.spec(), fused, sink, rows
        # the kernel's backward needs the output (the next term's input in a series)
        ctx.save_for_backward(q, k, x, key_mask, *((out, lse) if fused else ()))
        return out.flatten(1, 2)[:, rows[0] : rows[1]]  # (Bf, hi - lo, C), a view

    @staticmethod
    def backward(
        ctx: Any, dy: Tensor
    ) -> tuple[None, None, None, Tensor | None, Tensor | None, Tensor | None, None]:
        saved = ctx.saved_tensors  # unpacked once (a checkpointed caller allows no more)
        q, k, x, key_mask = saved[:4]
        spec: Spec = ctx.spec
        layout = WindowLayout(*spec, q.device, key_mask)  # its masks made again
        # with create_graph (double backward) the gradients must be differentiable: plain
        # products then, whose autograd gives the second derivatives (the fused kernel's
        # backward has none), and sums into the buffers by add_ (a view's setitem, `+=`, is
        # refused on a buffer that becomes part of the graph)
        fused = ctx.fused and not torch.is_grad_enabled()
        slabs = _Slabs(layout, q, k, x, work=not fused)  # the fused kernels take half too
        bf, n, g, before = q.shape[0], layout.n, layout.num_global, layout.before
        b, nb = layout.row_block, layout.num_blocks
        acc = torch.float32 if q.dtype in _HALF else q.dtype  # sums of blocks in float32
        sink: GradSink | None = ctx.sink
        dq_rows, dk_pad = (sink or GradSink(layout, q.shape[1])).buffers(q, k, acc)  # in place
        dq = dq_rows.view(bf, nb, b, -1)  # (Bf, nb, b, E)
        dx_pad = sink.values(x, acc) if sink is not None else None  # x: v of a projection
        if dx_pad is None:
            dx_pad = q.new_zeros(bf, dk_pad.shape[1], x.shape[-1], dtype=acc)
        for blocks in layout.chunks(bf):
            dyb = layout.block_rows(dy, blocks, ctx.rows[0])  # (Bf, nb', b, C), 0 past rows
            empty = layout.run_masks(blocks)[2]
            if empty is not None:  # rows set to 0 in the forward pass pass no gradient
                dyb = dyb.masked_fill(empty, 0.0)
            if fused and layout.in_interior(blocks):  # no copies of slabs
                out, lse = (t[:, blocks] for t in saved[4:])  # the kernel takes strides
                dqb, dks, dxs, dkg, dxg = _interior_backward(
                    layout, q, k, x, dyb, out, lse, blocks, dq_rows
                )
                _add_blocks(dq, dk_pad, dx_pad, layout, blocks, (dqb, dks, dxs, dkg, dxg))
                continue
            qb, kb = slabs.queries(blocks), slabs.keys(blocks)  # (Bf, nb', b or g + L, E)
            if fused:
                out, lse = saved[4:]
                dqb, dkb, dxb = flash_attention_cpu_backward(
                    dyb, qb, kb, slabs.values(blocks), out[:, blocks], lse[:, blocks],
                    layout.sdpa_mask(blocks, q.dtype), layout.scale,
                )  # fmt: skip
            else:
                p = slabs.weights(blocks, qb, kb)  # (Bf, nb', b, g + L), recomputed
                dyb = _work(dyb)
                dp = dyb @ slabs.values(blocks).transpose(-1, -2)  # (Bf, nb', b, g + L)
                ds = softmax_backward(dp, p, -1)  # P (dp - rowsum)
                dqb = (ds @ kb).mul_(layout.scale)  # (Bf, nb', b, E)
                dkb = (ds.transpose(-1, -2) @ qb).mul_(layout.scale)
                dxb = p.transpose(-1, -2) @ dyb  # (Bf, nb', g + L, C)
            glob = (dkb[:, :, :g].sum(1), dxb[:, :, :g].sum(1)) if g else (None, None)
            parts = (dqb, dkb[:, :, g:], dxb[:, :, g:], *glob)
            _add_blocks(dq, dk_pad, dx_pad, layout, blocks, parts)
        dx = dx_pad[:, before : before + n].to(x.dtype)
        if sink is not None:  # q and k get theirs once, through shared()
            return None, None, None, None, None, dx, None
        off = layout.q_offset  # q's rows are graph rows off ... off + R - 1
        dq_out = dq_rows[:, off : off + q.shape[1]].to(q.dtype)
        dk_out = dk_pad[:, before : before + n].to(k.dtype)
        return None, None, None, dq_out, dk_out, dx, None


def window_attention(
    layout: WindowLayout,
    q: Tensor,
    k: Tensor,
    x: Tensor,
    sink: GradSink | None = None,
    rows: tuple[int, int] | None = None,
) -> Tensor:
    """``P x`` of the window graph of ``layout`` by :class:`WindowAttention`: ``(Bf, N, ...)``
    -> the graph rows ``rows = (lo, hi)`` (default all ``N``), ``(Bf, hi - lo, C)`` (``sink``:
    ``q``, ``k`` came from :func:`shared`)."""
    lo, hi = rows if rows is not None else (0, layout.n)  # 0 <= lo <= hi <= nb b
    out: Tensor = WindowAttention.apply(layout, sink, (lo, hi), q, k, x, layout.key_mask)
    return out
