r"""A study's plan: its claims, endpoints, families, margins, seeds and α, fixed in a file
before the runs.

``heatformer compare --plan FILE`` checks a comparison against the plan and records it (the
file's path, the sha256 of its bytes, the study and its endpoints: :class:`PlanRecord`, the
spec's ``plan``, so ``spec.json`` and ``results.json`` hold it); ``heatformer plan FILE DIR...``
gives the plan's verdicts across the comparisons it names
(:func:`heatformer.lab.report.plan.evaluate_plan`). A plan is a TOML file:

.. code-block:: toml

    alpha = 0.05                       # the family-wise error rate of every claim
    title = "..."                      # optional

    [study.mqar-ops]                   # every study a claim names, with its seeds
    seeds = [0, 1, 2]

    [[claim]]                          # one family of tests
    name = "mqar-ops"
    studies = ["mqar-ops"]             # the comparisons it spans, by their name
    endpoints = ["val_acc", "val_acc_far"]   # or endpoint = "val_acc"
    baseline = "attention:2"
    configurations = ["attention:1,laplacian:1", "attention:1,heat:1"]
    margin = 0.05                      # the equivalence margin, in the endpoint's units
    side = "higher"                    # the claimed direction: "higher" or "lower"
    trend = [0, 1, 2]                  # optional: a dose for the baseline, then each configuration

``margin`` and ``side`` are one value for every endpoint of the claim, or a table by endpoint
(``margin = {val_acc = 0.05, val_loss = 0.1}``) that names each. Every key but ``title`` is
required; a key the plan does not know is refused with the closest name, as is a study that no
claim names or a claim naming a study without seeds. An endpoint is written as ``--primary``
takes it (``val_acc``, ``nc1@last``) and resolved against each study's task.

A claim is one family: every configuration against the baseline, paired by seed, for every
endpoint, in every study it names -- :math:`m` comparisons, each tested twice (superiority,
two-sided; equivalence within the margin, TOST), and the :math:`2m` p-values Holm-adjusted
together (:mod:`heatformer.lab.report.plan`). A claim with ``trend`` (one number per
configuration, the baseline's first; at least two distinct) makes one test per endpoint and
study instead: the least-squares slope of the endpoint in the dose, per seed, tested against 0
over the seeds (:func:`~heatformer.lab.report.inference.trend_test`); its ``margin`` is then in
the endpoint's units per unit of dose, and ``side`` the claimed sign of the slope.

:func:`commit_state` says when a file was committed in its git repository, so the report can
say whether a plan was fixed before the runs began. This module imports no torch.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from heatformer._optional import toml_reader
from heatformer._suggest import did_you_mean
from heatformer.checks import ArgumentError, ArgumentValueError, bad_type, bad_value
from heatformer.lab.tuning import check_study

__all__ = [
    "SIDES",
    "Claim",
    "CommitState",
    "Plan",
    "PlanRecord",
    "commit_state",
    "parse_time",
    "plan_for_spec",
    "read_plan",
    "study_endpoint",
]

#: The values of a claim's ``side``: the direction it claims (the better one).
SIDES = ("higher", "lower")

_TOP_KEYS = ("alpha", "title", "study", "claim")
_CLAIM_KEYS = (
    "name", "studies", "endpoints", "endpoint", "baseline", "configurations", "margin", "side",
    "trend",
)  # fmt: skip
_OPTIONAL = ("endpoint", "endpoints", "trend")


@dataclass(frozen=True)
class Claim:
    """One claim of a plan, one family of tests.

    Attributes:
        name: its name, unique in the plan.
        studies: the studies (comparisons, by name) it spans.
        endpoints: its endpoints, as the plan writes them.
        baseline: the configuration every other is compared with.
        configurations: the configurations compared with it.
        margins: the equivalence margin of each endpoint, in its units (in endpoint order).
        sides: the claimed direction of each endpoint, ``"higher"`` or ``"lower"``.
        trend: empty, or the dose of the baseline and of each configuration: one trend test
            per endpoint and study instead of one comparison per configuration.
    """

    name: str
    studies: tuple[str, ...]
    endpoints: tuple[str, ...]
    baseline: str
    configurations: tuple[str, ...]
    margins: tuple[float, ...]
    sides: tuple[str, ...]
    trend: tuple[float, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A plan file, read and checked (:func:`read_plan`).

    Attributes:
        path: the file, absolute.
        sha256: the hex sha256 of its bytes.
        alpha: the family-wise error rate of each claim.
        seeds: study -> its seeds.
        claims: the claims, in file order.
        title: the optional title.
    """

    path: Path
    sha256: str
    alpha: float
    seeds: Mapping[str, tuple[int, ...]]
    claims: tuple[Claim, ...]
    title: str = ""

    def raw_endpoints(self, study: str) -> tuple[str, ...]:
        """The endpoints the claims that name ``study`` test there, as the plan writes them."""
        found = (e for claim in self.claims if study in claim.studies for e in claim.endpoints)
        return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class PlanRecord:
    """What a comparison keeps of its plan (the spec's ``plan``; ``spec.json``, ``results.json``).

    Attributes:
        path: the plan file, absolute, when the comparison started.
        sha256: the hex sha256 of its bytes then.
        study: the comparison's study in the plan.
        endpoints: the plan's endpoints for that study, resolved against its task.
    """

    path: str
    sha256: str
    study: str
    endpoints: tuple[str, ...]

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> PlanRecord:
        """The record of a ``spec.json``'s ``"plan"`` entry.

        Raises:
            ValueError: other keys, or values of another kind (naming ``plan``).
        """
        keys = ("path", "sha256", "study", "endpoints")
        if set(value) != set(keys):
            raise bad_value(
                "plan", f"expected a record with keys {list(keys)}, got {sorted(value)}"
            )
        endpoints = value["endpoints"]
        listed = isinstance(endpoints, list | tuple) and bool(endpoints)
        strings = [value[key] for key in keys[:3]] + (list(endpoints) if listed else [])
        if not listed or not all(isinstance(v, str) and v for v in strings):
            raise bad_value("plan", f"expected strings and a list of endpoints, got {dict(value)}")
        return cls(value["path"], value["sha256"], value["study"], tuple(endpoints))


def _fail(path: Path, where: str, detail: str) -> ArgumentValueError:
    return bad_value("plan", f"{path}: {where + ': ' if where else ''}{detail}")


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and check the plan file ``path`` (the schema of the module docstring).

    Returns:
        The :class:`Plan`, with the sha256 of the file's bytes.

    Raises:
        ValueError: no such file, not TOML, or a key or value the schema refuses; the message
            names ``plan``, the file and the key.
    """
    path = Path(path).expanduser().resolve()
    try:
        data = path.read_bytes()
    except OSError:
        raise bad_value("plan", f"expected a plan file (TOML), found none at {path}") from None
    toml = toml_reader("reading a plan file")
    try:
        table = toml.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, toml.TOMLDecodeError) as err:
        raise _fail(path, "", f"not a valid TOML file ({err})") from None
    _known(path, "", table, _TOP_KEYS)
    alpha = table.get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, float | int) or not 0 < alpha < 1:
        raise _fail(path, "alpha", f"expected a number in (0, 1), got {alpha!r}")
    title = table.get("title", "")
    if not isinstance(title, str):
        raise _fail(path, "title", f"expected a string, got {title!r}")
    seeds = _studies(path, table.get("study"))
    claims = table.get("claim")
    if not isinstance(claims, list) or not claims:
        raise _fail(path, "claim", "expected one [[claim]] table or more, got none")
    checked = tuple(_claim(path, i, claim, seeds) for i, claim in enumerate(claims))
    names = [claim.name for claim in checked]
    if len(set(names)) != len(names):
        raise _fail(path, "claim", f"expected distinct names, got {names}")
    unused = [study for study in seeds if not any(study in c.studies for c in checked)]
    if unused:
        raise _fail(path, f"study.{unused[0]}", "named by no claim")
    sha = hashlib.sha256(data).hexdigest()
    return Plan(path, sha, float(alpha), seeds, checked, title)


def _known(path: Path, where: str, table: object, keys: Sequence[str]) -> None:
    if not isinstance(table, dict):
        raise _fail(path, where, f"expected a table, got {table!r}")
    for key in table:
        if key not in keys:
            detail = f"unknown key{did_you_mean(key, keys)}; expected some of {list(keys)}"
            raise _fail(path, f"{where}.{key}" if where else key, detail)


def _studies(path: Path, table: object) -> dict[str, tuple[int, ...]]:
    """``[study.NAME]`` tables: each with its seeds, distinct non-negative ints."""
    if not isinstance(table, dict) or not table:
        raise _fail(path, "study", "expected a [study.NAME] table with the seeds of each study")
    out = {}
    for name, entry in table.items():
        _known(path, f"study.{name}", entry, ("seeds",))
        seeds = entry.get("seeds")
        good = isinstance(seeds, list) and seeds and len(set(seeds)) == len(seeds)
        if not good or not all(type(s) is int and s >= 0 for s in seeds):
            raise _fail(path, f"study.{name}.seeds", f"expected distinct ints >= 0, got {seeds!r}")
        out[name] = tuple(seeds)
    return out


def _strings(path: Path, where: str, value: object, *, one: bool = False) -> tuple[str, ...]:
    """A non-empty string (``one``), or a list of distinct ones, as a tuple."""
    if one:
        if not isinstance(value, str) or not value.strip():
            raise _fail(path, where, f"expected a non-empty string, got {value!r}")
        return (value,)
    if not isinstance(value, list) or not value:
        raise _fail(path, where, f"expected a list of strings, got {value!r}")
    if not all(isinstance(item, str) and item.strip() for item in value):
        raise _fail(path, where, f"expected non-empty strings, got {value!r}")
    if len(set(value)) != len(value):
        raise _fail(path, where, f"expected distinct strings, got {value!r}")
    return tuple(value)


def _claim(path: Path, index: int, table: object, seeds: Mapping[str, Any]) -> Claim:
    where = f"claim[{index}]"
    _known(path, where, table, _CLAIM_KEYS)
    table = cast(dict[str, Any], table)  # a table: checked by _known
    missing = [k for k in _CLAIM_KEYS if k not in table and k not in _OPTIONAL]
    if missing:
        raise _fail(path, where, f"expected the keys {missing}, got none")
    name = _strings(path, f"{where}.name", table["name"], one=True)[0]
    where = f"claim {name!r}"
    studies = _strings(path, f"{where}.studies", table["studies"])
    for study in studies:
        if study not in seeds:
            raise _fail(path, f"{where}.studies", f"{study!r} has no [study.{study}] with seeds")
    if ("endpoint" in table) == ("endpoints" in table):
        raise _fail(path, where, 'expected endpoints = [...] or endpoint = "...", one of them')
    one = "endpoint" in table
    key = "endpoint" if one else "endpoints"
    endpoints = _strings(path, f"{where}.{key}", table[key], one=one)
    baseline = _strings(path, f"{where}.baseline", table["baseline"], one=True)[0]
    configurations = _strings(path, f"{where}.configurations", table["configurations"])
    if baseline in configurations:
        raise _fail(
            path, f"{where}.configurations", f"expected others than the baseline {baseline!r}"
        )

    def margin(value: object) -> float:
        number = math.nan
        if isinstance(value, float | int) and not isinstance(value, bool):
            number = float(value)
        if not 0 < number < math.inf:
            raise _fail(path, f"{where}.margin", f"expected a number > 0, got {value!r}")
        return number

    def side(value: object) -> str:
        if value not in SIDES:
            raise _fail(path, f"{where}.side", f"expected one of {list(SIDES)}, got {value!r}")
        return str(value)

    margins = _by_endpoint(path, f"{where}.margin", table["margin"], endpoints, margin)
    sides = _by_endpoint(path, f"{where}.side", table["side"], endpoints, side)
    trend = _trend(path, f"{where}.trend", table.get("trend"), 1 + len(configurations))
    return Claim(name, studies, endpoints, baseline, configurations, margins, sides, trend)


def _trend(path: Path, where: str, value: object, count: int) -> tuple[float, ...]:
    """A claim's optional doses: ``count`` finite numbers, at least two distinct."""
    if value is None:
        return ()
    numbers = value if isinstance(value, list) else []
    good = len(numbers) == count and all(
        isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v) for v in numbers
    )
    if not good or len(set(numbers)) < 2:
        raise _fail(
            path, where, f"expected {count} finite numbers, at least two distinct (the "
            f"baseline's dose, then each configuration's), got {value!r}",
        )  # fmt: skip
    return tuple(float(v) for v in numbers)


def _by_endpoint(
    path: Path, where: str, value: object, endpoints: tuple[str, ...], check: Any
) -> tuple[Any, ...]:
    """One value for every endpoint, or a table that gives each endpoint its own."""
    if not isinstance(value, dict):
        return tuple(check(value) for _ in endpoints)
    if set(value) != set(endpoints):
        raise _fail(
            path, where, f"expected a value for each of {list(endpoints)}, got {sorted(value)}"
        )
    return tuple(check(value[endpoint]) for endpoint in endpoints)


def study_endpoint(
    plan: Plan, study: str, endpoint: str, task_cls: Any, *, n_layer: int, analysis: bool
) -> str:
    """``endpoint`` as the task of ``study`` names it (``bpc`` -> ``val_bpc``), checked as
    ``--primary`` is (:func:`~heatformer.lab.tuning.check_study`).

    Raises:
        ValueError: an endpoint the task does not have (naming ``plan``, the file, the study).
    """
    try:
        checked = check_study(
            task_cls, tune=(), select_by=None, primary=(endpoint,), n_layer=n_layer,
            analysis=analysis,
        )  # fmt: skip
    except ArgumentError as err:
        raise _fail(plan.path, f"study {study!r}", err.detail) from None
    return str(checked["primary"][0])


def plan_for_spec(
    plan: object,
    *,
    name: str,
    task_cls: Any,
    heads: Sequence[str],
    seeds: Sequence[int],
    primary: Sequence[str],
    n_layer: int,
    analysis: bool,
) -> tuple[PlanRecord, tuple[str, ...]]:
    """The spec's ``plan`` and ``primary``, checked against each other (by the spec, once).

    ``plan`` is a plan file (read now: the comparison named ``name`` must be one of its
    studies, with the plan's seeds and every configuration its claims compare there), or the
    record a ``spec.json`` holds. Every ``primary`` endpoint must be one of the plan's for the
    study; without ``primary``, they all are.

    Returns:
        ``(record, primary)``.

    Raises:
        ValueError: a plan the schema refuses (naming ``plan``), another study, seeds or
            configurations than the plan's (naming ``seeds``, ``heads``), an endpoint the plan
            lacks (naming ``primary`` and the plan).
        TypeError: ``plan`` of another kind.
    """
    if isinstance(plan, PlanRecord):
        record = plan
    elif isinstance(plan, Mapping):
        record = PlanRecord.of(plan)
    elif isinstance(plan, str | os.PathLike):
        record = _record(read_plan(plan), name, task_cls, heads, seeds, n_layer, analysis)
    else:
        raise bad_type("plan", f"expected a plan file's path, got {type(plan).__name__}")
    lacking = [endpoint for endpoint in primary if endpoint not in record.endpoints]
    if lacking:
        raise bad_value(
            "primary",
            f"expected endpoints of the plan {record.path} for study {record.study!r} "
            f"{list(record.endpoints)}, got {lacking[0]!r}, which the plan lacks (amend the "
            "plan, in a commit before the runs, or leave the endpoint out)",
        )
    return record, tuple(primary) or record.endpoints


def _record(
    plan: Plan,
    name: str,
    task_cls: Any,
    heads: Sequence[str],
    seeds: Sequence[int],
    n_layer: int,
    analysis: bool,
) -> PlanRecord:
    if name not in plan.seeds:
        raise _fail(
            plan.path, "", f"expected the comparison's name (--name, or name in --config) to "
            f"be one of the plan's studies {list(plan.seeds)}, got {name!r}",
        )  # fmt: skip
    if sorted(seeds) != sorted(plan.seeds[name]):
        raise bad_value(
            "seeds", f"expected the seeds the plan {plan.path} fixes for study {name!r}, "
            f"{list(plan.seeds[name])}, got {list(seeds)}",
        )  # fmt: skip
    compared = (
        h for c in plan.claims if name in c.studies for h in (c.baseline, *c.configurations)
    )
    missing = [h for h in dict.fromkeys(compared) if h not in heads]
    if missing:
        raise bad_value(
            "heads", f"expected every configuration the plan {plan.path} compares in study "
            f"{name!r}, got none of {missing}",
        )  # fmt: skip
    endpoints = tuple(dict.fromkeys(
        study_endpoint(plan, name, e, task_cls, n_layer=n_layer, analysis=analysis)
        for e in plan.raw_endpoints(name)
    ))  # fmt: skip
    return PlanRecord(str(plan.path), plan.sha256, name, endpoints)


# ---------------------------------------------------------------------------- git


@dataclass(frozen=True)
class CommitState:
    """Where a file stands in its git repository (:func:`commit_state`).

    Attributes:
        state: ``"committed"`` (tracked, the same bytes as in ``HEAD``), ``"modified since its
            commit"``, ``"not committed"`` or ``"unknown"`` (no git, no repository).
        time: the commit time of the last commit that changed the file (with ``"committed"``
            and ``"modified since its commit"``).
        commit: that commit's hash.
        reason: why the state is ``"unknown"``.
    """

    state: str
    time: datetime | None = None
    commit: str | None = None
    reason: str = ""

    def before(self, started: datetime | None) -> str:
        """Whether the file was committed before ``started`` (the runs' start), in words."""
        when = ""
        if self.commit and self.time:
            when = f" (commit {self.commit[:10]}, {self.time.isoformat()})"
        if self.state == "unknown":
            return f"unknown ({self.reason})"
        if self.state != "committed":
            return self.state + when
        if started is None:
            return f"committed{when}, the runs' start unknown"
        order = "before" if self.time is not None and self.time < started else "after"
        return f"committed {order} the runs began{when}"


def commit_state(path: str | os.PathLike[str]) -> CommitState:
    """The state of ``path`` in the git repository that holds it.

    ``git log -1 --format=%H %cI -- FILE`` gives the last commit that changed the file (its
    committer time); the file counts as committed when its bytes are those of ``HEAD``'s
    version (``git show HEAD:./FILE``). Only commands that read are run.

    Returns:
        The :class:`CommitState`; ``"unknown"`` without git or outside a repository.
    """
    path = Path(path).resolve()
    git = shutil.which("git")
    if git is None:
        return CommitState("unknown", reason="git is not installed")
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        command = [git, "-C", str(path.parent), *args]
        return subprocess.run(command, capture_output=True, env=env, timeout=60, check=False)

    inside = run("rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        lines = inside.stderr.decode(errors="replace").strip().splitlines()
        return CommitState(
            "unknown", reason=f"not in a git repository: {lines[0] if lines else path.parent}"
        )
    log = run("log", "-1", "--format=%H %cI", "--", path.name)
    if log.returncode != 0 or not log.stdout.strip():
        return CommitState("not committed")
    commit, time = log.stdout.decode().split()
    stamp = datetime.fromisoformat(time)
    committed = run("show", f"HEAD:./{path.name}")
    same = committed.returncode == 0 and committed.stdout == path.read_bytes()
    return CommitState("committed" if same else "modified since its commit", stamp, commit)


def parse_time(text: object) -> datetime | None:
    """An ISO 8601 time as an aware datetime; one without an offset is this machine's local
    time (as ``invocations.json`` and ``spec.json`` record it); ``None`` for none."""
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.astimezone()
