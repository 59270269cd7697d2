"""One layer's analysis values, accumulated over the slices of a task's analysis batch
(:meth:`heatformer.lab.tasks.Task.layer_metrics`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from heatformer.lab.tasks.base import Task

__all__ = ["LayerStats"]


class LayerStats:
    r"""One layer's analysis, accumulated over slices of the analysis batch.

    Per-sequence values (within-sequence variance, effective rank, decay rate) are kept per
    sequence and averaged at the end; the total token variance merges each slice's count
    :math:`n`, mean :math:`\mu` and sum of squared deviations :math:`M` in float64 (Chan et
    al.'s pairwise update, :math:`M = M_a + M_b + \lVert\mu_b - \mu_a\rVert^2 n_a n_b / n`);
    the sequence means are kept (float64, ``(b, D)`` per slice) for ``between_seq_var``, the
    mean over sequences of :math:`\lVert \mu_s - \mu \rVert^2` around the merged mean
    :math:`\mu`, computed directly (not as the total less the within part); the
    :meth:`~heatformer.lab.tasks.Task.grouping_states` of the slices and their labels are
    concatenated. One slice gives the values of the whole batch at once.
    """

    def __init__(self) -> None:
        self.within: list[Tensor] = []  # (b,) float64 per slice
        self.rank: list[Tensor] = []
        self.rate: list[Tensor] = []
        self.means: list[Tensor] = []  # (b, D) float64 sequence means per slice
        self.grouped: list[Tensor] = []
        self.labels: list[Tensor] = []
        self.count = 0
        self.mean: Tensor | None = None  # (D,) float64
        self.m2 = 0.0

    def add(self, task: Task, x: Tensor, labels: Tensor) -> LayerStats:
        """Add a slice of token states ``x`` ``(b, N, D)`` with its ``labels``."""
        from heatformer.analysis import spectral_decay, within_sequence_variance

        self.within.append(within_sequence_variance(x, reduction="none").reshape(-1))
        spectrum = spectral_decay(x)
        self.rank.append(spectrum.effective_rank.reshape(-1))
        self.rate.append(spectrum.decay_rate.reshape(-1))
        flat = x.reshape(-1, x.shape[-1]).double()  # (b * N, D)
        if flat.shape[0]:
            n, mean = flat.shape[0], flat.mean(0)
            self.means.append(flat.reshape(-1, *x.shape[-2:]).mean(1))  # (b, D)
            m2 = float(((flat - mean) ** 2).sum(-1).sum())
            if self.mean is None:
                self.count, self.mean, self.m2 = n, mean, m2
            else:
                total, delta = self.count + n, mean - self.mean
                self.m2 += m2 + float(delta.square().sum()) * self.count * n / total
                self.mean = self.mean + delta * (n / total)
                self.count = total
        grouped = task.grouping_states(x)
        if grouped.untyped_storage().nbytes() > grouped.nbytes:  # a view (pooled: x[:, -1])
            grouped = grouped.clone()  # would keep the whole slice alive otherwise
        self.grouped.append(grouped)
        self.labels.append(labels)
        return self

    def values(self, task: Task) -> dict[str, float]:
        """The metrics of :attr:`~heatformer.lab.tasks.Task.analysis_names` over every slice
        added."""
        import torch

        within = float(torch.cat(self.within).mean())
        total = self.m2 / self.count if self.count else math.nan
        between = math.nan
        if self.mean is not None:
            between = float((torch.cat(self.means) - self.mean).square().sum(-1).mean())
        rates = torch.cat(self.rate)
        rates = rates[rates.isfinite()]  # (B',) the sequences with an exponent
        return {
            "within_seq_var": within,
            "between_seq_var": between,
            "within_seq_frac": within / total if total > 0 else math.nan,
            "effective_rank": float(torch.cat(self.rank).mean()),
            "decay_rate": float(rates.mean()) if rates.numel() else math.nan,
            **task.grouping_values(torch.cat(self.grouped), torch.cat(self.labels)),
        }
