"""Peak memory and time of one training step of the recall task's model: top-k vs softmax,
with and without activation checkpointing.

The model is what ``heatformer train --task recall --seq-len N --topk 32 --heads attention:4``
builds (4 blocks, width 128, 4 heads, causal), made through the task's own ``build_model``
(``--activation-checkpointing``: ``activation_checkpointing=True`` in its config). Each cell
runs in a fresh child process with one thread and glibc's mmap threshold fixed as the
``heatformer`` command fixes it (``heatformer.cli._heap``; ``--threshold`` to try another): a
warm-up step at N = 256, then one step at N (forward, backward, AdamW) on ``--batch``
sequences. "peak" is the growth of the resident set over the level before the step
(``_common.PeakRSS``). Printed per N: the peak, its ratio to the smallest N's (linear memory:
the ratio follows N), the peak per sequence, and the step's time. With ``--rounds R`` every
cell runs R times, the rounds interleaved (a load spike hits every cell alike), and the
median is printed. ``--baseline SRC`` adds the same step (without checkpointing) on another
source tree (``git worktree add /tmp/base <commit>``; its own heap where it has no
``heatformer.cli._heap``), in the same rounds.

    python benchmarks/bench_topk_train.py              # N = 4096, 8192; batch 2 (~3 min)
    python benchmarks/bench_topk_train.py --ns 4096 16384 65536 --kinds topk --checkpointing on
    python benchmarks/bench_topk_train.py --ns 4096 --rounds 3 --baseline /tmp/base/src
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PeakRSS, fmt_bytes, fmt_time, print_machine, print_table, run_child

KINDS = {"topk": 32, "softmax": None}


def child(kind: str, n: int, batch: int, checkpointing: bool, threshold: int) -> dict[str, object]:
    import torch

    from heatformer.experiments import CompareSpec, resolve_task

    torch.set_num_threads(1)
    try:
        from heatformer.cli._heap import fix_mmap_threshold

        fixed = fix_mmap_threshold(threshold)
    except ImportError:  # a baseline tree from before the command fixed its heap
        fixed = False
    extra = {"activation_checkpointing": True} if checkpointing else {}

    def step_at(length: int) -> None:
        spec = CompareSpec(task="recall", heads=("attention:4",), topk=KINDS[kind],
                           options={"seq_len": length}, **extra)  # fmt: skip
        task = resolve_task("recall")(spec)
        torch.manual_seed(0)
        model = task.build_model(spec.heads[0])
        optimizer = torch.optim.AdamW(model.parameters())
        inputs, targets = task.train_batch(batch, torch.Generator().manual_seed(0))
        with PeakRSS() as peak:
            start = time.perf_counter()
            loss = task.loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            seconds = time.perf_counter() - start
        result.update(peak=peak.extra, method=peak.method, seconds=seconds, loss=loss.item())

    result: dict[str, object] = {}
    step_at(256)  # warm-up: code pages, thread pools
    step_at(n)
    return {**result, "heap_fixed": fixed}


def main() -> None:
    try:
        from heatformer.cli._heap import MMAP_THRESHOLD
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
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, n, batch, ck, threshold = args.child
        print(json.dumps(child(kind, int(n), int(batch), ck == "on", int(threshold))))
        return
    print_machine()
    cells = [(n, kind, ck) for n in args.ns for kind in args.kinds for ck in args.checkpointing]
    if args.baseline:
        cells += [(n, kind, "baseline") for n in args.ns for kind in args.kinds]
    runs: dict[tuple[int, str, str], list[dict[str, object]]] = {cell: [] for cell in cells}
    for _ in range(args.rounds):
        for n, kind, ck in cells:
            on = "on" if ck == "on" else "off"
            child_args = ["--child", kind, str(n), str(args.batch), on, str(args.threshold)]
            env = {"PYTHONPATH": args.baseline} if ck == "baseline" else None
            runs[n, kind, ck].append(run_child(__file__, child_args, timeout=3600, env=env))
    rows, first = [], {}
    for n, kind, ck in cells:
        done = [r for r in runs[n, kind, ck] if "error" not in r]
        if not done:
            rows.append([n, kind, ck, runs[n, kind, ck][0]["error"], "", "", "", ""])
            continue
        peak = statistics.median(float(r["peak"]) for r in done)
        seconds = statistics.median(float(r["seconds"]) for r in done)
        n0, p0 = first.setdefault((kind, ck), (n, peak))
        rows.append([
            n, kind, ck, fmt_bytes(peak), f"{peak / p0:.2f} (N x{n / n0:g})",
            fmt_bytes(peak / args.batch), fmt_time(seconds), f"{float(done[0]['loss']):.6f}",
        ])  # fmt: skip
    print_table(
        ["N", "graph", "checkpointing (baseline: the other tree)", "peak", "vs first N",
         "per sequence", "step time",
         "loss"],
        rows,
        title=f"One training step of the recall model, batch {args.batch}, one thread, mmap "
        f"threshold {args.threshold / 2**20:g} MiB, median of {args.rounds} round(s)",
    )  # fmt: skip


if __name__ == "__main__":
    main()
