"""Benchmark heatformer heads inside a Hugging Face GPT-2, side by side in one run.

A GPT-2-shaped model (random init, 4 layers, width 256, 8 heads, a 256-token byte vocabulary
so that the LM head does not hide the attention, N = 1024), forward + backward of the LM
loss, timed round-robin (``_common.compare``) in three forms:

- transformers' own ``"sdpa"`` attention (the baseline);
- converted with ``heatformer.integrations.hf.convert(model, "attention")``;
- converted with 2 of 8 Laplacian heads per layer (``"attention:6,laplacian:2"``).

Then the peak memory of ``attention_graphs`` on that model, in fresh child processes
(``_common.PeakRSS``), at several N, with and without padding, next to the dense graphs
(``dense=True``, ``N x N`` per head) and to the bytes the returned graphs hold.

    python benchmarks/bench_integrations.py            # ~3 minutes on 2 idle cores
    python benchmarks/bench_integrations.py --quick    # small sizes, seconds
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# benchmarks/ on the path, whether this runs as a script or is imported as a module
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    PeakRSS,
    compare,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    print_machine,
    print_table,
    run_child,
    target,
    wait_for_quiet,
)

LAYERS, WIDTH, HEADS, VOCAB = 4, 256, 8, 256
FORMS = {
    "transformers sdpa": None,
    "heatformer attention:8": "attention",
    "heatformer attention:6,laplacian:2": "attention:6,laplacian:2",
}


def gpt2(n_positions: int, seed: int = 0) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, n_positions=n_positions, vocab_size=VOCAB,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")


def timing(n: int, batch: int, repeats: int) -> tuple[list[list[str]], dict[str, Any]]:
    from heatformer.integrations import hf

    base = gpt2(n)
    models = {
        name: base if spec is None else hf.convert(copy.deepcopy(base), spec)
        for name, spec in FORMS.items()
    }
    ids = torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the converted all-attention model computes the same function
        diff = (models["heatformer attention:8"](ids).logits - base(ids).logits).abs().max()

    def step(model: Any) -> None:
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()

    fns = {name: (lambda m=m: step(m)) for name, m in models.items()}
    times = compare(fns, repeats=repeats, warmup=1, budget_s=600.0, min_repeats=3)
    cpu: dict[str, list[float]] = {name: [] for name in fns}  # process CPU time, round-robin
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            cpu[name].append(time.process_time() - t0)
    base_t = times["transformers sdpa"].median
    base_cpu = statistics.median(cpu["transformers sdpa"])
    rows, record = [], {"max_abs_logit_diff_all_attention": float(diff)}
    for name, t in times.items():
        ratio = None if base_t is None or t.median is None else t.median / base_t
        cpu_s = statistics.median(cpu[name])
        rows.append([name, fmt_time(t.median), t.n, fmt_ratio(ratio) if ratio else "-",
                     fmt_time(cpu_s), fmt_ratio(cpu_s / base_cpu)])  # fmt: skip
        record[name] = {**t.as_dict(), "ratio": ratio, "cpu_s": cpu[name],
                        "cpu_ratio": cpu_s / base_cpu}  # fmt: skip
    return rows, record


def child_graphs(n: int, batch: int, padded: bool, dense: bool) -> dict[str, Any]:
    """In a fresh process: peak RSS growth of one ``attention_graphs`` call."""
    from heatformer.integrations import hf

    torch.set_num_threads(1)
    model = gpt2(max(n, 16)).eval()

    def inputs(m: int) -> dict[str, Any]:
        ids = torch.randint(0, VOCAB, (batch, m), generator=torch.Generator().manual_seed(2))
        mask = torch.ones(batch, m, dtype=torch.long)
        if padded:
            mask[0, m // 2 :] = 0
        return {"input_ids": ids, "attention_mask": mask}

    hf.attention_graphs(model, dense=dense, **inputs(16))  # warm the code path
    small = inputs(n)
    with PeakRSS() as peak:
        graphs = hf.attention_graphs(model, dense=dense, **small)
    storages: dict[int, int] = {}  # what the graphs keep alive (a q view keeps its qkv)
    for g in graphs:
        tensors = [g.to_dense()] if dense else [g.q, g.k] + ([g.mask] if g.mask is not None else [])
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    held = sum(storages.values())
    return {"peak_extra": peak.extra, "held": held, "method": peak.method}


def memory(ns: list[int], batch: int) -> tuple[list[list[str]], dict[str, Any]]:
    rows, record = [], {}
    dh = WIDTH // HEADS
    for n in ns:
        cells = [str(n)]
        for padded, dense in ((False, False), (True, False), (False, True)):
            if dense and n > 2048:
                cells.append("-")
                continue
            args = ["--child-graphs", str(n), "--batch", str(batch)]
            args += (["--padded"] if padded else []) + (["--dense"] if dense else [])
            out = run_child(__file__, args)
            key = f"n{n}-{'padded' if padded else 'full'}-{'dense' if dense else 'implicit'}"
            record[key] = out
            peak = out.get("peak_extra")
            cells.append(f"{fmt_bytes(peak)} (holds {fmt_bytes(out.get('held'))})")
        bhnd = LAYERS * batch * HEADS * n * dh * 4
        cells += [fmt_bytes(bhnd), fmt_bytes(LAYERS * batch * HEADS * n * n * 4)]
        rows.append(cells)
    return rows, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--n", type=int, default=1024, help="sequence length of the timing")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds for idle CPUs first")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--only", choices=["timing", "memory"], help="run one part only")
    parser.add_argument(
        "--threads", type=int, help="torch threads of the timing (default: torch's)"
    )
    parser.add_argument("--child-graphs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--padded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dense", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_graphs:
        print(json.dumps(child_graphs(args.child_graphs, args.batch, args.padded, args.dense)))
        return
    if args.wait_quiet:
        waited, busy = wait_for_quiet(args.wait_quiet)
        print(f"waited {waited:.0f} s for quiet CPUs (busy fraction {busy})")
    if args.threads:
        torch.set_num_threads(args.threads)
    info = print_machine()
    n, repeats = (128, 3) if args.quick else (args.n, args.repeats)
    timed: dict[str, Any] = {}
    mem: dict[str, Any] = {}
    if args.only != "memory":
        timed = report_timing(n, args.batch, repeats)
    if args.only != "timing":
        mem = report_memory([64, 128] if args.quick else [256, 512, 1024, 2048, 4096], args.batch)
    if args.json:
        args.json.write_text(
            json.dumps({"machine": info, "timing": timed, "memory": mem}, indent=1)
        )


def report_timing(n: int, batch: int, repeats: int) -> dict[str, Any]:
    rows, timed = timing(n, batch, repeats)
    print_table(
        [
            "model (forward + backward of the LM loss)",
            "median",
            "runs",
            "/ transformers sdpa",
            "CPU time",
            "/ sdpa (CPU time)",
        ],
        rows,
        title=f"## GPT-2 ({LAYERS} layers, width {WIDTH}, {HEADS} heads), B={batch}, N={n}",
    )
    print(f"max |logits(sdpa) - logits(heatformer attention:8)| = "
          f"{timed['max_abs_logit_diff_all_attention']:.2e}")  # fmt: skip
    target("all-attention / sdpa", timed["heatformer attention:8"]["ratio"], 1.05,
           higher_is_better=False)  # fmt: skip
    target("2 of 8 Laplacian heads / sdpa", timed["heatformer attention:6,laplacian:2"]["ratio"],
           1.10, higher_is_better=False)  # fmt: skip
    print("(CPU time: the process's own CPU seconds per step, round-robin too; on a shared "
          "machine it is less disturbed by other processes than the wall clock)")  # fmt: skip
    print()
    return timed


def report_memory(ns: list[int], batch: int) -> dict[str, Any]:
    mem_rows, mem = memory(ns, batch)
    dh = WIDTH // HEADS
    print_table(
        ["N", "attention_graphs", "padded batch", "dense=True", f"L·B·H·N·Dh·4 B (Dh={dh})",
         "L·B·H·N²·4 B"],
        mem_rows,
        title=f"## attention_graphs peak memory (RSS growth), {LAYERS} layers, B={batch}",
    )  # fmt: skip
    return mem


if __name__ == "__main__":
    main()
