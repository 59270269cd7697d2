"""The same measurements on two source trees, alternating, side by side in one run.

For a restructuring that must keep speed: ``--baseline`` is the ``src`` folder of another
checkout (``git worktree add /tmp/base <commit>``); each round runs every measurement once in
a fresh child process per tree (``PYTHONPATH`` set to that tree), alternating trees, so a load
spike hits both alike. Printed: the median over rounds per tree and the ratio new / baseline.

Measurements (the public API both trees share):

- ``layer mixed``: a ``DiffusionAttention(512, 8, "attention:4,laplacian:4")`` forward +
  backward at B=4, N=1024 (the fused SDPA path), and ``layer attention`` (all attention);
- ``heat series``: ``heat_kernel`` on a ``SoftmaxGraph`` at H=4, N=1024, d=64, t=1, tol 1e-6;
- ``topk build``: ``SoftmaxGraph(q, k).topk(32)`` at H=4, N=4096, d=64, and
  ``topk propagate``: forward + backward of ``propagate`` on that graph;
- ``window layer``: a ``DiffusionAttention(256, 4, "attention:4",
  graph="window[w=128,global=1]", causal=True)`` forward + backward at B=1, N=65536, and
  ``window layer 1M``: the same at N=2^20 (one timed call; not in the default set);
- ``hf model``: a 2-layer GPT-2 (``transformers``' ``GPT2LMHeadModel``, D=256, 8 heads,
  random weights) converted with ``heatformer.integrations.hf.convert(model,
  "attention:6,laplacian:2")``, forward + backward of its LM loss at B=2, N=512.

    python benchmarks/bench_versions.py --baseline /tmp/base/src --rounds 5
    python benchmarks/bench_versions.py --baseline /tmp/base/src --threads 1 --only "window layer"

``--clock cpu`` times the child's process time instead of the wall clock: on a machine shared
with other jobs, which slow the wall clock of both trees by whatever they happen to run, it
counts only this process's work (memory contention still shows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from heatformer.graph_ops import SoftmaxGraph, heat_kernel
from heatformer.models import DiffusionAttention
name = sys.argv[1]
torch.manual_seed(0)

CLOCK = time.process_time if sys.argv[3] == "cpu" else time.perf_counter

def best(fn, repeats=3):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return min(times)

if name.startswith("layer"):
    spec = "attention:4,laplacian:4" if name == "layer mixed" else "attention:8"
    layer = DiffusionAttention(512, 8, spec)
    x = torch.randn(4, 1024, 512, requires_grad=True)
    def run():
        layer(x).sum().backward()
elif name == "heat series":
    q, k, v = (torch.randn(1, 4, 1024, 64) for _ in range(3))
    g = SoftmaxGraph(q, k)
    def run():
        heat_kernel(g, v, 1.0, method="series", tol=1e-6)
elif name.startswith("window layer"):
    layer = DiffusionAttention(256, 4, "attention:4", graph="window[w=128,global=1]", causal=True)
    n = 1 << 20 if name.endswith("1M") else 65536
    x = torch.randn(1, n, 256, requires_grad=True)
    def run():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()
    if n > 65536:  # one call: a short warm-up instead of a full one
        small = torch.randn(1, 4096, 256, requires_grad=True)
        layer(small).sum().backward()
        start = CLOCK()
        run()
        print(json.dumps({"seconds": CLOCK() - start}))
        sys.exit(0)
elif name == "hf model":
    from transformers import GPT2Config, GPT2LMHeadModel
    from heatformer.integrations import hf
    config = GPT2Config(
        n_layer=2, n_embd=256, n_head=8, n_positions=512, vocab_size=256, attn_pdrop=0.0,
        resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = hf.convert(
        GPT2LMHeadModel._from_config(config, attn_implementation="sdpa"),
        "attention:6,laplacian:2",
    )
    ids = torch.randint(0, 256, (2, 512), generator=torch.Generator().manual_seed(1))
    def run():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
elif name.startswith("topk"):
    q, k = (torch.randn(1, 4, 4096, 64, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 4, 4096, 64, requires_grad=True)
    if name == "topk build":
        def run():
            with torch.no_grad():
                SoftmaxGraph(q, k).topk(32)
    else:
        g = SoftmaxGraph(q, k).topk(32)
        def run():
            g.propagate(v).sum().backward(retain_graph=True)
print(json.dumps({"seconds": best(run)}))
"""

NAMES = [
    "layer attention", "layer mixed", "heat series", "topk build", "topk propagate",
    "window layer", "hf model",
]  # fmt: skip
EXTRA = ["window layer 1M"]


def measure(src: Path, name: str, threads: int, clock: str = "wall") -> float:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(threads), clock],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{name} on {src}: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="src folder of the baseline")
    parser.add_argument("--new", type=Path, default=ROOT / "src", help="src folder (default: this)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time (default), or the child's CPU time (process time: less sensitive to "
        "other jobs on a shared machine, which take cores but not this process's CPU time)",
    )
    parser.add_argument(
        "--only", action="append", choices=NAMES + EXTRA, help="these measurements (repeatable)"
    )
    args = parser.parse_args()
    names = args.only or NAMES
    trees = {"baseline": args.baseline.resolve(), "new": args.new.resolve()}
    times: dict[str, dict[str, list[float]]] = {n: {t: [] for t in trees} for n in names}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in names:
            for tree in order:
                times[name][tree].append(measure(trees[tree], name, args.threads, args.clock))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"baseline: {trees['baseline']}\nnew:      {trees['new']}")
    print(
        f"{args.rounds} alternating rounds, best of 3 calls per child, {args.threads} threads, "
        f"{args.clock} time"
    )
    print(f"{'measurement':<18}{'baseline':>12}{'new':>12}{'new/base':>10}")
    results = {}
    for name in names:
        base, new = (statistics.median(times[name][t]) for t in trees)
        results[name] = {"baseline_s": base, "new_s": new, "ratio": new / base}
        print(f"{name:<18}{base * 1e3:>10.1f}ms{new * 1e3:>10.1f}ms{new / base:>10.3f}")
    if args.json:
        record = {"rounds": args.rounds, "clock": args.clock, "results": results}
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
