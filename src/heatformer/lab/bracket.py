r"""Tuning that brackets: a grid extended past the edge where a configuration's best setting lies.

A best learning rate that is the largest one tried says only that a larger one might be better:
the grid did not bracket the optimum, and a configuration compared there is not tuned. With
``heatformer compare --sweep lr=1e-3,2e-3,4e-3 --select-by val_loss`` (:mod:`heatformer.lab.
tuning`) and ``--bracket N`` (the spec's ``bracket``, default 2), once every seed of every
setting of the grid has run, each configuration's chosen setting is looked at field by field:

- a swept field whose grid has two values or more, and whose chosen value is the smallest (or
  largest) of the values the configuration has tried, while no other value of it (the other
  fields at the chosen setting's values) reaches the same validation mean, is **at an edge**;
  a tie with another value counts as bracketed;
- such a field gets one more value past that edge, for that configuration only
  (:func:`next_value`): the grid's own ratio at that edge for a geometric grid (``lr=1e-3,
  2e-3,4e-3`` -> ``8e-3`` above, ``5e-4`` below), its difference for an arithmetic one
  (``warmup_steps=0,50,100`` -> ``150``); crossed with the other fields' values, the new
  settings run with every seed, and the choice is made again, until no chosen value is at an
  edge that can move;
- at most ``N`` values past each side of the listed grid (``bracket = 0``: none). A field's own
  bounds stop it too (``lr > 0``, ``dropout < 1``, ``weight_decay``, ``grad_clip`` and
  ``min_lr_ratio >= 0``, ``min_lr_ratio <= 1``, ``warmup_steps`` a whole number ``>= 0``): a
  step that would cross an inclusive bound lands on it, one that would cross an exclusive
  bound goes half way to it; a best value *on* an inclusive bound (``weight_decay = 0``) is
  the best of the field's whole range on that side (status ``"bound"``), and is tuned;
- a best value still at an edge when the limit is reached is reported **at the grid edge**
  (status ``"edge"``): in ``results.json["selection"]``, each configuration's ``"bracket"``
  (per field: ``status``, ``side``, the values tried, the extensions per side, the limit)
  and ``"tuned": false``, and in the printed selection table.

A grid is geometric when its values are all positive and either it has three values or more
whose successive ratios are equal, or it has two (or irregular steps) and the field is a
scale (``lr``, ``weight_decay``, ``grad_clip``); else it is arithmetic (``dropout=0.1,0.2``
steps by 0.1). Float values past the grid are rounded to 6 significant digits (the digits of
their label and folder name: ``lr=0.0005``, ``c00-attention4-lr0.0005-s0``).

The decisions are a function of the recorded results only (the validation means of the runs'
``result.json``), so an interrupted comparison resumed with ``--resume`` takes them again,
finds the extension runs it had started by their folder names, and continues the interrupted
one from its checkpoint (:func:`folder_plan`, :func:`bracketed`).

This module imports no torch at import time.

Examples:
    >>> next_value("lr", (1e-3, 2e-3, 4e-3), 4e-3, "high")
    0.008
    >>> next_value("lr", (1e-3, 2e-3, 4e-3), 1e-3, "low")
    0.0005
    >>> next_value("dropout", (0.1, 0.3), 0.1, "low")  # crosses 0: lands on it
    0.0
    >>> next_value("weight_decay", (0.0, 0.1), 0.0, "low") is None  # on its bound
    True
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from heatformer.lab.tuning import TUNABLE, parse_tune, select, setting_label

__all__ = [
    "BOUNDS",
    "bracketed",
    "decide",
    "folder_plan",
    "grid_kind",
    "new_settings",
    "next_value",
    "plan_note",
    "select_bracketed",
]

#: A run of a comparison: ``(heads, setting, seed, folder name)``.
Run = tuple[str, dict[str, Any], int, str]

#: Each tunable field's hard bounds: ``(low, low included, high, high included)``.
BOUNDS: dict[str, tuple[float, bool, float, bool]] = {
    "lr": (0.0, False, math.inf, False),
    "weight_decay": (0.0, True, math.inf, False),
    "min_lr_ratio": (0.0, True, 1.0, True),
    "grad_clip": (0.0, True, math.inf, False),
    "warmup_steps": (0.0, True, math.inf, False),
    "dropout": (0.0, True, 1.0, False),
}

#: The fields that are scales: a grid of two values (or irregular steps) of them is geometric.
_SCALES = frozenset({"lr", "weight_decay", "grad_clip"})


def _equal(steps: Sequence[float]) -> bool:
    return all(math.isclose(step, steps[0], rel_tol=1e-6) for step in steps)


def grid_kind(name: str, values: Sequence[float]) -> str:
    """``"geometric"`` or ``"arithmetic"``: how the grid ``values`` of the field ``name`` steps
    (rule in the module docstring).

    Examples:
        >>> grid_kind("lr", (1e-3, 2e-3)), grid_kind("lr", (1e-3, 2e-3, 3e-3))
        ('geometric', 'arithmetic')
        >>> grid_kind("dropout", (0.1, 0.2)), grid_kind("dropout", (0.1, 0.2, 0.4))
        ('arithmetic', 'geometric')
    """
    v = sorted(values)
    if v[0] <= 0:
        return "arithmetic"
    if len(v) >= 3:
        if _equal([b / a for a, b in itertools.pairwise(v)]):
            return "geometric"
        if _equal([b - a for a, b in itertools.pairwise(v)]):
            return "arithmetic"
    return "geometric" if name in _SCALES else "arithmetic"


def _inside(name: str, value: float) -> bool:
    low, low_in, high, high_in = BOUNDS[name]
    above = value >= low if low_in else value > low
    below = value <= high if high_in else value < high
    return above and below and math.isfinite(value)


def next_value(name: str, grid: Sequence[float], edge: float, side: str) -> float | None:
    """The value of the field ``name`` one step past ``edge`` on ``side``, or ``None`` where
    the field's bound allows none.

    Args:
        name: a field of :data:`~heatformer.lab.tuning.TUNABLE`.
        grid: its listed values (two or more): they set the kind and the step.
        edge: the configuration's smallest (``side="low"``) or largest (``"high"``) value
            so far.
        side: ``"low"`` or ``"high"``.

    Returns:
        ``edge`` divided (low) or multiplied (high) by the grid's ratio at that edge for a
        geometric grid, minus or plus its difference there for an arithmetic one; an int for
        an int field (at least 1 away), a float rounded to 6 significant digits; on an
        inclusive bound when the step crosses it, half way to an exclusive one.
    """
    v = sorted(grid)
    low = side == "low"
    a, b = (v[0], v[1]) if low else (v[-2], v[-1])
    if grid_kind(name, v) == "geometric":
        raw = edge * (a / b if low else b / a)
    else:
        raw = edge - (b - a) if low else edge + (b - a)
    whole = TUNABLE[name] is int
    if whole:
        raw = min(round(raw), edge - 1) if low else max(round(raw), edge + 1)
    bound, included = BOUNDS[name][0:2] if low else BOUNDS[name][2:4]
    if not _inside(name, raw):
        if edge == bound:
            return None
        raw = bound if included else (edge + bound) / 2
    value: float = round(raw) if whole else float(f"{raw:.6g}")
    return value if _inside(name, value) and value != edge else None


def decide(
    row: Mapping[str, Any], grid: Mapping[str, Sequence[float]], limit: int
) -> dict[str, Any]:
    """Where a configuration's chosen setting lies in each swept field (rule in the module
    docstring).

    Args:
        row: one configuration of :func:`~heatformer.lab.tuning.select`'s selection
            (``chosen``, ``chosen_label``, ``candidates`` with their ``setting`` and ``mean``).
        grid: the listed values of each swept field (``dict(parse_tune(text) ...)``).
        limit: the most values past each side of a field's listed values (``bracket``).

    Returns:
        Per field with two listed values or more: ``{"status", "side", "values",
        "extensions": {"low": k, "high": k}, "limit"}`` and, where the grid is to be extended,
        ``"next"``. ``status`` is ``"interior"``, ``"extend"`` (at an edge that can move:
        ``next`` is the value to add), ``"bound"`` (on the field's bound) or ``"edge"`` (at an
        edge after ``limit`` extensions); ``"diverged"`` when no candidate has a finite mean.
    """
    candidates, chosen = row["candidates"], row["chosen"]
    best = next(c["mean"] for c in candidates if c["label"] == row["chosen_label"])
    out: dict[str, Any] = {}
    for name, listed in grid.items():
        if len(listed) < 2:
            continue
        values = sorted({c["setting"][name] for c in candidates})
        past = {"low": sum(x < min(listed) for x in values),
                "high": sum(x > max(listed) for x in values)}  # fmt: skip
        entry: dict[str, Any] = {"status": "interior", "side": None, "values": values,
                                 "extensions": past, "limit": limit}  # fmt: skip
        out[name] = entry
        if not math.isfinite(best):
            entry["status"] = "diverged"
            continue
        line = [c for c in candidates
                if all(c["setting"][g] == chosen[g] for g in chosen if g != name)]  # fmt: skip
        tops = {c["setting"][name] for c in line if c["mean"] == best}
        side = "low" if tops == {values[0]} else "high" if tops == {values[-1]} else None
        if side is None:
            continue
        step = next_value(name, listed, values[0] if side == "low" else values[-1], side)
        entry["side"] = side
        if step is None:
            entry["status"] = "bound"
        elif past[side] >= limit:
            entry["status"] = "edge"
        else:
            entry["status"], entry["next"] = "extend", step
    return out


def new_settings(row: Mapping[str, Any], decision: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The settings a configuration runs next: its grid with each ``"next"`` value of
    ``decision`` added to its field, less the settings it has run (in grid order, each field's
    values increasing)."""
    added = {name: entry["next"] for name, entry in decision.items() if "next" in entry}
    if not added:
        return []
    candidates = row["candidates"]
    axes = {
        name: sorted({c["setting"][name] for c in candidates} | ({added[name]} if name in added
                                                                 else set()))
        for name in row["chosen"]
    }  # fmt: skip
    seen = {setting_label(c["setting"]) for c in candidates}
    cells = (dict(zip(axes, values)) for values in itertools.product(*axes.values()))
    return [cell for cell in cells if setting_label(cell) not in seen]


def _higher(spec: Any) -> bool:
    """Whether larger values of ``spec.select_by`` are better (the task's declaration)."""
    from heatformer.lab.tasks import resolve_task

    task = resolve_task(spec.task)
    return bool(task.higher_is_better[task.metric_names.index(spec.select_by)])


def bracketed(
    spec: Any,
    runs: Iterable[Run],
    records: Sequence[Mapping[str, Any]],
    decided: Callable[[int], None] | None = None,
) -> Iterator[Run]:
    """The runs of a comparison: ``runs`` (the grid's), then each round of extensions.

    The caller appends the record of each run it is given to ``records`` (with its
    ``setting``) before it asks for the next; once every run so far has a record, the next
    round is decided from them (:func:`decide`, :func:`new_settings`) and given seed-major,
    like the grid. A round is decided only when ``records`` holds one record per run given: a
    caller that leaves a run out (not finished) ends the plan there.

    Args:
        spec: the comparison's :class:`~heatformer.lab.spec.CompareSpec`.
        runs: the grid's runs, in their order, or those :func:`folder_plan` found decided.
        records: the records so far, filled by the caller.
        decided: called with the number of runs planned so far after each round is decided
            (a progress bar's total).
    """
    plan = list(runs)
    yield from plan
    if not spec.tune or spec.select_by is None or spec.bracket == 0:
        return
    from heatformer.lab.folder import run_name  # torch (the checkpoints)

    total, higher = len(plan), _higher(spec)
    grid = dict(parse_tune(text) for text in spec.tune)
    while len(records) == total:
        _, rows = select(records, spec.heads, spec.select_by, higher)
        new = {row["heads"]: new_settings(row, decide(row, grid, spec.bracket)) for row in rows}
        plan = [
            (heads, setting, seed, run_name(index, heads, seed, setting_label(setting)))
            for seed in spec.seeds
            for index, heads in enumerate(spec.heads)
            for setting in new.get(heads, ())
        ]
        if not plan:
            return
        total += len(plan)
        if decided is not None:
            decided(total)
        yield from plan


def folder_plan(
    spec: Any, runs: Iterable[Run], out: str | Path, *, finished: bool = False
) -> list[Run]:
    """The runs of the comparison in ``out`` as far as its finished runs decide them: the
    grid's, then every round of extensions whose runs before it have all finished (their
    ``result.json``); with ``finished``, only the finished ones."""
    from heatformer.lab.checkpoint import read_json
    from heatformer.lab.trainer import RESULT_NAME

    plan: list[Run] = []
    records: list[dict[str, Any]] = []
    for item in bracketed(spec, runs, records):
        path = Path(out) / "runs" / item[3] / RESULT_NAME
        done = path.is_file()
        if done:
            records.append({**read_json(path), "setting": item[1]})
        if done or not finished:
            plan.append(item)
    return plan


def select_bracketed(
    records: Sequence[Mapping[str, Any]], spec: Any
) -> tuple[list[Mapping[str, Any]], list[dict[str, Any]]]:
    """:func:`~heatformer.lab.tuning.select` by ``spec.select_by``, each configuration's row
    with its ``"bracket"`` (per swept field: :func:`decide`'s entry; an edge that could still
    move, left by a comparison that stopped before, is an ``"edge"``) and ``"tuned"`` (no
    field at the grid edge, none diverged)."""
    kept, rows = select(records, spec.heads, spec.select_by, _higher(spec))
    grid = dict(parse_tune(text) for text in spec.tune)
    for row in rows:
        fields = decide(row, grid, spec.bracket)
        for entry in fields.values():
            if entry.pop("next", None) is not None:
                entry["status"] = "edge"
        row["bracket"] = fields
        row["tuned"] = all(entry["status"] in ("interior", "bound") for entry in fields.values())
    return kept, rows


def plan_note(spec: Any) -> str:
    """What a plan line adds for bracketing: ``""`` without it."""
    if not spec.tune or spec.select_by is None or spec.bracket == 0:
        return ""
    return f" (+ up to {spec.bracket} value(s) per side where a best one is at the grid's edge)"
