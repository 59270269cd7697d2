"""The probes and public fallbacks of :mod:`heatformer._torch_compat`.

Each fallback must equal the private op it stands in for on this torch (so the fallbacks are
tested where the probes succeed) and an independent reference (SDPA and autograd in float64);
the probes must turn a missing or wrong op into the fallback, with a warning; and the window
graphs, with every probe forced off, must still equal the dense masked softmax in values and
gradients.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from heatformer import _torch_compat as tc
from heatformer.graph_ops import HeatKernel, SoftmaxGraph, WindowGraph

F64 = torch.float64
HALF = [torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _inputs(dtype: torch.dtype, mask: str, seed: int = 0):
    """q ``(2, 3, 5, 8)``, k, v ``(2, 3, 7, 8)``, an output gradient and a mask of the kind
    ``mask``: an expanded (stride-0) additive pattern, a full one, or none."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen).to(dtype) for n in (5, 7, 7))
    dy = torch.randn(2, 3, 5, 8, generator=gen).to(dtype)
    allowed = torch.rand(2, 3, 5, 7, generator=gen) > 0.4
    allowed[..., 0] = True  # every row has a key
    pattern = torch.zeros(5, 7, dtype=dtype).masked_fill_(~allowed[0, 0], float("-inf"))
    masks = {
        "expanded": pattern.expand(2, 3, 5, 7),
        "additive": torch.zeros(2, 3, 5, 7, dtype=dtype).masked_fill_(~allowed, float("-inf")),
        "none": None,
    }
    return q, k, v, dy, masks[mask]


def _sdpa_reference(q, k, v, dy, attn_mask, scale):
    """Output, log-sum-exp and ``(dq, dk, dv)`` by SDPA and autograd, in float64."""
    q, k, v = (t.detach().to(F64).requires_grad_() for t in (q, k, v))
    mask = None if attn_mask is None else attn_mask.to(F64)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    grads = torch.autograd.grad(out, (q, k, v), dy.to(F64))
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    return out.detach(), torch.logsumexp(s, -1).detach(), grads


def _assert_close(got, want, dtype):
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b.double(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize(
    ("dtype", "mask"),
    list(itertools.product([F64, torch.float32, *HALF], ["expanded", "additive", "none"])),
)
def test_flash_fallback_equals_the_cpu_kernel_and_sdpa(dtype, mask) -> None:
    q, k, v, dy, attn_mask = _inputs(dtype, mask)
    out, lse = tc._flash_fallback(q, k, v, attn_mask, 0.3)
    grads = tc._flash_backward_fallback(dy, q, k, v, out, lse, attn_mask, 0.3)
    assert out.dtype == dtype and lse.dtype == (torch.float32 if dtype in HALF else dtype)
    assert [g.dtype for g in grads] == [dtype] * 3
    ref_out, ref_lse, ref_grads = _sdpa_reference(q, k, v, dy, attn_mask, 0.3)
    _assert_close((out, lse, *grads), (ref_out, ref_lse, *ref_grads), dtype)
    n_out, n_lse = tc._flash_native(q, k, v, attn_mask, 0.3)  # the private kernels, directly
    n_grads = tc._flash_backward_native(dy, q, k, v, n_out, n_lse, attn_mask, 0.3)
    assert n_lse.dtype == lse.dtype
    _assert_close((out, lse, *grads), (n_out, n_lse, *n_grads), dtype)


@pytest.mark.parametrize("path", ["fallback", "native"])
def test_flash_backward_on_some_keys_of_a_row_gives_their_part_of_its_gradient(path) -> None:
    """With the ``out`` and ``lse`` of the whole row (all 7 keys), the backward on keys 0-2
    and on keys 3-6 gives those keys' gradients of the whole row's softmax (autograd of SDPA),
    and their ``dq`` add up to the row's: what the window kernels' global keys rely on."""
    if path == "native" and not tc.native("flash_attention_cpu", F64):
        pytest.skip("no native flash kernel here")
    q, k, v, dy, mask = _inputs(F64, "additive")
    out, lse = tc._flash_fallback(q, k, v, mask, 0.3)
    backward = tc._flash_backward_fallback if path == "fallback" else tc._flash_backward_native
    parts = [backward(dy, q, k[..., s, :], v[..., s, :], out, lse, mask[..., s], 0.3)
             for s in (slice(0, 3), slice(3, 7))]  # fmt: skip
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    y = F.scaled_dot_product_attention(qa, ka, va, attn_mask=mask, scale=0.3)
    want = torch.autograd.grad(y, (qa, ka, va), dy)
    torch.testing.assert_close(parts[0][0] + parts[1][0], want[0], atol=1e-12, rtol=1e-10)
    for i in (1, 2):
        got = torch.cat([parts[0][i], parts[1][i]], dim=-2)
        torch.testing.assert_close(got, want[i], atol=1e-12, rtol=1e-10)


def test_flash_fallback_gives_zero_for_a_row_without_keys() -> None:
    """No NaN from ``exp(-inf - -inf)``: such a row's weights, output and gradients are 0."""
    q, k, v, dy, _ = _inputs(F64, "none")
    mask = torch.zeros(5, 7, dtype=F64)
    mask[2] = float("-inf")
    out, lse = tc._flash_fallback(q, k, v, mask, 0.5)
    dq, dk, dv = tc._flash_backward_fallback(dy, q, k, v, out, lse, mask, 0.5)
    assert torch.isinf(lse[..., 2]).all() and out[..., 2, :].abs().max() == 0
    assert dq[..., 2, :].abs().max() == 0
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv))
    keep = [0, 1, 3, 4]  # the other rows: as without the empty row
    ref = tc._flash_fallback(q[..., keep, :], k, v, mask[keep], 0.5)[0]
    torch.testing.assert_close(out[..., keep, :], ref, atol=1e-14, rtol=0)


@pytest.mark.parametrize("dtype", [F64, torch.float32, *HALF])
def test_softmax_backward_fallback_equals_the_private_op_and_autograd(dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    s = torch.randn(3, 4, 9, generator=gen, dtype=F64).masked_fill_(
        torch.rand(3, 4, 9, generator=gen) > 0.7, float("-inf")
    )
    s[..., 0] = 0.0
    grad = torch.randn(3, 4, 9, generator=gen, dtype=F64)
    for dim in (-1, 1):
        p = torch.softmax(s, dim)
        sr = s.clone().requires_grad_()
        (want,) = torch.autograd.grad(torch.softmax(sr, dim), sr, grad)
        want = want.nan_to_num()  # -inf scores: autograd's 0 * inf; both formulas give 0
        pd, gd = p.to(dtype), grad.to(dtype)
        got = tc._softmax_backward_fallback(gd, pd, dim)
        private = torch.ops.aten._softmax_backward_data(gd, pd, dim, pd.dtype)
        _assert_close((got,), (want,), dtype if dtype not in HALF else torch.bfloat16)
        _assert_close((got,), (private,), dtype)
        _assert_close((tc.softmax_backward(gd, pd, dim),), (private,), dtype)


class _Keys(torch.autograd.Function):
    """Identity whose backward records the pass key (twice, as two products of one pass do)."""

    seen: list[int] = []  # noqa: RUF012 - a record for the test

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        _Keys.seen += [tc.graph_task_id(), tc.graph_task_id()]
        return dy


@pytest.mark.parametrize("native", [True, False])
def test_graph_task_id_is_one_key_per_backward_pass(monkeypatch, native) -> None:
    """Both keys (the engine's id and the per-pass counter): -1 outside a pass, one key for all
    calls in a pass, a new key for each later pass (also of a retained graph)."""
    if native:
        assert tc.native("graph_task_id")  # this torch has it
    else:
        monkeypatch.setattr(tc, "native", lambda op, dtype=None: False)
    _Keys.seen = []
    assert tc.graph_task_id() == -1
    x = torch.ones(3, requires_grad=True)
    y = (_Keys.apply(x) * _Keys.apply(x)).sum()  # two nodes in one pass
    y.backward(retain_graph=True)
    y.backward()
    (_Keys.apply(x).sum()).backward()
    first, second, third = _Keys.seen[:4], _Keys.seen[4:8], _Keys.seen[8:]
    assert len(set(first)) == len(set(second)) == len(set(third)) == 1
    assert len({first[0], second[0], third[0]}) == 3 and min(_Keys.seen) >= 0
    assert tc.graph_task_id() == -1


def test_native_names_its_ops_and_honours_the_environment(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"^op: expected one of flash_attention_cpu"):
        tc.native("flash")
    monkeypatch.setenv(tc.ENV, tc.FALLBACK)
    tc.native.cache_clear()
    try:
        assert not any(tc.native(op) for op in tc.OPS)
    finally:
        monkeypatch.delenv(tc.ENV)
        tc.native.cache_clear()
    assert all(tc.native(op) for op in tc.OPS)  # this torch has all of them, and they agree


@pytest.mark.parametrize(
    ("target", "fault"),
    [
        ("_flash_native", "missing"),
        ("_flash_native", "wrong"),
        ("_flash_backward_native", "wrong"),
        ("_softmax_backward_native", "missing"),
        ("_softmax_backward_native", "wrong"),
    ],
)
def test_a_missing_or_wrong_private_op_selects_the_fallback_with_a_warning(
    monkeypatch, target, fault
) -> None:
    original = getattr(tc, target)

    def faulty(*args, **kwargs):
        if fault == "missing":
            raise AttributeError("'_OpNamespace' 'aten' object has no attribute 'x'")
        got = original(*args, **kwargs)
        return got * 1.01 if isinstance(got, torch.Tensor) else tuple(t * 1.01 for t in got)

    monkeypatch.setattr(tc, target, faulty)
    op = "softmax_backward" if "softmax" in target else "flash_attention_cpu"
    tc.native.cache_clear()
    try:
        reason = "AttributeError" if fault == "missing" else "differs from the public reference"
        with pytest.warns(tc.TorchCompatWarning, match=f"not usable with torch .*{reason}"):
            assert not tc.native(op, torch.float32)
        q, k, v, dy, mask = _inputs(torch.float32, "expanded")
        if op == "flash_attention_cpu":  # the public functions now give the fallback's numbers
            out, lse = tc.flash_attention_cpu(q, k, v, mask, 0.3)
            want = tc._flash_fallback(q, k, v, mask, 0.3)
            assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
            grads = tc.flash_attention_cpu_backward(dy, q, k, v, out, lse, mask, 0.3)
            want = tc._flash_backward_fallback(dy, q, k, v, out, lse, mask, 0.3)
            assert all(torch.equal(a, b) for a, b in zip(grads, want, strict=True))
        else:
            p = torch.softmax(q, -1)
            got = tc.softmax_backward(dy, p, -1)
            assert torch.equal(got, tc._softmax_backward_fallback(dy, p, -1))
    finally:
        tc.native.cache_clear()


def test_a_kernel_that_forms_float16_logits_in_float16_selects_the_fallback(monkeypatch) -> None:
    """torch 2.4's CPU flash kernel formed float16 logits in float16 (NaN past 65504): the probe
    refuses such a kernel for float16, where it is wrong, and keeps it for float32."""

    def half_logits(q, k, v, attn_mask, scale):
        s = (q @ k.transpose(-1, -2)) * scale + attn_mask  # in the inputs' dtype
        p = torch.softmax(s.float(), -1)
        return (p @ v.float()).to(q.dtype), torch.logsumexp(s.float(), -1)

    monkeypatch.setattr(tc, "_flash_native", half_logits)
    tc.native.cache_clear()
    try:
        with pytest.warns(tc.TorchCompatWarning, match="differs from the public reference"):
            assert not tc.native("flash_attention_cpu", torch.float16)
        assert tc.native("flash_attention_cpu", torch.float32)
    finally:
        tc.native.cache_clear()


# ---- the window graphs through the fallbacks --------------------------------------------------


@pytest.fixture
def fallbacks(monkeypatch) -> Iterator[dict[str, int]]:
    """Every probe forced off; counts the calls of each fallback."""
    calls = dict.fromkeys(("flash", "flash_backward", "softmax_backward", "graph_task_id"), 0)

    def counted(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(tc, "native", lambda op, dtype=None: False)
    monkeypatch.setattr(tc, "_flash_fallback", counted("flash", tc._flash_fallback))
    monkeypatch.setattr(
        tc, "_flash_backward_fallback", counted("flash_backward", tc._flash_backward_fallback)
    )
    monkeypatch.setattr(
        tc,
        "_softmax_backward_fallback",
        counted("softmax_backward", tc._softmax_backward_fallback),
    )
    monkeypatch.setattr(tc, "_pass_counter", counted("graph_task_id", tc._pass_counter))
    yield calls


def _band(n: int, w: int, causal: bool, g: int) -> torch.Tensor:
    """The dense mask of a window graph, from its definition."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    band = ((i - j >= 0) & (i - j < w)) if causal else (i - j).abs() <= w
    glob = (i < g) | (j < g)
    return band | (glob & (i >= j)) if causal else band | glob


@pytest.mark.parametrize(
    ("causal", "g", "fused"), list(itertools.product([True, False], [0, 2], [True, False]))
)
def test_window_graphs_through_the_fallbacks_equal_the_dense_graph(
    monkeypatch, fallbacks, causal, g, fused
) -> None:
    """Products, a heat series and their gradients in q, k, x (one graph used many times, a
    retained graph's second pass and a pass that stops short of q and k, which the per-pass
    counter must keep apart) equal the dense masked softmax's."""
    from heatformer.graph_ops.window import kernels

    monkeypatch.setattr(kernels, "FUSED_CPU", fused)
    n, w = 23, 3
    gen = torch.Generator().manual_seed(7)
    q, k, x = (torch.randn(2, 2, n, 3, generator=gen, dtype=F64, requires_grad=True)
               for _ in range(3))  # fmt: skip
    graph = WindowGraph(q, k, window=w, causal=causal, num_global=g, row_block=4)
    dense = SoftmaxGraph(q, k, mask=_band(n, w, causal, g))

    def loss(G):
        return (HeatKernel(t=1.0, tol=1e-12)(G, x) ** 2).sum() + (G.propagate(x) ** 3).sum()

    torch.testing.assert_close(graph.propagate(x), dense.propagate(x), atol=1e-12, rtol=1e-10)
    expected = torch.autograd.grad(loss(dense), (q, k, x))
    y = loss(graph)
    (gx,) = torch.autograd.grad(y, (x,), retain_graph=True)  # not reaching q and k
    torch.testing.assert_close(gx, expected[2], atol=1e-11, rtol=1e-9)
    for _ in range(2):
        got = torch.autograd.grad(y, (q, k, x), retain_graph=True)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)
    used = ("flash", "flash_backward") if fused else ("softmax_backward",)
    assert all(fallbacks[name] > 0 for name in (*used, "graph_task_id")), fallbacks


def test_a_window_graph_through_the_fallbacks_passes_gradcheck(fallbacks) -> None:
    n = 11
    gen = torch.Generator().manual_seed(3)
    q, k, x = (torch.randn(1, 2, n, 3, generator=gen, dtype=F64, requires_grad=True)
               for _ in range(3))  # fmt: skip
    key_mask = torch.ones(1, n, dtype=torch.bool)
    key_mask[0, :3] = False

    def f(q, k, x):
        graph = WindowGraph(q, k, window=3, causal=True, num_global=1, key_mask=key_mask,
                            row_block=4)  # fmt: skip
        return graph.propagate(graph.propagate(x))

    assert torch.autograd.gradcheck(f, (q, k, x))
    assert fallbacks["flash_backward"] > 0 and fallbacks["graph_task_id"] > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_sdpa_inside_vmap_is_sdpa_per_sample_without_a_loop(dtype, mask) -> None:
    """``tc.sdpa`` under ``vmap`` (its math form) equals SDPA on each sample, and batches:
    no 'performance drop' warning, the sign that torch loops over the samples."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 4, dtype=dtype) for _ in range(3))
    allowed = torch.rand(5, 5) < 0.6
    allowed[:, 0] = True  # every row keeps a key
    kwargs: dict = {
        "none": {},
        "bool": {"attn_mask": allowed},
        "additive": {"attn_mask": torch.zeros(5, 5, dtype=dtype).masked_fill(~allowed, -1e4)},
        "causal": {"is_causal": True},
    }[mask]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.func.vmap(lambda a, b, c: tc.sdpa(a, b, c, scale=0.7, **kwargs))(q, k, v)
    assert not [w for w in caught if "performance drop" in str(w.message)]
    want = F.scaled_dot_product_attention(q, k, v, scale=0.7, **kwargs)
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
