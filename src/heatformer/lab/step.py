"""One training step, in the pieces the trainer and the preflight share.

:func:`build_optimizer` makes the run's AdamW; a step is :func:`backward_pass` (forward under
the task's autocast, loss, gradients) then :func:`optimizer_step` (clipping, ``step()``). The
trainer (:func:`~heatformer.lab.trainer.train_run`) puts its stop handling and its
learning-rate schedule around them; the preflight times the same step before a run
(:func:`~heatformer.lab.preflight.time_steps`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from heatformer.graph_ops import SequenceShard
from heatformer.lab.tasks.base import IGNORE_INDEX, Task, autocast

__all__ = ["backward_pass", "build_optimizer", "optimizer_step"]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (biases, norms and gains are not decayed).

    Args:
        model: the model.
        lr: learning rate (the loop overwrites it every step from the schedule).
        weight_decay: decay of the parameters with 2 or more dimensions.

    Returns:
        The optimizer, betas ``(0.9, 0.95)``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def backward_pass(
    task: Task,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: Tensor,
    targets: Tensor,
    train_model: nn.Module | None = None,
    shard: SequenceShard | None = None,
) -> Tensor:
    """The forward and backward pass of one training step on a batch already on the model's
    device: forward (under bfloat16 autocast if ``task.spec.bf16``), :meth:`Task.loss`, the
    gradients cleared, backward. :func:`optimizer_step` completes the step.

    Args:
        task: the task (its spec and loss).
        model: the model.
        optimizer: its optimizer (whose gradients are cleared first).
        inputs, targets: the batch.
        train_model: what runs the forward pass (a DDP or compiled wrapper of ``model``);
            default ``model``.
        shard: ``inputs`` and ``targets`` are this rank's block ``(b, n_local)`` of every
            sequence split over a sequence group (the model takes ``shard=``); the loss is then
            this rank's share of the mean over every scored token of the group's ``(b, N)``
            batch (its tokens' mean times its share of the scored tokens: the shares sum to
            the mean, also when some targets are ``IGNORE_INDEX``).

    Returns:
        The loss (a scalar tensor, still attached to the graph).
    """
    with autocast(inputs.device, task.spec.bf16):
        if shard is None:
            logits = (train_model or model)(inputs)
        else:
            logits = (train_model or model)(inputs, shard=shard)
    if shard is None:
        loss = task.loss(logits, targets)
    else:
        loss = _shard_share(task, logits, targets, shard)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss


def _shard_share(task: Task, logits: Tensor, targets: Tensor, shard: SequenceShard) -> Tensor:
    """This rank's share of the sequence group's mean loss: :meth:`Task.loss` of its block
    times ``m_local / m`` (``m``: the scored targets, not :data:`IGNORE_INDEX`, summed over the
    group by one all-reduce). A block with no scored target adds ``0 * logits`` (its backward
    still runs, so every rank makes the same messages)."""
    import torch.distributed as dist

    scored = (targets != IGNORE_INDEX).sum().to(torch.float64)  # this rank's scored targets
    total = scored.clone()
    dist.all_reduce(total, group=shard.group)
    if not int(scored):  # one read per step, outside the model's forward
        return logits.sum() * 0.0
    return task.loss(logits, targets) * (scored / total).to(torch.float32)


def optimizer_step(task: Task, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The end of a training step: gradient clipping at ``task.spec.grad_clip`` (0: none),
    then ``optimizer.step()`` (learning rates set by the caller)."""
    if task.spec.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), task.spec.grad_clip)
    optimizer.step()
