"""What the tasks of the synthetic long-sequence benchmarks share (``mqar``, ``induction``,
``selective_copy``, ``parity``, ``listops``, ``passkey``).

Each is a generator of :mod:`heatformer.datasets` behind the lab's one batch interface:

- the data are tensors ``(inputs, labels)`` of shape ``(num_examples, seq_len)``, with
  ``labels`` the token a causal model should emit at each position and
  :data:`~heatformer.lab.tasks.base.IGNORE_INDEX` (``-100``) where nothing is scored, so the
  shared loss and evaluation score exactly the generator's scored positions;
- the model is a causal :class:`~heatformer.models.GPT` over the generator's tokens, read at
  the scored positions only (:meth:`SyntheticTask.scored_logits`: its logits ``(B, M, V)``
  against those labels ``(B, M)``, the same loss and accuracy as every position's); a task that
  asks one question per sequence (``parity``, ``listops``) is scored at the answer's position;
- a training batch is the generator's output for a seed drawn from the run's generator
  (:func:`draw_seed`): the same generator state gives the same batch, and a checkpoint that
  keeps the state resumes the same stream. Training seeds are drawn from ``[2**32, 2**62)``,
  the fixed sets' seeds (:data:`EVAL_SEED`, :data:`ANALYSIS_SEED`) are below: no training
  batch is drawn from the seed of a held-out set;
- the fixed evaluation set is ``eval_size`` examples generated once from :data:`EVAL_SEED`,
  the analysis batch ``analysis_size`` examples from :data:`ANALYSIS_SEED`;
- metrics: ``val_acc``, the share of scored positions where the model's most likely token is
  the label (teacher-forced: a multi-token answer is scored token by token, as Zoology scores
  MQAR), and ``val_loss``, the mean cross-entropy over them (nats);
- the analysis groups the token states of the scored positions by their answer
  (:class:`~heatformer.lab.tasks.base.NextTokenGrouping`).

An options class (:class:`SyntheticOptions`) says how to call its generator
(:meth:`SyntheticOptions.generate`), how many token ids it uses and which of the generator's
argument names its options stand for (``seq_len`` is the lab's name of every length; Zoology's
``input_seq_len``, LRA's ``max_length``): its values are checked once, when it is made, by the
generator itself on one example, and an error names the option.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from heatformer.checks import (
    ArgumentError,
    check_bool,
    check_generator,
    check_int,
    check_positive_int,
)
from heatformer.lab.tasks.base import IGNORE_INDEX, NextTokenGrouping
from heatformer.lab.tasks.options import TaskOptions, option

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from heatformer.graph_ops import SequenceShard

__all__ = [
    "ANALYSIS_SEED",
    "EVAL_BATCH",
    "EVAL_SEED",
    "SyntheticOptions",
    "SyntheticTask",
    "draw_seed",
    "scored_positions",
    "yes_no",
]

#: the seed of every synthetic task's fixed evaluation set
EVAL_SEED = 1_000_003
#: the seed of every synthetic task's analysis batch
ANALYSIS_SEED = 1_000_033
#: examples per batch of the evaluation set
EVAL_BATCH = 64
#: the range training seeds are drawn from (above the fixed sets' seeds)
_TRAIN_SEEDS = (2**32, 2**62)


def draw_seed(generator: torch.Generator) -> int:
    """A training batch's seed, drawn from ``generator`` (a CPU generator) in
    ``[2**32, 2**62)``: above :data:`EVAL_SEED` and :data:`ANALYSIS_SEED`.

    Examples:
        >>> import torch
        >>> a = draw_seed(torch.Generator().manual_seed(0))
        >>> a == draw_seed(torch.Generator().manual_seed(0)), 2**32 <= a < 2**62
        (True, True)
    """
    import torch

    low, high = _TRAIN_SEEDS
    return int(torch.randint(low, high, (1,), generator=check_generator(generator)))


def scored_positions(targets: Tensor) -> tuple[Tensor, Tensor]:
    """The scored positions of each sequence (targets other than ``-100``), in order, and
    their targets: ``(B, M)`` each, ``M`` the most of any sequence (at least 1); a sequence
    with fewer is padded with unscored positions (target ``-100``).

    Reads the count on the host (one sync per batch: a shape).

    Examples:
        >>> import torch
        >>> targets = torch.tensor([[-100, 5, -100, 7], [3, -100, -100, -100]])
        >>> positions, scored = scored_positions(targets)
        >>> positions.tolist(), scored.tolist()
        ([[1, 3], [0, 1]], [[5, 7], [3, -100]])
    """
    import torch

    unscored = targets == IGNORE_INDEX  # (B, N)
    most = int((~unscored).sum(-1).max()) if targets.numel() else 0
    order = torch.argsort(unscored.to(torch.uint8), dim=-1, stable=True)  # scored first
    positions = order[:, : max(most, 1)].contiguous()  # (B, M)
    return positions, targets.gather(-1, positions)


@contextlib.contextmanager
def _option_names(renamed: dict[str, str]) -> Iterator[None]:
    """Inside the block, an argument error of the generator names the option it came from
    (``input_seq_len`` -> ``seq_len``), with the generator's name in its detail."""
    try:
        yield
    except ArgumentError as err:
        if err.argument not in renamed:
            raise
        raise type(err)(
            renamed[err.argument], f"{err.detail} (the generator's {err.argument})"
        ) from None


def yes_no(text: str) -> bool:
    """``yes`` / ``no`` (also ``true`` / ``false``, ``1`` / ``0``) as a bool."""
    value = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}.get(
        text.strip().lower()
    )
    if value is None:
        raise ValueError(f"expected yes or no, got {text!r}")
    return value


@dataclass(frozen=True)
class SyntheticOptions(TaskOptions):
    """Options every synthetic task takes; a subclass adds its generator's and says how to call
    it (:meth:`generate`, :meth:`num_tokens`, :attr:`renamed`)."""

    #: generator argument -> the option that gives it (for the errors)
    renamed: ClassVar[dict[str, str]] = {}

    eval_size: int = option(512, "examples in the fixed evaluation set")
    analysis_size: int = option(64, "sequences in the analysis batch", numbers=False)
    tie_embeddings: bool = option(
        False, "the output layer is the token embedding (as Zoology's models): yes | no",
        parse=yes_no, metavar="yes|no",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("eval_size", "analysis_size"):
            check_positive_int(name, getattr(self, name))
        check_bool("tie_embeddings", self.tie_embeddings)
        self.generate(1, 0)  # the generator's own checks, naming the options

    def generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        """``(inputs, labels)`` of the generator with these options: ``(num_examples, L)``
        int64 tensors on the CPU.

        Raises:
            ValueError, TypeError: options the generator refuses (naming the option).
        """
        with _option_names(self.renamed):
            return self._generate(num_examples, seed)

    def _generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def num_tokens(self) -> int:
        """The token ids the generator uses (the model's vocabulary)."""
        raise NotImplementedError


class SyntheticTask(NextTokenGrouping):
    """A synthetic benchmark: a :mod:`heatformer.datasets` generator, a causal GPT, accuracy on
    the scored positions (see the module docstring). A subclass names itself and its
    :attr:`Options`."""

    metric_names: ClassVar[tuple[str, ...]] = ("val_acc", "val_loss")
    higher_is_better: ClassVar[tuple[bool, ...]] = (True, False)
    eval_loss_name = "val_loss"

    options: Any
    data: tuple[Tensor, Tensor]

    def load_data(self) -> tuple[Tensor, Tensor]:
        """The fixed evaluation set: ``eval_size`` examples from :data:`EVAL_SEED`."""
        data: tuple[Tensor, Tensor] = self.options.generate(self.options.eval_size, EVAL_SEED)
        return data

    def block_size(self) -> int:
        """The longest sequence the model reads (its position table): ``seq_len``."""
        size: int = self.options.max_tokens()
        return size

    def model_config(self, heads: str) -> Any:
        from heatformer.models import GPTConfig

        return GPTConfig(
            vocab_size=self.options.num_tokens(), block_size=self.block_size(),
            tie_embeddings=self.options.tie_embeddings, **self.model_kwargs(heads),
        )  # fmt: skip

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import GPT

        return GPT(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        check_int("batch_size", batch_size, minimum=1)
        batch: tuple[Tensor, Tensor] = self.options.generate(batch_size, draw_seed(generator))
        return batch

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.batches_of(*self.data)

    @staticmethod
    def batches_of(inputs: Tensor, labels: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """``(inputs, labels)`` in batches of :data:`EVAL_BATCH` examples."""
        return (
            (inputs[i : i + EVAL_BATCH], labels[i : i + EVAL_BATCH])
            for i in range(0, len(inputs), EVAL_BATCH)
        )

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"val_acc": accuracy, "val_loss": loss}

    def scored_logits(
        self,
        model: nn.Module,
        inputs: Tensor,
        targets: Tensor,
        shard: SequenceShard | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The logits at the scored positions only (the GPT's ``logits_at``), with their
        targets: ``(B, M, V)`` and ``(B, M)``, ``M`` the most scored positions of a sequence
        of the batch (:func:`scored_positions`). The loss and accuracy are those of every
        position's logits (an unscored target is left out either way), the output layer
        runs on ``B M`` rows instead of ``B N``: MQAR scores 4 of 64 positions, and its
        ``64 x 8192`` output layer was most of a step's cost. With ``shard``: every position
        of this rank's block."""
        if shard is not None:
            return super().scored_logits(model, inputs, targets, shard)
        positions, scored = scored_positions(targets)
        return model(inputs, logits_at=positions), scored

    def grouping_values(self, states: Tensor, labels: Tensor) -> dict[str, float]:
        """``nc1`` and ``probe_acc`` of the scored positions grouped by their answer; NaN (as
        any metric the analysis cannot compute) when the batch holds fewer than two answers
        seen twice each (a few scored positions per sequence, a small ``analysis_size``)."""
        try:
            return super().grouping_values(states, labels)
        except ArgumentError as err:
            if err.argument != "next_tokens":
                raise
            return {"nc1": math.nan, "probe_acc": math.nan}

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        """``analysis_size`` examples from :data:`ANALYSIS_SEED`; the labels group the scored
        positions' states by their answer."""
        batch: tuple[Tensor, Tensor] = self.options.generate(
            self.options.analysis_size, ANALYSIS_SEED
        )
        return batch
