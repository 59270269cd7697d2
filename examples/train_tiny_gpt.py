"""Train a tiny byte-level GPT with Laplacian heads on the built-in `chars` corpus.

A plain training loop (nanoGPT style) on the Python standard library's own source code
(heatformer.lab.tasks.load_chars: no download), reporting the validation loss in bits per
character before and after. For the full experiment runner with seeds, resumable runs and
reports see `heatformer compare --help`.

    python examples/train_tiny_gpt.py --heads attention:2,laplacian:2 --steps 300
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from heatformer.lab.tasks import load_chars
from heatformer.models import GPT, GPTConfig


@torch.no_grad()
def val_bits_per_char(model: GPT, task, seq_len: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for x, y in task.eval_batches(32, seq_len, max_windows=64):
        logits = model(x)  # (B, N, 256)
        total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
        count += y.numel()
    model.train()
    return total / count / math.log(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="attention:2,laplacian:2", help="head spec")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-bytes", type=int, default=400_000, help="corpus size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    task = load_chars(max_bytes=args.max_bytes, val_fraction=0.1)
    config = GPTConfig(
        vocab_size=task.vocab_size, block_size=args.seq_len, n_layer=args.n_layer, n_head=4,
        n_embd=args.n_embd, heads=args.heads,
    )  # fmt: skip
    model = GPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    print(f"{args.heads}: {model.num_parameters():,} parameters, "
          f"{task.train.numel():,} training bytes")  # fmt: skip
    start_bpc = val_bits_per_char(model, task, args.seq_len)
    print(f"step 0: val {start_bpc:.3f} bits/char")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = task.get_batch("train", args.batch_size, args.seq_len, gen)  # (B, N) each
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % max(1, args.steps // 5) == 0:
            print(f"step {step}: train {loss.item() / math.log(2):.3f} bits/char")
    final_bpc = val_bits_per_char(model, task, args.seq_len)
    print(f"final val {final_bpc:.3f} bits/char (from {start_bpc:.3f}) "
          f"in {time.perf_counter() - start:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
