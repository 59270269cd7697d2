"""Benchmark DiffusionAttention layers and GPT training throughput, side by side in one run.

Forward+backward time and peak extra memory of a DiffusionAttention layer with 8 attention
heads, 4 attention + 4 Laplacian, 4 attention + 4 heat (t = 1), the same mixed layer written
the obvious way (materialized softmax), and top-k(32), at N in {1024, 4096, 16384}; then GPT
training throughput with 0, 2 and 4 Laplacian heads of 8.

Times are taken round-robin in one process (``_common.compare``), so a load spike hits every
layer alike and the ratios stay meaningful. Peak memory of each layer is measured in a fresh
child process (``_common.run_child`` + ``PeakRSS``: growth of the resident set over its level
before the step, after a warm-up at a tiny size); on CUDA, ``torch.cuda.max_memory_allocated``.

    python benchmarks/bench_layers.py             # full run (~10 minutes on 2 cores)
    python benchmarks/bench_layers.py --quick     # tiny sizes (well under a minute)
    python benchmarks/bench_layers.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# benchmarks/ on the path, whether this runs as a script or is imported as a module
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

from heatformer.models import GPT, DiffusionAttention, GPTConfig

HEADS = 8


class MaterializedMixed(nn.Module):
    """The mixed layer written the obvious way: softmax materialized, ``(I - P) V`` by hand."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layer = DiffusionAttention(dim, HEADS, "attention:4,laplacian:4")

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.layer.project_qkv(x)  # (B, H, N, Dh)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, N, N)
        pv = torch.softmax(scores, dim=-1) @ v
        y = torch.cat([pv[:, :4], v[:, 4:] - pv[:, 4:]], dim=1)
        return self.layer.merge_heads(y)


#: layer name -> constructor (dim) ; dense layers only up to N = 4096
LAYERS: dict[str, Callable[[int], nn.Module]] = {
    "attention:8": lambda d: DiffusionAttention(d, HEADS, "attention:8"),
    "attention:4,laplacian:4": lambda d: DiffusionAttention(d, HEADS, "attention:4,laplacian:4"),
    "attention:4,heat:4": lambda d: DiffusionAttention(d, HEADS, "attention:4,heat:4"),
    "materialized 4+4": MaterializedMixed,
    "topk32 attention:4,laplacian:4": lambda d: DiffusionAttention(
        d, HEADS, "attention:4,laplacian:4", graph="topk[k=32]"
    ),
}
DENSE_MAX_N = 4096


def fwd_bwd(layer: nn.Module, x: Tensor) -> Callable[[], None]:
    """One forward+backward of ``layer`` on ``x`` (grads reset each call)."""

    def run() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()
        if x.is_cuda:
            torch.cuda.synchronize()

    return run


def child_peak(name: str, n: int, batch: int, dim: int, device: str) -> dict[str, object]:
    """Peak extra memory of one forward+backward (run in a fresh process)."""
    torch.manual_seed(0)
    layer = LAYERS[name](dim).to(device)
    fwd_bwd(layer, torch.randn(1, 64, dim, device=device, requires_grad=True))()  # warm-up
    x = torch.randn(batch, n, dim, device=device, requires_grad=True)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_bwd(layer, x)()
        return {"peak": torch.cuda.max_memory_allocated() - base, "method": "cuda allocator"}
    with PeakRSS() as p:
        fwd_bwd(layer, x)()
    return {"peak": p.extra, "method": p.method}


def layer_rows(
    ns: list[int], dim: int, batch_for: Callable[[int], int], repeats: int, device: str
) -> list[dict[str, object]]:
    """Time (round-robin) and peak memory (child processes) of every layer at every N."""
    rows: list[dict[str, object]] = []
    for n in ns:
        b = batch_for(n)
        names = [m for m in LAYERS if n <= DENSE_MAX_N or m.startswith("topk")]
        torch.manual_seed(0)
        x = torch.randn(b, n, dim, device=device, requires_grad=True)
        fns = {m: fwd_bwd(LAYERS[m](dim).to(device), x) for m in names}
        timings = compare(fns, repeats=repeats, warmup=1, budget_s=60.0)
        del fns, x
        for m in names:
            args = ["--child", m, "--n", str(n), "--batch", str(b), "--dim", str(dim)]
            mem = run_child(__file__, [*args, "--device", device])
            rows.append(
                {"n": n, "batch": b, "layer": m, "time": timings[m].median,
                 "runs": timings[m].n, "peak": mem.get("peak"), "error": mem.get("error")}
            )  # fmt: skip
    return rows


def gpt_throughput(
    lap_counts: list[int], repeats: int, batch: int, seq: int, device: str
) -> dict[int, float]:
    """Training tokens/s of a 4-layer GPT with ``c`` Laplacian heads of 8 (round-robin)."""
    gen = torch.Generator().manual_seed(0)
    fns = {}
    for c in lap_counts:
        heads = "attention:8" if c == 0 else f"attention:{8 - c},laplacian:{c}"
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=seq, n_layer=4, n_head=8, n_embd=256, heads=heads))
        model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        idx = torch.randint(0, 256, (batch, seq + 1), generator=gen).to(device)

        def step(model: GPT = model, opt: torch.optim.Optimizer = opt, idx: Tensor = idx) -> None:
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if idx.is_cuda:
                torch.cuda.synchronize()

        fns[str(c)] = step
    timings = compare(fns, repeats=repeats, warmup=2, budget_s=120.0)
    return {c: batch * seq / (timings[str(c)].median or math.inf) for c in lap_counts}


def layer_flops(batch: int, n: int, dim: int, heads: int = HEADS) -> float:
    """Matmul flops of one forward+backward of a dense layer that stores no ``N x N`` tensor.

    Projections (q, k, v and out; forward, grad of input, grad of weight): ``3 * 8 B N D^2``.
    Attention core: forward ``q k^T`` and ``P v`` (``4 B H N^2 Dh``); a backward that does
    not keep ``P`` recomputes ``q k^T`` and forms ``dV, dP, dQ, dK`` (``10 B H N^2 Dh``).
    Laplacian heads add element-wise work only.
    """
    dh = dim // heads
    return 24.0 * batch * n * dim**2 + 14.0 * batch * heads * n * n * dh


def _layer_ceiling(
    mixed: dict[str, Any], mat: dict[str, Any], attn: dict[str, Any], dim: int, rate: float
) -> None:
    """Print what the ``<= 0.5x materialized`` target asks of the machine's matmul rate."""
    flops = layer_flops(mixed["batch"], mixed["n"], dim)
    goal = 0.5 * mat["time"]
    print(
        f"ceiling: the fused layer does >= {flops / 1e9:.1f} GFLOP of matmuls; reaching 0.5x "
        f"the materialized layer ({fmt_time(goal)}) needs {flops / goal / 1e9:.0f} GFLOP/s "
        f"with exponentials and element-wise work free. This machine's best float32 matmul "
        f"in this run: {rate / 1e9:.0f} GFLOP/s; the all-attention layer ran at "
        f"{flops / attn['time'] / 1e9:.0f} GFLOP/s and the mixed one at "
        f"{flops / mixed['time'] / 1e9:.0f} GFLOP/s."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per layer")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dim", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_peak(args.child, args.n, args.batch, args.dim, args.device)))
        return

    print_machine()
    if args.quick:
        ns, dim, repeats, gpt = [128, 256], 64, 2, {"batch": 2, "seq": 64}
        batch_for: Callable[[int], int] = lambda n: 2  # noqa: E731
    else:
        ns, dim, repeats, gpt = [1024, 4096, 16384], 512, args.repeats, {"batch": 16, "seq": 256}
        batch_for = lambda n: 4 if n <= 1024 else 1  # noqa: E731
    rows = layer_rows(ns, dim, batch_for, repeats, args.device)
    base = {r["n"]: r for r in rows if r["layer"] == "attention:8"}
    table = []
    for r in rows:
        ref = base.get(r["n"])
        t_ratio = r["time"] / ref["time"] if ref and r["time"] else None
        m_ratio = r["peak"] / ref["peak"] if ref and r["peak"] and ref["peak"] else None
        table.append(
            [r["n"], r["batch"], r["layer"], fmt_time(r["time"]), r["runs"],
             fmt_ratio(t_ratio), fmt_bytes(r["peak"]), fmt_ratio(m_ratio)]
        )  # fmt: skip
    print_table(
        [
            "N",
            "B",
            "layer",
            "fwd+bwd",
            "runs",
            "time vs attention",
            "peak extra",
            "mem vs attention",
        ],
        table,
        title=f"## DiffusionAttention forward+backward (D={dim}, H={HEADS}, Dh={dim // HEADS})",
    )
    n0, nmax = ns[0], ns[-1]
    at = {r["layer"]: r for r in rows if r["n"] == n0}
    mixed, attn, mat = at["attention:4,laplacian:4"], at["attention:8"], at["materialized 4+4"]
    print(f"## targets (N={n0})")
    target("4+4 Laplacian time / all-attention", mixed["time"] / attn["time"], 1.10,
           higher_is_better=False)  # fmt: skip
    target("4+4 Laplacian time / materialized softmax", mixed["time"] / mat["time"], 0.5,
           higher_is_better=False)  # fmt: skip
    if mixed["peak"] and attn["peak"]:
        target("4+4 Laplacian peak memory / all-attention", mixed["peak"] / attn["peak"], 1.2,
               higher_is_better=False)  # fmt: skip
    _layer_ceiling(mixed, mat, attn, dim, matmul_rate(device=args.device))
    topk = next(r for r in rows if r["n"] == nmax and str(r["layer"]).startswith("topk"))
    gb = topk["peak"] / 1e9 if topk["peak"] else None
    target(f"top-k(32) layer at N={nmax}: peak GB", gb, 4.0, higher_is_better=False)

    print(f"\n## GPT training throughput (4 layers, D=256, 8 heads, B={gpt['batch']}, "
          f"N={gpt['seq']})")  # fmt: skip
    tps = gpt_throughput([0, 2, 4], repeats, gpt["batch"], gpt["seq"], args.device)
    print_table(
        ["Laplacian heads of 8", "tokens/s", "vs all-attention"],
        [[c, f"{v:.0f}", fmt_ratio(v / tps[0])] for c, v in tps.items()],
    )
    target("GPT throughput with 2 Laplacian heads / all-attention", tps[2] / tps[0], 0.95)


if __name__ == "__main__":
    main()
