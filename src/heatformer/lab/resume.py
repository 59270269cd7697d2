"""A run's state and its checkpoint: what one run trains with and what it has recorded so far
(:class:`RunState`), made fresh (:func:`setup_run`) or restored from the run's
``checkpoint.pt`` (:func:`load_run_checkpoint`, checked to belong to the run, then
:func:`resume_run`).

The checkpoint holds the run's key (spec fingerprint, head schedule, seed), the step, the
model, optimizer, gradient-scaler (``precision="fp16"``), data-generator and torch RNG states,
and the record so far (losses,
evaluations, train time, the world sizes it was trained with); resuming restores every piece
of state the next step depends on (see :mod:`heatformer.lab.trainer`). It is a model file of
:mod:`heatformer.models.files` too (the model's kind, config and weights, and the steps the run
is to make), so that ``heatformer.models.load_model(run_dir)`` loads the model it holds.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from heatformer.checks import bad_value
from heatformer.lab.checkpoint import load_checkpoint, save_checkpoint
from heatformer.lab.distributed import DistContext
from heatformer.lab.spec import CompareSpec
from heatformer.lab.step import build_optimizer, make_scaler
from heatformer.lab.tasks.base import Task
from heatformer.models import DiffusionAttention, model_file_keys

__all__ = [
    "CHECKPOINT_NAME",
    "ModelFactory",
    "RunState",
    "WorldSizeChanged",
    "load_run_checkpoint",
    "make_model",
    "resume_run",
    "setup_run",
]

#: The checkpoint's file name inside a run folder.
CHECKPOINT_NAME = "checkpoint.pt"

#: ``factory(task, heads) -> model``; the default is ``task.build_model(heads)``.
ModelFactory = Callable[[Task, str], nn.Module]


def make_model(task: Task, heads: str, model_factory: ModelFactory | None = None) -> nn.Module:
    """A run's model: ``model_factory(task, heads)``, by default ``task.build_model(heads)``."""
    return model_factory(task, heads) if model_factory is not None else task.build_model(heads)


class WorldSizeChanged(UserWarning):
    """A run resumed with another number of DDP processes than the one that saved it.

    Every rank draws the same global batch and keeps an equal slice of it, so the
    optimization is the same with any number of processes and the run continues; the
    run record's ``world_sizes`` lists each stretch (``{"world_size", "from_step"}``).
    Issued by rank 0 only (``heatformer train``/``compare`` print it as a note).
    """


def _run_key(task: Task, heads: str, seed: int) -> dict[str, Any]:
    return {"spec": task.spec.fingerprint(), "heads": heads, "seed": seed}


def _describe_mismatch(saved: dict[str, Any], now: dict[str, Any]) -> str:
    diffs = []
    for key in sorted(set(saved) | set(now)):
        if isinstance(saved.get(key), dict) and isinstance(now.get(key), dict):
            inner = _describe_mismatch(saved[key], now[key])
            if inner:
                diffs.append(inner)
        elif saved.get(key) != now.get(key):
            diffs.append(f"{key}: saved {saved.get(key)!r}, now {now.get(key)!r}")
    return "; ".join(diffs)


def load_run_checkpoint(task: Task, heads: str, seed: int, run_dir: Path) -> dict[str, Any] | None:
    """The checkpoint of an unfinished run, checked against the run it should continue.

    Args:
        task: the task (holds the resolved spec).
        heads: the run's head schedule.
        seed: the run's seed.
        run_dir: the run folder.

    Returns:
        The checkpoint dict, or ``None`` when the run has no checkpoint (yet).

    Raises:
        ValueError: the file is not a readable checkpoint (the message says how to start
            that run again), or it was written for another configuration.
    """
    path = Path(run_dir) / CHECKPOINT_NAME
    saved = load_checkpoint(path)
    key = _run_key(task, heads, seed)
    saved_key = saved.get("key") if saved is not None else None
    if saved is not None and saved_key != key:
        mismatch = _describe_mismatch(saved_key if isinstance(saved_key, dict) else {}, key)
        raise ValueError(
            f"{path}: expected a checkpoint of this run, got one written for another "
            f"configuration ({mismatch})"
        )
    return saved


def _model_file_keys(model: nn.Module) -> dict[str, Any]:
    """What makes a run's checkpoint a model file, which :func:`heatformer.models.load_model`
    reads: the model's kind, config and weights (the tensors of ``"model"``, which
    ``torch.save`` writes once); for a model of another kind (a ``model_factory``'s), its
    class's name, which ``load_model`` gives in its refusal."""
    keys = model_file_keys(model)
    if keys is None:
        return {"model_class": f"{type(model).__module__}.{type(model).__qualname__}"}
    return keys


@dataclasses.dataclass(eq=False)
class RunState:
    """One run being trained: what trains it and what its checkpoint holds.

    ``step``, ``train_loss``, ``evals``, ``train_time`` and ``world_sizes`` are the record
    so far; ``saved_step`` is the step in ``checkpoint.pt`` (step 0: none needed, a fresh
    start is that). ``scaler`` is the gradient scaler of ``precision="fp16"`` (else ``None``);
    its state is checkpointed with the optimizer's.
    """

    task: Task
    heads: str
    seed: int
    spec: CompareSpec
    ctx: DistContext
    run_dir: Path
    model: nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    world_sizes: list[dict[str, Any]]
    step: int = 0
    train_loss: list[float] = dataclasses.field(default_factory=list)
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    train_time: float = 0.0
    saved_step: int = 0
    scaler: torch.amp.GradScaler | None = None

    def due(self, at: int) -> bool:
        """Whether an evaluation is due after step ``at``."""
        return at % int(self.spec.eval_every or 0) == 0 or at == self.spec.steps

    def checkpoint(self) -> None:
        """Save the run at ``step`` (rank 0 writes; every rank records it as saved)."""
        self.saved_step = self.step
        if not self.ctx.is_main:
            return
        device = self.ctx.device
        save_checkpoint(
            self.run_dir / CHECKPOINT_NAME,
            {
                "key": _run_key(self.task, self.heads, self.seed),
                "step": self.step,
                "steps": self.spec.steps,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "grad_scaler": None if self.scaler is None else self.scaler.state_dict(),
                "data_generator": self.generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                "train_loss": self.train_loss,
                "evals": self.evals,
                "train_time_s": self.train_time,
                "world_sizes": self.world_sizes,
                **_model_file_keys(self.model),
            },
        )


def setup_run(
    task: Task,
    heads: str,
    seed: int,
    run_dir: Path,
    spec: CompareSpec,
    ctx: DistContext,
    model_factory: ModelFactory | None,
) -> RunState:
    """A fresh run: the seed's initial weights, its optimizer and its batch order."""
    torch.manual_seed(seed)  # initial weights
    model = make_model(task, heads, model_factory).to(ctx.device)
    if ctx.sequence_parallel > 1:
        _check_shards(task, model, spec)
    optimizer = build_optimizer(model, spec.lr, spec.weight_decay)
    generator = torch.Generator().manual_seed(seed)  # batch order
    return RunState(
        task=task,
        heads=heads,
        seed=seed,
        spec=spec,
        ctx=ctx,
        run_dir=run_dir,
        model=model,
        optimizer=optimizer,
        generator=generator,
        world_sizes=[{"world_size": ctx.world_size, "from_step": 0}],
        scaler=make_scaler(spec.precision, ctx.device),
    )


def _check_shards(task: Task, model: nn.Module, spec: CompareSpec) -> None:
    """Refuse sequence parallelism for a model that does not take a sharded sequence, or whose
    attention layers have a graph kind that does not shard (both ask the entry's flag), and
    with ``compile`` (untried: the collectives inside the sharded graphs)."""
    if spec.compile:
        raise bad_value(
            "sequence_parallel",
            "expected no --compile with a sequence split over processes (not supported yet: "
            "torch.compile of the sharded graphs' collectives is untried)",
        )
    if not getattr(model, "shards", False):
        raise bad_value(
            "sequence_parallel",
            f"expected a task whose model takes a sharded sequence (a GPT: --task chars), got "
            f"--task {task.name} with a {type(model).__name__}",
        )
    kinds = [m.graph_kind for m in model.modules() if isinstance(m, DiffusionAttention)]
    refused = sorted({kind.spec for kind in kinds if not kind.shards})
    if refused:
        raise bad_value(
            "sequence_parallel",
            f"expected graph kinds that shard a sequence (--graph window[w=...]), got "
            f"{refused}: dense softmax and exact top-k need every key on every process",
        )


def resume_run(run: RunState) -> None:
    """Load ``run``'s checkpoint into it, if it has one (else it stays a fresh start).

    Warns:
        WorldSizeChanged: the checkpoint was written by another number of processes.
    """
    saved = load_run_checkpoint(run.task, run.heads, run.seed, run.run_dir)
    if saved is None:
        return
    ctx, device = run.ctx, run.ctx.device
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    if run.scaler is not None and saved.get("grad_scaler"):  # fp16 (same fingerprint)
        run.scaler.load_state_dict(saved["grad_scaler"])
    run.generator.set_state(saved["data_generator"])
    torch.set_rng_state(saved["torch_rng"])
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], device)
    run.step = run.saved_step = int(saved["step"])
    run.train_loss = list(saved["train_loss"])
    run.evals = list(saved["evals"])
    run.train_time = float(saved["train_time_s"])
    run.world_sizes = [dict(stretch) for stretch in saved.get("world_sizes") or run.world_sizes]
    before = int(run.world_sizes[-1]["world_size"])
    if before != ctx.world_size:
        run.world_sizes.append({"world_size": ctx.world_size, "from_step": run.step})
        if ctx.is_main:
            warnings.warn(
                f"run {run.run_dir.name}: resuming at step {run.step} with {ctx.world_size} "
                f"process(es); its checkpoint was written by {before} process(es). Every "
                f"process count trains on the same global batch ({run.spec.batch_size}), so "
                "the optimization is the same and the run continues (losses may differ "
                "in float rounding); the record's world_sizes keeps both",
                WorldSizeChanged,
                stacklevel=2,
            )
