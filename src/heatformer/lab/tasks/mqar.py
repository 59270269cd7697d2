"""The ``mqar`` task: multi-query associative recall (Zoology), with a causal GPT.

The data are :func:`heatformer.datasets.mqar` with Zoology's arguments: ``num_kv_pairs``
key-value pairs, then every key asked once at power-law gaps (``power_a``), over
``vocab_size`` token ids. The lab's ``seq_len`` is Zoology's ``input_seq_len``; the other
options keep Zoology's names. The defaults are Zoology's smallest setting (sequence length 64,
4 key-value pairs, vocabulary 8,192), where attention of width 64 reaches about 100 %.
``val_acc`` is Zoology's accuracy: the share of queries answered with their value.

``val_acc_near`` and ``val_acc_far`` split it by the query's gap: the distance from a query to
its key's (last) position in the key-value context, ``gap = i_query - i_key``. A query is near
when ``gap <= near_gap``: with a causal window graph of ``w = near_gap`` keys (``window[w=16]``
and ``--near-gap 16``), the value (at ``i_key + 1``) is within the query's own window, so one
window head can read it; a far query's value lies outside every window of its position, and a
model reaches it only through several layers or multi-step (heat, PPR) heads. On the default
evaluation set (length 64, 4 pairs, ``power_a = 0.01``) 58 % of the queries have ``gap <= 16``.
A split with no query is NaN. What the synthetic tasks share (batches, evaluation set,
analysis): :mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from heatformer.checks import check_positive_int
from heatformer.lab.tasks._synthetic import SyntheticOptions, SyntheticTask, yes_no
from heatformer.lab.tasks.base import IGNORE_INDEX, VALIDATION
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["Mqar", "MqarOptions", "query_gaps"]


def query_gaps(inputs: Tensor, labels: Tensor, context_len: int) -> Tensor:
    """The gap of every scored position of MQAR data: its distance to the last position of its
    token (the key it asks for) among the first ``context_len`` tokens (the key-value context),
    ``i - max{j < context_len : inputs[j] == inputs[i]}``; ``0`` at unscored positions and at a
    position whose token is not in the context.

    Args:
        inputs: ``(B, N)`` token ids.
        labels: ``(B, N)`` labels, ``-100`` where nothing is scored.
        context_len: how many leading tokens hold the keys (``2 * num_kv_pairs * num_passes``).

    Returns:
        ``(B, N)`` int64 gaps.

    Examples:
        >>> import torch
        >>> inputs = torch.tensor([[5, 9, 6, 8, 0, 6, 5]])
        >>> labels = torch.tensor([[-100, -100, -100, -100, -100, 8, 9]])
        >>> query_gaps(inputs, labels, 4).tolist()
        [[0, 0, 0, 0, 0, 3, 6]]
    """
    import torch

    context = inputs[:, :context_len]  # (B, C)
    match = context[:, :, None] == inputs[:, None, :]  # (B, C, N): context j holds token i
    where = torch.arange(1, context.shape[1] + 1, device=inputs.device)[None, :, None]
    last = (match * where).amax(dim=1) - 1 if context_len else torch.full_like(inputs, -1)
    gaps = torch.arange(inputs.shape[1], device=inputs.device) - last  # (B, N)
    return torch.where((labels != IGNORE_INDEX) & (last >= 0), gaps, 0)


@dataclass(frozen=True)
class MqarOptions(SyntheticOptions):
    """Options of the ``mqar`` task (``--seq-len``, ``--num-kv-pairs``, ...)."""

    renamed: ClassVar[dict[str, str]] = {"input_seq_len": "seq_len"}

    seq_len: int = option(64, "sequence length, even (Zoology's input_seq_len)")
    vocab_size: int = option(8192, "token ids: keys below vocab_size/2, values above")
    num_kv_pairs: int = option(4, "key-value pairs per sequence, each key asked once")
    power_a: float = option(0.01, "exponent of the power law of the query gaps (1: uniform)")
    num_passes: int = option(1, "times the key-value context is repeated (JRT)")
    random_non_queries: bool = option(
        True, "filler drawn from the vocabulary (no: token 0, as Zoology's figure 2): yes | no",
        parse=yes_no, metavar="yes|no",
    )  # fmt: skip
    near_gap: int = option(
        16, "val_acc_near scores the queries at most this many tokens after their key, "
        "val_acc_far the others"
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_positive_int("near_gap", self.near_gap)
        super().__post_init__()

    def _generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        from heatformer.datasets import mqar

        return mqar(
            self.vocab_size, num_examples, self.seq_len, seed, power_a=self.power_a,
            num_kv_pairs=self.num_kv_pairs, num_passes=self.num_passes,
            random_non_queries=self.random_non_queries,
        )  # fmt: skip

    def num_tokens(self) -> int:
        return self.vocab_size

    def max_tokens(self) -> int:
        return self.seq_len


class Mqar(SyntheticTask):
    """Multi-query associative recall with a causal GPT (see the module docstring)."""

    name = "mqar"
    Options = MqarOptions
    metric_names = ("val_acc", "val_acc_near", "val_acc_far", "val_loss")
    higher_is_better = (True, True, True, False)

    options: MqarOptions

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        """``val_acc`` and ``val_loss`` (:meth:`evaluate` adds the near and far splits)."""
        return {"val_acc": accuracy, "val_loss": loss}

    def evaluate(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        precision: str = "fp32",
        shard_of: Any = None,
        batches: Any = None,
    ) -> dict[str, float]:
        """:meth:`Task.evaluate <heatformer.lab.tasks.base.Task.evaluate>` on the evaluation
        set, then on its near and far queries (the others' labels set to ``-100``):
        ``val_acc``, ``val_loss``, ``val_acc_near``, ``val_acc_far`` (and each under
        ``validation/`` when the spec selects settings); a split with no query in a half is
        NaN."""
        base = super().evaluate
        out = base(model, device, precision=precision, shard_of=shard_of, batches=batches)
        if batches is not None:
            return out
        o = self.options
        inputs, labels = self.data
        gaps = query_gaps(inputs, labels, 2 * o.num_kv_pairs * o.num_passes)  # (E, N)
        prefixes = ("", VALIDATION) if self.spec.select_by is not None else ("",)
        for name, keep in (
            ("val_acc_near", gaps <= o.near_gap),
            ("val_acc_far", gaps > o.near_gap),
        ):
            split = labels.masked_fill(~keep, IGNORE_INDEX)  # (E, N)
            scored = (split != IGNORE_INDEX).any(-1)  # (E,): an example with a query here
            # a selecting spec scores two halves: test (odd examples) and validation (even)
            parts = (scored[1::2], scored[0::2]) if len(prefixes) == 2 else (scored,)
            if all(bool(part.any()) for part in parts):
                cell = base(model, device, precision=precision, shard_of=shard_of,
                            batches=self.batches_of(inputs, split))  # fmt: skip
                out.update({p + name: cell[p + "val_acc"] for p in prefixes})
            else:
                out.update({p + name: math.nan for p in prefixes})
        return out
