"""Benchmark DiffusionAttention layers and GPT training throughput, side by side in one run.

Prints forward+backward time and peak extra memory of a DiffusionAttention layer with
8 attention heads, 4 attention + 4 Laplacian, 4 attention + 4 heat (t = 1), the same mixed
layer written the obvious way (materialized softmax), and top-k(32), at several N; then GPT
training throughput with 0, 2 and 4 Laplacian heads of 8. Configurations are timed in
interleaved rounds (median reported), so machine noise hits them alike; the ratios are the
point. Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the process's peak
resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) minus the resident set
before the step.

    python benchmarks/bench_layers.py             # full run (several minutes on 2 cores)
    python benchmarks/bench_layers.py --quick     # a tiny configuration (seconds)
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer.models import GPT, DiffusionAttention, GPTConfig

# ---- measurement ---------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak memory above the level before ``fn()`` (CUDA allocator or CPU resident set)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - base) * 1024


def interleaved_median(
    fns: dict[str, Callable[[], object]], rounds: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds (1 warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds + 1):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r > 0:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def machine(device: torch.device) -> str:
    """One line describing the machine and torch."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc = f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    if device.type == "cuda":
        desc += f", {torch.cuda.get_device_name(device)}"
    return desc


# ---- layers ----------------------------------------------------------------------------------


class MaterializedMixed(nn.Module):
    """The mixed layer written the obvious way: softmax materialized, ``(I - P) V`` by hand."""

    def __init__(self, layer: DiffusionAttention) -> None:
        super().__init__()
        self.layer = layer
        self.num_lap = sum(op.name == "laplacian" for op in layer.head_operators)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.layer.project_qkv(x)  # (B, H, N, Dh)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, N, N)
        p = torch.softmax(scores, dim=-1)
        pv = p @ v
        h = self.layer.num_heads - self.num_lap
        y = torch.cat([pv[:, :h], v[:, h:] - pv[:, h:]], dim=1)
        return self.layer.merge_heads(y)


def layer_table(
    ns: list[int], batch: int, dim: int, heads: int, rounds: int, device: torch.device,
    big_batch_n: int,
) -> list[tuple[int, str, float, int]]:  # fmt: skip
    """Rows ``(N, name, seconds, peak bytes)`` for every layer kind at every N."""
    rows = []
    for n in ns:
        b = batch if n <= big_batch_n else 1
        half = heads // 2
        kinds: dict[str, nn.Module] = {}
        if n <= 4096:
            kinds["attention:8"] = DiffusionAttention(dim, heads, f"attention:{heads}")
            kinds["attn:4+lap:4"] = DiffusionAttention(
                dim, heads, f"attention:{half},laplacian:{half}"
            )
            kinds["attn:4+heat:4"] = DiffusionAttention(dim, heads, f"attention:{half},heat:{half}")
            kinds["materialized 4+4"] = MaterializedMixed(kinds["attn:4+lap:4"])  # type: ignore[arg-type]
        kinds["topk32 attn:4+lap:4"] = DiffusionAttention(
            dim, heads, f"attention:{half},laplacian:{half}", topk=32
        )
        for mod in kinds.values():
            mod.to(device)
        x = torch.randn(b, n, dim, device=device, requires_grad=True)

        def step(mod: nn.Module, x: Tensor = x) -> Callable[[], object]:
            def run() -> None:
                x.grad = None
                mod.zero_grad(set_to_none=True)
                mod(x).sum().backward()

            return run

        fns = {name: step(mod) for name, mod in kinds.items()}
        times = interleaved_median(fns, rounds if n <= 4096 else 1, device)
        for name, fn in fns.items():
            rows.append((n, f"B={b} " + name, times[name], peak_extra_bytes(fn, device)))
        del kinds, fns, x
        gc.collect()
    return rows


def gpt_throughput(
    lap_counts: list[int], steps: int, batch: int, seq: int, device: torch.device
) -> dict[int, float]:
    """Training tokens/s of a small GPT with ``c`` Laplacian heads of 8 (interleaved)."""
    models, opts, data = {}, {}, {}
    gen = torch.Generator().manual_seed(0)
    for c in lap_counts:
        heads = "attention:8" if c == 0 else f"attention:{8 - c},laplacian:{c}"
        cfg = GPTConfig(block_size=seq, n_layer=4, n_head=8, n_embd=256, heads=heads)
        torch.manual_seed(0)
        models[c] = GPT(cfg).to(device)
        opts[c] = torch.optim.AdamW(models[c].parameters(), lr=3e-4)
        data[c] = torch.randint(0, 256, (batch, seq + 1), generator=gen).to(device)

    def step(c: int) -> Callable[[], object]:
        def run() -> None:
            idx = data[c]
            logits = models[c](idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
            opts[c].zero_grad(set_to_none=True)
            loss.backward()
            opts[c].step()

        return run

    times = interleaved_median({str(c): step(c) for c in lap_counts}, steps, device)
    return {c: batch * seq / times[str(c)] for c in lap_counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per configuration")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.quick:
        ns, batch, dim, rounds, big = [128, 256], 2, 64, 2, 256
        gpt = {"steps": 2, "batch": 2, "seq": 64}
    else:
        ns, batch, dim, rounds, big = [1024, 4096, 16384], 4, 512, args.rounds, 1024
        gpt = {"steps": args.rounds, "batch": 16, "seq": 256}
    print(f"machine: {machine(device)}")
    print(f"\nDiffusionAttention forward+backward (D={dim}, H=8, Dh={dim // 8}, median of rounds)")
    print(f"{'N':>6}  {'layer':<32}{'time (s)':>10}{'peak extra (MB)':>17}{'time ratio':>12}")
    rows = layer_table(ns, batch, dim, 8, rounds, device, big)
    base: dict[int, tuple[float, int]] = {}
    for n, name, sec, peak in rows:
        if name.endswith("attention:8"):
            base[n] = (sec, peak)
        ratio = f"{sec / base[n][0]:.2f}x" if n in base else "-"
        print(f"{n:>6}  {name:<32}{sec:>10.3f}{peak / 2**20:>17.1f}{ratio:>12}")
    n0 = ns[0]
    by = {name.split(" ", 1)[1]: (sec, peak) for n, name, sec, peak in rows if n == n0}
    mixed, attn, mat = by["attn:4+lap:4"], by["attention:8"], by["materialized 4+4"]
    print(f"\ntargets at N={n0}:")
    _report("4+4 Laplacian time <= 1.10x all-attention", mixed[0] / attn[0], 1.10)
    _report("4+4 Laplacian time <= 0.5x materialized", mixed[0] / mat[0], 0.5)
    _report("4+4 Laplacian peak memory <= 1.2x all-attention", mixed[1] / max(attn[1], 1), 1.2)
    nmax = ns[-1]
    topk_peak = next(peak for n, name, _, peak in rows if n == nmax and "topk" in name)
    _report(f"top-k(32) layer at N={nmax} peak memory (GB) <= 4", topk_peak / 2**30, 4.0)

    print(f"\nGPT training throughput (4 layers, D=256, 8 heads, B={gpt['batch']}, N={gpt['seq']})")
    tps = gpt_throughput([0, 2, 4], gpt["steps"], gpt["batch"], gpt["seq"], device)
    for c, v in tps.items():
        print(f"  {c} Laplacian heads of 8: {v:10.0f} tokens/s  ({v / tps[0]:.3f}x)")
    _report("2 Laplacian heads throughput >= 0.95x all-attention", tps[2] / tps[0], 0.95, ge=True)


def _report(what: str, value: float, bound: float, *, ge: bool = False) -> None:
    ok = value >= bound if ge else value <= bound
    print(f"  [{'PASS' if ok else 'FAIL'}] {what}: {value:.3f}")


if __name__ == "__main__":
    main()
