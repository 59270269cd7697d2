r"""Fair tuning: each configuration at its own best optimiser setting, chosen on validation data.

``heatformer compare --sweep lr=1e-3,2e-3,4e-3 --select-by val_loss`` crosses the listed
values of an optimiser field (:data:`TUNABLE`) with every head configuration: each
``(configuration, setting, seed)`` is one run. Several such sweeps (``--sweep lr=...
--sweep weight_decay=0,0.1``) make a grid; the value a swept field has in the spec itself is
not used.

Selection on a held-out split. With ``select_by`` the evaluation set of every run is split in
two by example parity (:meth:`~heatformer.lab.tasks.base.Task.evaluate`): the even
examples (0, 2, 4, ...) are the *validation* half, whose metrics are recorded as
``validation/<metric>``; the odd examples are the *test* half, which the usual metric names
report. For each configuration, :func:`select` takes the setting whose validation
``select_by`` metric has the best mean over seeds (lowest, or highest for a metric where
higher is better; ties go to the first setting listed; a setting with a NaN run is taken only
when every one has); the report's numbers -- the table, the paired differences, the primary
endpoints -- are then the test-half metrics of the chosen setting's runs. So every
configuration is compared at its own best learning rate, and the number that compares them
was not used to choose it. ``results.json`` keeps every candidate's validation scores and the
choice (``"selection"``), and ``"runs"`` every run. A candidate whose training diverges (a
non-finite loss, :class:`~heatformer.lab.trainer.TrainingDiverged`) does not stop the
comparison: its run is recorded as finished with NaN metrics and ``"diverged"`` (step, loss),
and selection passes over it.

A chosen value at the edge of its grid (the largest learning rate tried) brackets nothing: with
``bracket`` (``--bracket N``, default 2) the configuration's grid is extended past that edge and
the choice made again, and a value still at an edge is reported "at the grid edge", not tuned
(:mod:`heatformer.lab.bracket`).

This module imports no torch.

Examples:
    >>> parse_tune("lr=1e-3,2e-3")
    ('lr', (0.001, 0.002))
    >>> labels = [setting_label(s) for s in settings(("lr=1e-3,2e-3", "warmup_steps=0,10"))]
    >>> len(labels), labels[0], labels[-1]
    (4, 'lr=0.001 warmup_steps=0', 'lr=0.002 warmup_steps=10')
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from heatformer.checks import bad_type, bad_value, check_int
from heatformer.lab.tasks.base import VALIDATION

__all__ = [
    "TUNABLE",
    "check_study",
    "format_selection",
    "is_tune_sweep",
    "parse_tune",
    "resolve_metric",
    "select",
    "setting_label",
    "settings",
]

#: The optimiser fields ``--sweep FIELD=V1,V2,...`` takes, with the type of their values.
TUNABLE: dict[str, type] = {
    "lr": float,
    "weight_decay": float,
    "min_lr_ratio": float,
    "grad_clip": float,
    "warmup_steps": int,
    "dropout": float,
}

_TUNE = re.compile(r"^\s*([A-Za-z_]+)\s*=\s*(.*?)\s*$")


def is_tune_sweep(text: str) -> bool:
    """Whether the ``--sweep`` value ``text`` sweeps an optimiser field (``lr=...``), not heads."""
    match = _TUNE.match(text) if isinstance(text, str) else None
    return match is not None and match.group(1) in TUNABLE


def parse_tune(text: str) -> tuple[str, tuple[Any, ...]]:
    """``"lr=1e-3,2e-3"`` -> ``("lr", (0.001, 0.002))``.

    Args:
        text: ``FIELD=V1,V2,...`` with ``FIELD`` one of :data:`TUNABLE`.

    Returns:
        The field and its values, distinct, in the order given.

    Raises:
        ValueError: bad syntax, an unknown field, a value that does not parse or is out of the
            field's range, or a repeated value; the message names ``sweep``.
    """
    if not isinstance(text, str):
        raise bad_type("sweep", f"expected a string FIELD=V1,V2, got {type(text).__name__}")
    match = _TUNE.match(text)
    if match is None or match.group(1) not in TUNABLE:
        raise bad_value(
            "sweep",
            f"expected FIELD=V1,V2,... with FIELD one of {sorted(TUNABLE)} (e.g. "
            f"lr=1e-3,2e-3,4e-3), got {text!r}",
        )
    name, kind = match.group(1), TUNABLE[match.group(1)]
    values = []
    for part in match.group(2).split(","):
        try:
            value = kind(part.strip())
        except ValueError:
            raise bad_value(
                "sweep", f"expected {kind.__name__} values for {name} in {text!r}, got {part!r}"
            ) from None
        if not _in_range(name, value):
            raise bad_value("sweep", f"expected {name} values {_RANGES[name]}, got {part.strip()}")
        values.append(value)
    if len(set(values)) != len(values):
        raise bad_value("sweep", f"expected distinct values in {text!r}, got {values}")
    return name, tuple(values)


_RANGES = {
    "lr": "> 0",
    "weight_decay": ">= 0",
    "grad_clip": ">= 0",
    "min_lr_ratio": "in [0, 1]",
    "warmup_steps": ">= 0",
    "dropout": "in [0, 1)",
}


def _in_range(name: str, value: float) -> bool:
    if not math.isfinite(value):
        return False
    if name == "lr":
        return value > 0
    if name == "min_lr_ratio":
        return 0 <= value <= 1
    if name == "dropout":
        return 0 <= value < 1
    return value >= 0


def settings(tune: Sequence[str]) -> list[dict[str, Any]]:
    """Every setting of the grid the sweeps ``tune`` make (``[{}]`` with none), first sweep
    slowest.

    Raises:
        ValueError: a bad sweep (see :func:`parse_tune`) or a field swept twice.
    """
    parsed = [parse_tune(text) for text in tune]
    names = [name for name, _ in parsed]
    if len(set(names)) != len(names):
        raise bad_value("sweep", f"expected each field swept once, got {names}")
    return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in parsed))]


def setting_label(setting: Mapping[str, Any]) -> str:
    """``{"lr": 0.002}`` -> ``"lr=0.002"`` (``""`` for no setting)."""
    return " ".join(f"{name}={value:g}" for name, value in setting.items())


def resolve_metric(task_cls: Any, name: str, argument: str) -> str:
    """The task's final metric called ``name``, or the one that is ``name`` after a
    ``val_``/``test_`` prefix (``bpc`` -> ``val_bpc`` on ``chars``).

    Raises:
        ValueError: no such metric, or several; the message names ``argument``.
    """
    names = tuple(task_cls.metric_names)
    if name in names:
        return name
    found = [m for m in names if m in (f"val_{name}", f"test_{name}")]
    if len(found) == 1:
        return found[0]
    raise bad_value(
        argument, f"expected a metric of task {task_cls.name!r} {list(names)}, got {name!r}"
    )


def _check_primary(task_cls: Any, text: str, n_layer: int, analysis: bool) -> str:
    """``"bpc"`` -> ``"val_bpc"``; ``"within_seq_frac@-1"`` as it is, checked against the
    model's ``n_layer`` layers and whether the run has its ``analysis``."""
    if not isinstance(text, str) or not text.strip():
        raise bad_value("primary", f"expected METRIC or METRIC@LAYER, got {text!r}")
    metric, at, layer = (part.strip() for part in text.partition("@"))
    if not at:
        return resolve_metric(task_cls, metric, "primary")
    names = tuple(task_cls.analysis_names)
    if metric not in names:
        raise bad_value(
            "primary",
            f"expected METRIC@LAYER with METRIC one of the per-layer metrics {list(names)}, "
            f"got {text!r}",
        )
    if layer != "last" and not re.fullmatch(r"-?\d+", layer):
        raise bad_value("primary", f"expected a layer index (0, 3, -1) or 'last', got {text!r}")
    if layer != "last" and not -n_layer <= int(layer) < n_layer:
        raise bad_value("primary", f"expected a layer in [-{n_layer}, {n_layer}), got {text!r}")
    if not analysis:
        raise bad_value("primary", f"expected the per-layer analysis for {text!r}, got it off")
    return f"{metric}@{layer}"


def check_study(
    task_cls: Any,
    *,
    tune: Sequence[str],
    select_by: str | None,
    primary: Sequence[str],
    n_layer: int,
    analysis: bool,
    bracket: int = 0,
) -> dict[str, Any]:
    """Check a comparison's ``tune``, ``select_by``, ``bracket`` and ``primary`` (fields of its
    spec) for the task ``task_cls``, a model of ``n_layer`` layers and whether it has the
    per-layer ``analysis``; return the canonical values of all but ``bracket`` (an int >= 0).

    Returns:
        ``{"tune", "select_by", "primary"}`` as the spec should hold them (tuples, metric
        names resolved).

    Raises:
        ValueError: a bad sweep, a metric the task does not have, ``select_by`` without a
            sweep of an optimiser field (or a sweep without it), a negative ``bracket``,
            ``primary`` that is not ``METRIC[@LAYER]``; each message names its argument.
    """
    check_int("bracket", bracket, minimum=0)
    for name, value in (("tune", tune), ("primary", primary)):
        if isinstance(value, str):
            raise bad_type(name, f"expected a sequence of strings, got {value!r}")
    tune = tuple(tune)
    settings(tune)
    if select_by is not None:
        if not isinstance(select_by, str):
            raise bad_type("select_by", f"expected a metric name, got {select_by!r}")
        select_by = resolve_metric(task_cls, select_by, "select_by")
        if not tune:
            raise bad_value(
                "select_by",
                "expected a sweep of an optimiser field to select from (e.g. --sweep "
                f"lr=1e-3,2e-3,4e-3), got none; fields: {sorted(TUNABLE)}",
            )
    elif tune:
        raise bad_value(
            "select_by",
            f"expected the metric that picks each configuration's setting of {list(tune)} "
            f"on the validation half (e.g. --select-by {task_cls.eval_loss_name}), got none",
        )
    checked = tuple(_check_primary(task_cls, text, n_layer, analysis) for text in primary)
    if len(set(checked)) != len(checked):
        raise bad_value("primary", f"expected distinct endpoints, got {list(checked)}")
    return {"tune": tune, "select_by": select_by, "primary": checked}


def select(
    records: Sequence[Mapping[str, Any]],
    heads_order: Sequence[str],
    metric: str,
    higher_is_better: bool,
) -> tuple[list[Mapping[str, Any]], list[dict[str, Any]]]:
    """Each configuration's best setting on the validation half, and the runs it keeps.

    Args:
        records: run records, each with ``heads``, ``seed``, ``setting`` (a dict) and
            ``final[VALIDATION + metric]``.
        heads_order: the configurations, in report order.
        metric: the metric that selects (a final metric of the task).
        higher_is_better: whether larger values of ``metric`` are better.

    Returns:
        ``(kept, selection)``: the records of the chosen settings, and per configuration
        ``{"heads", "metric", "chosen", "chosen_label", "candidates": [{"setting", "label",
        "seeds", "values", "mean"}]}`` (the candidates in the order first seen).
    """
    kept: list[Mapping[str, Any]] = []
    selection: list[dict[str, Any]] = []
    for heads in heads_order:
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for record in records:
            if record["heads"] == heads:
                groups.setdefault(setting_label(record.get("setting") or {}), []).append(record)
        if not groups:
            continue
        candidates: list[dict[str, Any]] = []
        for label, runs in groups.items():
            runs = sorted(runs, key=lambda r: r["seed"])
            values = [_number(r["final"].get(VALIDATION + metric)) for r in runs]
            mean = math.fsum(values) / len(values)
            candidates.append({"setting": dict(runs[0].get("setting") or {}), "label": label,
                               "seeds": [r["seed"] for r in runs], "values": values,
                               "mean": mean})  # fmt: skip
        sign = -1.0 if higher_is_better else 1.0
        finite = [c for c in candidates if math.isfinite(c["mean"])] or candidates[:1]
        best = min(finite, key=lambda c: sign * c["mean"])  # first of equals (min is stable)
        kept += sorted(groups[best["label"]], key=lambda r: r["seed"])
        selection.append({"heads": heads, "metric": metric, "chosen": best["setting"],
                          "chosen_label": best["label"], "candidates": candidates})  # fmt: skip
    return kept, selection


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def format_selection(selection: Sequence[Mapping[str, Any]]) -> str:
    """The selection as text: per configuration, each candidate's validation mean, ``*`` the
    chosen one; a configuration whose best value of a field is at the grid edge (its
    ``"bracket"``, see :mod:`heatformer.lab.bracket`) is marked, and a last line says what that
    means."""
    if not selection:
        return ""
    metric = selection[0]["metric"]
    lines = [f"selection by validation {metric} (mean over seeds; * chosen, reported on test):"]
    limits = set()
    for row in selection:
        cells = [
            f"{'*' if c['label'] == row['chosen_label'] else ' '}{c['label']}: {c['mean']:.4f}"
            for c in row["candidates"]
        ]
        edges = [(name, entry) for name, entry in (row.get("bracket") or {}).items()
                 if entry["status"] == "edge"]  # fmt: skip
        limits |= {entry["limit"] for _, entry in edges}
        mark = ", ".join(f"{name} {entry['side']}" for name, entry in edges)
        lines.append(f"  {row['heads']}:  " + "   ".join(cells)
                     + (f"   [at the grid edge: {mark}; not tuned]" if edges else ""))  # fmt: skip
    if limits:
        lines.append(
            f"at the grid edge: the best value is still the smallest or largest tried, "
            f"{max(limits)} extension(s) past the listed grid allowed per side (--bracket): "
            "widen the grid or raise --bracket before calling that configuration tuned"
        )
    return "\n".join(lines)
