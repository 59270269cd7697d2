"""One rank of the sharded-graph equality tests (called by ``graph_ops/test_sharding.py`` in a
pooled gloo group, ``sequence_parallel_helpers.GroupPool``).

:func:`run` runs one case of :func:`cases` on this rank's block of the sequence and on the
whole sequence (the single-process :class:`~heatformer.graph_ops.WindowGraph`) and returns a
report ``{"case": ..., "checks": n, "failures": [...], "refusals": [...]}``. Every rank
computes the single-process reference itself (same seed), so no result travels but the
sharded graph's own messages.
"""

from __future__ import annotations

import copy
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from heatformer.checks import ArgumentValueError
from heatformer.graph_ops import (
    OPERATORS,
    SequenceShard,
    heat,
    resolve_operator,
    shard_graph,
    split_maps,
)
from heatformer.graph_ops.window.builder import WindowBuilder

B, H, E, C = 2, 2, 4, 3
TOL = 1e-10
#: examples of the registry left out here: a hundred products and more each, the same calls as
#: the others (the single-process matrix runs them; ``QUICK`` stands for the default PageRank)
SLOW = [
    ("ppr", {}),
    ("ppr", {"alpha": 0.05, "normalization": "combinatorial"}),
    ("heat", {"t": 40.0, "normalization": "combinatorial", "tol": 1e-08}),
]
#: the parameters of the cases that run one example per operator (the default PageRank
#: teleport needs 130 products; 0.5 needs 20)
QUICK = {"ppr": {"alpha": 0.5}}


@dataclass(frozen=True)
class Case:
    n: int
    w: int
    g: int
    causal: bool
    mask: bool
    drop: bool
    operators: int  # 0: the protocol only; 1: every operator, its first example; 2: every example

    def __str__(self) -> str:
        return (
            f"N={self.n} w={self.w} g={self.g} {'causal' if self.causal else 'bidir'}"
            f"{' masked' if self.mask else ''}{' drop' if self.drop else ''}"
        )


def cases(world: int) -> Iterator[Case]:
    """Uneven blocks (13 over 2 or 4), blocks shorter than the window (10 over 4 with w = 6),
    an empty block (3 over 4), global rows held by two ranks (g = 5); the operators on two
    processes (every example once) and, on one case, on four (one example each)."""
    shapes = [(13, 3, (0, 2, 5)), (10, 6, (2,)), (3, 2, (2,))]
    for n, w, globals_ in shapes:
        for g in globals_:
            for causal in (False, True):
                for mask, drop in ((False, False), (True, False), (True, True)):
                    if mask and not drop and n != 13:
                        continue
                    operators = 0
                    if (n, g) == (13, 2) and drop == mask and (world == 2 or not causal):
                        operators = 2 if world == 2 and drop and not causal else 1
                    yield Case(n, w, g, causal, mask, drop, operators)


def key_mask(n: int, world: int) -> Tensor:
    """Padding at the blocks' boundaries: element 0 loses the first key of every block but
    the first, element 1 the last key of every block and the sequence's last key (3 over 4:
    element 1 has no real key at all)."""
    m = torch.ones(B, n, dtype=torch.bool)
    for r in range(1, world):
        start = SequenceShard.bounds_of(n, world, r)[0]
        if start < n:
            m[0, start] = False
        if start > 0:
            m[1, start - 1] = False
    m[1, n - 1] = False
    return m


class Checker:
    def __init__(self) -> None:
        self.checks = 0
        self.failures: list[str] = []

    def close(self, what: str, actual: Tensor | None, expected: Tensor | None) -> None:
        self.checks += 1
        if actual is None or expected is None:
            if (actual is None) != (expected is None):
                self.failures.append(f"{what}: gradient {actual is None=} {expected is None=}")
            return
        if actual.shape != expected.shape:
            self.failures.append(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
            return
        err = float((actual - expected).abs().max()) if actual.numel() else 0.0
        scale = 1.0 + (float(expected.abs().max()) if expected.numel() else 0.0)
        if not err <= TOL * scale:
            self.failures.append(f"{what}: max error {err:.3g}")


def leaves(*ts: Tensor) -> list[Tensor]:
    return [t.detach().clone().requires_grad_(True) for t in ts]


def compare(
    check: Checker,
    what: str,
    shard: SequenceShard,
    full_fn: Callable[[Tensor, Tensor, Tensor], Tensor],
    local_fn: Callable[[Tensor, Tensor, Tensor], Tensor],
    q: Tensor,
    k: Tensor,
    x: Tensor,
    params: tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]] = ([], []),
) -> None:
    """Outputs and gradients in q, k, x (and parameters, summed over ranks) of a sharded
    computation against this rank's rows of the single-process one."""
    gen = torch.Generator().manual_seed(7)
    fq, fk, fx = leaves(q, k, x)
    y = full_fn(fq, fk, fx)
    r = torch.randn(y.shape, generator=gen, dtype=y.dtype)
    (y * r).sum().backward()
    full_params = [p.grad for p in params[0]]
    lq, lk, lx = leaves(*(shard.take(t) for t in (q, k, x)))
    y_loc = local_fn(lq, lk, lx)
    check.close(f"{what} output", y_loc.detach(), shard.take(y.detach()))
    (y_loc * shard.take(r)).sum().backward()
    for name, a, b in (("q", lq, fq), ("k", lk, fk), ("x", lx, fx)):
        grad = None if b.grad is None else shard.take(b.grad)
        check.close(f"{what} grad {name}", a.grad, grad)
    for p, expected in zip(params[1], full_params, strict=True):
        grad = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)  # each rank's part of the gradient
        check.close(f"{what} grad {tuple(p.shape)} parameter", grad, expected)


def maps_of(maps: int, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """``q``, ``k`` for an operator of ``maps`` maps per head: the maps from their channels
    (a batch dim more), as a layer splits them."""
    return (q, k) if maps == 1 else (split_maps(q, maps), split_maps(k, maps))


def run_case(case: Case, rank: int, world: int, check: Checker, refusals: list[str]) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    n = case.n
    q = torch.randn(B, H, n, E, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, n, E, generator=gen, dtype=torch.float64)
    x = torch.randn(B, H, n, C, generator=gen, dtype=torch.float64)
    mask = key_mask(n, world) if case.mask else None
    shard = SequenceShard(n, rank, world)
    kind = WindowBuilder(case.w, case.g)
    sharded = shard_graph(kind, shard)
    local_mask = None if mask is None else shard.take(mask, dim=-1)
    opts: dict[str, Any] = {"causal": case.causal, "drop_masked_queries": case.drop}

    def full(q: Tensor, k: Tensor) -> Any:
        return kind.build(q, k, key_mask=mask, **opts)

    def local(q: Tensor, k: Tensor) -> Any:
        return sharded.build(q, k, key_mask=local_mask, **opts)

    def protocol(graph_fn: Callable[..., Any]) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        def fn(q: Tensor, k: Tensor, x: Tensor) -> Tensor:
            g = graph_fn(q, k)
            deg = torch.stack([g.out_degree(), g.in_degree()], dim=-1)  # (B, H, n, 2)
            # a heat-like chain: several products of one graph, both directions
            y = g.propagate(x)
            y = g.propagate(y) + 0.5 * g.propagate_transpose(x) + g.uniform(x)
            return torch.cat([y, deg], dim=-1)

        return fn

    compare(check, f"{case}: protocol", shard, protocol(full), protocol(local), q, k, x)

    # the messages of one product: (w - 1) C values to the next rank(s) causal, w each way
    graph = local(shard.take(q), shard.take(k))
    check.checks += 1  # the extended block's graph holds this block's queries, not a padded copy
    if graph.ext.q.shape[-2] != shard.local_nodes or graph.ext.q.data_ptr() != graph.q.data_ptr():
        check.failures.append(f"{case}: extended queries {tuple(graph.ext.q.shape)}")
    shard.comm.reset()
    graph.propagate(shard.take(x))
    sent = shard.comm.by_kind.get("values", 0)
    w_eff = min(case.w, n)
    expected = 0
    for p in range(world):  # this block's positions that a row of p's block reads
        lo_p, hi_p = SequenceShard.bounds_of(n, world, p)
        if p == rank:
            continue
        reads = {
            j
            for i in range(lo_p, hi_p)
            for j in range(n)
            if (0 <= i - j < w_eff if case.causal else abs(i - j) <= w_eff)
            or (j < case.g and (j <= i or not case.causal))
        }  # the band and the global keys (a global row's other keys: the sums over ranks)
        expected += len(reads & set(range(shard.start, shard.stop)))
    check.checks += 1
    if sent != expected * B * H * C * 8:
        check.failures.append(f"{case}: sent {sent} bytes of values, expected {expected} rows")

    if not case.operators:
        return
    for name, cls in OPERATORS.items():
        examples = cls.examples if case.operators == 2 else (QUICK.get(name, cls.examples[0]),)
        for params in examples:
            if (name, params) in SLOW:
                continue
            torch.manual_seed(0)
            op = resolve_operator(name, **params)
            if op.needs_shape:
                # the head width a layer gives: the queries' for a head of several maps
                op.shape_parameters(H, E if op.maps > 1 else C)
            op = op.double()
            if name == "skip":  # not the identity
                with torch.no_grad():
                    for p in op.parameters():
                        p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
            if case.causal and op.reads_transpose:
                continue
            local_op = copy.deepcopy(op)
            what = f"{case}: {name}{params}"
            try:
                compare(
                    check, what, shard,
                    lambda q, k, x, op=op: op(full(*maps_of(op.maps, q, k)), x),
                    lambda q, k, x, op=local_op: op(local(*maps_of(op.maps, q, k)), x),
                    q, k, x, (list(op.parameters()), list(local_op.parameters())),
                )  # fmt: skip
            except ArgumentValueError as err:
                # the dense methods (exact heat kernel, PageRank solve) need every key
                if err.argument == "graph" and "split over processes" in str(err):
                    refusals.append(f"{name}{params}")
                    # every rank raised at the same product: nothing is left in flight
                else:
                    raise


def checkpointed_series(rank: int, world: int, check: Checker) -> None:
    """Series whose steps are recomputed in backward (messages inside checkpoints), at a
    threshold between the blocks' sizes: every rank must decide alike
    (Graph.signal_elements), or the ranks' messages no longer match."""
    largest = SequenceShard.bounds_of(13, world, 0)
    saved = heat.CHECKPOINT_ELEMENTS
    heat.CHECKPOINT_ELEMENTS = B * H * C * (largest[1] - largest[0])
    try:
        case = Case(13, 3, 2, False, True, False, 0)
        shard = SequenceShard(13, rank, world)
        gen = torch.Generator().manual_seed(3)
        q, k, x = (torch.randn(B, H, 13, d, generator=gen, dtype=torch.float64) for d in (E, E, C))
        kind, mask = WindowBuilder(3, 2), key_mask(13, world)
        for name, params in (("heat", {"t": 2.0, "normalization": "sym"}), ("ppr", {"alpha": 0.5}),
                             ("polynomial", {"coeffs": [0.5, -1.0, 0.25]})):  # fmt: skip
            op = resolve_operator(name, **params).double()
            compare(
                check, f"{case}: checkpointed {name}", shard,
                lambda q, k, x, op=op: op(kind.build(q, k, key_mask=mask), x),
                lambda q, k, x, op=op: op(shard_graph(kind, shard).build(
                    q, k, key_mask=shard.take(mask, dim=-1)), x),
                q, k, x,
            )  # fmt: skip
        check.checks += 1
        if not torch.equal(shard.gather(shard.take(x)), x):
            check.failures.append("gather: the blocks put together are not the sequence")
    finally:
        heat.CHECKPOINT_ELEMENTS = saved


def run(rank: int, world: int, index: int) -> dict[str, Any]:
    """Case ``index`` of :func:`cases` (``len(cases)``: :func:`checkpointed_series`) on this
    rank of a joined group of ``world`` processes; its report ``{"case": str, "operators":
    int, "checks": n, "failures": [...], "refusals": [...]}`` (a failure is a mismatch or a
    traceback: a rank that raised has still taken part in every message before it)."""
    check, refusals = Checker(), []
    all_cases = list(cases(world))
    case = all_cases[index] if index < len(all_cases) else None
    try:
        if case is None:
            checkpointed_series(rank, world, check)
        else:
            run_case(case, rank, world, check, refusals)
    except Exception:
        check.failures.append(traceback.format_exc())
    return {
        "case": str(case) if case is not None else "checkpointed series",
        "operators": case.operators if case is not None else 0,
        "checks": check.checks, "failures": check.failures, "refusals": sorted(set(refusals)),
    }  # fmt: skip
