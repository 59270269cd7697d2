"""Peak memory and time of one training step of the recall task's model, top-k vs softmax.

The model is what ``heatformer train --task recall --seq-len N --topk 32 --heads attention:4``
builds (4 blocks, width 128, 4 heads, causal), made through the task's own ``build_model``.
Each cell runs in a fresh child process: a warm-up step at N = 256, then one step at N
(forward, backward, AdamW) on ``--batch`` sequences, one thread. "peak" is the growth of the
resident set over the level before the step (``_common.PeakRSS``), under two heaps side by
side: glibc's default (a dynamic mmap threshold) and the threshold the ``heatformer`` command
fixes at start (``heatformer.cli._heap``). Printed per N: the peaks, their ratio to the
smallest N's (linear memory: the ratio follows N), the top-k peak per sequence, and the time.

    python benchmarks/bench_topk_train.py                 # N = 4096, 8192, 16384 (~4 min)
    python benchmarks/bench_topk_train.py --ns 4096 16384 65536 --kinds topk   # ~25 min
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PeakRSS, fmt_bytes, fmt_time, print_machine, print_table, run_child

KINDS = {"topk": 32, "softmax": None}


def child(kind: str, n: int, batch: int, heap: str) -> dict[str, object]:
    import torch

    from heatformer.cli._heap import fix_mmap_threshold
    from heatformer.experiments import CompareSpec, resolve_task

    torch.set_num_threads(1)
    fixed = heap == "command" and fix_mmap_threshold()

    def step_at(length: int) -> None:
        spec = CompareSpec(task="recall", heads=("attention:4",), topk=KINDS[kind],
                           options={"seq_len": length})  # fmt: skip
        task = resolve_task("recall")(spec)
        torch.manual_seed(0)
        model = task.build_model(spec.heads[0])
        optimizer = torch.optim.AdamW(model.parameters())
        inputs, targets = task.train_batch(batch, torch.Generator().manual_seed(0))
        with PeakRSS() as peak:
            start = time.perf_counter()
            task.loss(model(inputs), targets).backward()
            optimizer.step()
            seconds = time.perf_counter() - start
        result.update(peak=peak.extra, method=peak.method, seconds=seconds)

    result: dict[str, object] = {}
    step_at(256)  # warm-up: code pages, thread pools
    step_at(n)
    return {**result, "heap_fixed": fixed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=["topk", "softmax"])
    parser.add_argument("--batch", type=int, default=1, help="sequences per step")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, n, batch, heap = args.child
        print(json.dumps(child(kind, int(n), int(batch), heap)))
        return
    print_machine()
    rows, first = [], {}
    for n in args.ns:
        for kind in args.kinds:
            cells = {
                heap: run_child(
                    __file__, ["--child", kind, str(n), str(args.batch), heap], timeout=3600
                )
                for heap in ("default", "command")
            }
            if any("error" in cell for cell in cells.values()):
                rows.append([n, kind, *(cell.get("error", "") for cell in cells.values()), "", ""])
                continue
            peak = {heap: float(cell["peak"]) for heap, cell in cells.items()}
            first.setdefault(kind, (n, peak["command"]))
            n0, p0 = first[kind]
            rows.append([
                n, kind, fmt_bytes(peak["default"]), fmt_bytes(peak["command"]),
                f"{peak['command'] / p0:.2f} (N x{n / n0:g})",
                fmt_bytes(peak["command"] / args.batch),
                f"{fmt_time(float(cells['default']['seconds']))} / "
                f"{fmt_time(float(cells['command']['seconds']))}",
            ])  # fmt: skip
    print_table(
        ["N", "graph", "peak (glibc default)", "peak (command's heap)", "vs first N",
         "per sequence", "step time (default / command)"],
        rows,
        title=f"One training step of the recall model, batch {args.batch}, one thread",
    )  # fmt: skip


if __name__ == "__main__":
    main()
