"""A new task for `heatformer compare`, defined and registered here, outside the library.

The task, "majority": a sequence of random bits (token ids 0 and 1), labelled 1 when more than
half of its bits are 1. It is one `Task` subclass -- its options with their defaults, its data,
its model, one batch interface, its metrics -- plus one `register_task` call. From then on the
runner and the command line take it like a built-in task: `--task majority`, a flag for each of
its options (`--seq-len`, and `--p-one`, which no built-in task has), a fixed evaluation set,
seeds, resumable runs and the report.

    python examples/custom_task.py --steps 60 --out runs/majority
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from heatformer import checks
from heatformer.lab.cli import main as heatformer_main
from heatformer.lab.tasks import Task, TaskOptions, option, register_task
from heatformer.models import SequenceClassifier, SequenceClassifierConfig


@dataclass(frozen=True)
class MajorityOptions(TaskOptions):
    """The options of the task, each with its default and its help line (its flag)."""

    seq_len: int = option(15, "bits per sequence (odd: no ties)")
    p_one: float = option(0.5, "probability of a 1 bit")
    eval_size: int = option(256, "validation sequences")
    analysis_size: int = option(64, "sequences in the analysis batch", numbers=False)

    def __post_init__(self) -> None:
        for name in ("seq_len", "eval_size", "analysis_size"):
            checks.check_positive_int(name, getattr(self, name))
        if self.seq_len % 2 == 0:
            raise checks.bad_value("seq_len", f"expected an odd number of bits, got {self.seq_len}")
        checks.check_open_unit("p_one", self.p_one)

    def max_tokens(self) -> int:
        return self.seq_len  # lets the spec check graph kinds before any data exist


def majority_batch(size: int, options: MajorityOptions, generator: torch.Generator):
    """``(bits, label)``: ``(size, N)`` token ids 0/1 and ``(size,)`` 1 where most bits are 1."""
    bits = (torch.rand(size, options.seq_len, generator=generator) < options.p_one).long()
    return bits, (2 * bits.sum(1) > options.seq_len).long()


class Majority(Task):
    """Is the majority of the bits 1? A bidirectional classifier that mean-pools its tokens."""

    name = "majority"
    Options = MajorityOptions
    metric_names = ("val_acc", "val_loss")
    higher_is_better = (True, False)
    eval_loss_name = "val_loss"

    def load_data(self) -> tuple[Tensor, Tensor]:
        """The fixed validation set, from its own seed (training batches never touch it)."""
        return majority_batch(
            self.options.eval_size, self.options, torch.Generator().manual_seed(99)
        )

    def model_config(self, heads: str) -> SequenceClassifierConfig:
        return SequenceClassifierConfig(
            vocab_size=2, num_classes=2, block_size=self.options.seq_len, pool="mean",
            causal=False, **self.model_kwargs(heads),
        )  # fmt: skip

    def build_model(self, heads: str) -> nn.Module:
        return SequenceClassifier(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return majority_batch(batch_size, self.options, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        bits, labels = self.data
        return ((bits[i : i + 128], labels[i : i + 128]) for i in range(0, len(labels), 128))

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        bits, labels = self.data
        return bits[: self.options.analysis_size], labels[: self.options.analysis_size]

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"val_acc": accuracy, "val_loss": loss}


register_task(Majority)  # the whole of adding a task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    parser.add_argument("--seeds", default="2", help="seeds per configuration")
    parser.add_argument("--out", help="report folder (default: a new temporary folder)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="majority-")) / "report"

    code = heatformer_main([
        "compare", "--task", "majority", "--seq-len", "15", "--p-one", "0.5",
        "--heads", "attention:2", "--heads", "attention:1,laplacian:1",
        "--seeds", args.seeds, "--steps", str(args.steps), "--batch-size", "32",
        "--layers", "1", "--embd", "16", "--lr", "1e-2", "--eval-every", str(args.steps),
        "--device", "cpu", "--threads", "1", "--no-progress", "--out", str(out),
    ])  # fmt: skip
    if code != 0:
        raise SystemExit(code)
    results = json.loads((out / "results.json").read_text())
    for row in results["summary"]:
        acc = row["final"]["val_acc"]["mean"]
        print(f"{row['heads']}: val_acc {acc:.3f} (chance 0.5)")


if __name__ == "__main__":
    main()
