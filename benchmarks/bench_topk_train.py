"""Peak memory and time of one training step of the recall task's model: top-k vs softmax,
with and without activation checkpointing.

The model is what ``heatformer train --task recall --seq-len N --topk 32 --heads attention:4``
builds (4 blocks, width 128, 4 heads, causal), made through the task's own ``build_model``
(``--activation-checkpointing``: ``activation_checkpointing=True`` in its config). Each cell
runs in a fresh child process with one thread and glibc's mmap threshold fixed as the
``heatformer`` command fixes it (``heatformer.lab.cli._heap``; ``--threshold`` to try another): a
warm-up step at N = 256, then one step at N (forward, backward, AdamW) on ``--batch``
sequences. "peak" is the growth of the resident set over the level before the step
(``_common.PeakRSS``). Printed per N: the peak, its ratio to the smallest N's (linear memory:
the ratio follows N), the peak per sequence, and the step's time. With ``--rounds R`` every
cell runs R times, the rounds interleaved (a load spike hits every cell alike), and the
median is printed. ``--heap`` also samples glibc's heap 100 times a second
(:class:`HeapSampler`) and prints, at the largest sampled resident set, how much of the growth
is mapped blocks (the large tensors), heap in use and free heap (holes the heap keeps
resident): linear tensors with a growing "heap free" mean the allocator, not the library.
``--baseline SRC`` adds the same step (without checkpointing) on another
source tree (``git worktree add /tmp/base <commit>``; its own heap where it has no
``heatformer.lab.cli._heap``), in the same rounds.

    python benchmarks/bench_topk_train.py              # N = 4096, 8192; batch 2 (~3 min)
    python benchmarks/bench_topk_train.py --ns 4096 16384 65536 --kinds topk --checkpointing on
    python benchmarks/bench_topk_train.py --ns 4096 --rounds 3 --baseline /tmp/base/src
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PeakRSS, fmt_bytes, fmt_time, print_machine, print_table, run_child

KINDS = {"topk": 32, "softmax": None}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost",
    )]  # fmt: skip


class HeapSampler:
    """glibc's heap (``mallinfo2``) and the resident set, sampled by a 10 ms timer signal:
    the sample with the largest resident set, as growth over the level on entry.

    Keys of :attr:`at_peak`: ``rss`` (resident), ``mapped`` (blocks of at least the mmap
    threshold, each its own mapping), ``heap_used`` and ``heap_free`` (the heap's free chunks,
    which stay resident). Python runs the handler between bytecodes, so a peak inside one long
    torch op is seen at its end; the kernel's exact peak is :class:`PeakRSS`'s.
    """

    def __init__(self) -> None:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        self._mallinfo2 = libc.mallinfo2
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.base = self._sample()
        self.at_peak = dict.fromkeys(self.base, 0)

    def _sample(self) -> dict[str, int]:
        rss = int(os.pread(self._statm, 256, 0).split()[1]) * self._page
        m = self._mallinfo2()
        return {"rss": rss, "mapped": m.hblkhd, "heap_used": m.uordblks, "heap_free": m.fordblks}

    def _tick(self, *_: object) -> None:
        now = self._sample()
        if now["rss"] - self.base["rss"] > self.at_peak["rss"]:
            self.at_peak = {key: now[key] - self.base[key] for key in now}

    def __enter__(self) -> HeapSampler:
        self.base = self._sample()
        signal.signal(signal.SIGALRM, self._tick)
        signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._tick()
        os.close(self._statm)


def child(
    kind: str, n: int, batch: int, checkpointing: bool, threshold: int, heap: bool = False
) -> dict[str, object]:
    import contextlib

    import torch

    from heatformer.lab.spec import CompareSpec
    from heatformer.lab.tasks import resolve_task

    torch.set_num_threads(1)
    try:
        from heatformer.lab.cli._heap import fix_mmap_threshold

        fixed = fix_mmap_threshold(threshold)
    except ImportError:  # a baseline tree from before the command fixed its heap
        fixed = False
    extra = {"activation_checkpointing": True} if checkpointing else {}

    def step_at(length: int) -> None:
        graph = "softmax" if KINDS[kind] is None else f"topk[k={KINDS[kind]}]"
        spec = CompareSpec(task="recall", heads=("attention:4",), graph=graph,
                           options={"seq_len": length}, **extra)  # fmt: skip
        task = resolve_task("recall")(spec)
        torch.manual_seed(0)
        model = task.build_model(spec.heads[0])
        optimizer = torch.optim.AdamW(model.parameters())
        inputs, targets = task.train_batch(batch, torch.Generator().manual_seed(0))
        sampler = HeapSampler() if heap and length == n else None
        with PeakRSS() as peak, sampler or contextlib.nullcontext():
            start = time.perf_counter()
            loss = task.loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            seconds = time.perf_counter() - start
        result.update(peak=peak.extra, method=peak.method, seconds=seconds, loss=loss.item())
        if sampler is not None:
            result.update(heap=sampler.at_peak)

    result: dict[str, object] = {}
    step_at(256)  # warm-up: code pages, thread pools
    step_at(n)
    return {**result, "heap_fixed": fixed}


def main() -> None:
    try:
        from heatformer.lab.cli._heap import MMAP_THRESHOLD
    except ImportError:  # a child of --baseline, whose tree has no such module
        MMAP_THRESHOLD = 1 << 20

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=["topk", "softmax"])
    parser.add_argument("--checkpointing", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--batch", type=int, default=2, help="sequences per step")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every cell, interleaved")
    parser.add_argument(
        "--threshold", type=int, default=MMAP_THRESHOLD, help="glibc's mmap threshold, bytes"
    )
    parser.add_argument("--baseline", metavar="SRC", help="another tree's src folder")
    parser.add_argument(
        "--heap", action="store_true", help="sample glibc's heap: mapped, used, free at the peak"
    )
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, n, batch, ck, threshold, heap = args.child
        result = child(kind, int(n), int(batch), ck == "on", int(threshold), heap == "on")
        print(json.dumps(result))
        return
    print_machine()
    cells = [(n, kind, ck) for n in args.ns for kind in args.kinds for ck in args.checkpointing]
    if args.baseline:
        cells += [(n, kind, "baseline") for n in args.ns for kind in args.kinds]
    runs: dict[tuple[int, str, str], list[dict[str, object]]] = {cell: [] for cell in cells}
    for _ in range(args.rounds):
        for n, kind, ck in cells:
            on = "on" if ck == "on" else "off"
            heap = "on" if args.heap and ck != "baseline" else "off"
            child_args = ["--child", kind, str(n), str(args.batch), on, str(args.threshold), heap]
            env = {"PYTHONPATH": args.baseline} if ck == "baseline" else None
            runs[n, kind, ck].append(run_child(__file__, child_args, timeout=3600, env=env))
    rows, first = [], {}
    heap_cols = ["", "", ""] if args.heap else []
    for n, kind, ck in cells:
        done = [r for r in runs[n, kind, ck] if "error" not in r]
        if not done:
            rows.append([n, kind, ck, runs[n, kind, ck][0]["error"], "", "", "", "", *heap_cols])
            continue
        peak = statistics.median(float(r["peak"]) for r in done)
        seconds = statistics.median(float(r["seconds"]) for r in done)
        n0, p0 = first.setdefault((kind, ck), (n, peak))
        rows.append([
            n, kind, ck, fmt_bytes(peak), f"{peak / p0:.2f} (N x{n / n0:g})",
            fmt_bytes(peak / args.batch), fmt_time(seconds), f"{float(done[0]['loss']):.6f}",
        ] + (_heap_cells(done) if args.heap else []))  # fmt: skip
    print_table(
        ["N", "graph", "checkpointing (baseline: the other tree)", "peak", "vs first N",
         "per sequence", "step time",
         "loss"] + (["at the sampled peak: mapped", "heap used", "heap free"] if args.heap else []),
        rows,
        title=f"One training step of the recall model, batch {args.batch}, one thread, mmap "
        f"threshold {args.threshold / 2**20:g} MiB, median of {args.rounds} round(s)",
    )  # fmt: skip


def _heap_cells(done: list[dict[str, object]]) -> list[str]:
    """Medians of the heap split at the sampled peak (growth over the step's start)."""
    split = [r["heap"] for r in done if isinstance(r.get("heap"), dict)]
    if not split:
        return ["", "", ""]
    return [fmt_bytes(statistics.median(float(h[key]) for h in split))  # type: ignore[index]
            for key in ("mapped", "heap_used", "heap_free")]  # fmt: skip


if __name__ == "__main__":
    main()
