"""A comparison folder: its spec, its checks, and the record of the invocations that trained it.

Split from :mod:`heatformer.lab.compare` (the runner), which re-exports
:func:`load_spec`, :func:`prepare_output` and :data:`INVOCATIONS_NAME`; the folder's layout is
described there.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heatformer._atomic import LOCK_NAME, is_temporary
from heatformer.checks import bad_value, check_folder
from heatformer.lab.checkpoint import atomic_write_json, read_json
from heatformer.lab.distributed import DistContext
from heatformer.lab.plan import parse_time
from heatformer.lab.report import environment
from heatformer.lab.spec import SPEC_NAME, CompareSpec

__all__ = [
    "INVOCATIONS_NAME",
    "Invocation",
    "check_output",
    "first_start",
    "load_spec",
    "prepare_output",
    "read_invocations",
    "run_name",
    "total_time",
]

INVOCATIONS_NAME = "invocations.json"


def load_spec(out_dir: str | Path) -> CompareSpec:
    """Read ``OUT/spec.json``.

    Args:
        out_dir: a comparison folder.

    Returns:
        The spec it was started with.

    Raises:
        FileNotFoundError: no ``spec.json`` (not a comparison folder, or one whose start was
            killed before it wrote ``spec.json``: the message says what to do).
    """
    path = Path(out_dir) / SPEC_NAME
    if not path.is_file():
        left = _leftovers(Path(out_dir))
        if left:
            raise FileNotFoundError(
                f"{out_dir}: expected a comparison folder holding {SPEC_NAME}, found only what "
                f"a start killed before it wrote {SPEC_NAME} left ({', '.join(left)}); nothing "
                f"was trained there, so there is nothing to resume: start the comparison again "
                f"with its flags and --out {out_dir} (the leftovers are removed then), or delete "
                f"{out_dir}"
            )
        raise FileNotFoundError(
            f"{out_dir}: expected a comparison folder holding {SPEC_NAME}, found none"
        )
    data = read_json(path)
    return _spec_of(json.dumps(data["spec"], sort_keys=True))


@functools.lru_cache(maxsize=8)
def _spec_of(text: str) -> CompareSpec:
    """The spec of a ``spec.json``'s ``"spec"`` entry (canonical JSON text), validated once:
    a spec is a function of that text, and a resume reads the file three times (the command,
    the checks before the folder's lock and under it)."""
    return CompareSpec.from_dict(json.loads(text))


def _leftovers(out_dir: Path) -> list[str]:
    """The names in ``out_dir`` if it holds only what a start killed before it wrote
    ``spec.json`` can leave (the lock file, temporaries); else (or if empty) ``[]``."""
    if not out_dir.is_dir():
        return []
    names = sorted(p.name for p in out_dir.iterdir())
    spare = all(name == LOCK_NAME or is_temporary(out_dir / name) for name in names)
    return names if spare else []


def prepare_output(spec: CompareSpec, out_dir: Path, *, resume: bool, ctx: DistContext) -> None:
    """Create ``out_dir`` and write ``spec.json``, or check it when resuming.

    Args:
        spec: the spec to run.
        out_dir: the comparison folder.
        resume: continue the comparison already in ``out_dir``.
        ctx: DDP context (rank 0 writes).

    A folder that holds only what a killed start left (the lock file, temporaries: see
    :func:`load_spec`) counts as empty. The caller holds the folder's lock
    (:func:`run_compare` does) or knows that no other process writes it.

    Raises:
        ValueError: ``out_dir`` already holds a comparison (without ``resume``) or a
            different one (with ``resume``), is a non-empty folder of something else,
            or cannot be created or written.
        FileNotFoundError: ``resume`` and ``out_dir`` holds no comparison.
    """
    check_output(spec, out_dir, resume=resume)
    if resume:
        return
    ctx.barrier()  # every rank checked before rank 0 creates anything
    reason = ""
    if ctx.is_main:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(
                out_dir / SPEC_NAME,
                {"spec": spec.to_dict(), "created": time.strftime("%Y-%m-%dT%H:%M:%S")},
            )
        except OSError as err:  # before any training, so nothing is lost
            reason = err.strerror or str(err)
    if ctx.any(bool(reason)):  # every rank raises, none waits for the others
        raise bad_value(
            "out_dir",
            f"expected a folder that can be created and written, got {out_dir}"
            + (f" ({reason})" if reason else ""),
        )


def check_output(spec: CompareSpec, out_dir: Path, *, resume: bool) -> None:
    """The checks of :func:`prepare_output`, which write nothing (the spec saved in a folder
    to resume: the same fingerprint, heads, seeds, sweeps and ``bracket``). A folder or a
    ``runs/`` that is a loop of symbolic links is refused (naming ``out_dir``), and so is, when
    resuming, a run folder that is a link to nothing or a loop."""
    check_folder("out_dir", out_dir, inside=("runs",))
    if resume:
        saved = load_spec(out_dir)
        if (
            saved.fingerprint() != spec.fingerprint()
            or saved.heads != spec.heads
            or saved.seeds != spec.seeds
            or saved.tune != spec.tune
            or saved.bracket != spec.bracket
        ):
            raise ValueError(
                f"{out_dir}: expected the spec saved in {SPEC_NAME} when resuming, got a "
                "different one; resume with `--resume DIR` alone",
            )
        _check_run_folders(out_dir / "runs")
        return
    if (out_dir / SPEC_NAME).exists():
        raise ValueError(
            f"{out_dir}: already holds a comparison; continue it with --resume {out_dir} "
            "or choose another --out",
        )
    if out_dir.exists() and (
        not out_dir.is_dir() or (any(out_dir.iterdir()) and not _leftovers(out_dir))
    ):
        raise ValueError(
            f"{out_dir}: expected a new or empty folder for --out, got a non-empty one"
        )


def _check_run_folders(runs: Path) -> None:
    """Refuse a run folder in ``runs`` that is a symbolic link to nothing (or a loop of links):
    it would look like a run not started yet, then fail when its lock is taken."""
    if not runs.is_dir():
        return
    for run_dir in sorted(runs.iterdir()):
        if run_dir.is_symlink() and not run_dir.exists():
            raise ValueError(
                f"{run_dir}: expected a run folder, got a symbolic link to "
                f"{os.readlink(run_dir)!r}, which does not lead to a folder (missing, or a "
                "loop); point it at the run folder, or delete it and continue the comparison "
                "with --resume: that run starts again from step 0, the finished runs are kept"
            )


def read_invocations(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / INVOCATIONS_NAME
    if not path.is_file():
        return []
    entries: list[dict[str, Any]] = read_json(path).get("invocations", [])
    return entries


class Invocation:
    """This invocation's entry in ``OUT/invocations.json`` (rank 0 writes it).

    Args:
        out_dir: the comparison folder (it exists).
        ctx: the DDP context.
        started: ``time.perf_counter()`` when the invocation began.
        flags: its running options that ``spec.json`` does not hold (the command line's
            ``--threads``, ...), kept as the entry's ``"flags"`` for ``--resume``; ``None``:
            no such entry.
    """

    def __init__(
        self,
        out_dir: Path,
        ctx: DistContext,
        started: float,
        flags: Mapping[str, Any] | None = None,
    ) -> None:
        self.path, self.ctx, self.started = out_dir / INVOCATIONS_NAME, ctx, started
        self.earlier = read_invocations(out_dir)
        self.entry: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "elapsed_s": 0.0,
            "outcome": "running",
        }
        if flags is not None:
            self.entry["flags"] = dict(flags)
        self.entry["environment"] = environment(ctx.world_size, str(ctx.device))

    def save(self, outcome: str = "running") -> float:
        """Record the elapsed time so far and the outcome; return the total wall time.

        Returns:
            The elapsed time of the earlier invocations and of this one so far.
        """
        self.entry["elapsed_s"] = time.perf_counter() - self.started
        self.entry["outcome"] = outcome
        if self.ctx.is_main:
            atomic_write_json(self.path, {"invocations": [*self.earlier, self.entry]})
        return total_time([*self.earlier, self.entry])


def total_time(invocations: list[dict[str, Any]]) -> float:
    return math.fsum(float(entry.get("elapsed_s") or 0.0) for entry in invocations)


def first_start(invocations: list[dict[str, Any]]) -> str | None:
    """When the first invocation that trained in the folder began: the runs' start, as
    ``results.json`` records it (``"started"``), ISO 8601 with this machine's UTC offset
    (``invocations.json`` holds local times without one); ``None`` without invocations."""
    stamp = parse_time(invocations[0].get("started") if invocations else None)
    return None if stamp is None else stamp.isoformat()


def run_name(index: int, heads: str, seed: int, setting: str = "") -> str:
    """Folder name of one run: ``c00-attention4+laplacian2-s0`` (``c00-...-lr0.002-s0``).

    Args:
        index: position of the configuration in ``spec.heads``.
        heads: its head schedule.
        seed: the seed.
        setting: its optimiser setting's label (``"lr=0.002"``), ``""`` without a sweep.

    Returns:
        A file-system-safe name, unique within a comparison.
    """
    slug = heads.replace(";", "__").replace(",", "+").replace(":", "")
    slug = re.sub(r"[^A-Za-z0-9_+.=-]", "", slug)[:60]
    tag = re.sub(r"[^A-Za-z0-9_.-]", "", setting.replace(" ", "_").replace("=", ""))
    return f"c{index:02d}-{slug}{'-' + tag if tag else ''}-s{seed}"
