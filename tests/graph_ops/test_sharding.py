"""A sequence split over processes (:mod:`heatformer.graph_ops.window.sharding`) equals one process.

The equality tests run on pooled groups of 2 and 4 CPU processes (gloo, a file store in a
temporary folder: loopback only; ``sequence_parallel_helpers.GroupPool``, started once per
module), one test per case of ``tests/sharding_cases.py`` -- window graphs causal and not, with
global tokens (held by one rank or two), key padding at the blocks' boundaries, blocks shorter
than the window, uneven blocks and an empty one -- and compare the outputs and the gradients in
``q``, ``k``, ``x`` (and the operators' parameters) of every registered operator with the
single-process :class:`~heatformer.graph_ops.WindowGraph` in float64."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import sharding_cases as _worker
from heatformer._spec import format_entry
from heatformer.checks import ArgumentTypeError, ArgumentValueError
from heatformer.graph_ops import (
    GRAPHS,
    OPERATORS,
    SequenceShard,
    WindowGraph,
    resolve_graph,
    resolve_operator,
    shard_graph,
)
from heatformer.graph_ops.window.builder import WindowBuilder
from heatformer.graph_ops.window.sharding import ShardedWindowBuilder, ShardedWindowGraph

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this build",
)


# ---- the blocks ---------------------------------------------------------------------------------


@given(st.integers(0, 300), st.integers(1, 17))
def test_bounds_of_cuts_the_sequence_into_contiguous_blocks_in_rank_order(n: int, p: int) -> None:
    bounds = [SequenceShard.bounds_of(n, p, r) for r in range(p)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (_, stop), (start, _) in itertools.pairwise(bounds):
        assert stop == start
    sizes = [stop - start for start, stop in bounds]
    assert sizes == [n // p + (1 if r < n % p else 0) for r in range(p)]
    shards = [SequenceShard(n, r, p) for r in range(p)]
    assert [(s.start, s.stop, s.local_nodes) for s in shards] == [(a, b, b - a) for a, b in bounds]


def test_take_and_gather_on_one_process() -> None:
    shard = SequenceShard(5, 0, 1)
    x = torch.randn(2, 5, 3, requires_grad=True)
    assert shard.take(x).data_ptr() == x.data_ptr()
    full = shard.gather(shard.take(x))
    assert torch.equal(full, x)
    full.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    assert torch.equal(SequenceShard(6, 1, 2).take(torch.arange(6.0), dim=0), torch.arange(3.0, 6))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"num_nodes": 4, "rank": 2, "world_size": 2}, "rank"),
        ({"num_nodes": -1, "rank": 0, "world_size": 2}, "num_nodes"),
        ({"num_nodes": 4, "rank": 0, "world_size": 0}, "world_size"),
        ({"num_nodes": 4, "rank": True, "world_size": 2}, "rank"),
    ],
)
def test_bad_shard_values_are_refused_by_name(kwargs: dict[str, int], argument: str) -> None:
    with pytest.raises(ArgumentValueError) as info:
        SequenceShard(**kwargs)
    assert info.value.argument == argument
    with pytest.raises(ArgumentValueError) as info:
        SequenceShard.bounds_of(kwargs["num_nodes"], kwargs["world_size"], kwargs["rank"])
    assert info.value.argument == argument


def test_shard_rows_are_checked() -> None:
    shard = SequenceShard(10, 1, 3)
    with pytest.raises(ArgumentValueError, match=r"^x: expected 10 rows"):
        shard.take(torch.zeros(9, 2))
    with pytest.raises(ArgumentValueError, match=r"^x: expected 3 rows"):
        shard.gather(torch.zeros(4, 2))


@pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed in this build")
def test_current_needs_an_initialized_group() -> None:
    if dist.is_initialized():  # pragma: no cover - only under a launcher
        pytest.skip("a process group is initialized")
    with pytest.raises(ArgumentValueError) as info:
        SequenceShard.current(10)
    assert info.value.argument == "group"


# ---- which kinds shard --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_kind_says_whether_it_shards_and_the_others_refuse_naming_graph(name: str) -> None:
    cls = GRAPHS[name]
    builder = resolve_graph(format_entry(name, cls.examples[0], sep=","))
    shard = SequenceShard(8, 0, 2)
    if not cls.shards:
        with pytest.raises(ArgumentValueError, match="cannot split a sequence") as info:
            builder.sharded(shard)
        assert info.value.argument == "graph"
        with pytest.raises(ArgumentValueError):
            shard_graph(builder.spec, shard)
        return
    sharded = builder.sharded(shard)
    assert sharded.shards and not sharded.incremental
    assert sharded.spec == builder.spec
    with pytest.raises(ArgumentValueError) as info:
        sharded.decode(*[torch.zeros(1, 1, 1, 2)] * 3, positions=torch.zeros(1), past=0)
    assert info.value.argument == "graph"


def test_shard_graph_is_resolve_then_sharded() -> None:
    shard = SequenceShard(8, 1, 2)
    builder = shard_graph("window[w=4,global=1]", shard)
    assert builder == WindowBuilder(4, 1).sharded(shard)
    assert isinstance(builder, ShardedWindowBuilder) and builder.shard == shard
    assert builder.edges_per_row(8, causal=True) == WindowBuilder(4, 1).edges_per_row(
        8, causal=True
    )
    with pytest.raises(ArgumentTypeError) as info:
        WindowBuilder(4).sharded("rank 0")  # type: ignore[arg-type]
    assert info.value.argument == "shard"


def test_a_block_of_the_wrong_length_is_refused_before_any_message() -> None:
    shard = SequenceShard(10, 0, 2)  # 5 rows on rank 0
    q = torch.zeros(1, 4, 2)
    with pytest.raises(ArgumentValueError, match=r"^q: expected this rank's 5 rows") as info:
        shard_graph("window[w=2]", shard).build(q, q)
    assert info.value.argument == "q"


def test_the_sharded_graph_refuses_what_the_window_graph_refuses() -> None:
    """Both constructors check their window arguments with one function: the same error, kind
    and message for the same bad argument."""
    from heatformer.graph_ops import WindowGraph

    shard = SequenceShard(8, 0, 1)  # the whole sequence: the checks come before any message
    q = torch.zeros(1, 8, 2)
    bad = [
        {"window": 0},
        {"window": 2, "num_global": "1"},
        {"window": 2, "num_global": -1},
        {"window": 2, "num_global": 9},
        {"window": 2, "causal": 1},
        {"window": 2, "drop_masked_queries": None},
        {"window": 2, "row_block": 0},
    ]
    for kwargs in bad:
        calls = [(WindowGraph, (q, q), {}), (ShardedWindowGraph, (q, q), {"shard": shard})]
        errors = set()
        for make, args, extra in calls:
            with pytest.raises((ArgumentTypeError, ArgumentValueError)) as info:
                make(*args, **extra, **kwargs)
            errors.add((type(info.value), str(info.value)))
        assert len(errors) == 1, (kwargs, errors)
    with pytest.raises(ArgumentValueError, match=r"^k: expected batch dims"):
        ShardedWindowGraph(q.expand(2, 8, 2), q.expand(3, 8, 2), shard=shard, window=2)


# ---- one process: the sharded graph with no messages --------------------------------------------


def _one_process(
    causal: bool, masked: bool, maps: int = 1
) -> tuple[WindowGraph, ShardedWindowGraph, torch.Tensor]:
    """The window graphs of one process, of ``maps`` maps per head (``split_maps``)."""
    gen = torch.Generator().manual_seed(1)
    q, k, x = (torch.randn(2, 2, 9, d, generator=gen, dtype=torch.float64) for d in (4, 4, 3))
    q, k = _worker.maps_of(maps, q, k)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    kw = {"key_mask": mask if masked else None, "causal": causal}
    graph = WindowBuilder(3, 2).sharded(SequenceShard(9, 0, 1)).build(q, k, **kw)
    assert isinstance(graph, ShardedWindowGraph)
    return WindowBuilder(3, 2).build(q, k, **kw), graph, x


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["", "masked"])
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_one_rank_equals_the_window_graph_for_every_operator(
    name: str, causal: bool, masked: bool
) -> None:
    """World size 1 (no process group): the extended block is the whole sequence."""
    op = resolve_operator(name)
    full, sharded, x = _one_process(causal, masked, op.maps)
    if op.needs_shape:
        op.shape_parameters(2, 4 if op.maps > 1 else 3)  # the queries' width for several maps
    op = op.double()
    if causal and op.reads_transpose:
        pytest.skip("a causal layer refuses operators that read W^T")
    torch.testing.assert_close(op(sharded, x), op(full, x), rtol=0, atol=1e-12)


def test_dense_views_of_a_sharded_graph_are_refused_naming_graph() -> None:
    _, sharded, x = _one_process(False, False)
    for call in (sharded.to_dense, lambda: sharded.topk(2)):
        with pytest.raises(ArgumentValueError, match="split over processes") as info:
            call()
        assert info.value.argument == "graph"
    with pytest.raises(ArgumentValueError) as info:  # t = 1e4: only the dense method converges
        resolve_operator("heat", t=1e4)(sharded, x)
    assert info.value.argument == "graph"


@pytest.mark.parametrize("transpose", [False, True], ids=["propagate", "transpose"])
def test_a_product_keeps_the_block_and_the_halo_rows_not_the_extended_copy(
    transpose: bool,
) -> None:
    """:func:`~heatformer.graph_ops.window.halo.saved_as_parts`: what the window kernels save of an
    extended block (received rows around this rank's block, a fresh copy) is kept as the block
    and the received rows; the backward rebuilds it (gradients equal to saving the copy), the
    copy itself is freed after the forward, and a block changed in place is refused at the
    backward as autograd refuses a changed saved tensor."""
    import weakref

    from heatformer.graph_ops.window.halo import saved_as_parts

    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 11, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    halo = torch.randn(2, 5, 5, generator=gen, dtype=torch.float64)  # 2 rows before, 3 after
    graph = WindowGraph(q.requires_grad_(), k.requires_grad_(), window=3, num_global=1)
    product = graph.propagate_transpose if transpose else graph.propagate
    results = []
    for hooked in (False, True):
        block = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(4), dtype=q.dtype)
        block.requires_grad_()
        ext = torch.cat([halo[:, :2], block * 1.0, halo[:, 2:]], dim=1)  # (2, 11, 5), a copy
        ext_ref = weakref.ref(ext)
        if hooked:
            with saved_as_parts(ext, block, 2):
                y = product(ext)
        else:
            y = product(ext)
        del ext
        if hooked:
            assert ext_ref() is None  # the copy is not kept for the backward
        y.pow(2).sum().backward()
        results.append([t.grad.clone() for t in (q, k, block)])
        for t in (q, k):
            t.grad = None
    for plain, hooked_grad in zip(*results, strict=True):
        torch.testing.assert_close(hooked_grad, plain, rtol=0, atol=1e-13)
    block = torch.randn(2, 6, 5, dtype=q.dtype, requires_grad=True)
    ext = torch.cat([halo[:, :2], block, halo[:, 2:]], dim=1)
    source = block * 1.0  # a non-leaf block that is then changed in place
    with saved_as_parts(ext, source, 2):
        y = graph.propagate(ext)
    source.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# ---- 2 and 4 processes --------------------------------------------------------------------------


#: the cases of the worker, per world size (the last index: the checkpointed series)
_CASES = {world: len(list(_worker.cases(world))) + 1 for world in (2, 4)}


@needs_gloo
@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.parametrize(
    ("world", "index"), [(w, i) for w, n in _CASES.items() for i in range(n)]
)  # fmt: skip
def test_sharded_window_graphs_equal_one_process(world: int, index: int, gloo_groups) -> None:
    """One case of ``tests/sharding_cases.py`` on a pooled group of ``world`` processes: every
    rank's outputs and gradients equal its rows of the single-process graph's."""
    reports = gloo_groups(world).call("sharding_cases:run", index)
    for rank, report in enumerate(reports):
        assert report["failures"] == [], f"rank {rank}, {report['case']}: " + "\n".join(
            report["failures"]
        )
        assert report["checks"] >= 3  # outputs, gradients, messages (every case ran)
        # the dense methods that the exact examples pick are refused on a split sequence
        refused = ["heat{'t': 10000.0}", "ppr{'alpha': 1e-06}"] if report["operators"] == 2 else []
        assert report["refusals"] == refused


def test_the_cases_cover_what_the_issue_names() -> None:
    """Uneven blocks, blocks shorter than the window, an empty block and global rows held by
    two ranks (4 processes), key padding, causal and not, every operator's every example on 2
    processes."""
    for world in (2, 4):
        cases = list(_worker.cases(world))
        blocks = {c: [b - a for a, b in (SequenceShard.bounds_of(c.n, world, r)
                                          for r in range(world))] for c in cases}  # fmt: skip
        assert any(len(set(sizes)) > 1 for sizes in blocks.values())  # uneven
        assert any(min(sizes) < c.w for c, sizes in blocks.items())  # shorter than w
        assert any(0 in sizes for sizes in blocks.values()) == (world == 4)  # an empty block
        assert any(c.g > blocks[c][0] for c in cases) == (world == 4)  # globals on two ranks
        assert {(c.causal, c.mask, c.drop) for c in cases} >= {
            (causal, mask, drop) for causal in (False, True)
            for mask, drop in ((False, False), (True, False), (True, True))
        }  # fmt: skip
        assert any(c.operators for c in cases)
    assert any(c.operators == 2 for c in _worker.cases(2))


@needs_gloo
@pytest.mark.usefixtures("one_launch_at_a_time")
def test_a_failed_or_stuck_call_of_a_pooled_group_fails_clearly_and_a_new_group_follows(
    gloo_groups,
) -> None:
    """The pool the equality tests run on: a rank's exception reaches the test with the rank
    and its traceback; a rank stuck in a collective fails the call at its timeout instead of
    hanging; either kills the pool, and the next call gets a fresh one."""
    pool = gloo_groups(2)
    assert pool.call("sequence_parallel_helpers:pool_probe", "rank") == [0, 1]
    with pytest.raises(AssertionError, match=r"(?s)rank 1: .*ValueError: probe failure on rank 1"):
        pool.call("sequence_parallel_helpers:pool_probe", "raise")
    assert pool.broken and all(proc.poll() is not None for proc in pool.procs)
    pool = gloo_groups(2)
    assert not pool.broken
    with pytest.raises(AssertionError, match=r"rank 0: no reply in 3 s"):
        pool.call("sequence_parallel_helpers:pool_probe", "stuck", timeout=3.0)
    assert all(proc.poll() is not None for proc in pool.procs)
    assert gloo_groups(2).call("sequence_parallel_helpers:pool_probe", "rank") == [0, 1]
