"""The ``recall`` task: synthetic associative recall over long sequences.

The data (:class:`RecallTask`) are generated on the fly: key/value pairs at the start, filler,
and a query key at the end whose paired value the model must name. The task (:class:`Recall`)
trains a causal :class:`~heatformer.models.SequenceClassifier` that reads the final position
and reports ``val_acc`` and ``val_loss`` on a fixed validation set (drawn from its own seed).
Its analysis groups the final-position states -- the features the classifier reads -- by their
target (``nc1``).

Every random draw of a training batch goes through a caller-supplied CPU ``torch.Generator``.
Tensors are returned on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heatformer.checks import (
    bad_value,
    check_generator,
    check_int,
    check_positive_int,
)
from heatformer.lab.tasks._classifier import SequenceClassifierTask
from heatformer.lab.tasks.options import TaskOptions, option

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["Recall", "RecallOptions", "RecallTask"]

#: Examples generated per random draw when building the fixed validation set; fixed so
#: the set does not depend on the evaluation batch size.
_RECALL_VAL_CHUNK = 64


@dataclass(frozen=True)
class RecallTask:
    """Synthetic associative recall over long sequences, generated on the fly.

    Token ids: keys ``[0, num_keys)``, values ``[num_keys, num_keys + num_values)``,
    filler ``[num_keys + num_values, vocab_size)``. A sequence of length ``seq_len`` is::

        k_1 v_1 k_2 v_2 ... k_P v_P  f f f ... f  q

    with ``P = num_pairs`` distinct keys drawn without replacement, values drawn with
    replacement, filler drawn uniformly from the filler tokens, and the query ``q``
    one of the ``k_i``; the target is the paired ``v_i`` (a token id in the value range).
    Only the final position is scored.

    Attributes:
        num_keys: number of key tokens, at least ``num_pairs``.
        num_values: number of value tokens.
        num_pairs: key/value pairs per sequence ``P``.
        seq_len: sequence length ``N``, at least ``2 * num_pairs + 1``.
        num_filler: number of filler (noise) tokens.
        val_size: number of examples in the fixed validation set.
        val_seed: seed of the validation set (separate from any training generator).

    Examples:
        >>> import torch
        >>> task = RecallTask(num_keys=4, num_values=4, num_pairs=2, seq_len=8, num_filler=1)
        >>> x, target = task.get_batch(1, torch.Generator().manual_seed(0))
        >>> pairs = dict(zip(x[0, 0:4:2].tolist(), x[0, 1:4:2].tolist()))
        >>> pairs[x[0, -1].item()] == target[0].item(), x[0, 4:7].tolist()
        (True, [8, 8, 8])
    """

    num_keys: int = 64  # key tokens
    num_values: int = 64  # value tokens
    num_pairs: int = 16  # key/value pairs at the start of each sequence
    seq_len: int = 512  # total length, filler fills the gap before the query
    num_filler: int = 16  # distinct filler (noise) tokens
    val_size: int = 512  # examples in the fixed validation set
    val_seed: int = 1_000_003  # seed of the validation set

    def __post_init__(self) -> None:
        check_int("num_keys", self.num_keys, minimum=1)
        check_int("num_values", self.num_values, minimum=1)
        check_int("num_pairs", self.num_pairs, minimum=1)
        check_int("num_filler", self.num_filler, minimum=1)
        check_int("val_size", self.val_size, minimum=1)
        check_int("val_seed", self.val_seed, minimum=0)
        check_int("seq_len", self.seq_len, minimum=1)
        if self.num_pairs > self.num_keys:
            raise bad_value(
                "num_pairs",
                f"expected at most num_keys={self.num_keys} (keys in a sequence "
                f"are distinct), got {self.num_pairs}",
            )
        if self.seq_len < 2 * self.num_pairs + 1:
            raise bad_value(
                "seq_len",
                f"expected at least 2 * num_pairs + 1 = {2 * self.num_pairs + 1}, "
                f"got {self.seq_len}",
            )

    @property
    def vocab_size(self) -> int:
        """Total number of token ids: ``num_keys + num_values + num_filler``."""
        return self.num_keys + self.num_values + self.num_filler

    @property
    def num_classes(self) -> int:
        """Alias of :attr:`vocab_size`: targets are token ids of the full vocabulary."""
        return self.vocab_size

    def _generate(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        import torch

        num_pairs, num_keys = self.num_pairs, self.num_keys
        keys = torch.rand(batch_size, num_keys, generator=generator).argsort(dim=1)
        keys = keys[:, :num_pairs]  # (B, P) distinct keys per row
        values = num_keys + torch.randint(
            self.num_values, (batch_size, num_pairs), generator=generator
        )  # (B, P)
        filler = (num_keys + self.num_values) + torch.randint(
            self.num_filler, (batch_size, self.seq_len - 2 * num_pairs - 1), generator=generator
        )  # (B, N - 2P - 1)
        which = torch.randint(num_pairs, (batch_size, 1), generator=generator)  # (B, 1)
        query = keys.gather(1, which)  # (B, 1)
        target = values.gather(1, which).squeeze(1)  # (B,)
        pairs = torch.stack((keys, values), dim=2).reshape(batch_size, 2 * num_pairs)  # (B, 2P)
        x = torch.cat((pairs, filler, query), dim=1)  # (B, N)
        return x, target

    def get_batch(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generate a fresh training batch.

        Args:
            batch_size: number of sequences ``B``.
            generator: CPU generator that drives the sampling.

        Returns:
            ``(x, target)``: ``x`` is ``(B, N)`` int64 token ids, ``target`` is ``(B,)``
            int64, the value token paired with the query ``x[:, -1]``; predict it from
            the output at the last position.
        """
        check_int("batch_size", batch_size, minimum=1)
        x, target = self._generate(batch_size, check_generator(generator))
        return x, target

    def eval_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate over the fixed validation set of ``val_size`` examples.

        The set is drawn from a generator seeded with ``val_seed``, in chunks of a fixed
        size, so it is the same for every ``batch_size`` and every call.

        Args:
            batch_size: sequences per batch; the last batch may be smaller.

        Yields:
            ``(x, target)``: ``(b, N)`` and ``(b,)`` int64, ``b <= batch_size``.
        """
        check_int("batch_size", batch_size, minimum=1)
        return _rebatch(self._val_chunks(), batch_size)

    def _val_chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        generator = torch.Generator().manual_seed(self.val_seed)
        for begin in range(0, self.val_size, _RECALL_VAL_CHUNK):
            x, target = self._generate(_RECALL_VAL_CHUNK, generator)
            keep = min(_RECALL_VAL_CHUNK, self.val_size - begin)
            yield x[:keep], target[:keep]


def _rebatch(
    chunks: Iterator[tuple[torch.Tensor, torch.Tensor]], batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Regroup ``(x, target)`` chunks of any sizes into batches of ``batch_size``."""
    import torch

    xs: list[torch.Tensor] = []
    ts: list[torch.Tensor] = []
    buffered = 0
    for x, target in chunks:
        xs.append(x)
        ts.append(target)
        buffered += target.numel()
        while buffered >= batch_size:
            x_all, t_all = torch.cat(xs), torch.cat(ts)  # (buffered, N), (buffered,)
            yield x_all[:batch_size], t_all[:batch_size]
            xs, ts = [x_all[batch_size:]], [t_all[batch_size:]]
            buffered -= batch_size
    if buffered:
        yield torch.cat(xs), torch.cat(ts)


# --------------------------------------------------------------------------------------
# the task
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecallOptions(TaskOptions):
    """Options of the ``recall`` task (``--seq-len``, ``--eval-size``, ...)."""

    seq_len: int = option(128, "sequence length")
    eval_size: int = option(128, "validation examples")
    analysis_size: int = option(256, "sequences in the analysis batch", numbers=False)
    num_pairs: int = option(16, "key/value pairs at the start of each sequence")
    num_keys: int = option(64, "key tokens (at least num_pairs)")
    num_values: int = option(64, "value tokens (the classes)")

    def __post_init__(self) -> None:
        for name in (
            "seq_len",
            "eval_size",
            "analysis_size",
            "num_pairs",
            "num_keys",
            "num_values",
        ):
            check_positive_int(name, getattr(self, name))

    def max_tokens(self) -> int:
        return self.seq_len


class Recall(SequenceClassifierTask):
    """Associative recall with a causal sequence classifier (see the module docstring).

    The classifier and the analysis read the final position (``pool="last"``).
    """

    name = "recall"
    Options = RecallOptions
    metric_names = ("val_acc", "val_loss")
    eval_loss_name = "val_loss"
    data_factory = RecallTask
    pool = "last"
    causal = True
    eval_batch_size = 128

    options: RecallOptions
    data: RecallTask

    def load_data(self) -> RecallTask:
        o = self.options
        return RecallTask(
            seq_len=o.seq_len, val_size=o.eval_size, num_pairs=o.num_pairs, num_keys=o.num_keys,
            num_values=o.num_values,
        )  # fmt: skip

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        x, target = next(iter(self.data.eval_batches(self.options.analysis_size)))
        return x, target
