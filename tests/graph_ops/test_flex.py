"""The FlexAttention backend of window graphs against the window kernels and the predicate.

- The block mask built from kv blocks (``flex.window_block_mask``, ``O(N w)``) equals, tile by
  tile, what the dense predicate allows, and ``create_block_mask``'s ``O(N^2)`` answer: the
  oracle of the arithmetic.
- ``WindowGraph.propagate`` with ``BACKEND = "flex"`` equals the window kernels' for every
  registered operator (with each of its ``examples``), causal and bidirectional, global tokens,
  key masks, ``N`` not a multiple of the tile, ``w > N``, ``N = 1``: forward only on the CPU,
  where FlexAttention has no backward in torch 2.13 (the refusal is tested). Most of these run
  FlexAttention's eager reference (the predicate on all pairs, seconds instead of a compile per
  case); a few run the compiled CPU kernel, which reads the block mask's tiles.
- On CUDA (marked ``cuda``): forward and backward against the kernels, half precision, and the
  memory of a long sequence.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import heatformer.graph_ops.window as window_module
from graph_helpers import band_mask
from heatformer.graph_ops import OPERATORS, WindowGraph, resolve_operator
from heatformer.graph_ops.window import flex

pytestmark = pytest.mark.skipif(
    not flex.flex_available(),
    reason="FlexAttention with BlockMask.from_kv_blocks needs torch>=2.6",
)

F32, F64 = torch.float32, torch.float64


def dense_allowed(n, w, causal, g, key_mask=None, drop=False):
    """The window graph's ``N x N`` mask, written from its definition (``(Bf, N, N)`` with a
    key mask; a window past ``N`` is ``N``)."""
    allowed = band_mask(n, min(w, max(n, 1)), causal, g, key_mask, drop)
    return allowed if key_mask is None else allowed[:, 0]
    allowed = allowed & key_mask[:, None, :]
    if drop:
        allowed = allowed & key_mask[:, :, None]
    return allowed


def layout(n, w, causal=False, g=0, key_mask=None, drop=False):
    """The edges of the window graph of ``n`` nodes (its arguments checked by the graph): what
    the block mask and the predicate are made from."""
    q = torch.zeros(1 if key_mask is None else key_mask.shape[0], n, 1)
    graph = WindowGraph(
        q, q, window=w, causal=causal, num_global=g, key_mask=key_mask, drop_masked_queries=drop
    )
    return graph.layout


def tiles(n, w, causal, g, bs):
    """``(any, all)`` per ``bs x bs`` tile of the dense predicate; padding past ``N`` counts
    as masked (as in ``create_block_mask``), so a tile cut by ``N`` is never all allowed."""
    nb = -(-n // bs)
    real = torch.nn.functional.pad(dense_allowed(n, w, causal, g), [0, nb * bs - n] * 2)
    t = real.reshape(nb, bs, nb, bs)
    return t.any(-1).any(-2), t.all(-1).all(-2)


def mask_parts(bm):
    """Partial and full tiles of a BlockMask as bool ``(nb, nb)``."""
    from torch.nn.attention.flex_attention import _ordered_to_dense

    nb = bm.kv_indices.shape[-1]
    partial = _ordered_to_dense(bm.kv_num_blocks, bm.kv_indices, nb)[0, 0].bool()
    full = _ordered_to_dense(bm.full_kv_num_blocks, bm.full_kv_indices, nb)[0, 0].bool()
    return partial, full


GEOMETRIES = [
    (n, w, causal, g, bs)
    for n, w, causal, g, bs in itertools.product(
        [1, 5, 16, 37, 64, 100], [1, 3, 16, 29, 200], [False, True], [0, 1, 20], [8, 16]
    )
    if g <= n
]


@pytest.mark.parametrize(("n", "w", "causal", "g", "bs"), GEOMETRIES)
def test_block_mask_from_kv_blocks_equals_the_dense_predicate(n, w, causal, g, bs):
    bm = flex.window_block_mask(layout(n, w, causal, g), block_size=bs)
    assert bm.shape == (1, 1, n, n) and bm.BLOCK_SIZE == (bs, bs)
    partial, full = mask_parts(bm)
    any_, all_ = tiles(n, w, causal, g, bs)
    assert torch.equal(full, all_)  # every fully allowed tile, and only those, skips the mask
    assert torch.equal(partial, any_ & ~all_)
    assert torch.equal(bm.to_dense()[0, 0].bool(), any_)
    # the transposed lists (the backward's) are those of the same tiles
    nb = partial.shape[0]
    from torch.nn.attention.flex_attention import _ordered_to_dense

    q_partial = _ordered_to_dense(bm.q_num_blocks, bm.q_indices, nb)[0, 0].bool()
    assert torch.equal(q_partial, partial.T)


@pytest.mark.parametrize(
    ("n", "w", "causal", "g"),
    [(37, 3, True, 2), (37, 5, False, 0), (50, 200, False, 1), (45, 40, True, 17), (5, 2, True, 0)],
)
def test_block_mask_equals_create_block_mask(n, w, causal, g):
    from torch.nn.attention.flex_attention import create_block_mask

    mod = flex.window_mask_mod(layout(n, w, causal, g))
    ref = create_block_mask(mod, 1, 1, n, n, device="cpu", BLOCK_SIZE=16)
    bm = flex.window_block_mask(layout(n, w, causal, g), block_size=16)
    assert torch.equal(bm.to_dense(), ref.to_dense())
    assert torch.equal(mask_parts(bm)[1], mask_parts(ref)[1])


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_mod_is_the_predicate_with_a_key_mask(causal, drop):
    n, w, g = 23, 4, 2
    key_mask = torch.rand(3, n, generator=torch.Generator().manual_seed(0)) > 0.3
    key_mask[2] = False  # a batch row with no key at all
    edges = layout(n, w, causal, g, key_mask, drop)
    mod = flex.window_mask_mod(edges)
    b = torch.arange(3)[:, None, None]
    i, j = torch.arange(n)[None, :, None], torch.arange(n)[None, None, :]
    got = mod(b, torch.zeros((), dtype=torch.long), i, j)
    assert torch.equal(got, dense_allowed(n, w, causal, g, key_mask, drop))
    # with a key mask no tile is full, and the tiles are the structural ones
    bm = flex.window_block_mask(edges, block_size=8)
    partial, full = mask_parts(bm)
    assert not full.any()
    assert torch.equal(partial, tiles(n, w, causal, g, 8)[0])


def test_block_mask_rejects_bad_sizes():
    """The window's own arguments are the graph's to check (``test_sharding``: one function for
    both graph constructors); the block mask refuses what no graph checks for it."""
    with pytest.raises(ValueError, match="num_nodes"):
        flex.window_block_mask(layout(0, 3))
    with pytest.raises(ValueError, match="block_size"):
        flex.window_block_mask(layout(5, 3), block_size=0)


def test_block_mask_work_is_linear_in_n():
    """The classified candidates grow as N w, not N^2: at 64k tokens (512 tiles a side) the
    builder stays fast where ``create_block_mask`` would evaluate 4e9 pairs."""
    import time

    t0 = time.perf_counter()
    bm = flex.window_block_mask(layout(1 << 16, 128, causal=True, g=1))
    assert time.perf_counter() - t0 < 10.0
    nb = bm.kv_num_blocks.shape[-1]
    assert nb == 512
    per_row = bm.kv_num_blocks[0, 0] + bm.full_kv_num_blocks[0, 0]
    assert int(per_row[1:].max()) <= 3  # its own tile, the one before, the global one
    assert int(per_row[0]) == 1  # the global row's tile is causal: its own tile only


# ---- propagate: flex against the kernels --------------------------------------------------


@pytest.fixture
def eager_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention's eager reference instead of the compiled kernel (no compile per case),
    quietly, and tiles of 16 so that small graphs span several."""
    from torch.nn.attention import flex_attention as fa

    monkeypatch.setattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    monkeypatch.setattr(flex, "_kernel", lambda: fa.flex_attention)
    monkeypatch.setattr(flex, "DEFAULT_BLOCK_SIZE", 16)


CONFIGS = [  # n, w, causal, g, masked, drop
    pytest.param(37, 5, True, 2, False, False, id="n37-w5-causal-g2"),
    pytest.param(37, 5, False, 2, True, False, id="n37-w5-bidir-g2-keymask"),
    pytest.param(20, 50, True, 0, True, True, id="n20-w50>N-causal-keymask-drop"),
    pytest.param(32, 3, False, 0, False, False, id="n32-w3-bidir"),
    pytest.param(37, 4, True, 0, True, True, id="n37-w4-causal-keymask-drop"),
    pytest.param(20, 50, False, 1, False, False, id="n20-w50>N-bidir-g1"),
    pytest.param(1, 3, True, 0, False, False, id="n1-causal"),
    pytest.param(1, 3, False, 1, False, False, id="n1-bidir-g1"),
]

#: every registered operator with each of its examples on the first three configurations (all
#: the features: some heat and PPR examples take hundreds of propagations, and the eager
#: reference costs ~10 ms each); the three main operators on all of them
OPERATOR_CASES = [
    pytest.param(name, params, *config.values, id=f"{name}{params or ''}-{config.id}")
    for name, cls in OPERATORS.items()
    for params in cls.examples
    for i, config in enumerate(CONFIGS)
    if i < 3 or (not params and name in ("attention", "laplacian", "heat"))
]


def make_graph(n, w, causal, g, masked, drop, *, dtype=F32, device="cpu", seed=0, scale=1.0,
               requires_grad=False):  # fmt: skip
    """A ``(2, 3)``-batched window graph with ``E = 8``, a signal ``x`` ``(2, 3, N, 5)`` (leaves
    on ``device``; ``graph.q``, ``graph.k`` are ``q``, ``k`` themselves)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (
        (torch.randn(2, 3, n, 8, generator=gen, dtype=dtype) * scale)
        .to(device)
        .requires_grad_(requires_grad)
        for _ in range(2)
    )
    key_mask = None
    if masked:
        key_mask = torch.rand(2, n, generator=gen) > 0.3
        key_mask[1, : min(n, 4)] = False
        key_mask = key_mask.to(device)
    graph = WindowGraph(
        q, k, window=w, causal=causal, num_global=g, key_mask=key_mask, drop_masked_queries=drop
    )
    x = torch.randn(2, 3, n, 5, generator=gen, dtype=dtype).to(device)
    return graph, x.requires_grad_(requires_grad)


def run_both(monkeypatch, fn):
    """``fn()`` with the kernels, then with FlexAttention (as a pair of results or errors)."""
    out = {}
    for backend in ("kernels", "flex"):
        monkeypatch.setattr(window_module, "BACKEND", backend)
        try:
            out[backend] = fn()
        except (ValueError, TypeError) as err:  # a refusal must not depend on the backend
            out[backend] = err
    return out["kernels"], out["flex"]


@pytest.mark.usefixtures("eager_flex")
@pytest.mark.parametrize(("name", "params", "n", "w", "causal", "g", "masked", "drop"),
                         OPERATOR_CASES)  # fmt: skip
def test_every_operator_on_flex_equals_the_kernels(monkeypatch, name, params, n, w, causal,
                                                   g, masked, drop):  # fmt: skip
    graph, x = make_graph(n, w, causal, g, masked, drop)
    op = resolve_operator(name, **params)
    with torch.no_grad():
        ref, got = run_both(monkeypatch, lambda: op(graph, x))
    if isinstance(ref, Exception):
        assert type(got) is type(ref) and str(got) == str(ref)
        return
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.usefixtures("eager_flex")
@pytest.mark.parametrize(("n", "w", "causal", "g", "masked", "drop"), CONFIGS)
def test_flex_propagate_equals_the_dense_graph_in_float64(monkeypatch, n, w, causal, g,
                                                          masked, drop):  # fmt: skip
    """Against the definition: rows without keys give 0, scale and masks as the graph's."""
    graph, x = make_graph(n, w, causal, g, masked, drop, dtype=F64)
    monkeypatch.setattr(window_module, "BACKEND", "flex")
    with torch.no_grad():
        got = graph.propagate(x)
        dense = graph.to_dense()  # the kernels' dense rows
    torch.testing.assert_close(got, dense @ x, atol=1e-12, rtol=1e-12)
    if masked and drop:  # padded queries lose their rows: exactly 0
        empty = ~graph.row_has_edge()
        assert empty.any() and (got[empty] == 0).all()


@pytest.mark.usefixtures("eager_flex")
def test_flex_signal_with_extra_leading_dims_and_many_channels(monkeypatch):
    """Extra leading dims fold into the channels (300 > 128: three kernel calls)."""
    graph, _ = make_graph(37, 5, True, 2, False, False)
    x = torch.randn(4, 2, 3, 37, 75)
    with torch.no_grad():
        ref, got = run_both(monkeypatch, lambda: graph.propagate(x))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_compiled_cpu_kernel_reads_the_tiles_and_matches_the_kernels(monkeypatch):
    """The compiled CPU kernel (which skips the tiles the block mask leaves out and does not
    apply the predicate on full ones) against the window kernels and the dense graph: several
    tiles, N not a multiple of the tile; bidirectional with global tokens and a key mask in
    float32, causal with a global token in float16 with logits past float16's range (the
    kernel's scores are float32). About a minute: each case compiles its kernel."""
    monkeypatch.setattr(flex, "DEFAULT_BLOCK_SIZE", 16)
    cases = [
        ((70, 9, False, 2, True, True), F32, 1.0, 1e-6),
        ((70, 9, True, 1, False, False), torch.float16, 100.0, 2e-3),
    ]
    for geometry, dtype, scale, tol in cases:
        graph, x = make_graph(*geometry, dtype=dtype, scale=scale)
        with torch.no_grad():
            ref, got = run_both(monkeypatch, lambda g=graph, x=x: g.propagate(x))
            exact = graph.to(F64).to_dense() @ x.double()
        assert got.dtype == dtype and got.isfinite().all()
        torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
    # the float16 logits did pass 65504: a float16 score would have overflowed
    assert (graph.q.float() @ graph.k.float().transpose(-1, -2)).abs().max() > 65504


def test_flex_propagate_traces_into_one_graph(monkeypatch):
    """Inside ``torch.compile`` the flex path (block mask built in the program, key mask and
    global tokens included) has no graph break: ``torch._dynamo.explain``, no compilation."""
    monkeypatch.setattr(window_module, "BACKEND", "flex")
    graph, x = make_graph(37, 5, True, 2, True, False)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(graph.propagate)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_flex_backward_on_cpu_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(window_module, "BACKEND", "flex")
    graph, x = make_graph(20, 4, True, 1, False, False)
    x.requires_grad_(True)
    with pytest.raises(NotImplementedError, match=r"no backward on the CPU.*BACKEND = 'auto'"):
        graph.propagate(x)


def test_auto_keeps_the_kernels_on_cpu_and_bad_backends_are_refused(monkeypatch):
    graph, x = make_graph(20, 4, True, 1, False, False)
    assert not flex.use_flex(graph, "auto") and flex.use_flex(graph, "flex")
    monkeypatch.setattr(window_module, "BACKEND", "fast")
    with pytest.raises(ValueError, match="BACKEND: expected one of 'auto', 'kernels', 'flex'"):
        graph.propagate(x)


# ---- CUDA -----------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


#: float32 on every configuration, bfloat16 on the first (each dtype and mask structure is one
#: more compilation of the kernel, forward and backward: seconds each on a GPU)
CUDA_CASES = [
    pytest.param(*config.values, F32, id=f"{config.id}-float32") for config in CONFIGS
] + [pytest.param(*CONFIGS[0].values, torch.bfloat16, id=f"{CONFIGS[0].id}-bfloat16")]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(("n", "w", "causal", "g", "masked", "drop", "dtype"), CUDA_CASES)
@pytest.mark.parametrize("name", ["attention", "laplacian", "heat"])
def test_cuda_flex_forward_and_backward_equal_the_kernels(monkeypatch, name, n, w, causal, g,
                                                          masked, drop, dtype):  # fmt: skip
    op = resolve_operator(name)
    results = {}
    for backend in ("kernels", "flex"):
        monkeypatch.setattr(window_module, "BACKEND", backend)
        graph, x = make_graph(n, w, causal, g, masked, drop, dtype=dtype, device="cuda",
                              requires_grad=True)  # fmt: skip
        y = op(graph, x)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y)
        results[backend] = (y, *torch.autograd.grad(y, (graph.q, graph.k, x), dy))
    tol = 1e-4 if dtype == F32 else 3e-2
    for ref, got in zip(results["kernels"], results["flex"], strict=True):
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


@pytest.mark.cuda
@needs_cuda
def test_cuda_auto_takes_flex_and_long_sequences_stay_linear_in_memory(monkeypatch):
    """At 64k tokens the auto backend is FlexAttention and one forward + backward of a heat
    head needs far less than a dense ``N x N`` score matrix (16 GiB in float32)."""
    monkeypatch.setattr(window_module, "BACKEND", "auto")
    n, dev = 1 << 16, torch.device("cuda")
    q = torch.randn(1, 2, n, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, n, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(1, 2, n, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    graph = WindowGraph(q, k, window=128, causal=True, num_global=1)
    assert flex.use_flex(graph, "auto")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = resolve_operator("heat")(graph, x)
    y.float().square().sum().backward()
    assert y.isfinite().all() and q.grad.isfinite().all()
    assert torch.cuda.max_memory_allocated() - base < 2 << 30
