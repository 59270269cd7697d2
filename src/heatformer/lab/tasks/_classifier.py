"""What the classification tasks share: accuracy and loss, and the sequence classifier.

- :class:`ClassificationTask` -- a task scored by the accuracy and the loss of one label per
  example (``digits``, ``recall``, ``stdlib``): its metrics are ``(<split>_acc,
  <split>_loss)``, the accuracy first (the headline), ``test`` unless a task says otherwise.
- :class:`SequenceClassifierTask` -- a classification task whose model is a
  :class:`~heatformer.models.SequenceClassifier` over token sequences (``recall``,
  ``stdlib``): its config, model and batches come from the data's ``vocab_size``,
  ``num_classes``, ``seq_len``, ``get_batch(batch_size, generator)`` and
  ``eval_batches(batch_size)``; a task says only how the classifier reads a sequence
  (:attr:`~SequenceClassifierTask.pool`, :attr:`~SequenceClassifierTask.causal`).

Nothing here imports torch at import time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from heatformer.lab.tasks.base import Task

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["ClassificationTask", "SequenceClassifierTask"]


class ClassificationTask(Task):
    """A task scored by accuracy (higher is better) and mean loss on its evaluation set."""

    metric_names = ("test_acc", "test_loss")
    higher_is_better = (True, False)
    eval_loss_name = "test_loss"

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        accuracy_name, loss_name = self.metric_names
        return {accuracy_name: accuracy, loss_name: loss}


class SequenceClassifierTask(ClassificationTask):
    """A classification task of token sequences, read by a
    :class:`~heatformer.models.SequenceClassifier` (see the module docstring)."""

    #: how the classifier reads a sequence (``SequenceClassifierConfig.pool``); the analysis
    #: pools the token states the same way (:meth:`pooled`)
    pool: ClassVar[str] = "mean"
    #: whether the classifier's attention is causal
    causal: ClassVar[bool] = False
    #: sequences per batch of :meth:`eval_batches`
    eval_batch_size: ClassVar[int] = 256

    def model_config(self, heads: str) -> Any:
        from heatformer.models import SequenceClassifierConfig

        return SequenceClassifierConfig(
            vocab_size=self.data.vocab_size, num_classes=self.data.num_classes,
            block_size=self.data.seq_len, pool=self.pool, causal=self.causal,
            **self.model_kwargs(heads),
        )  # fmt: skip

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import SequenceClassifier

        return SequenceClassifier(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.get_batch(batch_size, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.eval_batches(self.eval_batch_size)

    def pooled(self, x: Tensor) -> Tensor:
        """What the classifier reads of ``x`` ``(B, N, D)``: the final position's state for
        ``pool="last"``, else the mean over the tokens."""
        return x[:, -1] if self.pool == "last" else super().pooled(x)  # (B, D)
