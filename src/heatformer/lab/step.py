"""One training step, in the pieces the trainer and the preflight share.

:func:`build_optimizer` makes the run's AdamW and :func:`make_scaler` its gradient scaler
(``precision="fp16"`` only); a step is :func:`backward_pass` (forward under the run's autocast,
loss, gradients, in ``grad_accum`` micro-batches) then :func:`optimizer_step` (unscaling,
clipping, ``step()``). The trainer (:func:`~heatformer.lab.trainer.train_run`) puts its stop
handling and its learning-rate schedule around them; the preflight times the same step before
a run (:func:`~heatformer.lab.preflight.time_steps`).

Gradient accumulation: with ``spec.grad_accum = A`` the batch ``(B, ...)`` runs as ``A``
micro-batches of ``B / A`` examples, each backward adding its gradients to the others'. The
loss of micro-batch ``i`` is :meth:`~heatformer.lab.tasks.Task.loss` (a mean over its
``m_i`` scored targets, those not :data:`IGNORE_INDEX`) times ``m_i / m``, ``m = sum_i m_i``:
the weighted losses sum to the mean over the whole batch's scored targets, so the gradients
are those of one pass over the batch (up to float rounding; with dropout the masks differ),
also when the micro-batches score different numbers of targets. Under DDP every micro-batch
but the last runs inside ``no_sync()``: the gradients are all-reduced once per step.

Precision: ``"fp32"``, ``"bf16"`` (bfloat16 autocast) or ``"fp16"`` (float16 autocast with a
:class:`torch.amp.GradScaler`: the loss is scaled before backward, the gradients unscaled
before clipping, and a step whose gradients hold an inf or NaN is skipped while the scale
shrinks). float16 needs CUDA; :func:`check_precision` refuses it elsewhere.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn

from heatformer.checks import bad_value
from heatformer.graph_ops import SequenceShard
from heatformer.lab.tasks.base import IGNORE_INDEX, Task, autocast

__all__ = [
    "backward_pass",
    "build_optimizer",
    "check_precision",
    "make_scaler",
    "optimizer_step",
]


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


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a ``precision`` the ``device`` cannot train with: ``"fp16"`` (float16 autocast
    with a gradient scaler) needs CUDA.

    Raises:
        ValueError: ``"fp16"`` on a device that is not CUDA (naming ``precision``).
    """
    if precision == "fp16" and device.type != "cuda":
        raise bad_value(
            "precision",
            f"expected 'fp32' or 'bf16' on {device} (float16 autocast with a gradient scaler "
            "needs CUDA), got 'fp16'",
        )


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """The gradient scaler of a run: a :class:`torch.amp.GradScaler` for ``"fp16"`` (torch's
    defaults: initial scale ``2**16``, halved at a step with inf/NaN gradients, doubled after
    2000 steps without), ``None`` for ``"fp32"`` and ``"bf16"``.

    Raises:
        ValueError: ``"fp16"`` on a device that is not CUDA (:func:`check_precision`).
    """
    check_precision(precision, device)
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def backward_pass(
    task: Task,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: Tensor,
    targets: Tensor,
    train_model: nn.Module | None = None,
    shard: SequenceShard | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Tensor:
    """The forward and backward passes of one training step on a batch already on the model's
    device: the gradients cleared, then for each of the ``task.spec.grad_accum`` micro-batches
    (see the module docstring) forward under the autocast of ``task.spec.precision``,
    :meth:`Task.loss` weighted by the micro-batch's share of the scored targets, backward
    (through ``scaler`` if given). :func:`optimizer_step` completes the step.

    Args:
        task: the task (its spec and loss).
        model: the model.
        optimizer: its optimizer (whose gradients are cleared first).
        inputs, targets: the batch, ``(b, ...)`` with ``b`` a multiple of ``grad_accum``.
        train_model: what runs the forward pass (a DDP or compiled wrapper of ``model``);
            default ``model``.
        shard: ``inputs`` and ``targets`` are this rank's block ``(b, n_local)`` of every
            sequence split over a sequence group (the model takes ``shard=``); the loss is then
            this rank's share of the mean over every scored token of the group's ``(b, N)``
            batch (its tokens' mean times its share of the scored tokens: the shares sum to
            the mean, also when some targets are ``IGNORE_INDEX``).
        scaler: the run's gradient scaler (``precision="fp16"``, :func:`make_scaler`): each
            backward runs on the scaled loss.

    Returns:
        The loss (a scalar tensor, unscaled; the sum of the micro-batches' weighted losses, the
        batch's mean loss, or with ``shard`` this rank's share of it).

    Raises:
        ValueError: a batch that does not split into ``grad_accum`` micro-batches (naming
            ``grad_accum``).
    """
    micro = task.spec.grad_accum
    if inputs.shape[0] % micro:
        raise bad_value(
            "grad_accum",
            f"expected a divisor of the batch of {inputs.shape[0]} examples on this process, "
            f"got {micro}",
        )
    size = inputs.shape[0] // micro
    weights = _micro_weights(targets, micro, shard)
    runner = train_model or model
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for i in range(micro):
        part = slice(i * size, (i + 1) * size)
        last = i == micro - 1  # DDP all-reduces the gradients in this backward only
        with contextlib.nullcontext() if last else _no_sync(runner):
            with autocast(inputs.device, task.spec.precision):
                logits, scored = task.scored_logits(runner, inputs[part], targets[part], shard)
            if weights is None:  # one pass over the batch, no shard: the loss as it is
                loss = task.loss(logits, scored)
            elif weights[i] == 0:  # no scored target: its backward still runs (collectives)
                loss = logits.sum() * 0.0
            else:
                loss = task.loss(logits, scored) * weights[i]
            (loss if scaler is None else scaler.scale(loss)).backward()
        losses.append(loss.detach())
    return losses[0] if micro == 1 else torch.stack(losses).sum()


def _micro_weights(targets: Tensor, micro: int, shard: SequenceShard | None) -> list[float] | None:
    """The weight of each micro-batch's mean loss: its scored targets (not
    :data:`IGNORE_INDEX`) over those of the whole batch, with ``shard`` over those of the
    sequence group (one all-reduce); ``None`` for one micro-batch and no shard (weight 1, and
    no read of the targets on the host)."""
    if micro == 1 and shard is None:
        return None
    scored = (targets != IGNORE_INDEX).reshape(micro, -1).sum(1).to(torch.float64)  # (micro,)
    total = scored.sum()
    if shard is not None:
        import torch.distributed as dist

        dist.all_reduce(total, group=shard.group)
    whole = float(total)  # one read per step, outside the model's forward
    return [m / whole if m else 0.0 for m in scored.tolist()]


def _no_sync(train_model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """DDP's ``no_sync()`` of ``train_model`` (also under ``torch.compile``, which keeps the
    wrapped module as ``_orig_mod``); a no-op context for a model that is not DDP."""
    module = getattr(train_model, "_orig_mod", train_model)
    no_sync = getattr(module, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()


def optimizer_step(
    task: Task,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
) -> bool:
    """The end of a training step: the gradients unscaled (with ``scaler``), clipped at
    ``task.spec.grad_clip`` (0: none), then ``optimizer.step()`` (learning rates set by the
    caller) -- through ``scaler``, which skips it when a gradient is inf or NaN and updates
    its scale.

    Returns:
        Whether the optimizer stepped: ``False`` only for a step the scaler skipped.
    """
    if scaler is not None:
        scaler.unscale_(optimizer)
    if task.spec.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), task.spec.grad_clip)
    if scaler is None:
        optimizer.step()
        return True
    scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() >= scale  # lowered: inf/NaN gradients, the step was skipped
