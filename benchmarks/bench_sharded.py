"""A window heat step split over 2 processes against one process, side by side.

One heat operator (``t = 1``, ``tol = 1e-6``) on a causal ``window[w=W,global=G]`` graph,
B = 1, H heads of width C, float32, forward + backward, one thread per process:

- ``1 process, N``: the single-process :class:`~heatformer.graph_ops.WindowGraph`;
- ``2 processes, N``: the same sequence split over 2 ranks (gloo, loopback);
- ``2 processes, 2N``: twice the sequence on 2 ranks (weak scaling: the issue's target is
  at most 1.25x the time of one process at N).

For each: the time (the slowest rank, between barriers; with ``--repeat R`` the fastest of R
steps, as ``timeit`` reports), the peak RSS growth of each fresh
process (its own block of the sequence only; target at fixed N: at most 0.55x of one
process), and the bytes each rank sent per heat term (per ``propagate``, forward and backward)
against the formula ``(w - 1 + g) C H itemsize`` (causal: the ``w - 1`` rows before a block and
the ``g`` global rows; the backward sends as much back).

Every process first runs the same step once on a short sequence (``4 w`` positions), so that
the measured peak is the step's data, not the code pages and lazy set-up of a first call, which
every process pays once whatever its share of the sequence. Every process runs with glibc's
``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB, as the ``heatformer`` command fixes it (see
``heatformer.lab.cli._heap``; with the dynamic threshold the peak of the same run varied by tens of
MB with the heap's history); ``--heap dynamic`` leaves glibc's default.

    OMP_NUM_THREADS=1 python benchmarks/bench_sharded.py --n 65536 --w 128 --c 64 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PeakRSS, fmt_bytes, fmt_ratio, fmt_time, print_machine, print_table, run_child

from heatformer.graph_ops import HeatKernel, SequenceShard, shard_graph
from heatformer.graph_ops.window.builder import WindowBuilder
from heatformer.graph_ops.window.sharding import ShardedWindowGraph


def _inputs(n: int, heads: int, c: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, n, c, generator=gen).requires_grad_(True) for _ in range(3))


def child(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(1)
    kind = WindowBuilder(args.w, args.g)
    op = HeatKernel(t=1.0)
    if args.child == "single":
        q, k, v = _inputs(4 * args.w, args.heads, args.c, 0)  # warm-up
        op(kind.build(q, k, causal=True), v).sum().backward()
        q, k, v = _inputs(args.n, args.heads, args.c, 0)
        times = []
        for i in range(args.repeat):
            with PeakRSS() as peak:
                start = time.perf_counter()
                op(kind.build(q, k, causal=True), v).sum().backward()
                times.append(time.perf_counter() - start)
            if i == 0:
                first_peak = peak.extra
            for t in (q, k, v):
                t.grad = None
        return {"time": min(times), "times": times, "peak": first_peak}
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{args.store}", rank=args.rank, world_size=args.world
    )
    warm = SequenceShard.current(4 * args.w * args.world)  # warm-up, every rank alike
    q, k, v = _inputs(warm.local_nodes, args.heads, args.c, 1 + args.rank)
    op(shard_graph(kind, warm).build(q, k, causal=True), v).sum().backward()
    shard = SequenceShard.current(args.n)
    q, k, v = _inputs(shard.local_nodes, args.heads, args.c, 1 + args.rank)
    calls = [0]
    plain = ShardedWindowGraph.propagate

    def counted(self: ShardedWindowGraph, x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return plain(self, x)

    ShardedWindowGraph.propagate = counted  # type: ignore[method-assign]
    times = []
    for i in range(args.repeat):
        dist.barrier()
        with PeakRSS() as peak:
            start = time.perf_counter()
            op(shard_graph(kind, shard).build(q, k, causal=True), v).sum().backward()
            dist.barrier()
            times.append(time.perf_counter() - start)
        if i == 0:  # the first step's peak, messages and products
            first_peak, by_kind, propagates = peak.extra, dict(shard.comm.by_kind), calls[0]
        for t in (q, k, v):
            t.grad = None
    dist.destroy_process_group()
    return {
        "time": min(times),
        "times": times,
        "peak": first_peak,
        "propagates": propagates,
        "by_kind": by_kind,
        "rank": args.rank,
    }


def _child_env(args: argparse.Namespace) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": "1"}
    if args.heap == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    return env


def sharded(args: argparse.Namespace, n: int) -> list[dict[str, object]]:
    store = Path(tempfile.mkdtemp()) / "store"
    common = ["--n", str(n), "--w", str(args.w), "--g", str(args.g), "--c", str(args.c),
              "--heads", str(args.heads), "--store", str(store), "--world", "2",
              "--repeat", str(args.repeat)]  # fmt: skip
    env = {**os.environ, **_child_env(args)}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", "rank", "--rank", str(r), *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=3600)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        out.append(json.loads(lines[-1]) if lines else {"error": stderr[-500:]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--w", type=int, default=128)
    parser.add_argument("--g", type=int, default=1)
    parser.add_argument("--c", type=int, default=64)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--child", choices=["single", "rank"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--store", default="")
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="steps timed per process after the warm-up; the time of a run is the fastest "
        "(the peak and the bytes are the first step's)",
    )  # fmt: skip
    parser.add_argument(
        "--heap", choices=["fixed", "dynamic"], default="fixed",
        help="glibc's mmap threshold in every process: fixed at 1 MiB as the heatformer "
        "command fixes it (default), or glibc's dynamic default",
    )  # fmt: skip
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    print_machine()
    print(f"heat(t=1) on causal window[w={args.w},global={args.g}], B=1, H={args.heads}, "
          f"C={args.c}, float32, fwd+bwd, 1 thread per process, a warm-up step first, "
          f"heap: {args.heap}, time: the fastest of {args.repeat} step(s)")  # fmt: skip
    base = ["--n", str(args.n), "--w", str(args.w), "--g", str(args.g), "--c", str(args.c),
            "--heads", str(args.heads), "--repeat", str(args.repeat)]  # fmt: skip
    single = run_child(__file__, ["--child", "single", *base], env=_child_env(args))
    split = sharded(args, args.n)
    weak = sharded(args, 2 * args.n)
    if "error" in single or any("error" in r for r in split + weak):
        print(json.dumps({"single": single, "split": split, "weak": weak}))
        raise SystemExit(1)
    t1, p1 = float(single["time"]), float(single["peak"])  # type: ignore[arg-type]
    rows = [["1 process, N", fmt_time(t1), fmt_bytes(p1), "1", "1"]]
    for label, runs in (("2 processes, N", split), ("2 processes, 2N", weak)):
        t = max(float(r["time"]) for r in runs)  # type: ignore[arg-type]
        peaks = [float(r["peak"]) for r in runs]  # type: ignore[arg-type]
        rows.append([label, fmt_time(t), " / ".join(fmt_bytes(p) for p in peaks),
                     fmt_ratio(t / t1), " / ".join(fmt_ratio(p / p1) for p in peaks)])  # fmt: skip
    print_table(["run", "time", "peak RSS per rank", "time ratio", "peak ratio"], rows,
                title=f"N = {args.n}")  # fmt: skip
    formula = (args.w - 1 + args.g) * args.c * args.heads * 4
    comm_rows = []
    for label, runs in (("N", split), ("2N", weak)):
        for r in runs:
            terms = int(r["propagates"])  # type: ignore[call-overload]
            kinds: dict[str, int] = r["by_kind"]  # type: ignore[assignment]
            fwd, bwd = kinds.get("values", 0) / terms, kinds.get("values-grad", 0) / terms
            comm_rows.append([f"{label}, rank {r['rank']}", terms, fmt_bytes(fwd),
                              fmt_bytes(bwd), fmt_bytes(formula),
                              fmt_bytes(sum(kinds.values()))])  # fmt: skip
    print_table(["run", "heat terms", "sent per term fwd", "bwd", "(w-1+g) C H 4",
                 "total sent (keys too)"], comm_rows, title="bytes sent")  # fmt: skip
    print(json.dumps({"single": single, "split": split, "weak": weak, "formula": formula}))


if __name__ == "__main__":
    main()
