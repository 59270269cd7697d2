"""The ``stdlib`` task: package classification of Python source snippets, split by file."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from heatformer.lab.compare import run_compare
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import (
    TASKS,
    Stdlib,
    StdlibOptions,
    StdlibTask,
    load_stdlib_task,
    load_task,
    options_by_name,
    resolve_task,
)
from heatformer.lab.tasks._corpus import hash_fraction, stdlib_source_root


@pytest.fixture(scope="module")
def stdlib_data() -> StdlibTask:
    """The default data: the running Python's standard library, 16 classes, 128 bytes."""
    return load_stdlib_task()


def _file_bytes(data: StdlibTask, split: str) -> list[list[bytes]]:
    """Per class, the contents of its files of ``split``, read back from the root."""
    root = Path(data.source)
    return [
        [(root / rel).read_bytes() for rel in names] for names in getattr(data, f"{split}_files")
    ]


def _check_windows(data: StdlibTask, split: str, x: torch.Tensor, labels: torch.Tensor) -> None:
    """Every window is an exact substring of one file of its labelled class, in ``split``."""
    files = _file_bytes(data, split)
    assert x.dtype == labels.dtype == torch.long and x.shape == (len(labels), data.seq_len)
    for row, label in zip(x.tolist(), labels.tolist(), strict=True):
        window = bytes(row)
        assert any(window in content for content in files[label]), (split, label, window[:40])


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _pattern(letters: bytes, size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.choice(letters) for _ in range(size))


@pytest.fixture()
def tiny_root(tmp_path: Path) -> Path:
    """Fake packages: ``big`` (5 files), ``tie_b`` and ``tie_a`` (same bytes), ``small``, and
    folders that are no class (one usable file, no ``__init__.py``, hidden, ``tests``)."""
    root = tmp_path / "lib"
    _write(root / "big" / "__init__.py", b"")  # empty: shorter than any window
    for i, size in enumerate((400, 300, 300, 200, 200)):
        _write(root / "big" / f"m{i}.py", _pattern(b"abcd", size, i))
    _write(root / "big" / "sub" / "deep.py", _pattern(b"abcd", 100, 9))  # subfolders count
    _write(root / "big" / "tests" / "test_x.py", b"x" * 5000)  # a test folder does not
    _write(root / "big" / "notes.txt", b"n" * 5000)  # nor a file that is not .py
    _write(root / "big" / "tiny.py", b"abc")  # shorter than seq_len: left out
    for name in ("tie_b", "tie_a"):
        _write(root / name / "__init__.py", _pattern(b"efgh", 300, 1))
        _write(root / name / "x.py", _pattern(b"efgh", 300, 2))
    _write(root / "small" / "__init__.py", _pattern(b"ijkl", 100, 3))
    _write(root / "small" / "y.py", _pattern(b"ijkl", 100, 4))
    _write(root / "single" / "__init__.py", b"s" * 9000)  # one usable file: no split
    _write(root / "single" / "short.py", b"s")
    _write(root / "plain" / "z.py", b"p" * 9000)  # no __init__.py: not a package
    _write(root / ".hidden" / "__init__.py", b"h" * 9000)
    _write(root / "tests" / "__init__.py", b"t" * 9000)
    _write(root / "tests" / "t.py", b"t" * 9000)
    _write(root / "module.py", b"m" * 9000)  # a module, not a package
    return root


# ----------------------------------------------------------------------------- the stdlib


def test_default_classes_are_the_largest_stdlib_packages(stdlib_data: StdlibTask) -> None:
    data = stdlib_data
    assert data.num_classes == 16 and data.seq_len == 128 and data.vocab_size == 256
    assert {"asyncio", "email", "encodings"} <= set(data.classes)
    assert data.source == str(stdlib_source_root())
    totals = [sum(a) + sum(b) for a, b in zip(data.train_sizes, data.test_sizes, strict=True)]
    assert totals == sorted(totals, reverse=True)  # ranked by bytes, largest first
    for c, name in enumerate(data.classes):
        train, test = data.train_files[c], data.test_files[c]
        assert train and test and not set(train) & set(test)  # split by file, both non-empty
        assert all(rel.startswith(f"{name}/") and rel.endswith(".py") for rel in train + test)
        assert not any("/tests/" in rel or "/test/" in rel for rel in train + test)
        assert sum(data.test_sizes[c]) <= 0.2 * totals[c] or len(test) == 1
    assert data.train.numel() == sum(map(sum, data.train_sizes))
    assert data.test.numel() == sum(map(sum, data.test_sizes))


def test_default_data_are_the_same_twice(stdlib_data: StdlibTask) -> None:
    again = load_task("stdlib")
    for f in dataclasses.fields(StdlibTask):
        if f.name.startswith("_"):
            continue
        mine, theirs = getattr(stdlib_data, f.name), getattr(again, f.name)
        assert torch.equal(mine, theirs) if isinstance(mine, torch.Tensor) else mine == theirs
    assert torch.equal(stdlib_data.eval_set()[0], again.eval_set()[0])


def test_snippets_are_substrings_of_files_of_their_class(stdlib_data: StdlibTask) -> None:
    x, labels = stdlib_data.get_batch(64, torch.Generator().manual_seed(0))
    _check_windows(stdlib_data, "train", x, labels)
    x, labels = stdlib_data.eval_set()
    _check_windows(stdlib_data, "test", x, labels)  # test snippets: files never trained on


def test_eval_set_is_fixed_balanced_and_interleaved(stdlib_data: StdlibTask) -> None:
    x, labels = stdlib_data.eval_set()
    assert len(labels) == 16 * 32
    assert Counter(labels.tolist()) == dict.fromkeys(range(16), 32)
    assert torch.equal(labels, torch.arange(16 * 32) % 16)  # every prefix is balanced too
    assert len({bytes(row) for row in x.tolist()}) == len(labels)  # distinct windows
    parts = list(stdlib_data.eval_batches(100))
    assert [len(y) for _, y in parts] == [100] * 5 + [12]
    assert torch.equal(torch.cat([p for p, _ in parts]), x)


def test_training_batches_come_from_the_generator_only(stdlib_data: StdlibTask) -> None:
    torch.manual_seed(0)
    x, y = stdlib_data.get_batch(32, torch.Generator().manual_seed(5))
    torch.manual_seed(1)  # the global RNG plays no part
    x2, y2 = stdlib_data.get_batch(32, torch.Generator().manual_seed(5))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = stdlib_data.get_batch(32, torch.Generator().manual_seed(6))
    assert not torch.equal(x, x3)
    _, labels = stdlib_data.get_batch(16_000, torch.Generator().manual_seed(0))
    counts = torch.bincount(labels, minlength=16).double()
    assert float(((counts - 1000) ** 2 / 1000).sum()) < 45  # chi-square, 15 dof: p ~ 1e-4


# ----------------------------------------------------------------------------- a tiny root


def test_tiny_root_ranking_files_and_split(tiny_root: Path) -> None:
    data = load_stdlib_task(tiny_root, num_classes=4, seq_len=50, eval_per_class=3)
    assert data.classes == ("big", "tie_a", "tie_b", "small")  # bytes, then name for ties
    assert data.source == str(tiny_root)
    big = sorted(data.train_files[0] + data.test_files[0])
    assert big == ["big/m0.py", "big/m1.py", "big/m2.py", "big/m3.py", "big/m4.py",
                   "big/sub/deep.py"]  # fmt: skip
    # the test files are those that fit 20 % of the bytes (300 of 1500), in hash order
    order = sorted(big, key=hash_fraction)
    sizes = {"big/m0.py": 400, "big/m1.py": 300, "big/m2.py": 300, "big/m3.py": 200,
             "big/m4.py": 200, "big/sub/deep.py": 100}  # fmt: skip
    expected, used = [], 0
    for rel in order:
        if used + sizes[rel] <= 300:
            expected.append(rel)
            used += sizes[rel]
    assert sorted(data.test_files[0]) == sorted(expected) and used > 0
    assert sum(data.test_sizes[0]) == used
    for c in (1, 2, 3):  # two files larger than the budget: the first in hash order is test
        files = data.train_files[c] + data.test_files[c]
        assert len(files) == 2 and data.test_files[c] == (min(files, key=hash_fraction),)
    assert data.num_windows("test")[3] == 100 - 50 + 1
    x, labels = data.eval_set()
    _check_windows(data, "test", x, labels)
    assert load_stdlib_task(tiny_root, num_classes=2, seq_len=50).classes == ("big", "tie_a")


def test_tiny_root_windows_are_uniform_over_a_class(tmp_path: Path) -> None:
    """A class's files are weighted by their windows: a file with 2 of 11 windows gets 2/11."""
    _write(tmp_path / "a" / "__init__.py", b"0123456789X")  # 2 windows of 10 bytes
    _write(tmp_path / "a" / "long.py", b"A" * 18)  # 9 windows
    _write(tmp_path / "a" / "t.py", b"T" * 10)
    _write(tmp_path / "b" / "__init__.py", b"B" * 30)
    _write(tmp_path / "b" / "t.py", b"U" * 10)
    data = load_stdlib_task(tmp_path, num_classes=2, seq_len=10, test_fraction=0.27)
    assert data.classes == ("b", "a")  # 40 bytes, then 39
    assert data.test_files == (("b/t.py",), ("a/t.py",))  # the only files within the budget
    assert data.num_windows("train") == (21, 11) and data.num_windows("test") == (1, 1)
    x, labels = data.get_batch(20_000, torch.Generator().manual_seed(0))
    from_init = float((x[labels == 1][:, 0] < ord("A")).double().mean())  # starts "0" or "1"
    assert from_init == pytest.approx(2 / 11, abs=0.015)
    assert bool((x[labels == 0] == ord("B")).all())
    assert float((labels == 0).double().mean()) == pytest.approx(0.5, abs=0.015)


def test_tiny_root_errors(tiny_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("num_classes: expected at most 4")) as info:
        load_stdlib_task(tiny_root, num_classes=5, seq_len=50)
    assert "(big, tie_a, tie_b, small)" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("num_classes: expected at most 3")):
        load_stdlib_task(tiny_root, num_classes=4, seq_len=150)  # 'small' has no such file
    with pytest.raises(FileNotFoundError, match="root: no such folder") as missing:
        load_stdlib_task(tmp_path / "nowhere")
    assert missing.value.argument == "root"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="root: expected a folder of packages, got the file"):
        load_stdlib_task(tiny_root / "module.py")
    with pytest.raises(ValueError, match="root: expected package folders"):
        load_stdlib_task(tiny_root / "plain")
    for kwargs, name in [
        ({"num_classes": 1}, "num_classes"),
        ({"seq_len": 0}, "seq_len"),
        ({"eval_per_class": 0}, "eval_per_class"),
        ({"test_fraction": 1.0}, "test_fraction"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}: "):
            load_stdlib_task(tiny_root, **kwargs)  # type: ignore[arg-type]


def test_data_that_do_not_hold_together_are_refused() -> None:
    data = StdlibTask(
        classes=("a", "b"), train_files=(("a/x.py",), ("b/x.py",)), train_sizes=((4,), (4,)),
        test_files=(("a/y.py",), ("b/y.py",)), test_sizes=((4,), (4,)),
        train=torch.zeros(8, dtype=torch.uint8), test=torch.zeros(8, dtype=torch.uint8),
        seq_len=4, eval_per_class=2, source="<bytes>",
    )  # fmt: skip
    assert data.num_windows("train") == (1, 1)
    for changes, message in [
        ({"test_files": (("a/x.py",), ("b/y.py",))}, "test_files: expected files disjoint"),
        ({"train_sizes": ((4,), (5,))}, "train: expected 9 bytes"),
        ({"test_sizes": ((3,), (5,))}, "test_sizes: expected files of at least seq_len=4"),
        ({"train_files": ((), ("b/x.py",))}, "train_files: expected at least one file"),
        ({"classes": ("a", "a")}, "classes: expected distinct class names"),
        ({"test": torch.zeros(8)}, "test: expected a 1-D uint8 tensor"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            dataclasses.replace(data, **changes)
    with pytest.raises(ValueError, match="split: expected 'train' or 'test'"):
        data.num_windows("val")


# ----------------------------------------------------------------------------- the task


def test_task_registry_entry_options_and_model(tiny_root: Path) -> None:
    assert TASKS["stdlib"] is Stdlib and resolve_task("stdlib") is Stdlib
    assert Stdlib.metric_names == ("test_acc", "test_loss")
    assert Stdlib.higher_is_better == (True, False) and Stdlib.eval_loss_name == "test_loss"
    assert StdlibOptions() == StdlibOptions(16, 128, 32, 256, None)
    table = options_by_name()
    assert "stdlib" in table["seq_len"] and "stdlib" in table["analysis_size"]
    assert table["root"]["stdlib"].metadata["path"] is True
    assert table["analysis_size"]["stdlib"].metadata["numbers"] is False
    from heatformer.lab.cli import _build_parsers

    help_text = " ".join(_build_parsers()[1]["compare"].format_help().split())
    for line in (
        "chars, recall, stdlib, masked: sequence length (default 128)",
        "--num-classes N stdlib: number of classes: the largest packages (at least 2) (default 16)",
        "--eval-per-class N stdlib: test snippets per class (default 32)",
        "stdlib: sequences in the analysis batch (capped by the test set) (default 256)",
        "--root PATH stdlib: a folder of packages",
    ):
        assert line in help_text
    spec = CompareSpec(
        task="stdlib", heads=("attention:2",), n_layer=1, n_embd=16,
        options={"root": str(tiny_root), "num_classes": 3, "seq_len": 40, "eval_per_class": 5,
                 "analysis_size": 7},
    )  # fmt: skip
    assert spec.options.max_tokens() == 40
    assert "analysis_size" not in spec.fingerprint()["options"]
    task = Stdlib(spec)
    assert task.data.classes == ("big", "tie_a", "tie_b") and task.data.eval_per_class == 5
    config = task.model_config("attention:2")
    assert (config.vocab_size, config.num_classes, config.block_size) == (256, 3, 40)
    assert (config.pool, config.causal) == ("mean", False)
    inputs, labels = task.analysis_batch()
    assert inputs.shape == (7, 40) and labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    big = dataclasses.replace(spec, options=dataclasses.replace(spec.options, analysis_size=99))
    assert len(Stdlib(big, task.data).analysis_batch()[1]) == 15  # capped by the test set
    other = dataclasses.replace(spec, options=dataclasses.replace(spec.options, seq_len=41))
    with pytest.raises(ValueError, match="seq_len: expected data with seq_len=41, got 40"):
        Stdlib(other, task.data)
    with pytest.raises(ValueError, match="num_classes"):
        StdlibOptions(num_classes=1)


def test_short_run_on_an_easy_root_beats_chance(tmp_path: Path) -> None:
    """Four packages, each written in its own four letters: learnt within a few dozen steps."""
    root = tmp_path / "easy"
    for c, letters in enumerate((b"abcd", b"efgh", b"ijkl", b"mnop")):
        for i, name in enumerate(("__init__.py", "f1.py", "f2.py")):
            _write(root / f"pkg{c}" / name, _pattern(letters, 400, 10 * c + i))
    spec = CompareSpec(
        task="stdlib", heads=("attention:2", "attention:1,laplacian:1"), seeds=(0,), steps=40,
        batch_size=16, lr=1e-2, n_layer=1, n_embd=16, eval_every=20, device="cpu",
        options={"root": str(root), "num_classes": 4, "seq_len": 16, "eval_per_class": 8,
                 "analysis_size": 16},
    )  # fmt: skip
    report = run_compare(spec, tmp_path / "out")
    runs = report.results["runs"]
    assert len(runs) == 2
    for record in runs:
        final = record["final"]
        assert math.isfinite(final["test_loss"]) and final["test_loss"] < 0.5  # chance: ln 4
        assert final["test_acc"] > 0.9  # chance: 0.25
        assert all(math.isfinite(v) for v in record["train_loss"])
        for name in ("within_seq_frac", "effective_rank", "nc1"):
            assert all(math.isfinite(v) for v in record["analysis"][name]), name
