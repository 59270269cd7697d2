"""Study files (issue 40): ``heatformer compare|train --config FILE``.

A study file (TOML, or JSON such as a run folder's ``spec.json``) gives the spec's fields by
name and the task's options in ``[options]``; the flags override it field by field. Tested
through the command: a run from a file equals the run from flags (the same ``spec.json``, the
same numbers), a finished run's ``spec.json`` runs it again, each shipped study file makes
exactly the spec its recorded ``spec.json`` holds, and every mistake in a file is one line
naming the file and the key, exit status 2.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heatformer.lab import preflight
from heatformer.lab.cli import _experiments, build_parser, main
from heatformer.lab.cli._config import StudyError, read_study
from heatformer.lab.spec import CompareSpec

ROOT = Path(__file__).resolve().parents[2]
STUDIES = sorted(path.stem for path in (ROOT / "studies").glob("*.toml"))

#: a tiny run of the chars task (the corpus' path is added by each test)
TINY = """\
task = "chars"
heads = ["attention:2"]
seeds = [0]
steps = 4
batch_size = 4
lr = 3e-3
n_layer = 1
n_embd = 16
eval_every = 2
device = "cpu"

[options]
seq_len = 16
eval_size = 4
analysis_size = 4
"""
#: the same run as flags
TINY_FLAGS = [
    "--task", "chars", "--heads", "attention:2", "--seed", "0", "--steps", "4",
    "--batch-size", "4", "--lr", "3e-3", "--layers", "1", "--embd", "16", "--eval-every", "2",
    "--device", "cpu", "--seq-len", "16", "--eval-size", "4", "--analysis-size", "4",
]  # fmt: skip
RUNNING = ["--threads", "1", "--no-progress"]


def _spec(*argv: str, compare: bool = True) -> CompareSpec:
    """The spec the command line ``argv`` makes (``compare`` or ``train``), as the command
    makes it."""
    args = build_parser().parse_args(["compare" if compare else "train", *argv])
    return _experiments._build_spec(args, compare=compare)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command prints (its exit status is 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


# ---------------------------------------------------------------- the shipped studies


def test_every_study_of_the_docs_ships_as_a_file() -> None:
    recorded = sorted(p.parent.name for p in (ROOT / "docs" / "study").glob("*/spec.json"))
    assert recorded and STUDIES == recorded


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_file_makes_the_spec_its_recorded_run_holds(study: str) -> None:
    """``studies/<study>.toml`` is the study: it makes exactly the spec of
    ``docs/study/<study>/spec.json`` (all but ``name``, a label), and so does that
    ``spec.json`` given as the study file."""
    recorded = ROOT / "docs" / "study" / study / "spec.json"
    saved = CompareSpec.from_dict(json.loads(recorded.read_text())["spec"]).resolved()
    for config in (ROOT / "studies" / f"{study}.toml", recorded):
        spec = _spec("--config", str(config)).resolved()
        assert spec == saved
        mine, theirs = spec.to_dict(), saved.to_dict()
        assert mine.pop("name") in (study, saved.name)
        theirs.pop("name")
        # a plan is recorded with its absolute path, which is the clone's: the same file
        plans = [d.pop("plan", None) for d in (mine, theirs)]
        if plans[1] is not None:
            assert plans[0] is not None, f"studies/{study}.toml does not name its plan"
            paths = [Path(plan.pop("path")) for plan in plans]
            assert paths[0].name == paths[1].name
            assert config == recorded or paths[0].is_relative_to(ROOT)
        assert plans[0] == plans[1]
        assert mine == theirs
    assert (
        f"heatformer compare --config studies/{study}.toml"
        in (ROOT / "docs" / "reproducing.md").read_text()
    )


def test_a_study_files_plan_is_read_from_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plan = "plan.toml"`` in a study file names the file beside it, wherever the command
    runs; the spec keeps its record (that path, the file's sha256)."""
    folder = tmp_path / "study"
    folder.mkdir()
    shutil.copy(ROOT / "docs" / "study" / "suite-plan.toml", folder / "plan.toml")
    text = (ROOT / "studies" / "mqar-ops.toml").read_text()
    _write(folder, "mqar-ops.toml", text.replace("primary = [", 'plan = "plan.toml"\nprimary = ['))
    monkeypatch.chdir(tmp_path)
    spec = _spec("--config", str(folder / "mqar-ops.toml"))
    assert spec.plan.path == str((folder / "plan.toml").resolve())
    assert spec.plan.sha256 == hashlib.sha256((folder / "plan.toml").read_bytes()).hexdigest()


# ---------------------------------------------------------------- end to end


def _numbers(out: Path) -> list[dict[str, Any]]:
    """Each run's losses, evaluations and final metrics in ``out/results.json``."""
    results = json.loads((out / "results.json").read_text())
    return [
        {key: run[key] for key in ("heads", "seed", "final", "history") if key in run}
        for run in results["runs"]
    ]


def test_a_run_from_a_file_equals_the_run_from_flags_and_its_spec_json_runs_it_again(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run three ways: from flags; from a study file, with a flag overriding it (the file
    says 6 steps, ``--steps 4``) and the corpus named relative to the file's folder; from the
    first run's ``spec.json``. The same ``spec.json``, the same numbers, bit for bit."""
    shutil.copy(corpus, tmp_path / "corpus.txt")
    study = _write(
        tmp_path, "study.toml", TINY.replace("steps = 4", "steps = 6") + 'text = "corpus.txt"\n'
    )
    flags = [*TINY_FLAGS, "--text", str(tmp_path / "corpus.txt"), *RUNNING]
    outs = [tmp_path / name for name in ("flags", "file", "again")]
    assert main(["train", *flags, "--out", str(outs[0])]) == 0, capsys.readouterr().err
    argv = ["--config", str(study), "--steps", "4", *RUNNING, "--out", str(outs[1])]
    assert main(["train", *argv]) == 0, capsys.readouterr().err
    argv = ["--config", str(outs[0] / "spec.json"), *RUNNING, "--out", str(outs[2])]
    assert main(["compare", *argv]) == 0, capsys.readouterr().err
    specs = [json.loads((out / "spec.json").read_text())["spec"] for out in outs]
    assert specs[0]["steps"] == 4 and specs[0]["options"]["text"] == str(tmp_path / "corpus.txt")
    assert specs[1] == specs[0] and specs[2] == specs[0]
    numbers = [_numbers(out) for out in outs]
    assert numbers[0] and numbers[0][0]["final"]
    assert numbers[1] == numbers[0] and numbers[2] == numbers[0]


@pytest.fixture()
def validations(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    seen: Counter[str] = Counter()
    validate = CompareSpec.__post_init__

    def counted(self: CompareSpec) -> None:
        seen["validations"] += 1
        validate(self)

    monkeypatch.setattr(CompareSpec, "__post_init__", counted)
    yield seen


def test_a_dry_run_from_a_file_validates_its_spec_once(
    validations: Counter[str],
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(preflight, "time_steps", lambda *a, **k: preflight.StepTimes(0, 0, 0))
    study = _write(tmp_path, "study.toml", TINY + f"text = {json.dumps(str(corpus))}\n")
    argv = ["compare", "--config", str(study), "--heads", "attention:1,laplacian:1", *RUNNING]
    assert main([*argv, "--dry-run"]) == 0, capsys.readouterr().err
    assert validations == Counter({"validations": 1})
    assert "1 configuration(s) x 1 seed(s) = 1 run(s) x 4 steps" in capsys.readouterr().out


# ---------------------------------------------------------------- flags over the file


def test_flags_override_the_file_field_by_field_and_option_by_option(tmp_path: Path) -> None:
    study = _write(tmp_path, "study.toml", TINY)
    spec = _spec("--config", str(study))
    assert (spec.steps, spec.n_layer, spec.heads, spec.seeds) == (4, 1, ("attention:2",), (0,))
    assert (spec.options.seq_len, spec.options.eval_size) == (16, 4)
    spec = _spec(
        "--config", str(study), "--steps", "2", "--seq-len", "8", "--heads", "attention:4",
        "--heads", "attention:2,laplacian:2", "--seeds", "2", "--topk", "4", "--no-analysis",
    )  # fmt: skip
    assert (spec.steps, spec.lr, spec.n_layer) == (2, 3e-3, 1)  # the rest: the file's
    assert (spec.options.seq_len, spec.options.eval_size) == (8, 4)
    assert spec.heads == ("attention:4", "attention:2,laplacian:2") and spec.seeds == (0, 1)
    assert (spec.graph, spec.analysis) == ("topk[k=4]", False)
    # a sweep on the command line is made for the file's sizes, and replaces its heads
    spec = _spec("--config", str(study), "--sweep", "laplacian=0..2", "--n-head", "2")
    assert spec.heads == ("attention:2", "attention:1,laplacian:1", "laplacian:2")
    # another --task keeps only the file's options that task takes
    spec = _spec("--config", str(study), "--task", "recall")
    assert (spec.task, spec.options.seq_len, spec.options.num_pairs) == ("recall", 16, 16)
    # the file over a preset
    spec = _spec("--preset", "demo", "--config", str(study))
    assert (spec.steps, spec.batch_size, spec.options.seq_len) == (4, 4, 16)
    assert spec.eval_every == 2 and spec.name == "demo"  # the preset's, not in the file


def test_train_takes_one_schedule_and_one_seed_of_a_file(tmp_path: Path) -> None:
    text = TINY.replace('heads = ["attention:2"]', 'heads = ["attention:2", "laplacian:2"]')
    study = _write(tmp_path, "study.toml", text.replace("seeds = [0]", "seeds = [0, 1]"))
    with pytest.raises(StudyError, match=r"study\.toml: heads: train runs one, got 2 .*--heads"):
        _spec("--config", str(study), compare=False)
    with pytest.raises(StudyError, match=r"seeds: train runs one, got 2 \(0, 1\).*--seed"):
        _spec("--config", str(study), "--heads", "laplacian:2", compare=False)
    spec = _spec("--config", str(study), "--heads", "laplacian:2", "--seed", "1", compare=False)
    assert (spec.heads, spec.seeds) == (("laplacian:2",), (1,))


# ---------------------------------------------------------------- mistakes: one line each


def _tiny_with(top: str = "", options: str = "") -> str:
    """:data:`TINY` with the lines ``top`` and the ``[options]`` lines ``options`` in place of
    the ones they set (``options = ...`` in ``top``: no ``[options]`` table)."""
    head, table = TINY.split("[options]\n")
    for extra in (top, options):
        for line in extra.splitlines():
            key = line.split("=")[0].strip()
            head = "".join(ln for ln in head.splitlines(True) if ln.split("=")[0].strip() != key)
            table = "".join(ln for ln in table.splitlines(True) if ln.split("=")[0].strip() != key)
    if top.startswith("options ="):
        return f"{top}\n{head}"
    return f"{top}\n{head}[options]\n{options}\n{table}"


@pytest.mark.parametrize(
    ("top", "options", "message"),
    [
        ("layers = 2", "", r"layers: unknown key \(did you mean 'n_layer'\?\)"),
        ("threads = 1", "", r"threads: a flag of the command line \(--threads\), not a field"),
        ("dry_run = true", "", r"dry_run: a flag of the command line \(--dry-run\), not a field"),
        ("sweep = []", "", r"sweep: a flag of the command line \(--sweep\), not a field"),
        ("epochs = 3", "", r"epochs: unknown key; expected fields of the spec and \[options\]"),
        ("seq_len = 8", "", r"seq_len: a task option: put it in the \[options\] table"),
        ('steps = "100"', "", r"steps: expected an integer, got a string '100'"),
        ("lr = true", "", r"lr: expected a number, got true"),
        ('heads = "attention:2"', "", r"heads: expected a list of strings, got a string"),
        ("seeds = [0, 1.5]", "", r"seeds: expected a list of integers, got a list \[0, 1.5\]"),
        ("steps = 0", "", r"steps: expected a positive int, got 0"),  # the spec's own check
        ("topk = 8", "", r"topk: expected graph='topk\[k=8\]' instead"),
        ("options = 3", "", r"options: expected a table of task options, got an integer 3"),
        ("", "seqlen = 8", r"options\.seqlen: unknown task option \(did you mean 'seq_len'"),
        ("", "seq_len = 0", r"options\.seq_len: expected .*got 0"),
        ("", "num_pairs = 2", r"options\.num_pairs: only the 'recall' task uses it"),
    ],
)
def test_a_mistake_in_a_file_is_one_line_naming_the_file_and_the_key(
    top: str, options: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = _write(tmp_path, "study.toml", _tiny_with(top, options))
    err = _error(["compare", "--config", str(study), "--dry-run"], capsys)
    assert err.startswith(f"heatformer compare: error: --config {study}: "), err
    assert re.search(message, err), err


def test_a_value_the_flags_override_is_not_checked_against_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = _write(tmp_path, "study.toml", TINY.replace("steps = 4", "steps = 0"))
    assert _spec("--config", str(study), "--steps", "3").steps == 3
    err = _error(["compare", "--config", str(study), "--steps", "-1", "--dry-run"], capsys)
    assert err == "heatformer compare: error: --steps: expected a positive int, got -1"


def test_a_file_that_is_not_toml_json_or_there_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _write(tmp_path, "study.toml", 'steps = 4\nheads = ["attention:2"\nlr = 1e-3\n')
    err = _error(["train", "--config", str(bad)], capsys)
    assert f"--config {bad}: not valid TOML" in err and "line 3" in err, err
    bad = _write(tmp_path, "spec.json", '{"steps": 4,}')
    err = _error(["compare", "--config", str(bad)], capsys)
    assert f"--config {bad}: not valid JSON" in err and "line 1" in err, err
    bad = _write(tmp_path, "list.json", "[1, 2]")
    err = _error(["compare", "--config", str(bad)], capsys)
    assert err.endswith("expected a mapping of spec fields, got a list [1, 2]"), err
    err = _error(["compare", "--config", str(tmp_path / "none.toml")], capsys)
    assert err.endswith(f"--config {tmp_path / 'none.toml'}: expected a study file, found none")


def test_a_resume_takes_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "spec.json").write_text(
        json.dumps({"spec": CompareSpec(steps=2, n_layer=1, n_embd=16).to_dict()})
    )
    err = _error(
        ["compare", "--resume", str(folder), "--config", str(folder / "spec.json")], capsys
    )
    assert "drop the flags ['config']" in err, err


def test_the_reader_keeps_the_types_of_the_spec(tmp_path: Path) -> None:
    """Lists become tuples, integers become floats where a float is asked; JSON's null is a
    field's default; a path option is read from the file's folder."""
    study = _write(
        tmp_path,
        "study.json",
        json.dumps({"spec": {"lr": 1, "heads": ["attention"], "n_head": None,
                             "options": {"text": "data/corpus.txt"}}}),
    )  # fmt: skip
    values = read_study(study).values
    assert values["lr"] == 1.0 and isinstance(values["lr"], float)
    assert values["heads"] == ("attention",) and values["n_head"] is None
    assert values["options"]["text"] == str((tmp_path / "data" / "corpus.txt").resolve())


def test_every_field_of_the_spec_is_a_key_of_its_type(tmp_path: Path) -> None:
    """The keys are the spec's fields, read by their types (a field added later is a key at
    once): every field of a spec, written as TOML by its value (``None`` left out) and as
    JSON, makes that spec."""
    spec = CompareSpec(heads=("attention:2", "laplacian:2"), seeds=(3, 4), lr=2e-3, n_head=2)
    data = {k: v for k, v in spec.to_dict().items() if v is not None and k != "options"}
    lines = [f"{key} = {json.dumps(value)}" for key, value in data.items()]
    options = [f"{k} = {json.dumps(v)}" for k, v in spec.to_dict()["options"].items() if v]
    toml = _write(tmp_path, "all.toml", "\n".join([*lines, "[options]", *options]) + "\n")
    saved = _write(tmp_path, "spec.json", json.dumps({"spec": spec.to_dict()}))
    for path in (toml, saved):
        assert CompareSpec(**read_study(path).values).to_dict() == spec.to_dict()
