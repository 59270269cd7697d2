"""The long-range experiment: which graph kinds let a token 4k to 64k positions away through.

Task: ``recall`` with one key/value pair (``--num-pairs 1 --num-keys 1 --num-values 8``): a
sequence ``k v f f ... f k`` whose label is the value ``v`` at position 1; the classifier reads
the last position, so the graph must carry position 1 across the whole sequence. Chance is
1/8. One-layer models (D=32, 2 heads), 150 steps, batch 8, lr 3e-3, seeds 0 and 1 at 4k, seed
0 above; graphs: ``softmax`` and ``topk[k=16]`` where they fit in time (4k), ``window[w=64]``
at 4k (a window of 64 cannot reach position 1 at any longer N) and ``window[w=64,global=2]``
at every length; heads: attention, attention + Laplacian, attention + heat (the heat head only
up to 16k, for time). (Top-k at 4k runs seed 0 only: its build scores every pair, and on 2
cores a run takes about ten minutes.)

Every configuration is one ``heatformer compare`` (printed before it runs; a finished one is
read back, an interrupted one resumed), and the table at the end is what docs/reproducing.md
shows.

    python benchmarks/long_range.py --out runs/long-range        # 2-3 hours on 2 cores
    python benchmarks/long_range.py --out runs/long-range --lengths 4096
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

HEADS = ["attention:2", "attention:1,laplacian:1", "attention:1,heat:1"]
#: heads above 16k: the heat head (about nine propagations per forward) is left out for time
LONG_HEADS = HEADS[:2]
GRAPHS = {  # graph -> longest N it runs at here (2 CPU cores, minutes per run)
    "softmax": 4096,
    "topk[k=16]": 4096,
    "window[w=64]": 4096,  # its reach is 64 positions: it cannot see position 1 at any N > 64
    "window[w=64,global=2]": 1 << 16,
}
COMMON = [
    "--task", "recall", "--num-pairs", "1", "--num-keys", "1", "--num-values", "8",
    "--layers", "1", "--embd", "32", "--steps", "150", "--batch-size", "8", "--lr", "3e-3",
    "--eval-size", "128", "--no-analysis", "--device", "cpu",
]  # fmt: skip


def command(n: int, graph: str, out: Path) -> list[str]:
    seeds = "2" if n <= 4096 and not graph.startswith("topk") else "1"  # a count: seeds 0, 1 or 0
    heads = [arg for h in (HEADS if n <= 16384 else LONG_HEADS) for arg in ("--heads", h)]
    return [
        sys.executable, "-m", "heatformer", "compare", *COMMON, "--seq-len", str(n),
        "--graph", graph, *heads, "--seeds", seeds, "--out", str(out),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/long-range"))
    parser.add_argument("--lengths", default="4096,16384,65536")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for n in (int(v) for v in args.lengths.split(",")):
        for graph, longest in GRAPHS.items():
            if n > longest:
                continue
            out = args.out / f"n{n}-{graph.replace('[', '-').replace(']', '').replace(',', '-')}"
            cmd = [*command(n, graph, out), "--threads", str(args.threads)]
            if (out / "spec.json").exists() and not (out / "results.json").exists():
                cmd = [*cmd[:4], "--resume", str(out), "--threads", str(args.threads)]
            if not (out / "results.json").exists():
                print("$ " + shlex.join(["heatformer", *cmd[3:]]), flush=True)
                subprocess.run(cmd, check=True)
            results = json.loads((out / "results.json").read_text())
            for row in results["summary"]:
                acc = row["final"]["val_acc"]
                rows.append((n, graph, row["heads"], acc["mean"], acc["std"], len(results["seeds"]),
                             results["wall_time_s"]))  # fmt: skip
    print("\n| N | graph | heads | val_acc (mean ± std) | seeds | wall time of the compare |")
    print("|---|---|---|---|---|---|")
    for n, graph, heads, mean, std, seeds, wall in rows:
        print(f"| {n} | `{graph}` | `{heads}` | {mean:.3f} ± {std:.3f} | {seeds} | {wall:.0f} s |")


if __name__ == "__main__":
    main()
