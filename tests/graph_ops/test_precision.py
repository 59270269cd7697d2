"""Half precision, non-finite inputs and the bounded PPR: the defects of issue 10, pinned.

- float16/bfloat16 top-k graphs propagate (the CSR product runs in float32), forward and
  backward, and return the input dtype;
- the heat kernel at large ``t`` in half precision is finite and right (the dense route runs
  in float64), and so is every dense route in float32;
- personalized PageRank with a tiny ``alpha`` does not run ``ln(1/tol)/alpha`` propagations:
  ``"auto"`` takes the dense solve, ``"series"`` is refused with its cost;
- NaN in, NaN out: a NaN query reaches the same rows in every layout, mask and graph kind
  (as in ``scaled_dot_product_attention``), never a silent zero row.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F

from heatformer.graph_ops import (
    PPR_METHODS,
    DenseGraph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    SoftmaxGraph,
    spectrum,
)
from heatformer.graph_ops.operators import ppr_order
from heatformer.graph_ops.operators.ppr import smallest_alpha
from references import adjacency_reference, laplacian_reference, softmax_reference

HALF = [torch.float16, torch.bfloat16]


def _qkv(dtype: torch.dtype, n: int = 16, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, 8, generator=gen).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_topk_propagates_forward_and_backward(dtype: torch.dtype) -> None:
    q, k, v = (t.requires_grad_(True) for t in _qkv(dtype))
    graph = SoftmaxGraph(q, k, causal=True).topk(4)
    y = graph.propagate(v)
    assert y.dtype == dtype and bool(torch.isfinite(y).all())
    (y.float() ** 2).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.dtype == dtype and bool(torch.isfinite(t.grad).all())
    # the float32 product of the same (rounded) graph, rounded once
    ref = SoftmaxGraph(q.detach().float(), k.detach().float(), causal=True).topk(4)
    expected = ref.propagate(v.detach().float())
    torch.testing.assert_close(y.float(), expected, atol=0.03, rtol=0.03)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_topk_under_autocast(dtype: torch.dtype) -> None:
    """What ``--bf16 --topk`` runs: float32 inputs, top-k graphs built under autocast."""
    q, k, v = _qkv(torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        qp, kp, vp = (t @ torch.eye(8) for t in (q, k, v))  # autocast makes them half
        y = SoftmaxGraph(qp, kp).topk(3).propagate(vp)
    assert y.dtype == dtype and bool(torch.isfinite(y).all())


@pytest.mark.parametrize("dtype", [*HALF, torch.float32], ids=str)
def test_heat_kernel_at_large_t_is_finite_and_right(dtype: torch.dtype) -> None:
    """t = 1e4 is beyond the series, so "auto" takes the exact method; it was all NaN in
    bfloat16 (matrix_exp in half precision) and off by t * 1e-7 in float32."""
    q, k, v = _qkv(dtype, n=32)
    op = HeatKernel(t=1e4)
    y = op(SoftmaxGraph(q, k), v)
    assert y.dtype == dtype and bool(torch.isfinite(y).all())
    p = softmax_reference(q.double().numpy(), k.double().numpy())
    expected = np.empty((*p.shape[:-1], v.shape[-1]))
    for h in range(2):
        lap = laplacian_reference(p[0, h], "rw")
        expected[0, h] = scipy.linalg.expm(-1e4 * lap) @ v[0, h].double().numpy()
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    np.testing.assert_allclose(y.double().numpy(), expected, atol=tol * np.abs(expected).max())


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_spectrum_is_solved_in_float32(dtype: torch.dtype) -> None:
    w = torch.rand(5, 5, generator=torch.Generator().manual_seed(0))
    ev = spectrum(DenseGraph(w.to(dtype)), "sym")
    assert ev.dtype == torch.float32
    expected = np.linalg.eigvalsh(laplacian_reference(w.to(dtype).double().numpy(), "sym"))
    np.testing.assert_allclose(ev.numpy(), expected, atol=1e-5)


def test_ppr_orders_are_bounded_and_small_alpha_takes_the_dense_solve() -> None:
    """alpha = 1e-5 and 1e-9 needed 1,381,544 and 13,815,510,941 propagations (a hang)."""
    assert [PersonalizedPageRank(alpha=a).order for a in (0.15, 0.5)] == [85, 19]
    assert ppr_order(1e-9, 1e-6) > 10**10  # the series' cost, never run
    q, k, x = (t.double() for t in _qkv(torch.float64, n=12))
    graph = SoftmaxGraph(q, k)
    for alpha in (1e-5, 1e-9):
        assert PPR_METHODS["series"].refuse(graph, alpha, "rw", 1e-6) is not None
        y = PersonalizedPageRank(alpha=alpha)(graph, x)
        p = softmax_reference(q.numpy(), k.numpy())
        expected = np.stack([
            alpha * np.linalg.solve(
                np.eye(12) - (1 - alpha) * adjacency_reference(p[0, h], "rw"), x[0, h].numpy()
            )
            for h in range(2)
        ])[None]  # fmt: skip
        # the system's condition number is about 1/alpha: float64 keeps ~1e-16/alpha
        np.testing.assert_allclose(y.numpy(), expected, atol=max(1e-12, 1e-15 / alpha))


def test_ppr_refusals_state_the_cost() -> None:
    with pytest.raises(ValueError, match=r"^alpha: method 'series' refused: needs 13815510551 "
                                         r"propagations .* alpha >= 0\.00276"):  # fmt: skip
        PersonalizedPageRank(alpha=1e-9, method="series")
    q, k, x = _qkv(torch.float32, n=2049, seed=1)
    big = SoftmaxGraph(q[:, :1], k[:, :1])
    with pytest.raises(ValueError, match=r"^method: no personalized-PageRank method accepts"
                                         r".*'series': needs .*'solve': .*N = 2049"):  # fmt: skip
        PersonalizedPageRank(alpha=1e-4)(big, x[:, :1])


def test_ppr_refuses_alpha_below_what_float64_resolves() -> None:
    """``alpha = 1e-17`` (``1 - alpha == 1.0`` in float64) gave +0.0377 where the limit is
    -0.0715, or a raw ``_LinAlgError`` on a singular system; now refused, the floor
    ``2^-53 / tol`` stated, and moved by ``tol``."""
    assert smallest_alpha(1e-6) == 2.0**-53 / 1e-6
    for alpha, tol in ((1e-17, 1e-6), (1e-12, 1e-6), (1e-14, 1e-3)):
        with pytest.raises(ValueError, match=r"^alpha: expected alpha >= \S+ \(2\^-53 / tol"):
            PersonalizedPageRank(alpha=alpha, tol=tol)
    assert PersonalizedPageRank(alpha=1e-12, tol=1e-3).alpha == 1e-12


@pytest.mark.parametrize("tol", [1e-6, 1e-3])
def test_ppr_at_its_smallest_alpha_meets_tol(tol: float) -> None:
    """At the floor the dense solve keeps its rounding below ``tol``: a walk ``A = 1 pi^T``
    (rows sum to 1 only to float64's rounding), whose PPR is ``alpha x + (1 - alpha) 1 pi^T x``
    exactly; measured 0.01 to 0.07 of ``2^-53 / alpha`` on 12 to 2000 nodes."""
    n = 300
    gen = torch.Generator().manual_seed(2)
    w = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    x = torch.randn(n, 1, generator=gen, dtype=torch.float64)
    alpha = 1.01 * smallest_alpha(tol)
    y = PersonalizedPageRank(alpha=alpha, tol=tol)(DenseGraph(w.expand(n, n).clone()), x)
    pi = w / w.sum()
    expected = alpha * x + (1 - alpha) * (pi @ x)
    assert float((y - expected).abs().max()) <= 0.2 * tol * float(x.abs().max())


def test_ppr_limit_is_the_heat_kernel_limit_where_every_node_has_out_edges() -> None:
    """The documented limit ``alpha -> 0``: ``1 pi^T x``, which the converged heat kernel
    computes too (``alpha / g`` apart at a spectral gap ``g``)."""
    q, k, x = (t.double() for t in _qkv(torch.float64, n=12))
    graph = SoftmaxGraph(q, k)
    ppr = PersonalizedPageRank(alpha=1e-9)(graph, x)
    torch.testing.assert_close(ppr, HeatKernel(t=1e300)(graph, x), atol=1e-7, rtol=0)


def test_ppr_dangling_nodes_lose_their_mass() -> None:
    """A node without out-edges keeps only the teleport share alpha x_i (documented; NetworkX
    redistributes it instead)."""
    w = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    x = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    y = PersonalizedPageRank(alpha=0.5)(DenseGraph(w), x).squeeze(-1)
    # y2 = a x2; y1 = a x1 + (1-a) y2; y0 = a x0 + (1-a) y1
    assert torch.allclose(y, torch.tensor([1.5, 2.0, 2.0], dtype=torch.float64))


# ---- NaN in, NaN out ------------------------------------------------------------------------


LAYOUTS = {"2-D": (6, 4), "3-D": (2, 6, 4), "4-D": (1, 2, 6, 4)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nan_query_gives_nan_rows_in_every_layout(layout: str, masked: bool, causal: bool) -> None:
    shape = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    x = torch.randn(*shape[:-1], 3, generator=gen)
    q[..., 2, 1] = math.nan
    mask = torch.ones(6, dtype=torch.bool)
    mask[4] = False  # key 4 padded: the masked paths of every method
    attn_mask = mask.expand(6, 6) if masked else None
    graph = SoftmaxGraph(q, k, mask=attn_mask, causal=causal)
    sdpa = F.scaled_dot_product_attention(
        q, k, x, attn_mask=None if attn_mask is None else attn_mask & ~_future(causal),
        is_causal=causal and attn_mask is None,
    )  # fmt: skip
    expected = sdpa.isnan().any(-1)
    assert bool(expected[..., 2].all()) and not bool(expected[..., 3].any())
    for what, y in {
        "propagate": graph.propagate(x),
        "to_dense": graph.to_dense() @ x,
        "topk": graph.topk(3).propagate(x),
        "laplacian": Laplacian()(graph, x),
    }.items():
        assert torch.equal(y.isnan().any(-1), expected), what


def _future(causal: bool) -> torch.Tensor:
    return torch.ones(6, 6, dtype=torch.bool).triu(1) if causal else torch.zeros(6, 6, dtype=bool)


# ---- large logits in half precision (issue 21) ----------------------------------------------


def _large(dtype: torch.dtype, scale: float = 100.0) -> tuple[torch.Tensor, ...]:
    """The issue's inputs: ``q, k`` of size ``scale`` (the float16 products overflow)."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 40, 16, generator=gen) * scale for _ in "qk")
    v = torch.randn(1, 2, 40, 16, generator=gen)
    return tuple(t.to(dtype) for t in (q, k, v))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "topk"])
def test_large_logits_heat_and_topk_are_finite_and_right(dtype: torch.dtype, sparse: bool) -> None:
    """``HeatKernel()(SoftmaxGraph(q, k, causal=True), v)`` with ``|q|, |k| ~ 100`` was all NaN
    in float16 (the scores overflowed in the materialized graph of the dense series), and so
    was every operator on its top-k graph; forward and backward now agree with float64 on the
    same rounded inputs."""
    q, k, v = (t.requires_grad_(True) for t in _large(dtype))
    assert bool((q.detach() @ k.detach().transpose(-1, -2)).isinf().any()) == (
        dtype == torch.float16
    )
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        graph = SoftmaxGraph(q, k, causal=True)
        y = HeatKernel()(graph.topk(4) if sparse else graph, v)
        y.double().square().sum().backward()
        return y

    y, y64 = run(q, k, v), run(q64, k64, v64)
    assert y.dtype == dtype
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for actual, expected in ((y, y64), (v.grad, v64.grad), (q.grad, q64.grad), (k.grad, k64.grad)):
        assert actual is not None and expected is not None and bool(actual.isfinite().all())
        err = (actual.double() - expected).abs().max()
        assert err <= tol * (expected.abs().max() + 1)


@pytest.mark.parametrize("heads", ["attention:1,heat:1", "laplacian:1,ppr:1"])
@pytest.mark.parametrize("graph", ["softmax", "topk[k=4]"])
def test_large_logits_half_layer_is_finite(heads: str, graph: str) -> None:
    """``DiffusionAttention(..., graph="topk[k=4]").half()`` on inputs of size 300 (projected
    logits past 65504) was NaN forward and backward; finite now, in every parameter's
    gradient."""
    from heatformer.models import DiffusionAttention

    torch.manual_seed(0)
    layer = DiffusionAttention(32, 2, heads, causal=True, graph=graph).half()
    x = (torch.randn(2, 40, 32) * 300).half().requires_grad_(True)
    with torch.no_grad():
        q, k, _ = layer.project_qkv(x)
        assert bool((q @ k.transpose(-1, -2)).isinf().any())  # the regime: float16 overflows
    y = layer(x)
    y.float().sum().backward()  # a linear loss: the true gradients stay in float16's range
    assert y.dtype == torch.float16 and bool(y.isfinite().all())
    grads = [x.grad] + [p.grad for p in layer.parameters() if p.requires_grad]
    assert all(g is not None and bool(g.isfinite().all()) for g in grads)


@pytest.mark.parametrize("scale", [100.0, 1e3, 1e4])
@pytest.mark.parametrize("variant", ["plain", "causal", "mask"])
def test_sdpa_computes_half_precision_logits_in_float32_on_the_cpu(
    scale: float, variant: str
) -> None:
    """What ``SoftmaxGraph.propagate`` relies on: torch's CPU ``scaled_dot_product_attention``
    takes float16 ``q``, ``k`` whose products overflow float16 and stays finite and right
    (it accumulates the logits in float32), forward and backward."""
    q, k, v = (t.requires_grad_(True) for t in _large(torch.float16, scale))
    mask = torch.rand(40, 40, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    kwargs = {"plain": {}, "causal": {"is_causal": True}, "mask": {"attn_mask": mask}}[variant]
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, **kwargs)
    y64 = F.scaled_dot_product_attention(q64, k64, v64, **kwargs)
    (y.double() * y64.detach()).sum().backward()
    (y64 * y64.detach()).sum().backward()
    # the gradient in q multiplies float16-rounded probabilities by keys of the logits' size:
    # its rounding grows with them (0.018 at scale 1e4 on an AVX2 CPU, whose kernel sums in
    # another order than AVX-512's; 1e-2 there)
    checks = ((y, y64, 1e-2), (v.grad, v64.grad, 1e-2), (q.grad, q64.grad, 5e-2))
    for actual, expected, tol in checks:
        assert actual is not None and expected is not None and bool(actual.isfinite().all())
        assert (actual.double() - expected).abs().max() <= tol * (expected.abs().max() + 1)


def test_attention_scores_cannot_overflow_in_half_precision() -> None:
    """The largest finite float16 ``q``, ``k``: ``65504^2 E`` in float32; bfloat16 logits
    exact to float32's rounding instead of bfloat16's (up to 256 off at 65536)."""
    from heatformer.graph_ops._precision import attention_scores

    big = torch.full((1, 16), 65504.0, dtype=torch.float16)
    s = attention_scores(big, -big, 1.0)
    # float32's rounding of the 16-term sum (exact with pairwise sums; a sequential sum, as
    # some CPUs' kernels take, is 1 unit off)
    assert s.dtype == torch.float32
    assert math.isclose(float(s), -(65504.0**2) * 16, rel_tol=2**-22)
    q = torch.tensor([[256.0, 1.0]], dtype=torch.bfloat16)
    k = torch.tensor([[256.0, 1.0]], dtype=torch.bfloat16)
    assert float(attention_scores(q, k, 1.0)) == 65537.0
    assert float(q @ k.T) == 65536.0  # what bfloat16 itself gives
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast is off inside
        assert attention_scores(q.float(), k.float(), 1.0).dtype == torch.float32


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("padded", [False, True], ids=["all-keys", "padded"])
@pytest.mark.parametrize("attention", ["self", "cross", "self-window"])
def test_large_logits_multihead_weights_agree_with_torch(
    dtype: torch.dtype, padded: bool, attention: str
) -> None:
    """``need_weights`` of a converted ``nn.MultiheadAttention`` in half precision, on inputs
    whose float16 logits pass 65504, agree with ``nn.MultiheadAttention``'s own weights in
    float64 (a window graph against its band as ``attn_mask``). They were NaN in float16 for
    cross-attention (scores formed in float16) and for a window graph's dense rows. Integer
    inputs and projections as in the matrix: ``q``, ``k`` are multiples of 32 below 2048,
    exact in every dtype, so the logits are exact in float32 and the softmax one-hot."""
    from heatformer.integrations.torch import MultiheadDiffusionAttention

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        weight = torch.randint(-1, 2, mha.in_proj_weight.shape, generator=gen).float()
        weight[:32] *= 32  # the query and key rows
        mha.in_proj_weight.copy_(weight)
        mha.in_proj_bias.zero_()
    mha = mha.to(dtype)
    x, memory = (torch.randint(-4, 5, (2, n, 16), generator=gen).to(dtype) for n in (7, 9))
    kv = memory if attention == "cross" else x
    window = attention == "self-window"
    ours = MultiheadDiffusionAttention.from_mha(mha, graph="window[w=2]" if window else "softmax")
    reference = copy.deepcopy(mha).double()
    pad = torch.zeros(2, kv.shape[1], dtype=torch.bool)
    pad[1, :3] = padded  # True = padding (nn.MultiheadAttention's polarity)
    gap = torch.arange(7)[:, None] - torch.arange(7)
    band = {"attn_mask": gap.abs() > 2} if window else {}  # True = not allowed (torch's)
    with torch.no_grad():
        q = F.linear(x.double(), reference.in_proj_weight[:16])
        k = F.linear(kv.double(), reference.in_proj_weight[16:32])
        q, k = (t.half().view(2, -1, 2, 8).transpose(1, 2) for t in (q, k))  # (B, H, L, Dh)
        assert bool((q @ k.transpose(-1, -2)).isinf().any())  # the regime: float16 overflows
        kwargs = {"key_padding_mask": pad, "average_attn_weights": False}
        got = ours(x, kv, kv, **kwargs)[1]
        expected = reference(x.double(), kv.double(), kv.double(), **kwargs, **band)[1]
    expected = expected.nan_to_num(0.0)  # a row without keys: 0 here, NaN in torch (documented)
    assert got.dtype == dtype and bool(got.isfinite().all())
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    assert float((got.double() - expected).abs().max()) <= tol
