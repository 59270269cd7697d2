"""Attention statistics of a Hugging Face model at 32k tokens, without ``output_attentions``.

``heatformer.integrations.hf.attention_stats(model, **inputs)`` runs the model once with its
own fused (sdpa) attention and a hook on every attention module that reduces the layer's
attention graph to the column sums of ``P`` (how much each token is read), the row entropy and
the largest logit of every query, per layer and head (issue 42, item 3). transformers' own way,
``output_attentions=True``, forces its eager path, which forms every ``(B, H, N, N)`` map:
at N = 32768 that is 4.3 GB per head and layer in float32.

Two tiny models built from configs (random init, offline, float32):

- a BERT (bidirectional): 2 layers, width 64, 2 heads of Dh = 32;
- a Llama (causal, grouped-query): 2 layers, width 64, 4 query heads of Dh = 16 sharing
  2 key/value heads.

Each run is a fresh child process (``_common.PeakRSS``: growth of the resident set over the
call, after a warm-up of the same path at N = 64): the model's plain forward (its sdpa), then
``hf.attention_stats``, wall and CPU time of one call each, the peak, and checks of the result
(every head's in-degrees sum to N; entropies within ``[0, log N]``). ``--check N`` also compares
the statistics with the eager maps of ``output_attentions=True`` at a small N.

    python benchmarks/bench_hf_stats.py                    # N = 32768, ~3 min on 2 idle cores
    python benchmarks/bench_hf_stats.py --n 8192 --models bert
    python benchmarks/bench_hf_stats.py --quick            # N = 1024, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# benchmarks/ on the path, whether this runs as a script or is imported as a module
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PeakRSS, fmt_bytes, fmt_time, print_machine, print_table, run_child

VOCAB = 256
MODELS = ("bert", "llama")


def build(family: str, n: int, seed: int = 0) -> Any:
    """A tiny random model of ``family`` for sequences of up to ``n`` tokens, sdpa, eval."""
    import transformers

    # a wide initialisation, so that the attention of the random model is not uniform
    common = {"vocab_size": VOCAB, "pad_token_id": 0, "initializer_range": 0.3}
    if family == "bert":
        config: Any = transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            max_position_embeddings=n, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            **common,
        )  # fmt: skip
        cls: Any = transformers.BertModel
    else:
        config = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=n, bos_token_id=1, eos_token_id=2,
            **common,
        )  # fmt: skip
        cls = transformers.LlamaModel
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval()


def inputs(n: int, batch: int = 1) -> dict[str, Any]:
    ids = torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones(batch, n, dtype=torch.long)}


def child(family: str, n: int, what: str) -> dict[str, Any]:
    """In a fresh process: one call of ``what`` (``forward`` or ``stats``) at ``n`` tokens."""
    from heatformer.integrations import hf

    model = build(family, n)
    small, big = inputs(64), inputs(n)

    def call(x: dict[str, Any]) -> Any:
        if what == "stats":
            return hf.attention_stats(model, **x)
        with torch.no_grad():
            return model(**x)

    call(small)  # warm the code path (and transformers' one-time work) at a tiny size
    t0, c0 = time.perf_counter(), time.process_time()
    with PeakRSS() as peak:
        out = call(big)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    record: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu, "peak_extra": peak.extra,
                              "method": peak.method}  # fmt: skip
    if what == "stats":
        sums = torch.stack([s.in_degree.sum(-1) for s in out])  # (L, B, H): N each
        entropy = torch.stack([s.entropy for s in out])
        logits = torch.stack([s.max_logit for s in out])
        record.update(
            layers=len(out),
            shape=list(out[0].entropy.shape),
            in_degree_sum_err=float((sums - n).abs().max() / n),
            entropy_min=float(entropy.min()),
            entropy_max=float(entropy.max()),
            log_n=math.log(n),
            max_logit_range=[float(logits.min()), float(logits.max())],
            top_read=[int(s.in_degree[0].sum(0).argmax()) for s in out],  # most-read token
            held_bytes=sum(
                t.numel() * t.element_size()
                for s in out
                for t in (s.in_degree, s.entropy, s.max_logit)
            ),
        )
    return record


def check_against_eager(family: str, n: int) -> dict[str, float]:
    """Largest differences from transformers' eager maps (``output_attentions=True``)."""
    import copy

    from heatformer.integrations import hf

    model = build(family, n).to(torch.float64)
    x = inputs(n, batch=2)
    x["attention_mask"][1, n // 2 :] = 0  # a padded sequence
    stats = hf.attention_stats(model, **x)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        maps = eager(**x, output_attentions=True).attentions
    d_in = d_h = 0.0
    for s, p in zip(stats, maps, strict=True):
        plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0)
        d_in = max(d_in, float((s.in_degree - p.sum(-2)).abs().max()))
        d_h = max(d_h, float((s.entropy + plogp.sum(-1)).abs().max()))
    return {"in_degree": d_in, "entropy": d_h}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32768, help="sequence length")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="N = 1024 (seconds)")
    parser.add_argument(
        "--check", type=int, default=256, metavar="N",
        help="compare with eager output_attentions at this N (0: skip)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--child", nargs=3, metavar=("FAMILY", "N", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        family, n, what = args.child
        print(json.dumps(child(family, int(n), what)))
        return
    info = print_machine()
    n = 1024 if args.quick else args.n
    record: dict[str, Any] = {"machine": info, "n": n, "runs": {}, "check": {}}
    rows = []
    for family in args.models:
        base = run_child(__file__, ["--child", family, str(n), "forward"], timeout=3600)
        stats = run_child(__file__, ["--child", family, str(n), "stats"], timeout=3600)
        record["runs"][family] = {"forward": base, "stats": stats}
        layers, (b, h, _) = stats.get("layers", 0), stats.get("shape", (0, 0, 0))
        eager_bytes = layers * b * h * n * n * 4  # the maps output_attentions returns
        for name, r in (("forward (sdpa)", base), ("attention_stats", stats)):
            rows.append([family, name, fmt_time(r.get("wall_s")), fmt_time(r.get("cpu_s")),
                         fmt_bytes(r.get("peak_extra"))])  # fmt: skip
        rows.append([family, "eager maps (not run)", "-", "-", fmt_bytes(eager_bytes)])
    print_table(["model", f"N = {n}, one call", "wall", "CPU", "peak RSS growth"], rows)
    print()
    for family in args.models:
        s = record["runs"][family]["stats"]
        print(f"{family}: per layer (B, H, N) = {tuple(s.get('shape', ()))}, "
              f"max |sum in-degree - N| / N = {s.get('in_degree_sum_err', float('nan')):.1e}, "
              f"entropy in [{s.get('entropy_min', float('nan')):.3f}, "
              f"{s.get('entropy_max', float('nan')):.3f}] (log N = {math.log(n):.3f}), "
              f"max logit in {s.get('max_logit_range')}, most-read token per layer "
              f"{s.get('top_read')}, kept {fmt_bytes(s.get('held_bytes'))}")  # fmt: skip
    if args.check:
        for family in args.models:
            diff = check_against_eager(family, args.check)
            record["check"][family] = diff
            print(f"{family}: against eager output_attentions at N = {args.check} (float64, one "
                  f"padded sequence): max |Δ in-degree| = {diff['in_degree']:.1e}, "
                  f"max |Δ entropy| = {diff['entropy']:.1e}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
