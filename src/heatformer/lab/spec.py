"""What a comparison runs: :class:`CompareSpec`, head schedules and seeds.

A comparison trains several head configurations (``heads``) with several seeds each,
under one budget: the same steps, batch size, learning rate, schedule, data and seeds
for every configuration. Everything that determines the numbers lives in one frozen
:class:`CompareSpec`, which is stored as ``spec.json`` in the run folder, so
``--resume`` and ``heatformer analyze`` rebuild exactly what ran.

Head schedules are strings in the spec (and in ``spec.json``), parsed and checked once, when
the spec is made, into :class:`~heatformer.models.heads.HeadSchedule` objects
(:meth:`CompareSpec.schedule`) that the tasks build their models from:

- ``"attention:6,laplacian:2"`` -- the same heads in every layer; the counts sum to the
  number of heads per layer. A bare ``"attention"`` means all heads. Operator
  parameters go in brackets: ``"attention:6,heat[t=0.5]:2"`` (see
  :mod:`heatformer.models.heads`).
- ``"attention:4;attention:2,laplacian:2"`` -- one spec per layer, separated by ``;``
  (here 2 layers: plain attention below, two Laplacian heads above); ``|`` works too.
  The number of layer specs must equal ``n_layer``.

Graph kinds (``graph``) use the same syntax: ``"topk[k=32]"`` in every layer, or
``"topk[k=8];softmax"`` one per layer (see :data:`heatformer.graph_ops.GRAPHS`); the command
line's ``--topk K`` is shorthand for ``graph="topk[k=K]"``. The options of the chosen task
(``seq_len``, ``text``, ...) live in ``options``; each task declares them, with their
defaults, in its module (:mod:`heatformer.lab.tasks`).

A spec is validated once, when it is made: :meth:`CompareSpec.resolved` fills in the derived
fields without validating again, and the runner passes the one spec (or, per optimiser
setting, one per run) down to the task, the trainer and the checkpoints.

This module imports no torch at import time (the models and the data are imported inside
the functions that need them): the command line reads the defaults of :class:`CompareSpec`
for its help pages before torch is loaded (and the presets, :mod:`heatformer.lab.presets`).

Examples:
    >>> spec = CompareSpec(heads=("attention:4;attention:2,laplacian:2",), n_layer=2)
    >>> spec.schedule(spec.heads[0]).config_heads
    ('attention:4', 'attention:2,laplacian:2')
    >>> parse_seeds("3"), parse_seeds("4,7")
    ((0, 1, 2), (4, 7))
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heatformer.checks import (
    bad_type,
    bad_value,
    check_bool,
    check_choice,
    check_int,
    check_positive_int,
)
from heatformer.lab.plan import plan_for_spec
from heatformer.lab.tasks import TASKS, options_by_name
from heatformer.lab.tasks.base import Task
from heatformer.lab.tasks.options import TaskOptions
from heatformer.lab.tuning import check_study

if TYPE_CHECKING:
    from heatformer.models.heads import HeadSchedule

__all__ = [
    "PRECISIONS",
    "SPEC_NAME",
    "CompareSpec",
    "parse_seeds",
]

#: The file of a comparison folder that holds its :class:`CompareSpec` (``OUT/spec.json``).
SPEC_NAME = "spec.json"

#: The values of :attr:`CompareSpec.precision`: float32, bfloat16 autocast, float16 autocast with
#: a gradient scaler (CUDA only).
PRECISIONS = ("fp32", "bf16", "fp16")

#: The values of the spec's analysis options that take a name.
_ANALYSIS_CHOICES = {"analysis_split": ("test", "train"), "analysis_point": ("pre_ln", "post_ln")}


@dataclass(frozen=True)
class CompareSpec:
    """Everything that determines the numbers of a comparison.

    The fields are what every task shares (the budget, the model's sizes, head schedules and
    graph kinds); ``options`` holds the chosen task's own options (``seq_len``, ``text``, ...;
    see :data:`heatformer.lab.tasks.TASKS`): give a mapping with the ones to change, and the
    spec keeps an instance of the task's ``Options`` dataclass with every other at its
    default. ``None`` in ``n_head``, ``eval_every``, ``ckpt_every`` and ``warmup_steps``
    means "derive it" (see :meth:`resolved`).

    Examples:
        >>> spec = CompareSpec(task="recall", options={"seq_len": 256})
        >>> spec.options.seq_len, spec.options.eval_size
        (256, 128)
        >>> spec.resolved().eval_every
        50
    """

    task: str = "chars"  # a name of heatformer.lab.tasks.TASKS
    heads: tuple[str, ...] = ("attention",)  # one head schedule per configuration
    seeds: tuple[int, ...] = (0,)  # every configuration runs with every seed
    steps: int = 500  # optimizer steps per run
    batch_size: int = 32  # global batch (split across DDP ranks)
    # micro-batches per optimizer step: each of batch_size / grad_accum examples (per DDP
    # replica: / replicas too), their gradients summed into the full batch's mean loss
    grad_accum: int = 1
    lr: float = 1e-3  # peak AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    warmup_steps: int | None = None  # linear warm-up; None: min(100, steps // 10)
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    grad_clip: float = 1.0  # max global gradient norm, 0 to disable
    eval_every: int | None = None  # None: max(1, steps // 10)
    ckpt_every: int | None = None  # None: same as eval_every
    n_layer: int = 4  # transformer blocks
    n_head: int | None = None  # heads per layer; None: the sum of the schedule's counts
    n_embd: int = 128  # model width D
    mlp_ratio: int = 4  # MLP hidden width in units of D; 0: attention-only blocks (no MLP)
    # zero every attention layer's output projection at initialization (the paper's LM code):
    # each layer, a Laplacian head with it, starts as nothing, a no-op on the residual stream
    zero_init_proj: bool = False
    # graph kind(s) of the attention layers: "softmax", "topk[k=32]", or one per layer
    # separated by ';' ("topk[k=8];softmax"); see heatformer.graph_ops.GRAPHS
    graph: str = "softmax"
    dropout: float = 0.0
    # the task's options: a mapping of the ones to change, kept as the task's Options
    options: Any = field(default_factory=dict)
    analysis: bool = True  # per-layer token-geometry metrics after training
    # what the analysis reads (no training number depends on it): the task's held-out "test"
    # batch or a "train" batch of the same size; the cls token (tasks whose model has one) or
    # not; each block's output ("pre_ln") or that output through the final LayerNorm ("post_ln")
    analysis_split: str = "test"
    analysis_cls: bool = True
    analysis_point: str = "pre_ln"
    device: str = "auto"  # "auto", "cpu" or "cuda" (or "cuda:1")
    # "fp32"; "bf16": bfloat16 autocast; "fp16": float16 autocast with a gradient scaler (CUDA)
    precision: str = "fp32"
    compile: bool = False  # torch.compile the model
    # recompute each block's activations in backward (models.TransformerBlock): the same
    # numbers in about one layer's training memory, for about one more forward per step
    activation_checkpointing: bool = False
    # optimiser sweeps crossed with heads ("lr=1e-3,2e-3"), see heatformer.lab.tuning;
    # select_by: the metric that picks each configuration's setting on the validation half
    tune: tuple[str, ...] = ()
    select_by: str | None = None
    # the most values a tuned grid gains past each side where a best one is at its edge (per
    # configuration and field; 0: none), see heatformer.lab.bracket
    bracket: int = 2
    primary: tuple[str, ...] = ()  # declared primary endpoints, "METRIC" or "METRIC@LAYER"
    # direct contrasts "A - B" of two compared schedules, paired over seeds, Holm over them
    contrast: tuple[str, ...] = ()
    name: str = field(default="", compare=False)  # a label for reports only
    # the study's plan (heatformer.lab.plan): a plan file, read and checked when the spec is
    # made, then kept as its PlanRecord (path, sha256, study, endpoints), as spec.json holds it;
    # a path (metadata "path"): a study file's relative one is read from the file's folder
    plan: Any = field(default=None, compare=False, metadata={"path": True})

    # ------------------------------------------------------------------ validation

    def __post_init__(self) -> None:
        task = _task_class(self.task)
        object.__setattr__(self, "options", _task_options(task, self.task, self.options))
        if not self.heads:
            raise bad_value("heads", "expected at least one head schedule, got none")
        if len(set(self.heads)) != len(self.heads):
            raise bad_value("heads", f"expected distinct schedules, got {list(self.heads)}")
        check_int("mlp_ratio", self.mlp_ratio, minimum=0)
        for name in ("steps", "batch_size", "grad_accum", "n_layer", "n_embd"):
            check_positive_int(name, getattr(self, name))
        if self.batch_size % self.grad_accum:
            raise bad_value(
                "grad_accum",
                f"expected a divisor of batch_size {self.batch_size} (micro-batches of "
                f"batch_size / grad_accum examples), got {self.grad_accum}",
            )
        check_choice("precision", self.precision, PRECISIONS)
        for name in ("analysis", "analysis_cls", "compile", "activation_checkpointing"):
            check_bool(name, getattr(self, name))
        for name, choices in _ANALYSIS_CHOICES.items():
            check_choice(name, getattr(self, name), choices)
        for name in ("eval_every", "ckpt_every", "n_head"):
            check_positive_int(name, getattr(self, name), optional=True)
        from heatformer.models.heads import HeadSchedule  # torch: not at import (the CLI's help)

        schedules: dict[str, HeadSchedule] = {}
        for heads in self.heads:  # parsed once; the tasks build their models from these
            schedule = HeadSchedule.parse(heads, n_layer=self.n_layer, n_head=self.n_head)
            if self.n_embd % schedule.num_heads:
                raise bad_value(
                    "n_embd",
                    f"expected a multiple of the {schedule.num_heads} heads per layer of "
                    f"{heads!r}, got {self.n_embd}",
                )
            schedules[heads] = schedule
        object.__setattr__(self, "_schedules", schedules)
        if not self.seeds:
            raise bad_value("seeds", "expected at least one seed, got none")
        if len(set(self.seeds)) != len(self.seeds) or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds
        ):
            raise bad_value("seeds", f"expected distinct non-negative ints, got {list(self.seeds)}")
        self._check_graphs()
        if self.warmup_steps is not None:
            check_int("warmup_steps", self.warmup_steps, minimum=0)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise bad_value("lr", f"expected a positive float, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise bad_value("min_lr_ratio", f"expected a float in [0, 1], got {self.min_lr_ratio}")
        if not 0.0 <= self.dropout < 1.0:
            raise bad_value("dropout", f"expected a float in [0, 1), got {self.dropout}")
        for name in ("weight_decay", "grad_clip"):  # NaN fails both comparisons
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise bad_value(name, f"expected a finite float >= 0, got {value}")
        if not isinstance(self.device, str) or not re.fullmatch(
            r"auto|cpu|cuda(:\d+)?", self.device
        ):
            raise bad_value("device", f"expected 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        study = check_study(
            task, tune=self.tune, select_by=self.select_by, bracket=self.bracket,
            primary=self.primary, n_layer=self.n_layer, analysis=self.analysis,
        )  # fmt: skip
        for name, value in study.items():  # canonical: tuples, metric names
            object.__setattr__(self, name, value)
        self._check_controls()
        if self.plan is not None:
            self._take_plan(task)

    def _take_plan(self, task: type[Task]) -> None:
        """The plan as its record (a plan file is read and checked against this spec, once);
        ``primary`` among the plan's endpoints for the study, or all of them."""
        record, primary = plan_for_spec(
            self.plan, name=self.name, task_cls=task, heads=self.heads, seeds=self.seeds,
            primary=self.primary, n_layer=self.n_layer, analysis=self.analysis,
        )  # fmt: skip
        object.__setattr__(self, "plan", record)
        object.__setattr__(self, "primary", primary)

    def _check_controls(self) -> None:
        """``zero_init_proj`` a bool; each ``contrast`` two compared schedules, made canonical
        (:func:`~heatformer.lab.report.contrasts.check_contrasts`)."""
        from heatformer.lab.report.contrasts import check_contrasts

        check_bool("zero_init_proj", self.zero_init_proj)
        object.__setattr__(self, "contrast", check_contrasts(self.contrast, self.heads))

    def _check_graphs(self) -> None:
        """Graph kinds: known, one per layer, within the task's longest sequence.

        The limits are the graph kinds' own
        (:meth:`~heatformer.graph_ops.GraphBuilder.check_nodes`); a task whose longest sequence
        only its data tell (digits: the patches of an image) is checked by its model config
        when the task is loaded, still before any training.
        """
        from heatformer.graph_ops import resolve_graph
        from heatformer.models.heads import parse_layer_graphs

        if not isinstance(self.graph, str) or not self.graph.strip():
            raise bad_type("graph", f"expected a graph spec string, got {self.graph!r}")
        builders = [
            resolve_graph(g) for g in dict.fromkeys(parse_layer_graphs(self.graph, self.n_layer))
        ]
        tokens = self.options.max_tokens()
        for builder in builders if tokens is not None else ():
            builder.check_nodes(tokens)

    # ------------------------------------------------------------------ derived

    def schedule(self, heads: str) -> HeadSchedule:
        """The parsed :class:`~heatformer.models.heads.HeadSchedule` of the schedule ``heads``:
        for one of :attr:`heads`, the one made with the spec; another (a model of this spec's
        sizes with other heads) is parsed and checked now, once.

        Raises:
            ValueError: a schedule that does not fit this spec's sizes (see
                :meth:`~heatformer.models.heads.HeadSchedule.parse`).
        """
        from heatformer.models.heads import HeadSchedule

        schedules: dict[str, HeadSchedule] = self._schedules  # type: ignore[attr-defined]
        if heads not in schedules:
            schedules[heads] = HeadSchedule.parse(heads, n_layer=self.n_layer, n_head=self.n_head)
        return schedules[heads]

    def resolved(self) -> CompareSpec:
        """The spec with every derived field (``None`` above) filled in; not validated again.

        ``eval_every`` is ``max(1, steps // 10)``, ``ckpt_every`` ``eval_every`` and
        ``warmup_steps`` ``min(100, steps // 10)`` where they are ``None``; a spec with none of
        them ``None`` is returned as it is.
        """
        eval_every = self.eval_every or max(1, self.steps // 10)
        derived = {
            "eval_every": eval_every,
            "ckpt_every": self.ckpt_every or eval_every,
            "warmup_steps": self._warmup_steps(),
        }
        if all(getattr(self, name) == value for name, value in derived.items()):
            return self
        out = copy.copy(self)  # the validated fields and the parsed schedules, as they are
        for name, value in derived.items():
            object.__setattr__(out, name, value)
        return out

    def _warmup_steps(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else min(100, self.steps // 10)

    def heads_per_layer(self, heads: str) -> int:
        """Heads per layer for the schedule ``heads``: ``n_head`` or the inferred count."""
        return self.schedule(heads).num_heads

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, cosine decay.

        Args:
            step: the step about to be taken, ``0 <= step < steps``.

        Returns:
            ``lr * (step + 1) / warmup`` during warm-up, then a cosine from ``lr`` down to
            ``lr * min_lr_ratio`` at the last step.
        """
        warmup = self._warmup_steps()
        if step < warmup:
            return self.lr * (step + 1) / warmup
        span = max(1, self.steps - warmup - 1)
        progress = min(1.0, (step - warmup) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)

    # ------------------------------------------------------------------ (de)serialization

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists, ``options`` a dict)."""
        out = dataclasses.asdict(self)
        out["heads"] = list(self.heads)
        out["seeds"] = list(self.seeds)
        out["tune"], out["primary"] = list(self.tune), list(self.primary)
        out["contrast"] = list(self.contrast)
        if self.plan is not None:
            out["plan"]["endpoints"] = list(self.plan.endpoints)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompareSpec:
        """Inverse of :meth:`to_dict`.

        A ``"topk": null`` entry (what specs kept before ``topk`` became the command line's
        shorthand for ``graph``) is dropped; a ``topk`` value is refused with what to write
        instead. A ``"bf16": true`` / ``false`` entry (specs before ``precision``) is read as
        ``precision="bf16"`` / ``"fp32"``. A spec with ``tune`` and no ``bracket`` (written
        before bracketing) is read with ``bracket=0``: the runs its folder holds (see
        :meth:`upgraded`).

        Args:
            data: a dict as written by :meth:`to_dict`.

        Returns:
            The spec.

        Raises:
            ValueError: unknown keys (the known ones are listed), or a ``bf16`` entry that
                contradicts ``precision``.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = cls.upgraded(data, written=True)
        unknown = sorted(set(values) - known)
        if unknown:
            raise bad_value(
                "spec", f"unknown fields {unknown}; expected a subset of {sorted(known)}"
            )
        for key in ("heads", "seeds", "tune", "primary", "contrast"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    @staticmethod
    def upgraded(data: Mapping[str, Any], *, written: bool = False) -> dict[str, Any]:
        """A spec dict as an older heatformer wrote it, in today's fields (not validated): the
        entries :meth:`from_dict` reads differently (``topk``, ``bf16``), translated. With
        ``written`` (a comparison's ``spec.json``, which holds every field of its day), a field
        added since takes the value the comparison ran with: ``bracket = 0`` where it tuned.

        Raises:
            ValueError: a ``topk`` value, or a ``bf16`` entry that contradicts ``precision``.
        """
        values = dict(data)
        topk = values.pop("topk", None)
        if topk is not None:
            raise bad_value("topk", f"expected graph='topk[k={topk}]' instead, got topk={topk}")
        if "bf16" in values:  # a spec written before ``precision``
            values["precision"] = _precision_of_bf16(values.pop("bf16"), values.get("precision"))
        if written and values.get("tune") and "bracket" not in values:  # before bracketing
            values["bracket"] = 0
        return values

    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with to be resumed (numbers-determining: not
        where or how fast it runs, so a run may resume with activation checkpointing on, nor
        what its final analysis reads).

        ``grad_accum`` is left out (the same optimization in other micro-batches, as with
        another number of processes: only float rounding differs), and ``precision`` is
        written as the ``bf16`` flag it replaced (``"fp32"``: false, ``"bf16"``: true;
        ``"fp16"`` as itself), so the checkpoints of runs made before these fields resume.
        """
        out = self.resolved().to_dict()
        precision = out.pop("precision")
        if precision == "fp16":
            out["precision"] = precision
        else:
            out["bf16"] = precision == "bf16"
        for key in (
            "name",
            "grad_accum",
            "heads",
            "seeds",
            "device",
            "compile",
            "analysis",
            "analysis_split",
            "analysis_cls",
            "analysis_point",
            "activation_checkpointing",
            "tune",  # a run's spec holds its own setting (lr, ...)
            "bracket",
            "primary",
            "contrast",  # what the report compares
            "plan",
        ):
            out.pop(key)
        if out["select_by"] is None:  # as before selection existed (evaluation not split)
            out.pop("select_by")
        if out["mlp_ratio"] == 4:  # as before the field existed
            out.pop("mlp_ratio")
        if not out["zero_init_proj"]:  # as before the field existed
            out.pop("zero_init_proj")
        out["options"] = self.options.fingerprint()
        return out


def _precision_of_bf16(bf16: object, precision: object) -> object:
    """The ``precision`` of a spec dict that has the old ``bf16`` flag: ``"bf16"`` for true,
    ``"fp32"`` for false; the dict's own ``precision`` when it has one that agrees."""
    check_bool("bf16", bf16)
    implied = "bf16" if bf16 else "fp32"
    if precision is not None and precision != implied:
        raise bad_value(
            "precision", f"expected {implied!r} (as the spec's bf16={bf16}), got {precision!r}"
        )
    return implied


def _task_class(name: object) -> type[Task]:
    """The task registered as ``name`` (an unknown one listed with the others)."""
    cls: type[Task] = TASKS.lookup(name)
    return cls


def _no_option_named_as_a_spec_field(cls: type[Task]) -> None:
    """A task option may not take the name of a spec field: one flag serves both on the
    command line (checked by :data:`~heatformer.lab.tasks.TASKS` at each registration)."""
    fields = {f.name for f in dataclasses.fields(CompareSpec)}
    for f in dataclasses.fields(cls.Options):
        if f.name in fields:
            raise bad_value(
                "task",
                f"task {cls.__name__}: option {f.name!r} clashes with the spec field of that name",
            )


TASKS.add_check(_no_option_named_as_a_spec_field)


def _task_options(task: Any, name: str, options: object) -> TaskOptions:
    """``options`` as an instance of the task's ``Options``, refusing options it does not take."""
    if isinstance(options, task.Options):
        return options
    if not isinstance(options, Mapping):
        raise bad_type(
            "options",
            f"expected a mapping of option names or a {task.Options.__name__}, "
            f"got {type(options).__name__}",
        )
    taken = {f.name for f in dataclasses.fields(task.Options)}
    everyone = options_by_name()
    for key in options:
        if key in taken:
            continue
        users = sorted(everyone.get(key, {}))
        if not users:
            raise bad_value(
                "options", f"expected options of task {name!r} {sorted(taken)}, got {key!r}"
            )
        used_by = _join([repr(user) for user in users])
        verb = "task uses" if len(users) == 1 else "tasks use"
        raise bad_value(key, f"only the {used_by} {verb} it, got task {name!r}")
    result: TaskOptions = task.Options(**options)
    return result


def _join(items: list[str]) -> str:
    """``['a', 'b', 'c']`` -> ``"a, b and c"``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def parse_seeds(text: str) -> tuple[int, ...]:
    """Parse ``--seeds``: a count (``"3"`` -> 0, 1, 2) or a comma list (``"4,7"``).

    Args:
        text: the flag's value.

    Returns:
        The seeds.

    Raises:
        ValueError: not a positive count or a list of non-negative ints.
    """
    text = text.strip()
    try:
        if "," in text:
            seeds = tuple(int(part) for part in text.split(",") if part.strip())
            if not seeds or any(seed < 0 for seed in seeds):
                raise ValueError
            return seeds
        count = int(text)
    except ValueError:
        raise bad_value(
            "seeds",
            f"expected a count (e.g. 3) or a comma list (e.g. 0,5,7), got {text!r}",
        ) from None
    if count < 1:
        raise bad_value("seeds", f"expected a count >= 1, got {count}")
    return tuple(range(count))
