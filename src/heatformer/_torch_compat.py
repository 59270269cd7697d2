r"""The private PyTorch ops heatformer calls, each behind a probe and a public fallback.

The window kernels (:mod:`heatformer.graph_ops.window.kernels`) use four names that are not
PyTorch's public API and may change or go away between releases:

====================================================  ==========================================
private name                                          fallback (public ops)
====================================================  ==========================================
``aten._scaled_dot_product_flash_attention_for_cpu``  ``softmax(s q k^T + mask) v`` and its
                                                      log-sum-exp, by plain products
``aten._scaled_dot_product_flash_attention_for_cpu``  the flash-attention backward formulas
``_backward``                                         below, by plain products
``aten._softmax_backward_data``                       ``P * (dP - rowsum(P * dP))``
``torch._C._current_graph_task_id``                   a per-backward-pass counter (see
                                                      :func:`graph_task_id`)
``torch._C._functorch.peek_interpreter_stack``        none: where it is missing, no
                                                      :mod:`torch.func` transform is seen (see
                                                      :func:`func_transforming`)
====================================================  ==========================================

Each is probed once per process, on first use (and, for the kernels, once per dtype): the probe
calls the op on tiny inputs the way the library calls it (an expanded, stride-0 additive mask,
an explicit scale; for half precision also logits past float16's range, which torch 2.4's CPU
kernel formed in float16 and turned into NaN) and compares the result with the fallback; a
missing op, a changed signature or a different result all select the fallback, with one
:class:`TorchCompatWarning` naming the op. :func:`native` reports the choices. The fallbacks
compute the same numbers from public ops; they are slower and keep the ``(rows, keys)`` weights
of one call.

The environment variable ``HEATFORMER_TORCH_COMPAT=fallback`` (read at the first probe) selects
every fallback, to run a test suite through them on a torch that has the private ops.

With ``s`` the scale, ``M`` the additive mask (0 or ``-inf``) and ``dY`` the output's gradient,
the forward and backward of the fused kernel are

.. math::

    S = s\,Q K^\top + M,\quad \ell = \log \textstyle\sum_j e^{S_{:j}},\quad
    P = e^{S - \ell},\quad Y = P V,

    \mathrm{d}V = P^\top \mathrm{d}Y,\quad \mathrm{d}P = \mathrm{d}Y\,V^\top,\quad
    \mathrm{d}S = P \odot (\mathrm{d}P - \mathrm{rowsum}(P \odot \mathrm{d}P)),\quad
    \mathrm{d}Q = s\,\mathrm{d}S\,K,\quad \mathrm{d}K = s\,\mathrm{d}S^\top Q.

Half-precision inputs are computed in float32 (the kernel accumulates in float32 too, and
returns its log-sum-exp in float32); results come back in the inputs' dtype.

Example:
    >>> import torch
    >>> from heatformer import _torch_compat
    >>> p = torch.softmax(torch.tensor([[0.0, 1.0, 2.0]]), -1)
    >>> dp = torch.tensor([[1.0, 0.0, 0.0]])
    >>> torch.allclose(_torch_compat.softmax_backward(dp, p, -1), p * (dp - (p * dp).sum(-1)))
    True
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "TorchCompatWarning",
    "flash_attention_cpu",
    "flash_attention_cpu_backward",
    "func_transforming",
    "graph_task_id",
    "native",
    "sdpa",
    "softmax_backward",
]

_HALF = (torch.float16, torch.bfloat16)
#: the environment variable (and its value) that selects every fallback
ENV, FALLBACK = "HEATFORMER_TORCH_COMPAT", "fallback"
#: the probed ops, by the short names :func:`native` takes
OPS = ("flash_attention_cpu", "softmax_backward", "graph_task_id")


class TorchCompatWarning(UserWarning):
    """A private PyTorch op is missing or differs here; heatformer uses its public fallback."""


# ---- the fallbacks (public ops only) ---------------------------------------------------------


def _work(t: Tensor) -> Tensor:
    return t.float() if t.dtype in _HALF else t


def _scores(q: Tensor, k: Tensor, attn_mask: Tensor | None, scale: float) -> Tensor:
    """``s q k^T + mask`` in the working dtype, ``(..., L, S)``."""
    s = (_work(q) @ _work(k).transpose(-1, -2)).mul_(scale)
    return s if attn_mask is None else s + _work(attn_mask)


def _weights(s: Tensor, lse: Tensor) -> Tensor:
    """``P = exp(S - lse)``; a row without any key (``lse = -inf``) gets weights 0, not NaN."""
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(s - finite.unsqueeze(-1))


def _flash_fallback(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    s = _scores(q, k, attn_mask, scale)  # (..., L, S)
    lse = torch.logsumexp(s, dim=-1)  # (..., L)
    out = _weights(s, lse) @ _work(v)  # (..., L, Ev)
    return out.to(q.dtype), lse


def _flash_backward_fallback(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    attn_mask: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    p = _weights(_scores(q, k, attn_mask, scale), _work(lse))  # (..., L, S), recomputed
    dyw = _work(dy)
    # D = rowsum(dy * out), as the kernel: the row's whole softmax even where k, v hold only
    # some of its keys (lse and out then those of the whole row)
    rowsum = (dyw * _work(out)).sum(-1, keepdim=True)
    ds = p * (dyw @ _work(v).transpose(-1, -2) - rowsum)
    dq = (ds @ _work(k)).mul_(scale)  # (..., L, E)
    dk = (ds.transpose(-1, -2) @ _work(q)).mul_(scale)  # (..., S, E)
    dv = p.transpose(-1, -2) @ dyw  # (..., S, Ev)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _softmax_backward_fallback(grad: Tensor, p: Tensor, dim: int) -> Tensor:
    return p * (grad - (grad * p).sum(dim, keepdim=True))


class _PassCounter:
    """A key per backward pass without ``torch._C._current_graph_task_id``: a counter advanced
    at the first call of a pass and closed by the autograd engine's end-of-pass callback.

    Passes run one after another (the usual case) get distinct keys; passes in parallel threads
    share one. Outside a backward pass the key is ``-1``, as the private function's is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._open = False

    def _close(self) -> None:
        with self._lock:
            self._open = False

    def __call__(self) -> int:
        with self._lock:
            if not self._open:
                try:  # raises outside a backward pass
                    torch.autograd.Variable._execution_engine.queue_callback(self._close)
                except RuntimeError:
                    return -1
                self._count += 1
                self._open = True
            return self._count


_pass_counter = _PassCounter()


# ---- the private ops and their probes --------------------------------------------------------


def _flash_native(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=attn_mask, scale=scale
    )
    return out, lse


def _flash_backward_native(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    attn_mask: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dy, q, k, v, out, lse, 0.0, False, attn_mask=attn_mask, scale=scale
    )
    return dq, dk, dv


def _softmax_backward_native(grad: Tensor, p: Tensor, dim: int) -> Tensor:
    out: Tensor = torch.ops.aten._softmax_backward_data(grad, p, dim, p.dtype)
    return out


def _tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 2e-2)


def _close(got: tuple[Tensor, ...], want: tuple[Tensor, ...], dtype: torch.dtype) -> bool:
    tol = _tolerance(dtype)
    return all(
        a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=tol, rtol=tol)
        for a, b in zip(got, want, strict=True)
    )


def _probe_flash(dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen).to(dtype) for n in (4, 6, 6))
    mask = torch.zeros(4, 6, dtype=dtype)
    mask[0, 5] = mask[3, :2] = float("-inf")
    mask = mask.expand(2, 3, 4, 6)  # stride 0, as a window run's shared pattern
    dy = torch.randn(2, 3, 4, 8, generator=gen).to(dtype)
    out, lse = _flash_native(q, k, v, mask, 0.3)
    grads = _flash_backward_native(dy, q, k, v, out, lse, mask, 0.3)
    ref_out, ref_lse = _flash_fallback(q, k, v, mask, 0.3)
    ref_grads = _flash_backward_fallback(dy, q, k, v, ref_out, ref_lse, mask, 0.3)
    ok = _close((out, lse, *grads), (ref_out, ref_lse, *ref_grads), dtype)
    if dtype in _HALF:  # logits past float16's range (|q.k| > 65504): formed in float32 or NaN
        q, k = q * 300, k * 300
        out, lse = _flash_native(q, k, v, mask, 0.3)
        grads = _flash_backward_native(dy, q, k, v, out, lse, mask, 0.3)
        ok = ok and _close((out, lse), _flash_fallback(q, k, v, mask, 0.3), dtype)
        ok = ok and all(bool(torch.isfinite(g).all()) for g in grads)
    return ok


def _probe_softmax_backward(dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 5, generator=gen), -1).to(dtype)
    grad = torch.randn(3, 5, generator=gen).to(dtype)
    got = _softmax_backward_native(grad, p, -1)
    return _close((got,), (_softmax_backward_fallback(grad, p, -1),), dtype)


def _probe_graph_task_id(dtype: torch.dtype) -> bool:
    del dtype  # one answer for every dtype
    inside: list[int] = []

    class _Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: Tensor) -> Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: object, dy: Tensor) -> Tensor:
            inside.append(torch._C._current_graph_task_id())
            return dy

    # the first call may come from inside a backward pass (no grad mode there): the probe's
    # own pass is then nested, and its id must differ from the enclosing one's
    before = torch._C._current_graph_task_id()
    with torch.inference_mode(False), torch.enable_grad():
        x = torch.zeros(1, requires_grad=True)
        _Probe.apply(x).sum().backward()
    return len(inside) == 1 and isinstance(inside[0], int) and inside[0] not in (-1, before)


_PROBES: dict[str, Callable[[torch.dtype], bool]] = {
    "flash_attention_cpu": _probe_flash,
    "softmax_backward": _probe_softmax_backward,
    "graph_task_id": _probe_graph_task_id,
}
_NAMES = {
    "flash_attention_cpu": "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu"
    " (and _backward)",
    "softmax_backward": "torch.ops.aten._softmax_backward_data",
    "graph_task_id": "torch._C._current_graph_task_id",
}


@functools.cache
def native(op: str, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the private op ``op`` (one of :data:`OPS`) is used for ``dtype`` inputs here:
    probed once per ``(op, dtype)``, False (with one :class:`TorchCompatWarning`) when it is
    missing, refuses the call or disagrees with its fallback, or when
    ``HEATFORMER_TORCH_COMPAT=fallback`` is set."""
    if op not in _PROBES:
        raise ValueError(f"op: expected one of {', '.join(OPS)}, got {op!r}")
    if os.environ.get(ENV) == FALLBACK:
        return False
    try:
        ok = _PROBES[op](dtype)
        reason = "its result differs from the public reference"
    except Exception as err:  # a probe: whatever goes wrong selects the fallback
        ok, reason = False, f"{type(err).__name__}: {err}".splitlines()[0]
    if not ok:
        warnings.warn(
            f"heatformer: {_NAMES[op]} is not usable with torch {torch.__version__} "
            f"({reason}); using the public-op fallback (same numbers, slower)",
            TorchCompatWarning,
            stacklevel=2,
        )
    return ok


# ---- what the library calls ------------------------------------------------------------------


def flash_attention_cpu(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    r"""``softmax(s q k^T + mask) v`` and each row's log-sum-exp: PyTorch's fused CPU
    flash-attention kernel where :func:`native`, else the same by plain products.

    Args:
        q: queries ``(..., L, E)``.
        k: keys ``(..., S, E)``.
        v: values ``(..., S, Ev)``.
        attn_mask: additive mask (0 or ``-inf``) in ``q``'s dtype, broadcast to
            ``(..., L, S)`` (the kernel takes no bool mask); None for none.
        scale: the factor ``s`` of the scores.

    Returns:
        ``(out, lse)``: ``out`` ``(..., L, Ev)`` in ``q``'s dtype, ``lse`` ``(..., L)`` (float32
        for half-precision inputs). A row whose keys are all masked is the caller's to avoid
        (the kernel's result there is unspecified; the fallback's is 0).

    Shape:
        ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)`` ->
        ``(..., L, Ev)``, ``(..., L)``.
    """
    if q.device.type == "cpu" and native("flash_attention_cpu", q.dtype):
        return _flash_native(q, k, v, attn_mask, scale)
    return _flash_fallback(q, k, v, attn_mask, scale)


def flash_attention_cpu_backward(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    attn_mask: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The gradients ``(dq, dk, dv)`` of :func:`flash_attention_cpu` for the output gradient
    ``dy``, from its ``out`` and ``lse``: the fused kernel's backward where :func:`native`,
    else the formulas of the module docstring by plain products (which recompute ``P`` from
    ``lse``). ``out`` and ``lse`` may be those of a longer row (more keys than ``k`` holds):
    the gradients are then the given keys' part of that row's softmax gradient.

    Shape:
        ``dy``, ``out`` ``(..., L, Ev)``, ``q (..., L, E)``, ``k (..., S, E)``,
        ``v (..., S, Ev)``, ``lse (..., L)`` -> the shapes of ``q``, ``k``, ``v``.
    """
    if q.device.type == "cpu" and native("flash_attention_cpu", q.dtype):
        return _flash_backward_native(dy, q, k, v, out, lse, attn_mask, scale)
    return _flash_backward_fallback(dy, q, k, v, out, lse, attn_mask, scale)


def softmax_backward(grad: Tensor, p: Tensor, dim: int) -> Tensor:
    r"""The gradient of the scores of ``p = softmax(s, dim)`` for ``grad = dL/dp``:
    :math:`P \odot (\mathrm{d}P - \mathrm{rowsum}(P \odot \mathrm{d}P))`, by
    ``aten._softmax_backward_data`` where :func:`native`, else by that formula.

    Shape:
        ``grad``, ``p`` of one shape -> that shape.
    """
    if native("softmax_backward", p.dtype):
        return _softmax_backward_native(grad, p, dim)
    return _softmax_backward_fallback(grad, p, dim)


def graph_task_id() -> int:
    """A key of the current backward pass (``-1`` outside one), to tell passes apart.

    ``torch._C._current_graph_task_id()`` where :func:`native`: the autograd engine's id of the
    running pass, distinct even for passes nested in a backward (reentrant checkpointing) or run
    in parallel threads. Else a per-backward-pass counter: advanced by the first call in a pass
    and reset by the engine's end-of-pass callback; distinct for passes run one after another,
    shared by nested passes and by passes running in parallel threads. The window kernels only
    need a key that differs between consecutive passes over one graph.
    """
    if native("graph_task_id"):
        task: int = torch._C._current_graph_task_id()
        return task
    return _pass_counter()


def func_transforming() -> bool:
    """Whether a :mod:`torch.func` transform (``grad``, ``vjp``, ``jacrev``, ``jvp``, ``vmap``,
    ...) is running the call, outside :func:`torch.compile`'s tracing.

    The library's custom autograd Functions keep Python state between their forward and
    backward (the window kernels' shared gradient buffers, keyed by the backward pass; a sparse
    graph's cached transpose) and take storage addresses, which a transform's wrapped tensors
    do not have; inside a transform the graphs compute with plain differentiable ops instead.
    ``torch._C._functorch.peek_interpreter_stack()`` is not None inside one; where the name is
    missing this says False. While :func:`torch.compile` traces, False: the tracer handles the
    transforms it traces itself, and the name is not one it may call.
    """
    if torch.compiler.is_compiling():
        return False
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    r""":func:`torch.nn.functional.scaled_dot_product_attention`, the library's one call of it;
    inside a :mod:`torch.func` transform (:func:`func_transforming`) its math form.

    SDPA's CPU kernels have no ``vmap`` batching rule in torch 2.13: under ``vmap`` (per-sample
    gradients, ``jacrev``) torch runs them once per sample, with a warning per call. The math
    form, ``softmax(s q k^T + M) v`` with ``M`` the mask (bool: ``True`` may attend; or
    additive) and the same ``is_causal`` alignment (top left), uses ops that all batch. Half
    precision computes it in float32, as the fused kernels do.

    Shape:
        ``q`` ``(..., L, E)``, ``k`` ``(..., S, E)``, ``v`` ``(..., S, Ev)``, ``attn_mask``
        broadcast to ``(..., L, S)``; returns ``(..., L, Ev)``.
    """
    if not func_transforming():
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    acc = torch.float32 if q.dtype in _HALF else q.dtype
    s = q.to(acc) @ k.to(acc).transpose(-1, -2)  # (..., L, S)
    s = s * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        attn_mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        s = s.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:  # additive
        s = s + attn_mask
    p = torch.softmax(s, dim=-1)
    if dropout_p:
        p = F.dropout(p, dropout_p)
    return (p @ v.to(acc)).to(v.dtype)
