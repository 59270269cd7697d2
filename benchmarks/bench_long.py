"""Long sequences: window graphs at 16k to 1M tokens, against dense attention, side by side.

Sections (all measured in one run; ratios are the point, absolute times are noisy):

1. ``scaling`` -- a ``window[w=128]`` causal layer, H=4, Dh=64 (D=256), B=1, forward +
   backward, of Laplacian heads and of heat heads (t=1, tol 1e-6), for N = 16k ... 1M: time,
   and peak memory (RSS growth of a fresh child process). Linear growth means the ratio
   N=1M / N=64k is 16.
2. ``dense`` -- at N=16k: the window Laplacian layer against dense SDPA with an explicit
   ``N x N`` band mask (the same outputs), and against ``torch.nn.attention.flex_attention``
   with a sliding-window block mask where it runs on this machine (reported either way).
3. ``rate`` -- the window ``propagate`` against this machine's float32 matmul rate, measured
   in the same run: the flop count of the issue's target is ``2 N w Dh`` per head (one product
   with ``w`` non-zeros per row), the full count ``4 N w Dh`` (scores and values); and the
   ceiling of that fraction from the rate of the batched 64-wide products it is made of, per
   query block size, measured in the same run.
4. ``heat`` -- the dense heat path at N=1024, H=4, Dh=64, t=1, tol 1e-6: the matrix-free
   series (one SDPA per term) and ``"series-dense"`` (``P`` formed once), each as a fraction
   of the SDPA route's flop ceiling (9 terms of ``4 N^2 Dh`` flops per head at the matmul rate).

5. ``pertoken`` (not in the default set; about 3 minutes a run) -- the layer of issue 22
   (``attention:4`` on ``window[w=128,global=1]``, causal, D=256, B=1), forward + backward in
   one child process, one thread: two calls at N=64k, then two at N=1M; CPU time and page
   faults per token of each call, and the ratio 1M / 64k per token of the first calls and of
   the second; each call's time split into user and system (the kernel's, nearly all page
   faults) and the system time per fault, so that a ratio above target can be told apart:
   the layer's own work (user time), or fresh pages costing more at 1M. ``--keep-heap`` runs
   the child with the C library's heap kept (glibc's ``MALLOC_MMAP_MAX_=0``,
   ``MALLOC_TRIM_THRESHOLD_``: freed memory stays in the process),
   so that the second call at each length reuses memory the process holds: where fresh pages
   cost more at 1M than at 64k (a virtual machine whose freed memory goes back to its host),
   the difference between the two runs is the machine's, not the layer's.

    python benchmarks/bench_long.py                 # everything (~20 minutes on 2 cores)
    python benchmarks/bench_long.py --quick         # small sizes (about a minute)
    python benchmarks/bench_long.py --sections rate,heat
    python benchmarks/bench_long.py --sections pertoken [--keep-heap]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    PeakRSS,
    compare,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    matmul_rate,
    print_machine,
    print_table,
    run_child,
    target,
)

from heatformer.graph_ops import SoftmaxGraph, WindowGraph, heat_kernel
from heatformer.models import DiffusionAttention

W, H, DH = 128, 4, 64
D = H * DH
LAYERS = {"laplacian": "laplacian:4", "heat": "heat[t=1.0;tol=1e-6]:4"}


def window_layer(heads: str) -> DiffusionAttention:
    torch.manual_seed(0)
    return DiffusionAttention(D, H, heads, graph=f"window[w={W}]", causal=True)


def fwd_bwd(layer: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()

    return run


def child(kind: str, n: int) -> dict[str, object]:
    """One timed forward + backward (or, for ``KIND-forward``, a forward pass without
    gradients) and its peak memory, in this (fresh) process."""
    forward_only = kind.endswith("-forward")
    layer = window_layer(LAYERS[kind.removesuffix("-forward")])
    fwd_bwd(layer, torch.randn(1, 256, D, requires_grad=True))()  # warm-up, tiny
    x = torch.randn(1, n, D, requires_grad=not forward_only)
    with PeakRSS() as peak:
        start = time.perf_counter()
        if forward_only:
            with torch.no_grad():
                layer(x)
        else:
            fwd_bwd(layer, x)()
        seconds = time.perf_counter() - start
    return {"time": seconds, "peak": peak.extra, "method": peak.method}


#: glibc's settings that keep freed memory in the process (no ``mmap``, no trimming)
KEEP_HEAP = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def per_token_child(ns: list[int]) -> dict[str, object]:
    """Two forward + backward calls of the issue-22 layer at each ``N`` of ``ns``, in this
    process, one thread: CPU seconds and minor page faults of each call."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = DiffusionAttention(D, H, "attention:4", graph=f"window[w={W},global=1]", causal=True)
    fwd_bwd(layer, torch.randn(1, 4096, D, requires_grad=True))()  # warm-up
    calls = []
    for n in ns:
        run = fwd_bwd(layer, torch.randn(1, n, D, requires_grad=True))
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.process_time()
            run()
            cpu = time.process_time() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            calls.append({"n": n, "cpu": cpu, "faults": after.ru_minflt - before.ru_minflt,
                          "user": after.ru_utime - before.ru_utime,
                          "sys": after.ru_stime - before.ru_stime})  # fmt: skip
    return {"calls": calls}


def per_token(ns: list[int], keep_heap: bool) -> None:
    env = KEEP_HEAP if keep_heap else None
    res = run_child(__file__, ["--child", "pertoken", "--n", ",".join(map(str, ns))],
                    timeout=3600, env=env)  # fmt: skip
    heap = "heap kept (" + " ".join(f"{k}={v}" for k, v in KEEP_HEAP.items()) + ")"
    title = (f"## per token: attention:4 on window[w={W},global=1], causal, D={D}, B=1, one "
             f"thread, CPU time; {heap if keep_heap else 'default heap'}")  # fmt: skip
    if "error" in res:
        print(f"{title}\nFAIL  {res['error']}")
        return
    calls = res["calls"]
    rows = [[c["n"], i % 2 + 1, fmt_time(c["cpu"]), f"{c['cpu'] / c['n'] * 1e6:.1f} us",
             f"{c['user'] / c['n'] * 1e6:.1f} us", f"{c['sys'] / c['n'] * 1e6:.1f} us",
             f"{c['faults'] / c['n']:.2f}", f"{c['sys'] / max(c['faults'], 1) * 1e6:.1f} us"]
            for i, c in enumerate(calls)]  # fmt: skip
    print_table(["N", "call", "fwd+bwd", "per token", "user", "system", "faults per token",
                 "system per fault"], rows, title=title)  # fmt: skip
    lo, hi = ns[0], ns[-1]
    for call in (0, 1):
        a, b = (next(c for j, c in enumerate(calls) if c["n"] == n and j % 2 == call)
                for n in (lo, hi))  # fmt: skip
        ratio = (b["cpu"] / hi) / (a["cpu"] / lo)
        target(f"per token N={hi} / N={lo}, call {call + 1}", ratio, 1.15,
               higher_is_better=False)  # fmt: skip
        user = (b["user"] / hi) / (a["user"] / lo)
        print(f"      user time alone (the process's own work, no page faults): {user:.2f}")


def scaling(ns: list[int], memory_limit: float) -> None:
    rows, by = [], {}
    for kind in LAYERS:
        for n in ns:
            previous = by.get((kind, n // 4), {}).get("peak")
            if previous and previous * 4.2 > memory_limit:  # a child killed for memory takes
                by[kind, n] = {"error": "skipped"}  # minutes and may take others with it
                rows.append([kind, n, "-", f"~{fmt_bytes(previous * 4)} extrapolated", "skipped: "
                             f"above --memory-limit {fmt_bytes(memory_limit)}"])  # fmt: skip
                continue
            res = run_child(__file__, ["--child", kind, "--n", str(n)], timeout=3600)
            by[kind, n] = res
            rows.append([kind, n, fmt_time(res.get("time")), fmt_bytes(res.get("peak")),
                         res.get("error", "")])  # fmt: skip
    print_table(
        ["heads", "N", "fwd+bwd", "peak extra", "error"],
        rows,
        title=f"## window[w={W}] layer, H={H}, Dh={DH}, causal, B=1 (child processes)",
    )
    res = run_child(__file__, ["--child", "heat-forward", "--n", str(ns[-1])], timeout=3600)
    print(f"heat heads, forward only (no gradients), N={ns[-1]}: {fmt_time(res.get('time'))}, "
          f"peak extra {fmt_bytes(res.get('peak'))} {res.get('error', '')}")  # fmt: skip
    lo, hi = 64 * 1024 if 64 * 1024 in ns else ns[0], ns[-1]
    for kind in LAYERS:
        a, b = by[kind, lo], by[kind, hi]
        if "time" in a and "time" in b:
            expect = hi / lo
            print(f"{kind}: time N={hi}/N={lo} = {b['time'] / a['time']:.2f} (linear: {expect:g}),"
                  f" memory = {(b['peak'] or 0) / max(a['peak'] or 1, 1):.2f}")  # fmt: skip
            target(f"{kind}: time ratio within 1.3x of linear", b["time"] / a["time"] / expect,
                   1.3, higher_is_better=False)  # fmt: skip
            if b.get("peak"):
                target(f"{kind}: peak memory at N={hi} (GB)", b["peak"] / 1e9, 16.0,
                       higher_is_better=False)  # fmt: skip
        else:
            print(f"FAIL  {kind}: N={hi} did not run ({b.get('error', 'no result')}): no time "
                  "ratio and no peak memory measured")  # fmt: skip


class BandMaskedLaplacian(torch.nn.Module):
    """The same layer by dense SDPA with an explicit ``N x N`` band mask."""

    def __init__(self, layer: DiffusionAttention, n: int) -> None:
        super().__init__()
        self.layer = layer
        i = torch.arange(n)
        gap = i[:, None] - i[None]
        self.register_buffer("band", (gap >= 0) & (gap < W))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.layer.project_qkv(x)
        pv = F.scaled_dot_product_attention(q, k, v, attn_mask=self.band)
        return self.layer.merge_heads(v - pv)


def flex_layer(layer: DiffusionAttention, n: int) -> tuple[torch.nn.Module | None, str]:
    """The same layer by flex_attention with a sliding-window block mask, if it runs here."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < W)

        mask = create_block_mask(window, None, None, n, n, device="cpu")
        attend = torch.compile(flex_attention)

        class Flex(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                q, k, v = layer.project_qkv(x)
                return layer.merge_heads(v - attend(q, k, v, block_mask=mask))

        model = Flex()
        probe = torch.randn(1, n, D)
        model(probe)  # compile (and fail here if flex_attention cannot run on this CPU)
        return model, "ran"
    except Exception as err:  # reported, not hidden: flex_attention support varies by build
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"


def dense(n: int, repeats: int) -> None:
    layer = window_layer(LAYERS["laplacian"])
    x = torch.randn(1, n, D, requires_grad=True)
    band = BandMaskedLaplacian(layer, n)
    torch.testing.assert_close(band(x), layer(x), atol=1e-4, rtol=1e-4)  # the same layer
    fns = {"window graph": fwd_bwd(layer, x), "dense SDPA + band mask": fwd_bwd(band, x)}
    flex, status = flex_layer(layer, n)
    if flex is not None:
        fns["flex_attention sliding window"] = fwd_bwd(flex, x)
    t = compare(fns, repeats=repeats, warmup=1, budget_s=120.0)
    base = t["window graph"].median
    print_table(
        ["layer (Laplacian heads)", "fwd+bwd", "runs", "vs window graph"],
        [[k, fmt_time(v.median), v.n, fmt_ratio(v.median / base)] for k, v in t.items()],
        title=f"## N={n}: window[w={W}] vs dense attention (H={H}, Dh={DH}, causal)",
    )
    print(f"flex_attention: {status}")
    target("dense SDPA + band mask time / window graph",
           t["dense SDPA + band mask"].median / base, 10.0)  # fmt: skip


def bmm_rate(batch: int, m: int, k: int, n: int, calls: int = 5) -> float:
    """Best float32 rate (flop/s) of a batched ``(m x k) @ (k x n)`` product, ``batch`` of them."""
    a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    best = float("inf")
    for _ in range(calls + 1):  # the first call warms up
        start = time.perf_counter()
        torch.bmm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * batch * m * k * n / best


def rate(n: int, repeats: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, n, DH, generator=gen) for _ in range(3))
    graph = WindowGraph(q, k, window=W, causal=True)
    t = compare({"propagate": lambda: graph.propagate(v)}, repeats=repeats, warmup=1)
    seconds = t["propagate"].median
    peak = matmul_rate()
    issue, full = 2 * H * n * W * DH, 4 * H * n * W * DH
    print(f"## window[w={W}] propagate, N={n}, H={H}, Dh={DH}: {fmt_time(seconds)}; "
          f"matmul rate {peak / 1e9:.0f} GFLOP/s (1024^2 product, this run)")  # fmt: skip
    print(f"rate for 2 N w Dh flops (the target's count): {issue / seconds / 1e9:.1f} GFLOP/s = "
          f"{issue / seconds / peak:.2f} of the matmul rate; for 4 N w Dh (scores and values): "
          f"{full / seconds / peak:.2f}")  # fmt: skip
    # The ceiling: a block of b queries meets a slab of L = b + w - 1 keys, w of them allowed
    # per row, in products Dh = 64 wide. Even with the weights stored (one product per call,
    # no scores), the target's fraction is at most (w / L) x (the rate of those products) / peak
    # (a kernel that skips fully masked tiles wastes less than w / L says, but no kernel beats
    # the rate of its 64-wide products on the useful flops, twice over when it computes scores).
    rows = []
    for b in (16, 32, 64, 128, 256):
        slab = b + W - 1
        shaped = bmm_rate(max(1, H * n // b // 8), b, slab, DH) / peak
        share = W / slab
        rows.append([b, f"({b} x {slab}) @ ({slab} x {DH})", f"{shaped:.2f}", f"{share:.2f}",
                     f"{shaped * share:.2f}", f"{shaped * share / 2:.2f}"])  # fmt: skip
    title = "## ceiling of the target's fraction, per query block size (this run)"
    header = ["block b", "product", "its rate / matmul rate", "allowed share w / L",
              "ceiling, weights stored", "ceiling, scores per call"]  # fmt: skip
    print_table(header, rows, title=title)
    best = max(float(r[4]) for r in rows)
    fastest = max(float(r[2]) for r in rows)
    print(f"best block-product ceiling {best:.2f} (weights stored; this graph's blocks: b = "
          f"{graph.row_block}). Without any waste: a propagate that computes its scores does "
          f"at least 4 N w Dh flops in products {DH} wide, so at the fastest such rate measured "
          f"here ({fastest:.2f}) the target's fraction is at most {fastest / 2:.2f}")  # fmt: skip
    target("window propagate: fraction of the matmul rate (2 N w Dh)", issue / seconds / peak, 0.5)


def heat(repeats: int) -> None:
    n, terms = 1024, 9
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, n, DH, generator=gen) for _ in range(3))
    graph = SoftmaxGraph(q, k)
    fns = {m: (lambda m=m: heat_kernel(graph, v, 1.0, method=m, tol=1e-6))
           for m in ("series", "series-dense")}  # fmt: skip
    t = compare(fns, repeats=repeats, warmup=1)
    peak = matmul_rate()
    ceiling = terms * 4 * n * n * DH * H / peak  # seconds, the SDPA route at the matmul rate
    rows = [[m, fmt_time(x.median), x.n, f"{ceiling / x.median:.2f}"] for m, x in t.items()]
    print_table(["method", "time", "runs", "fraction of the SDPA-route ceiling"], rows,
                title=f"## heat kernel on a dense attention graph, N={n}, H={H}, t=1, tol=1e-6 "
                      f"(ceiling {fmt_time(ceiling)} at {peak / 1e9:.0f} GFLOP/s)")  # fmt: skip
    target("series-dense: fraction of the SDPA-route ceiling", ceiling / t["series-dense"].median,
           0.75)  # fmt: skip


def _total_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--sections", default="scaling,dense,rate,heat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--memory-limit", type=float, default=0.8 * _total_memory(),
        help="skip a scaling run whose peak, extrapolated linearly from N/4, would exceed this "
        "many bytes (default 80%% of this machine's memory)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--json", type=Path, help="also write the machine info here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep-heap", action="store_true",
        help="pertoken: run the child with the C heap kept (glibc; see the docstring)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child == "pertoken":
        print(json.dumps(per_token_child([int(n) for n in args.n.split(",")])))
        return
    if args.child:
        print(json.dumps(child(args.child, int(args.n))))
        return
    info = print_machine()
    if args.json:
        args.json.write_text(json.dumps(info, indent=2))
    sections = set(args.sections.split(","))
    ns = [4096, 16384] if args.quick else [16384, 65536, 262144, 1 << 20]
    if "scaling" in sections:
        scaling(ns, args.memory_limit)
    if "dense" in sections:
        dense(4096 if args.quick else 16384, args.repeats)
    if "rate" in sections:
        rate(16384 if args.quick else 65536, args.repeats)
    if "heat" in sections:
        heat(args.repeats)
    if "pertoken" in sections:
        per_token([4096, 16384] if args.quick else [65536, 1 << 20], args.keep_heap)


if __name__ == "__main__":
    main()
