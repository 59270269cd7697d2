"""Sliding-window and global-token graphs against the dense softmax with the same mask.

``WindowGraph`` must equal ``SoftmaxGraph(q, k, mask=band)`` -- forward, backward, transpose
products, degrees, dense weights, top-k -- for causal and bidirectional windows, global tokens,
key masks (with and without dropping padded queries) and every block size, while never forming
an ``N x N`` tensor; a rolling KV cache keeps only the keys the window needs.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graph_helpers import band_mask
from heatformer.graph_ops import (
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    SoftmaxGraph,
    WindowGraph,
    resolve_graph,
)
from heatformer.graph_ops.window.graph import trusted_window_graph
from heatformer.models import GPT, DiffusionAttention, GPTConfig, KVCache

F64 = torch.float64


CASES = [
    pytest.param(n, w, causal, g, masked, drop, rb, id=f"n{n}-w{w}-{'c' if causal else 'b'}"
                 f"-g{g}{'-m' if masked else ''}{'-d' if drop else ''}-rb{rb}")
    for n, w, causal, g, masked, drop, rb in itertools.product(
        [1, 6, 23], [1, 4], [False, True], [0, 2], [False, True], [False, True], [None, 5]
    )
    if g <= n and (masked or not drop)
]  # fmt: skip


def _make(n, w, causal, g, masked, drop, rb, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, n, 4, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(2, 2, n, 4, generator=gen, dtype=F64, requires_grad=True)
    x = torch.randn(2, 2, n, 3, generator=gen, dtype=F64, requires_grad=True)
    key_mask = None
    if masked:
        key_mask = torch.ones(2, n, dtype=torch.bool)
        key_mask[1, : max(1, n // 3)] = False  # left padding: causal rows without edges
    window = WindowGraph(q, k, window=w, causal=causal, num_global=g, key_mask=key_mask,
                         drop_masked_queries=drop, row_block=rb)  # fmt: skip
    dense = SoftmaxGraph(q, k, mask=band_mask(n, w, causal, g, key_mask, drop))
    return window, dense, (q, k, x)


@pytest.mark.parametrize(("n", "w", "causal", "g", "masked", "drop", "rb"), CASES)
def test_window_graph_equals_the_dense_masked_softmax(n, w, causal, g, masked, drop, rb):
    window, dense, (q, k, x) = _make(n, w, causal, g, masked, drop, rb)
    for name, fn in {
        "propagate": lambda G: G.propagate(x),
        "propagate_transpose": lambda G: G.propagate_transpose(x),
        "to_dense": lambda G: G.to_dense(),
        "out_degree": lambda G: G.out_degree(),
        "in_degree": lambda G: G.in_degree(),
        "sym laplacian": lambda G: Laplacian("sym")(G, x),
        "heat": lambda G: HeatKernel(t=2.0, tol=1e-12)(G, x),
        "ppr comb": lambda G: PersonalizedPageRank(0.3, "combinatorial", tol=1e-12)(G, x),
    }.items():
        torch.testing.assert_close(fn(window), fn(dense), atol=1e-12, rtol=1e-10, msg=name)

    # gradients into q, k and x, through both products
    def loss(G):
        return (G.propagate(x) ** 2).sum() + (G.propagate_transpose(x) ** 2).sum()

    for a, b in zip(torch.autograd.grad(loss(window), (q, k, x)),
                    torch.autograd.grad(loss(dense), (q, k, x)), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize(("n", "w", "causal", "g", "masked", "drop", "rb"), CASES[::3])
def test_topk_inside_the_window_equals_topk_of_the_banded_matrix(n, w, causal, g, masked, drop, rb):
    window, dense, (q, k, x) = _make(n, w, causal, g, masked, drop, rb, seed=1)
    k_top = min(3, n)
    a, b = window.topk(k_top), dense.topk(k_top)
    assert a.num_edges == b.num_edges == 4 * n * k_top  # exactly k per row
    torch.testing.assert_close(a.to_dense(), b.to_dense(), atol=1e-12, rtol=1e-10)
    ga = torch.autograd.grad((a.propagate(x) ** 2).sum(), (q, k))
    gb = torch.autograd.grad((b.propagate(x) ** 2).sum(), (q, k))
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, v, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize(
    ("causal", "g", "masked", "path"),
    list(itertools.product([False, True], [0, 2], [False, True], ["fused", "generic", "narrow"])),
)
def test_propagate_gradcheck(monkeypatch, causal: bool, g: int, masked: bool, path: str) -> None:
    """The backward of ``propagate`` (used twice on one graph) against finite differences, in
    float64, with a last block shorter than the others: the fused CPU kernels (values as wide
    as the keys), the generic recomputing path (forced, and for narrower values)."""
    from heatformer.graph_ops.window import kernels

    monkeypatch.setattr(kernels, "FUSED_CPU", path == "fused")
    n = 11
    gen = torch.Generator().manual_seed(3)
    q, k, x = (torch.randn(1, 2, n, d, generator=gen, dtype=F64, requires_grad=True)
               for d in (3, 3, 2 if path == "narrow" else 3))  # fmt: skip
    key_mask = None
    if masked:
        key_mask = torch.ones(1, n, dtype=torch.bool)
        key_mask[0, :3] = False

    def f(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        graph = WindowGraph(q, k, window=3, causal=causal, num_global=g, key_mask=key_mask,
                            row_block=4)  # fmt: skip
        return graph.propagate(graph.propagate(x))  # the slabs of one graph, used twice

    assert torch.autograd.gradcheck(f, (q, k, x))


@pytest.mark.parametrize("width", [3, 2])  # values as wide as the keys (fused) or not
def test_checkpointed_series_on_a_window_graph_equals_the_dense_graph(monkeypatch, width) -> None:
    """Heat, PPR and polynomial series recompute each term in the backward above
    CHECKPOINT_ELEMENTS (lowered here to every size): the window graph's gradients then
    still equal those of the dense masked softmax."""
    from heatformer.graph_ops import Polynomial, heat

    monkeypatch.setattr(heat, "CHECKPOINT_ELEMENTS", 1)
    n, w = 13, 3
    gen = torch.Generator().manual_seed(5)
    q, k, x = (torch.randn(2, 2, n, d, generator=gen, dtype=F64, requires_grad=True)
               for d in (3, 3, width))  # fmt: skip
    mask = band_mask(n, w, True, 1, None, False)
    for op in (HeatKernel(t=1.5), PersonalizedPageRank(alpha=0.3), Polynomial([0.5, 0.3, 0.2])):
        outs = []
        for graph in (WindowGraph(q, k, window=w, causal=True, num_global=1, row_block=4),
                      SoftmaxGraph(q, k, mask=mask)):  # fmt: skip
            y = op(graph, x)
            grads = torch.autograd.grad((y * torch.cos(y)).sum(), (q, k, x))
            outs.append((y, *grads))
        for u, v in zip(*outs, strict=True):
            torch.testing.assert_close(u, v, atol=1e-10, rtol=1e-8)


def test_a_long_window_graph_never_forms_n_by_n() -> None:
    """131072 nodes: an N x N float32 tensor would take 64 GiB, more than this machine has."""
    n = 1 << 17
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, n, 8, generator=gen) for _ in range(2))
    x = torch.randn(1, 1, n, 2, generator=gen)
    graph = WindowGraph(q, k, window=8, causal=True, num_global=1)
    y, yt = graph.propagate(x), graph.propagate_transpose(x)
    assert y.shape == yt.shape == (1, 1, n, 2) and bool(torch.isfinite(y).all())
    # row n-1 by hand: its 8 most recent keys and the global key 0
    cols = torch.tensor([0, *range(n - 8, n)])
    p = torch.softmax((q[0, 0, -1] @ k[0, 0, cols].T) / 8**0.5, -1)
    torch.testing.assert_close(y[0, 0, -1], p @ x[0, 0, cols], atol=1e-5, rtol=1e-5)
    # mass: the column sums (in-degrees) of a row-stochastic graph add up to N
    torch.testing.assert_close(graph.in_degree().sum(), torch.tensor(float(n)), rtol=1e-4, atol=0)
    assert graph.topk(4).num_edges == 4 * n


@pytest.mark.parametrize("spec", ["window[w=3]", "window[w=2,global=2]"])
def test_rolling_kv_cache_keeps_at_most_w_plus_g_keys_and_equals_recomputation(spec) -> None:
    builder = resolve_graph(spec)
    first, last = builder.cache_keep()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=24, n_layer=2, n_head=2, n_embd=8,
                          heads="attention:1,laplacian:1", graph=spec)).double().eval()  # fmt: skip
    assert model.supports_cache
    idx = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(1))
    full = model(idx)
    caches = [KVCache() for _ in model.blocks]
    steps = [model(idx[:, :6], caches)]
    for i in range(6, 20):
        steps.append(model(idx[:, i : i + 1], caches))
        assert all(c.length <= first + last for c in caches)
        assert all(sorted(c.positions.tolist())[:first] == list(range(first)) for c in caches)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("spec", ["softmax", "topk[k=3]", "window[w=2]", "window[w=2,global=1]"])
def test_layer_graphs_support_topk_dense_and_propagate_for_every_kind(spec) -> None:
    layer = DiffusionAttention(8, 2, "attention:2", graph=spec, causal=True, dtype=F64)
    x = torch.randn(2, 7, 8, dtype=F64)
    graph = layer.graphs(x)
    assert tuple(graph.batch_shape) == (2, 2) and graph.num_nodes == 7
    sparse = graph.topk(2)
    assert sparse.num_edges == 2 * 2 * 7 * 2
    v = torch.randn(2, 2, 7, 3, dtype=F64)
    torch.testing.assert_close(graph.propagate(v), graph.to_dense() @ v, atol=1e-12, rtol=0)


def test_window_spec_errors_name_the_graph() -> None:
    with pytest.raises(ValueError, match=r"^graph: in 'window\[w=0\]': w: expected"):
        resolve_graph("window[w=0]")
    with pytest.raises(ValueError, match=r"^graph: in 'window\[w=2,global=-1\]': global:"):
        resolve_graph("window[w=2,global=-1]")
    with pytest.raises(ValueError, match=r"^graph: window: unknown parameter\(s\) \['width'\]"):
        resolve_graph("window[width=2]")
    with pytest.raises(ValueError, match=r"^graph: window\[w=2,global=9\]: expected at most"):
        GPTConfig(block_size=8, graph="window[w=2,global=9]")
    assert resolve_graph("window[w=4,global=0]").spec == "window[w=4]"
    # a key given twice, or under its two names, is refused (the last one silently won)
    for spec, match in [
        ("window[w=4,w=8]", r"^graph: expected each key once in 'window\[w=4,w=8\]', got 'w'"),
        ("window[w=4;w=4]", r"^graph: expected each key once"),
        ("window[w=4,global=1,num_global=2]", r"^graph: expected one of 'global' and 'num_global'"),
    ]:
        with pytest.raises(ValueError, match=match) as info:
            resolve_graph(spec)
        assert info.value.argument == "graph"  # type: ignore[attr-defined]


def test_the_builder_checks_once_and_makes_the_graph_without_the_constructor(monkeypatch) -> None:
    """``WindowBuilder.build`` checks its call's arguments itself (the window and the global
    tokens were checked when it was made) and makes the graph by the trusted path: the public
    constructor, whose checks a layer would pay on every forward, is not called."""
    builder = resolve_graph("window[w=2,global=1]")
    q, k = torch.randn(2, 3, 7, 4, dtype=F64), torch.randn(2, 3, 7, 4, dtype=F64)
    want = WindowGraph(q, k, window=2, num_global=1, causal=True).propagate(k)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the builder called WindowGraph.__init__")

    monkeypatch.setattr(WindowGraph, "__init__", refuse)
    got = builder.build(q, k, causal=True).propagate(k)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    # and refuses what the constructor would, naming the argument
    bad = [
        ((q.long(), k), {}, TypeError, r"^q: expected"),
        ((q, k.float()), {}, TypeError, r"^k: expected the dtype of q"),
        ((q, k[..., :5, :]), {}, ValueError, r"^k: expected shape"),
        ((q, torch.randn(4, 3, 7, 4, dtype=F64)), {}, ValueError, r"^k: expected batch dims"),
        ((q, k), {"causal": 1}, TypeError, r"^causal: expected a bool"),
        ((q, k), {"drop_masked_queries": None}, TypeError, r"^drop_masked_queries: expected"),
        ((q, k), {"row_block": 0}, ValueError, r"^row_block: expected"),
        ((q, k), {"key_mask": torch.ones(2, 6, dtype=torch.bool)}, ValueError, r"^key_mask:"),
    ]
    for args, kwargs, error, match in bad:
        with pytest.raises(error, match=match):
            builder.build(*args, **kwargs)


def test_slabs_made_without_grad_do_not_serve_a_backward() -> None:
    """The key slabs are shared between propagations of one graph; a no-grad one first must
    not cut the gradient of a later one."""
    window, dense, (q, k, x) = _make(9, 3, True, 0, False, False, None)
    with torch.no_grad():
        window.propagate(x)
    a = torch.autograd.grad(window.propagate(x).sum(), (q, k))
    b = torch.autograd.grad(dense.propagate(x).sum(), (q, k))
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    ("causal", "g", "fused"), list(itertools.product([True, False], [0, 2], [True, False]))
)
def test_interior_runs_share_one_mask_and_equal_the_dense_graph(monkeypatch, causal, g, fused):
    """Long enough for interior blocks (one shared mask pattern, expanded) and small runs (a
    lowered SLAB_ELEMENTS): runs never straddle the interior's ends, interior masks take no
    memory per block, and products, gradients and a heat series equal the dense graph's."""
    from heatformer.graph_ops.window import kernels
    from heatformer.graph_ops.window import layout as window_layout

    monkeypatch.setattr(kernels, "FUSED_CPU", fused)
    monkeypatch.setattr(window_layout, "SLAB_ELEMENTS", 300)
    n, w, rb = 61, 3, 4
    gen = torch.Generator().manual_seed(7)
    q, k, x = (torch.randn(2, 2, n, 3, generator=gen, dtype=F64, requires_grad=True)
               for _ in range(3))  # fmt: skip
    graph = WindowGraph(q, k, window=w, causal=causal, num_global=g, row_block=rb)
    dense = SoftmaxGraph(q, k, mask=band_mask(n, w, causal, g, None, False))
    layout = graph.layout
    lo, hi = layout.interior()
    runs = layout.chunks(4)
    assert 0 < lo < hi < layout.num_blocks and len(runs) > 3
    assert all(r.stop <= lo or lo <= r.start < r.stop <= hi or r.start >= hi for r in runs)
    inside = [r for r in runs if lo <= r.start and r.stop <= hi]
    storages = {layout.run_masks(r)[0].untyped_storage().data_ptr() for r in inside}
    additive = {layout.sdpa_mask(r, F64).untyped_storage().data_ptr() for r in inside}
    assert inside and len(storages) == len(additive) == 1  # one pattern, shared

    def loss(G):
        return (HeatKernel(t=1.0, tol=1e-12)(G, x) ** 2).sum() + (G.propagate(x) ** 3).sum()

    torch.testing.assert_close(graph.propagate(x), dense.propagate(x), atol=1e-12, rtol=1e-10)
    for a, b in zip(torch.autograd.grad(loss(graph), (q, k, x)),
                    torch.autograd.grad(loss(dense), (q, k, x)), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_gradients_in_q_and_k_are_summed_once_per_backward_pass() -> None:
    """Every propagation of one graph adds its gradient in q and k into one buffer per backward
    pass, handed over once: a pass that stops short of q and k (gradients in x only) leaves
    nothing behind for a later one, and a retained graph's second pass starts from zero."""
    window, dense, (q, k, x) = _make(23, 4, True, 2, False, False, 5)

    def loss(G):
        return (G.propagate(G.propagate(x)) ** 2).sum() + G.propagate_transpose(x).sum()

    expected = torch.autograd.grad(loss(dense), (q, k, x))
    y = loss(window)
    (gx,) = torch.autograd.grad(y, (x,), retain_graph=True)  # not reaching q and k
    torch.testing.assert_close(gx, expected[2], atol=1e-11, rtol=1e-9)
    for _ in range(2):  # the same graph twice: each pass its own sums
        got = torch.autograd.grad(y, (q, k, x), retain_graph=True)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_window_layer_has_the_same_gradients(reentrant: bool) -> None:
    """A layer recomputed by ``torch.utils.checkpoint`` (its own backward pass when reentrant,
    a new graph object either way) still hands every gradient in q and k over exactly once."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    layer = DiffusionAttention(16, 2, "heat[t=1.0]:1,laplacian:1", graph="window[w=3]",
                               causal=True, dtype=F64)  # fmt: skip
    x = torch.randn(2, 37, 16, dtype=F64, requires_grad=True)

    def grads(run) -> list[torch.Tensor]:  # .backward(): reentrant checkpoints refuse .grad()
        x.grad = None
        layer.zero_grad(set_to_none=True)
        (run(x) ** 2).sum().backward()
        return [t.grad for t in (x, *layer.parameters())]

    expected = grads(layer)
    got = grads(lambda x: checkpoint(layer, x, use_reentrant=reentrant))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_a_window_graph_is_freed_by_reference_counting_after_its_backward() -> None:
    """No reference cycle keeps a graph (and with it q, k and their projection) alive after a
    training step until the next garbage collection."""
    import gc
    import weakref

    _, _, (q, k, x) = _make(23, 4, True, 2, False, False, 5)
    graph = WindowGraph(q, k, window=4, causal=True, num_global=2, row_block=5)
    graph.propagate(graph.propagate(x)).sum().backward()
    alive = weakref.ref(graph)
    gc.disable()
    try:
        del graph
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_past_n_is_sized_by_n_and_equals_the_full_graph(causal: bool) -> None:
    """``w = 10^6`` on 16 tokens: the slabs are bounded by ``N`` (they were ``b + 2w`` long:
    3-4 GB), and the graph is the full (causal) softmax graph, values and gradients."""
    n = 16
    _, _, (q, k, x) = _make(n, 1, causal, 0, False, False, None)
    graph = WindowGraph(q, k, window=10**6, causal=causal)
    assert graph.row_block <= max(n, 32) and graph.layout.slab <= graph.row_block + 2 * n
    full = SoftmaxGraph(q, k, causal=causal)
    for op in (Laplacian(), HeatKernel(t=1.0)):
        y, expected = op(graph, x), op(full, x)
        torch.testing.assert_close(y, expected, atol=1e-12, rtol=1e-10)
        got = torch.autograd.grad((y**2).sum(), (q, k, x))
        for a, b in zip(got, torch.autograd.grad((expected**2).sum(), (q, k, x)), strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


_HUGE_WINDOW_SCRIPT = """
import resource, torch
from heatformer.models import DiffusionAttention
torch.set_num_threads(1)
layer = DiffusionAttention(32, 4, "heat:2,laplacian:2", graph="window[w=8]")
layer(torch.randn(2, 16, 32)).sum().backward()  # warm: the allocations a small layer needs
size = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize"))
limit = size * 1024 + (512 << 20)  # 512 MiB of address space more than this process has now
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for causal in (True, False):
    layer = DiffusionAttention(
        32, 4, "heat:2,laplacian:2", graph="window[w=1000000,global=1]", causal=causal
    )
    layer(torch.randn(2, 16, 32)).sum().backward()
print("ok")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_huge_window_on_a_short_sequence_runs_in_little_memory(tmp_path: Path) -> None:
    """A layer with ``window[w=1000000]`` on 16 tokens, forward and backward, in 512 MiB of
    address space beyond what the process holds (the old slabs took 3-4 GB)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    done = subprocess.run(
        [sys.executable, "-c", _HUGE_WINDOW_SCRIPT], capture_output=True, text=True, env=env,
        timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ---- large logits in half precision (issue 21) ----------------------------------------------

#: ``max|y - y64| <= tol * (max|y64| + 1)``: about ten units of rounding of each dtype
HALF_TOL = {torch.float16: 2e-2, torch.bfloat16: 8e-2}


@pytest.mark.parametrize("dtype", list(HALF_TOL), ids=str)
@pytest.mark.parametrize(
    ("causal", "g", "masked"),
    [(False, 0, False), (False, 2, True), (True, 2, False), (True, 0, True)],
)
@pytest.mark.parametrize("path", ["fused", "generic"])
def test_large_logits_in_half_precision_agree_with_the_dense_graph_in_float64(
    monkeypatch, dtype: torch.dtype, causal: bool, g: int, masked: bool, path: str
) -> None:
    """``q``, ``k`` of size 256 (every float16 product ``q . k`` past 65504 overflows; the
    softmax is nearly one-hot): transpose products (sym heads), degrees, dense rows and top-k
    were NaN in float16 (their scores were formed in the input's dtype). Every method is now
    finite and within ten units of rounding of the dense masked softmax in float64 on the same
    rounded inputs, forward and backward, on the fused and the generic kernel path."""
    from heatformer.graph_ops.window import kernels

    monkeypatch.setattr(kernels, "FUSED_CPU", path == "fused")
    n, w = 23, 4
    gen = torch.Generator().manual_seed(8)
    q, k = (torch.randn(2, 2, n, 4, generator=gen, dtype=F64) * 256 for _ in "qk")
    x = torch.randn(2, 2, n, 4, generator=gen, dtype=F64)
    q, k, x = (t.to(dtype).double() for t in (q, k, x))  # the rounded inputs
    assert bool((q.half() @ k.half().transpose(-1, -2)).isinf().any())  # the regime
    key_mask = None
    if masked:
        key_mask = torch.ones(2, n, dtype=torch.bool)
        key_mask[1, :3] = False
    methods = {
        "propagate": lambda G, x: G.propagate(x),
        "propagate_transpose": lambda G, x: G.propagate_transpose(x),
        "to_dense": lambda G, x: G.to_dense(),
        "in_degree": lambda G, x: G.in_degree(),
        "topk": lambda G, x: G.topk(3).propagate(x),
        "sym laplacian": lambda G, x: Laplacian("sym")(G, x),
    }
    probe_gen = torch.Generator().manual_seed(9)
    wrong = []
    for name, fn in methods.items():
        results = []
        for graph_dtype in (dtype, F64):
            leaves = [t.to(graph_dtype, copy=True).requires_grad_(True) for t in (q, k, x)]
            if graph_dtype == F64:
                mask = band_mask(n, w, causal, g, key_mask, False)
                graph = SoftmaxGraph(leaves[0], leaves[1], mask=mask)
            else:
                graph = WindowGraph(leaves[0], leaves[1], window=w, causal=causal, num_global=g,
                                    key_mask=key_mask, row_block=5)  # fmt: skip
            y = fn(graph, leaves[2])
            if graph_dtype == dtype:
                probe = torch.randn(y.shape, generator=probe_gen, dtype=F64)
            (y.double() * probe).sum().backward()
            grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]
            results.append([y.detach(), *grads])
        for what, actual, expected in zip(("value", "grad q", "grad k", "grad x"), *results):
            err = float((actual.double() - expected).abs().max())  # NaN if not finite
            bound = HALF_TOL[dtype] * (float(expected.abs().max()) + 1)
            if actual.dtype != dtype or not err <= bound:
                wrong.append(f"{name}: {what} ({actual.dtype}) off by {err:.3g} > {bound:.3g}")
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize(
    ("causal", "g", "masked", "fused"),
    [(c, g, m, f) for c, g, m, f in itertools.product([True, False], [0, 2], [False, True],
                                                      [True, False]) if not (m and f)],
)  # fmt: skip
@pytest.mark.parametrize(("offset", "rows"), [(0, 20), (5, 15), (7, 9), (0, 13), (20, 0)])
def test_queries_at_an_offset_equal_the_zero_padded_queries(
    monkeypatch, causal, g, masked, fused, offset, rows
) -> None:
    """``q_offset`` (how a sharded graph's extended block avoids a padded copy of ``q``): a
    graph whose ``q`` holds only rows ``offset ... offset + R - 1`` equals the graph of the
    zero-padded queries -- products both ways, degrees, dense rows, top-k, ``U x``, a heat
    series and the gradients in ``q`` (those rows of the padded one's), ``k`` and ``x`` --
    on the fused and the generic path, runs that straddle the offset (row_block 4, lowered
    SLAB_ELEMENTS), and a ``q`` with no rows."""
    from heatformer.graph_ops.window import kernels
    from heatformer.graph_ops.window import layout as window_layout

    monkeypatch.setattr(kernels, "FUSED_CPU", fused)
    monkeypatch.setattr(window_layout, "SLAB_ELEMENTS", 300)
    n, w = 20, 3
    gen = torch.Generator().manual_seed(11)
    q_full, k, x = (torch.randn(2, n, 3, generator=gen, dtype=F64) for _ in range(3))
    q_full[:, :offset] = 0.0
    q_full[:, offset + rows :] = 0.0
    key_mask = None
    if masked:
        key_mask = torch.ones(2, n, dtype=torch.bool)
        key_mask[1, 6:9] = False
    kw = {"window": w, "causal": causal, "num_global": g, "key_mask": key_mask,
          "drop_masked_queries": False, "row_block": 4}  # fmt: skip
    outs = []
    for shifted in (False, True):
        qq = (q_full[:, offset : offset + rows] if shifted else q_full).clone().requires_grad_()
        kk, xx = k.clone().requires_grad_(), x.clone().requires_grad_()
        graph = trusted_window_graph(qq, kk, q_offset=offset if shifted else 0, **kw)
        assert graph.num_nodes == n
        y = (graph.propagate(xx), graph.propagate_transpose(xx), graph.uniform(xx),
             HeatKernel(t=1.0, tol=1e-12)(graph, xx), Laplacian("sym")(graph, xx))  # fmt: skip
        loss = sum((t * torch.linspace(-1, 1, t.numel(), dtype=F64).view_as(t)).sum() for t in y)
        loss.backward()
        dq = qq.grad if shifted else qq.grad[:, offset : offset + rows]
        with torch.no_grad():
            views = (graph.out_degree(), graph.in_degree(), graph.to_dense(),
                     graph.topk(2).to_dense())  # fmt: skip
        outs.append((*[t.detach() for t in y], dq, kk.grad, xx.grad, *views))
    for got, want in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


# ---- products with the global keys on token-major rows ---------------------------------------


def _rows(bf: int, r: int, x: int, token_major: bool) -> torch.Tensor:
    """Random ``(Bf, R, X)`` rows, token-major (the heads of a ``(R, 3, Bf, X)`` projection's
    first part, rows at stride ``3 Bf X``) or plain."""
    if token_major:
        return torch.randn(r, 3, bf, x, dtype=torch.float64)[:, 0].transpose(0, 1)
    return torch.randn(bf, r, x, dtype=torch.float64)


@pytest.mark.parametrize("token_major", [False, True])
@pytest.mark.parametrize(("bf", "g"), [(1, 1), (4, 1), (4, 3), (2, 8), (17, 1)])
def test_global_key_products_equal_bmm(bf: int, g: int, token_major: bool) -> None:
    """The block-diagonal products on token-major rows (one matrix product for all heads)
    equal ``bmm``; other layouts, one head, or too many columns take ``bmm`` itself."""
    from heatformer.graph_ops.window import kernels

    rows, dy = _rows(bf, 37, 5, token_major), _rows(bf, 37, 6, token_major)
    mats = torch.randn(bf, 5, g, dtype=torch.float64)
    scores = kernels._rows_times(rows, mats)
    torch.testing.assert_close(scores, torch.bmm(rows, mats), rtol=1e-13, atol=1e-13)
    fast = token_major and bf > 1 and bf * g <= kernels._TOKEN_MAJOR_COLUMNS
    assert (kernels._token_major(rows, g) is not None) == fast
    torch.testing.assert_close(
        kernels._t_times_rows(scores, dy),
        torch.bmm(scores.transpose(1, 2), dy),
        rtol=1e-13,
        atol=1e-13,
    )
    out, values = _rows(bf, 37, 6, token_major), torch.randn(bf, g, 6, dtype=torch.float64)
    assert (kernels._token_major(out, g) is not None) == fast  # added into in place
    before = out.clone()
    kernels._add_rows_times(out, scores, values)
    torch.testing.assert_close(out, before + torch.bmm(scores, values), rtol=1e-13, atol=1e-13)
