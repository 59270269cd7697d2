r"""A plan's verdicts across the comparisons it names (``heatformer plan FILE DIR...``).

Each claim of a plan (:mod:`heatformer.lab.plan`) is one family: every configuration it names
against its baseline, paired by the plan's seeds, for every endpoint, in every study it spans
-- :math:`m` comparisons. Each comparison gets two tests:

- superiority: the two-sided paired t-test of no difference
  (:func:`~heatformer.lab.report.stats.paired_difference`);
- equivalence: TOST at the plan's margin :math:`\Delta`, in the endpoint's own units
  (:func:`~heatformer.lab.report.inference.tost`; null :math:`|\mu_d| \ge \Delta`).

A claim with a ``trend`` (a dose per configuration) makes one comparison per endpoint and study
instead: the per-seed least-squares slope of the endpoint in the dose
(:func:`~heatformer.lab.report.inference.trend_test`), its mean tested against 0 and within the
margin (per unit of dose) over the seeds, as a paired difference is.

The :math:`2m` p-values are Holm-adjusted together (:func:`~heatformer.lab.report.inference.holm`),
so that every verdict the claim states is covered by one family-wise error rate, the plan's
:math:`\alpha` (in each comparison at most one of the two nulls is true). The verdicts:

- ``"better"`` / ``"the other way"``: superiority rejected after correction, the difference on
  the claimed side (the plan's ``side``) / the other (``"better, by less than X"`` when
  equivalence is rejected too);
- ``"no effect larger than X"``: equivalence rejected after correction, X the plan's margin;
- ``"undetermined"``: neither.

Beside each: the mean difference with its simultaneous interval (Bonferroni over the :math:`m`
comparisons, level :math:`1 - \alpha/m`), and the power of the superiority test at the
corrected :math:`\alpha`, :math:`\alpha/K` (:math:`K` the tests made, :math:`2m`: Holm's first
and strictest step), against a true difference of the margin, in units of the seed-SD of the
differences (:func:`~heatformer.lab.report.inference.paired_power`).

Per study: its folder, the runs' start (``results.json``'s ``"started"``; for one written before
heatformer recorded it, the first start in ``invocations.json``, local time of this machine),
whether the plan file was committed before it (:func:`~heatformer.lab.plan.commit_state`), and
the plan the comparison recorded (``compare --plan``: this plan by its sha256, another one, or
none).

A claim whose studies have no folder among those given is not evaluated (the report says
which are missing). Refused, naming ``plan``, ``primary``, ``seeds`` or ``heads``: a folder with
no ``results.json`` (not finished) or of a study the plan does not name, two folders of one
study, other seeds than the plan's, a configuration without a result for every planned seed, an
endpoint its task does not have, and a declared primary endpoint (``--primary``) that the plan
lacks for the study.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heatformer.checks import bad_value
from heatformer.lab.checkpoint import read_json
from heatformer.lab.compare import RESULTS_NAME
from heatformer.lab.folder import first_start, read_invocations
from heatformer.lab.plan import Claim, Plan, commit_state, parse_time, study_endpoint
from heatformer.lab.report.endpoints import endpoint_values
from heatformer.lab.report.inference import holm, paired_power, tost, trend_test
from heatformer.lab.report.stats import mean_std, one_sample_t, paired_difference
from heatformer.lab.spec import SPEC_NAME
from heatformer.lab.tasks import TASKS

__all__ = ["evaluate_plan", "format_plan"]


@dataclass
class _Study:
    """One comparison folder, read and checked against the plan."""

    name: str
    folder: Path
    results: dict[str, Any]
    endpoints: dict[str, str]  # the plan's endpoint -> the task's name for it
    facts: dict[str, Any]  # what the report states about it


def evaluate_plan(plan: Plan, folders: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """The verdicts of the module docstring, for the comparisons in ``folders``.

    Args:
        plan: the plan (:func:`~heatformer.lab.plan.read_plan`).
        folders: finished ``heatformer compare`` folders, one per study at most; a study is
            found by its spec's ``name``, else by its folder's name.

    Returns:
        ``{"plan": {"path", "sha256", "title", "alpha", "commit": {"state", "time", "commit",
        "reason"}}, "studies": [{"study", "folder", "started", "started_from", "committed",
        "recorded_plan"}], "claims": [{"name", "studies", "endpoints", "baseline",
        "configurations", "margins", "sides", "trend", "missing", "tests", "corrected_alpha",
        "comparisons": [{"study", "endpoint", "heads", "seeds", "margin", "side", "mean",
        "ci95", "p", "n", "values", "p_tost", "p_adjusted", "p_tost_adjusted",
        "ci_simultaneous", "power", "verdict"}]}]}``.

    Raises:
        ValueError: see the module docstring.
    """
    commit = commit_state(plan.path)
    studies: dict[str, _Study] = {}
    for folder in folders:
        study = _read_study(plan, Path(folder))
        if study.name in studies:
            raise bad_value(
                "plan", f"expected one folder per study, got {studies[study.name].folder} and "
                f"{study.folder} for {study.name!r}",
            )  # fmt: skip
        study.facts["committed"] = commit.before(parse_time(study.facts["started"]))
        studies[study.name] = study
    stamp = commit.time.isoformat() if commit.time else None
    facts = {"state": commit.state, "time": stamp, "commit": commit.commit, "reason": commit.reason}
    return {
        "plan": {
            "path": str(plan.path),
            "sha256": plan.sha256,
            "title": plan.title,
            "alpha": plan.alpha,
            "commit": facts,
        },
        "studies": [study.facts for study in studies.values()],
        "claims": [_claim(plan, claim, studies) for claim in plan.claims],
    }


def _read_study(plan: Plan, folder: Path) -> _Study:
    path = folder / RESULTS_NAME
    if not path.is_file():
        raise bad_value(
            "plan", f"{folder}: expected a finished comparison, holding {RESULTS_NAME}, got none "
            "(a comparison writes it when its last run ends)",
        )  # fmt: skip
    results: dict[str, Any] = read_json(path)
    spec = results["spec"]
    name = spec.get("name") or folder.name
    if name not in plan.seeds:
        raise bad_value(
            "plan", f"{folder}: expected a comparison of one of the studies of {plan.path} "
            f"{list(plan.seeds)} (by its spec's name, else its folder's), got {name!r}",
        )  # fmt: skip
    if sorted(results["seeds"]) != sorted(plan.seeds[name]):
        raise bad_value(
            "seeds", f"{folder}: expected the seeds {plan.path} fixes for study {name!r}, "
            f"{list(plan.seeds[name])}, got {results['seeds']}",
        )  # fmt: skip
    task_cls = TASKS.lookup(results["task"])
    layers, analysis = spec["n_layer"], spec.get("analysis", True)
    endpoints = {
        raw: study_endpoint(plan, name, raw, task_cls, n_layer=layers, analysis=analysis)
        for raw in plan.raw_endpoints(name)
    }
    lacking = [e for e in spec.get("primary") or () if e not in endpoints.values()]
    if lacking:
        raise bad_value(
            "primary", f"{folder}: expected endpoints of the plan {plan.path} for study {name!r} "
            f"{list(dict.fromkeys(endpoints.values()))}, got {lacking[0]!r}, which the plan lacks",
        )  # fmt: skip
    started, source = _started(folder, results)
    recorded = spec.get("plan") or {}
    facts = {
        "study": name, "folder": str(folder), "started": started, "started_from": source,
        "committed": None, "recorded_plan": "none (run without --plan)" if not recorded else
        "this plan" if recorded.get("sha256") == plan.sha256 else
        f"another plan (sha256 {recorded.get('sha256')}, {recorded.get('path')})",
    }  # fmt: skip
    return _Study(name, folder, results, endpoints, facts)


def _started(folder: Path, results: Mapping[str, Any]) -> tuple[str | None, str]:
    """The runs' start and where it was read."""
    if results.get("started"):
        return str(results["started"]), RESULTS_NAME
    first = first_start(read_invocations(folder))
    if first is not None:
        return first, "invocations.json, the first invocation (local time of this machine)"
    spec = folder / SPEC_NAME
    created = parse_time(read_json(spec).get("created")) if spec.is_file() else None
    if created is not None:
        return created.isoformat(), f"{SPEC_NAME} (local time of this machine)"
    return None, "not recorded"


def _claim(plan: Plan, claim: Claim, studies: Mapping[str, _Study]) -> dict[str, Any]:
    """One claim's family: its comparisons, tested and Holm-adjusted together."""
    out: dict[str, Any] = {
        "name": claim.name, "studies": list(claim.studies), "endpoints": list(claim.endpoints),
        "baseline": claim.baseline, "configurations": list(claim.configurations),
        "margins": list(claim.margins), "sides": list(claim.sides),
        "trend": list(claim.trend),
        "missing": [study for study in claim.studies if study not in studies],
        "tests": 0, "corrected_alpha": math.nan, "comparisons": [],
    }  # fmt: skip
    if out["missing"]:
        return out
    rows = []
    for name in claim.studies:
        study, seeds = studies[name], plan.seeds[name]
        for raw, margin, side in zip(claim.endpoints, claim.margins, claim.sides):
            endpoint = study.endpoints[raw]
            base = _values(study, seeds, claim.baseline, endpoint)
            if claim.trend:
                test = _trend_row(claim, study, seeds, endpoint, base, margin, plan.alpha)
                rows.append({"study": name, "endpoint": endpoint, "margin": margin,
                             "side": side, **test})  # fmt: skip
                continue
            for heads in claim.configurations:
                mine = _values(study, seeds, heads, endpoint)
                diff = paired_difference([mine[s] for s in seeds], [base[s] for s in seeds])
                p_tost = (
                    tost(diff["values"], margin, plan.alpha)["p"] if len(seeds) > 1 else math.nan
                )
                rows.append({"study": name, "endpoint": endpoint, "heads": heads,
                             "seeds": list(seeds), "margin": margin, "side": side, **diff,
                             "p_tost": p_tost})  # fmt: skip
    out["tests"], out["corrected_alpha"] = _family(rows, plan.alpha)
    out["comparisons"] = rows
    return out


def _trend_row(
    claim: Claim,
    study: _Study,
    seeds: Sequence[int],
    endpoint: str,
    base: Mapping[int, float],
    margin: float,
    alpha: float,
) -> dict[str, Any]:
    """A trend claim's test in one study and endpoint: the per-seed slopes in the dose,
    tested against 0 (superiority) and within the margin (TOST) over the seeds."""
    columns = [base] + [_values(study, seeds, h, endpoint) for h in claim.configurations]
    test = trend_test([[column[s] for column in columns] for s in seeds], claim.trend)
    slopes = test["slopes"]
    doses = ", ".join(f"{k:g}" for k in claim.trend)
    return {
        "heads": f"slope over ({doses})", "seeds": list(seeds), "mean": test["slope"],
        **{key: test[key] for key in ("ci95", "p", "n")}, "values": slopes,
        "p_tost": tost(slopes, margin, alpha)["p"] if len(seeds) > 1 else math.nan,
    }  # fmt: skip


def _values(study: _Study, seeds: Sequence[int], heads: str, endpoint: str) -> dict[int, float]:
    """Seed -> the endpoint's value of configuration ``heads``, every planned seed present."""
    rows = {row["heads"]: row for row in study.results["summary"]}
    values = endpoint_values(rows[heads], endpoint) if heads in rows else None
    if values is None:
        raise bad_value(
            "heads", f"{study.folder}: expected results of {heads!r} for {endpoint!r}, got none "
            f"(its configurations: {list(rows)})",
        )  # fmt: skip
    missing = [seed for seed in seeds if seed not in values]
    if missing:
        raise bad_value(
            "seeds", f"{study.folder}: expected {heads!r} to have finished every seed the plan "
            f"fixes, {list(seeds)}, got none for {missing}",
        )  # fmt: skip
    return values


def _family(rows: list[dict[str, Any]], alpha: float) -> tuple[int, float]:
    """Holm over the superiority and equivalence p-values of ``rows`` together; the intervals,
    the power at the corrected alpha and the verdicts. Returns ``(tests made, alpha / tests)``."""
    m = len(rows)
    both = [row["p"] for row in rows] + [row["p_tost"] for row in rows]
    adjusted = holm(both)
    tests = sum(not math.isnan(p) for p in both)
    corrected = alpha / tests if tests else math.nan
    for row, p, p_tost in zip(rows, adjusted[:m], adjusted[m:]):
        row["p_adjusted"], row["p_tost_adjusted"] = p, p_tost
        row["ci_simultaneous"] = one_sample_t(row["values"], 1 - alpha / m)["ci95"]
        std = mean_std(row["values"])[1]
        effect = row["margin"] / std if std > 0 else math.inf if std == 0 else math.nan
        row["power"] = (
            paired_power(row["n"], effect, corrected) if row["n"] > 1 and tests else math.nan
        )
        row["verdict"] = _verdict(row, alpha)
    return tests, corrected


def _verdict(row: Mapping[str, Any], alpha: float) -> str:
    margin = f"{row['margin']:g}"
    equivalent = row["p_tost_adjusted"] < alpha
    if row["p_adjusted"] < alpha:
        words = "better" if (row["mean"] > 0) == (row["side"] == "higher") else "the other way"
        return f"{words}, by less than {margin}" if equivalent else words
    return f"no effect larger than {margin}" if equivalent else "undetermined"


def _signed(value: float) -> str:
    return "nan" if not math.isfinite(value) else f"{value:+.4f}"


def format_plan(evaluation: Mapping[str, Any]) -> str:
    """The evaluation of :func:`evaluate_plan` as text: the plan and its commit, each study's
    runs' start against it, then per claim each comparison's difference, simultaneous interval,
    Holm-adjusted p-values, power at the corrected alpha and verdict."""
    plan, alpha = evaluation["plan"], evaluation["plan"]["alpha"]
    commit = plan["commit"]
    state = commit["state"] + (f" ({commit['reason']})" if commit["reason"] else "")
    lines = [f"plan {plan['path']}" + (f": {plan['title']}" if plan["title"] else ""),
             f"  sha256 {plan['sha256']}; alpha {alpha:g} per claim; git: {state}"]  # fmt: skip
    for study in evaluation["studies"]:
        lines.append(
            f"  study {study['study']} ({study['folder']}): runs started {study['started']} "
            f"(from {study['started_from']}); the plan: {study['committed']}; recorded by the "
            f"comparison: {study['recorded_plan']}"
        )
    level = f"{100 * (1 - alpha):g}%"
    for claim in evaluation["claims"]:
        if claim["missing"]:
            lines.append(f"claim {claim['name']}: not evaluated, no folder for study "
                         f"{', '.join(claim['missing'])}")  # fmt: skip
            continue
        m = len(claim["comparisons"])
        what = f"config - {claim['baseline']} paired by seed"
        if claim["trend"]:
            doses = zip([claim["baseline"], *claim["configurations"]], claim["trend"])
            what = "the slope per unit of dose, per seed (" + ", ".join(
                f"{heads} at {dose:g}" for heads, dose in doses) + ")"  # fmt: skip
        lines.append(
            f"claim {claim['name']}: {what}; Holm over "
            f"{claim['tests']} tests ({m} comparisons x superiority and equivalence), alpha "
            f"{alpha:g}; simultaneous {level} intervals; power of the superiority test at "
            f"alpha/{claim['tests']} = {claim['corrected_alpha']:.3g} against a difference of "
            "the margin"
        )
        for row in claim["comparisons"]:
            lines.append(
                f"  {row['study']} {row['endpoint']} {row['heads']}: {_signed(row['mean'])} ± "
                f"{row['ci_simultaneous']:.4f} (n={row['n']}), p_holm {row['p_adjusted']:.3g}, "
                f"TOST at {row['margin']:g} p_holm {row['p_tost_adjusted']:.3g}, power "
                f"{row['power']:.2f} (claimed: {row['side']}): {row['verdict']}"
            )
    return "\n".join(lines)
