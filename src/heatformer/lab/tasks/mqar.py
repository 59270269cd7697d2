"""The ``mqar`` task: multi-query associative recall (Zoology), with a causal GPT.

The data are :func:`heatformer.datasets.mqar` with Zoology's arguments: ``num_kv_pairs``
key-value pairs, then every key asked once at power-law gaps (``power_a``), over
``vocab_size`` token ids. The lab's ``seq_len`` is Zoology's ``input_seq_len``; the other
options keep Zoology's names. The defaults are Zoology's smallest setting (sequence length 64,
4 key-value pairs, vocabulary 8,192), where attention of width 64 reaches about 100 %.
``val_acc`` is Zoology's accuracy: the share of queries answered with their value. What the
synthetic tasks share (batches, evaluation set, analysis): :mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from heatformer.lab.tasks._synthetic import SyntheticOptions, SyntheticTask, yes_no
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Mqar", "MqarOptions"]


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
