"""Head surgery on a Hugging Face causal LM: trailing heads to Laplacian heads, then recovery.

1. A small GPT-2 (transformers, byte vocabulary) is trained on the bytes of a few Python
   standard-library modules (no download) -- standing in for a pretrained checkpoint -- then
   saved with ``save_pretrained`` and reloaded, as any local checkpoint would be.
2. ``heatformer.integrations.hf.convert`` turns the trailing ``k`` heads of every layer into
   Laplacian heads (``(I - P) v`` instead of ``P v``), keeping every weight.
3. How much the function changed: validation loss in bits per byte and the KL divergence of
   the next-byte distributions from the original model's.
4. A short fine-tune of the converted model, and how much of the damage it recovered, next to
   the original model fine-tuned for as many steps (the control: is it only more training?).
5. Greedy generation with the KV cache equals generation that recomputes every step.

    python examples/hf_head_surgery.py                       # ~1 minute on 2 cores
    python examples/hf_head_surgery.py --laplacian-heads 1 --finetune-steps 400
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from heatformer.integrations import hf

MODULES = ("argparse", "textwrap", "difflib", "inspect")  # the training text: their source


def corpus(max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of a few stdlib modules' source: training split, validation (the last 10 %)."""
    files = [importlib.util.find_spec(name).origin for name in MODULES]
    data = b"".join(Path(str(f)).read_bytes() for f in files)[:max_bytes]
    ids = torch.tensor(list(data), dtype=torch.long)
    cut = int(0.9 * ids.numel())
    return ids[:cut], ids[cut:]


def batch(ids: torch.Tensor, size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - seq_len, (size,), generator=gen)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])  # (B, N)


def windows(ids: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    step = max(1, (ids.numel() - seq_len) // count)
    return torch.stack([ids[s : s + seq_len] for s in range(0, step * count, step)])


def train(model: GPT2LMHeadModel, ids: torch.Tensor, steps: int, args: argparse.Namespace,
          seed: int) -> None:  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        x = batch(ids, args.batch_size, args.seq_len, gen)
        loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


@torch.no_grad()
def evaluate(model: GPT2LMHeadModel, val: torch.Tensor, reference: torch.Tensor | None = None
             ) -> tuple[float, float, torch.Tensor]:  # fmt: skip
    """Validation loss (bits per byte), KL(reference || model) in bits per byte, and the
    log-probabilities ``(W, N, 256)`` (the next reference)."""
    logp = torch.log_softmax(model(val).logits, dim=-1)
    loss = F.nll_loss(logp[:, :-1].flatten(0, 1), val[:, 1:].flatten()) / math.log(2)
    kl = 0.0
    if reference is not None:
        kl = float((reference.exp() * (reference - logp)).sum(-1).mean()) / math.log(2)
    return float(loss), kl, logp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--laplacian-heads", type=int, default=2, help="trailing heads k")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument("--finetune-steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-bytes", type=int, default=300_000)
    parser.add_argument("--eval-windows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (one is fastest for this tiny model)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    k, h = args.laplacian_heads, args.heads
    if not 0 < k <= h:
        sys.exit(f"--laplacian-heads: expected 1..{h}, got {k}")
    torch.manual_seed(args.seed)
    train_ids, val_ids = corpus(args.max_bytes)
    val = windows(val_ids, args.seq_len, args.eval_windows)
    print(f"text: {train_ids.numel():,} training bytes, {val_ids.numel():,} validation bytes "
          f"({', '.join(m + '.py' for m in MODULES)})")  # fmt: skip

    config = GPT2Config(
        n_layer=args.layers, n_embd=args.width, n_head=h, n_positions=args.seq_len,
        vocab_size=256, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0,
    )  # fmt: skip
    model = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    train(model, train_ids, args.pretrain_steps, args, seed=args.seed)
    with tempfile.TemporaryDirectory() as folder:  # a local checkpoint, as from the hub
        model.save_pretrained(folder)
        base = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    base_loss, _, base_logp = evaluate(base, val)
    print(f"base model ({args.layers} layers x {h} heads, {args.pretrain_steps} steps): "
          f"val {base_loss:.3f} bits/byte")  # fmt: skip

    spec = f"attention:{h - k},laplacian:{k}" if k < h else f"laplacian:{h}"
    converted = hf.convert(copy.deepcopy(base), spec)
    conv_loss, conv_kl, _ = evaluate(converted, val, base_logp)
    print(f"converted ({spec} in every layer): val {conv_loss:.3f} bits/byte, "
          f"KL(base || converted) {conv_kl:.3f} bits/byte")  # fmt: skip

    train(converted, train_ids, args.finetune_steps, args, seed=args.seed + 1)
    tuned_loss, tuned_kl, _ = evaluate(converted, val, base_logp)
    damage = conv_loss - base_loss
    recovered = (conv_loss - tuned_loss) / damage if damage > 0 else float("nan")
    print(f"converted + {args.finetune_steps} fine-tuning steps: val {tuned_loss:.3f} bits/byte, "
          f"KL(base || converted) {tuned_kl:.3f} bits/byte")  # fmt: skip
    print(f"recovered {100 * recovered:.1f}% of the loss increase "
          f"({conv_loss - base_loss:+.3f} -> {tuned_loss - base_loss:+.3f} bits/byte)")  # fmt: skip

    control = copy.deepcopy(base)
    train(control, train_ids, args.finetune_steps, args, seed=args.seed + 1)
    control_loss, _, _ = evaluate(control, val)
    print(f"control: base + {args.finetune_steps} fine-tuning steps: "
          f"val {control_loss:.3f} bits/byte; the converted model is "
          f"{tuned_loss - control_loss:+.3f} bits/byte from it")  # fmt: skip

    prompt = val[:2, : args.seq_len // 2]
    kwargs = {"max_new_tokens": args.seq_len // 2, "do_sample": False, "pad_token_id": 0}
    cached = converted.generate(prompt, use_cache=True, **kwargs)
    again = converted.generate(prompt, use_cache=False, **kwargs)
    print(f"cached generation equals recomputation: {torch.equal(cached, again)}")
    text = bytes(cached[0, prompt.shape[1] :].tolist()).decode("utf-8", errors="replace")
    print(f"sample continuation: {text!r}")


if __name__ == "__main__":
    main()
