"""Study files: ``heatformer compare --config FILE`` and ``heatformer train --config FILE``.

A study file holds what a comparison's :class:`~heatformer.lab.spec.CompareSpec` holds, by the
names of its fields, and nothing else: ``FILE.json`` is read as JSON, any other name as TOML.

- TOML: one key per spec field (``steps = 1000``, ``heads = ["attention:4",
  "attention:2,laplacian:2"]``, ``n_layer = 2``, ``lr = 2e-3``, ``primary = ["val_bpc"]``) and
  the task's options in an ``[options]`` table (``seq_len = 64``), the names of the fields of
  the task's ``Options`` (:mod:`heatformer.lab.tasks`). A key takes the type of its field: a
  list for ``heads``, ``seeds``, ``tune`` and ``primary``, a number for ``lr``, ``true`` or
  ``false`` for a switch; ``int | None`` fields (``n_head``, ``eval_every``, ...) are left out
  for their default.
- JSON: the same mapping, or the ``spec.json`` of a run folder (``{"spec": {...}, "created":
  ...}``), which holds every field: ``--config runs/x/spec.json --out runs/y`` runs that study
  again.

The running flags (``--out``, ``--threads``, ``--dry-run``, ``--resume``, ...) are not in the
file: they say where and how to run a study, not what it is, and ``spec.json``
does not hold them either. A flag given on the command line overrides the file, field by
field (``--steps 100`` replaces ``steps``, ``--seq-len 32`` the option ``seq_len`` and no
other); the file overrides a ``--preset``. A relative path in a path option (``text``,
``npz``, ``root``) or in the spec's ``plan`` (the fields marked ``path``) is read from the
file's folder.

The keys are checked when the file is read, against the spec's fields and the registered
tasks' options (so a field or an option added later is read without more code here): an
unknown key is refused with the closest name, a value of the wrong type with the type its
field takes, and an error the spec raises about a value that came from the file names the file
and the key (:meth:`StudyFile.naming`). The spec itself is made once, from the merged values,
by the command. Nothing here imports torch.

Examples:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> path = folder / "study.toml"
    >>> _ = path.write_text('steps = 100\\nheads = ["attention:4"]\\n[options]\\nseq_len = 64\\n')
    >>> study = read_study(path)
    >>> study.values["steps"], study.values["heads"], study.values["options"]
    (100, ('attention:4',), {'seq_len': 64})
    >>> study.over({"steps": 300, "lr": 2e-3, "options": {"eval_size": 64}})["options"]
    {'eval_size': 64, 'seq_len': 64}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import types
import typing
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heatformer._optional import toml_reader
from heatformer._suggest import did_you_mean
from heatformer.checks import ArgumentError, bad_value
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import TASKS, options_by_name

__all__ = ["StudyError", "StudyFile", "check_one_run", "overridden", "read_study"]

#: The table of a study file that holds the task's options (``spec.json``'s ``"options"``).
OPTIONS = "options"


class StudyError(ValueError):
    """A study file that cannot be read as a spec: ``str(err)`` names the file and the key.

    Attributes:
        path: the file.
        key: the key that was wrong (``"steps"``, ``"options.seq_len"``), or ``""`` when the
            file as a whole is (not TOML, not JSON, not a mapping).
    """

    def __init__(self, path: Path, key: str, detail: str) -> None:
        where = f"{key}: " if key else ""
        super().__init__(f"--config {path}: {where}{detail}")
        self.path = path
        self.key = key


@dataclass(frozen=True)
class StudyFile:
    """A study file, read and checked: the spec values it gives.

    Attributes:
        path: the file.
        values: spec field -> value, of its field's type (lists as tuples); ``"options"``,
            when given, the task's options by name (paths absolute).
    """

    path: Path
    values: dict[str, Any]

    def over(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (e.g. a preset's values) with this file's values over it; the options are
        merged option by option."""
        out = {**base, **self.values}
        if OPTIONS in base and OPTIONS in self.values:
            out[OPTIONS] = {**base[OPTIONS], **self.values[OPTIONS]}
        return out

    def keys(self) -> set[str]:
        """The fields and the options (by their own names) this file sets."""
        return (set(self.values) - {OPTIONS}) | set(self.values.get(OPTIONS, {}))

    @contextlib.contextmanager
    def naming(self, overridden: Collection[str]) -> Iterator[None]:
        """Inside the block, an error about a field or an option that this file set, and that
        the command line did not override (``overridden``: names of fields and options), is
        re-raised as a :class:`StudyError` naming the file and the key."""
        try:
            yield
        except ArgumentError as err:
            name = err.argument
            if name not in self.keys() or name in overridden:
                raise
            key = name if name in self.values else f"{OPTIONS}.{name}"
            raise StudyError(self.path, key, err.detail) from None


def read_study(path: str | Path, *, flags: Collection[str] = ()) -> StudyFile:
    """Read the study file ``path`` (JSON by its ``.json`` suffix, else TOML) and check its keys.

    Args:
        path: a TOML study file, or a JSON one such as a run folder's ``spec.json``.
        flags: the argparse destinations of the command's flags (``threads``, ``out``, ...):
            such a key that is no field of the spec is refused as a flag of the command line.

    Returns:
        The file's spec values, each of its field's type.

    Raises:
        FileNotFoundError: no such file (naming it).
        StudyError: the file is not TOML (JSON), or a key is unknown (with the closest name) or
            has a value of the wrong type.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise FileNotFoundError(f"--config {path}: expected a study file, found none") from None
    except UnicodeDecodeError as err:
        raise StudyError(path, "", f"expected a UTF-8 text file ({err.reason})") from None
    written = False  # a run's spec.json: the fields added since take the values it ran with
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise StudyError(path, "", f"not valid JSON: {err}") from None
        if isinstance(data, dict) and isinstance(data.get("spec"), dict):  # a run's spec.json
            data, written = data["spec"], True
    else:
        toml = toml_reader("reading a TOML study file")
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as err:  # its message ends with the line and column
            raise StudyError(path, "", f"not valid TOML: {err}") from None
    if not isinstance(data, dict):
        raise StudyError(path, "", f"expected a mapping of spec fields, got {_kind(data)}")
    try:  # the entries an older spec.json holds (bf16, topk), in today's fields
        data = CompareSpec.upgraded(data, written=written)
    except ArgumentError as err:
        raise StudyError(path, err.argument, err.detail) from None
    return StudyFile(path, _checked_values(path, data, flags))


def overridden(args: argparse.Namespace, given: Collection[str], *, compare: bool) -> set[str]:
    """The spec fields and task options that the command line ``args`` sets: ``given`` (the
    fields and options of the flags named after them) and those of the command's own flags
    (``--heads``, ``--sweep``, ``--seeds`` or ``--seed``, ``--topk``)."""
    names = set(given)
    names |= {"heads"} if args.heads or (compare and args.sweep) else set()
    names |= {"seeds"} if getattr(args, "seeds" if compare else "seed") is not None else set()
    names |= {"graph"} if args.topk is not None else set()
    return names | ({"tune"} if compare and args.sweep else set())


def check_one_run(values: Mapping[str, Any]) -> None:
    """``train`` runs one head schedule with one seed: a study file's several are refused.

    Raises:
        ValueError: several ``heads`` or ``seeds`` in ``values`` (naming the field).
    """
    for name, flag in (("heads", "--heads"), ("seeds", "--seed")):
        given = values.get(name, ())
        if len(given) > 1:
            raise bad_value(
                name,
                f"train runs one, got {len(given)} ({', '.join(map(str, given))}): choose one "
                f"with {flag}, or run heatformer compare",
            )


# ---------------------------------------------------------------------------- the keys


def _checked_values(path: Path, data: dict[str, Any], flags: Collection[str]) -> dict[str, Any]:
    """``data``'s spec values, each checked against its field's type."""
    hints = typing.get_type_hints(CompareSpec)
    spec_fields = {f.name: f for f in dataclasses.fields(CompareSpec)}
    fields = list(spec_fields)
    options = options_by_name()
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == OPTIONS:
            values[OPTIONS] = _checked_options(path, value, options)
        elif key in fields:
            values[key] = _from_folder(path, spec_fields[key], _typed(path, key, value, hints[key]))
        elif key in options:
            raise StudyError(
                path, key, f"a task option: put it in the [{OPTIONS}] table (options.{key})"
            )
        elif key in flags:
            flag = "--" + key.replace("_", "-")
            raise StudyError(
                path,
                key,
                f"a flag of the command line ({flag}), not a field of the spec: give it "
                "there (a study file holds what the study is, not where or how it runs)",
            )
        else:
            raise StudyError(
                path,
                key,
                f"unknown key{did_you_mean(key, fields)}; expected fields of the spec and "
                f"[{OPTIONS}]",
            )
    return values


def _checked_options(
    path: Path, table: object, options: dict[str, dict[str, dataclasses.Field[Any]]]
) -> dict[str, Any]:
    """The ``[options]`` table: each option of a registered task, of its type; a path option
    relative to the file's folder made absolute. Which task takes it is the spec's check."""
    if not isinstance(table, dict):
        raise StudyError(path, OPTIONS, f"expected a table of task options, got {_kind(table)}")
    out = {}
    for key, value in table.items():
        by_task = options.get(key)
        if by_task is None:
            raise StudyError(
                path,
                f"{OPTIONS}.{key}",
                f"unknown task option{did_you_mean(key, options)}; the tasks take "
                f"{', '.join(sorted(options))}",
            )
        task, field = next(iter(by_task.items()))  # the tasks that take it agree on its type
        hint = typing.get_type_hints(TASKS.lookup(task).Options)[key]
        out[key] = _from_folder(path, field, _typed(path, f"{OPTIONS}.{key}", value, hint))
    return out


def _from_folder(path: Path, field: dataclasses.Field[Any], value: Any) -> Any:
    """A path field's (``metadata["path"]``) relative string read from the file's folder,
    made absolute; any other value as it is."""
    if field.metadata.get("path") and isinstance(value, str):
        return str((path.parent / Path(value).expanduser()).resolve())
    return value


class _Mismatch(Exception):
    """A value that is not of the type asked (caught by :func:`_typed`)."""


def _typed(path: Path, key: str, value: object, hint: Any) -> Any:
    """``value`` as a value of the type ``hint`` (lists as tuples, ints as floats where a float
    is asked), or a :class:`StudyError` saying what the key takes."""
    try:
        return _as(value, hint)
    except _Mismatch:
        raise StudyError(path, key, f"expected {_describe(hint)}, got {_kind(value)}") from None


def _as(value: object, hint: Any) -> Any:
    if hint is Any:
        return value
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        arms = typing.get_args(hint)
        if value is None and type(None) in arms:  # JSON's null: the field's default
            return None
        for arm in arms:
            with contextlib.suppress(_Mismatch):
                return _as(value, arm)
        raise _Mismatch
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        (item, *_) = typing.get_args(hint)
        return tuple(_as(v, item) for v in value)
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        ok = isinstance(value, float)
    elif hint is str:
        ok = isinstance(value, str)
    else:  # a type this reader does not know: the spec checks it
        ok = True
    if not ok:
        raise _Mismatch
    return value


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe(hint: Any) -> str:
    """What a value of type ``hint`` is, in the file's words (``tuple[str, ...]`` -> ``a list
    of strings``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        return " or ".join(_describe(arm) for arm in arms)
    if typing.get_origin(hint) is tuple:
        item = _describe(typing.get_args(hint)[0]).removeprefix("an ").removeprefix("a ")
        return f"a list of {item}s"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _kind(value: object) -> str:
    """``value`` with its kind, in the file's words: ``a string '10'``, ``a table``."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    for kind, name in ((int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return f"{name} {value!r}"
    if isinstance(value, list):
        return f"a list {value!r}"
    return f"{type(value).__name__} {value!r}"
