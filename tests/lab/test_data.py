"""Tests for the data of the built-in tasks (heatformer.lab.tasks)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heatformer.lab.tasks import (
    TASK_NAMES,
    CharsTask,
    DigitsTask,
    RecallTask,
    bits_per_char,
    load_chars,
    load_digits_task,
    load_task,
    stdlib_source_root,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bytes_task(train: bytes, val: bytes) -> CharsTask:
    return CharsTask(
        train=torch.tensor(list(train), dtype=torch.uint8),
        val=torch.tensor(list(val), dtype=torch.uint8),
        train_files=("train.txt",),
        val_files=("val.txt",),
        source="<bytes>",
    )


# --------------------------------------------------------------------------------------
# chars
# --------------------------------------------------------------------------------------

STDLIB_CAP = 300_000


@pytest.fixture(scope="module")
def stdlib_chars() -> CharsTask:
    return load_chars(max_bytes=STDLIB_CAP)


def test_stdlib_corpus_is_capped_and_split_by_file(stdlib_chars: CharsTask) -> None:
    task = stdlib_chars
    assert task.vocab_size == 256
    assert task.train.dtype == torch.uint8 and task.val.dtype == torch.uint8
    assert task.train.numel() + task.val.numel() == STDLIB_CAP
    assert task.train_files and task.val_files
    assert not set(task.train_files) & set(task.val_files)
    every = task.train_files + task.val_files
    assert all(name.endswith(".py") for name in every)
    excluded = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    assert all(not set(name.split("/")[:-1]) & excluded for name in every)
    assert list(task.train_files) == sorted(task.train_files)
    assert list(task.val_files) == sorted(task.val_files)


def test_stdlib_streams_are_the_concatenated_files(stdlib_chars: CharsTask) -> None:
    task = stdlib_chars
    root = stdlib_source_root()
    ordered = sorted(task.train_files + task.val_files)
    full = {name: (root / name).read_bytes() for name in ordered}
    # Files are read in sorted order until the cap; only the last one is truncated.
    kept = STDLIB_CAP - sum(len(full[name]) for name in ordered[:-1])
    assert 0 < kept <= len(full[ordered[-1]])
    full[ordered[-1]] = full[ordered[-1]][:kept]
    assert bytes(task.train.tolist()) == b"".join(full[name] for name in task.train_files)
    assert bytes(task.val.tolist()) == b"".join(full[name] for name in task.val_files)


def test_file_assignment_does_not_depend_on_the_cap(stdlib_chars: CharsTask) -> None:
    small = load_chars(max_bytes=STDLIB_CAP // 3)
    assert set(small.val_files) <= set(stdlib_chars.val_files)
    assert set(small.train_files) <= set(stdlib_chars.train_files)


def test_stdlib_batches_are_bytes_shifted_by_one(stdlib_chars: CharsTask) -> None:
    x, y = stdlib_chars.get_batch("train", 8, 64, _gen(0))
    assert x.shape == y.shape == (8, 64)
    assert x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 256
    assert torch.equal(x[:, 1:], y[:, :-1])


def _letter_folder(root: Path, count: int = 30, size: int = 50) -> dict[str, bytes]:
    """Text files whose content is one distinct letter repeated, nested in folders."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    files: dict[str, bytes] = {}
    for i in range(count):
        name = f"part{i % 3}/file{i:02d}.txt"
        files[name] = letters[i].encode() * size
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(files[name])
    (root / "blob.bin").write_bytes(b"\x00\x01\x02binary")  # NUL byte: skipped
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8: skipped
    (root / ".hidden").mkdir()
    (root / ".hidden" / "secret.txt").write_bytes(b"#" * size)  # hidden: skipped
    (root / "empty.txt").write_bytes(b"")  # empty: contributes nothing
    return files


def test_folder_corpus_split_by_file(tmp_path: Path) -> None:
    files = _letter_folder(tmp_path)
    task = load_chars(tmp_path)
    assert task.source == str(tmp_path)
    assert set(task.train_files) | set(task.val_files) == set(files)
    assert not set(task.train_files) & set(task.val_files)
    assert task.train_files and task.val_files
    assert bytes(task.train.tolist()) == b"".join(files[n] for n in sorted(task.train_files))
    assert bytes(task.val.tolist()) == b"".join(files[n] for n in sorted(task.val_files))


def test_split_follows_the_documented_path_hash(tmp_path: Path) -> None:
    for i in range(200):
        (tmp_path / f"doc{i:03d}.md").write_text(f"document {i}\n")
    task = load_chars(tmp_path, val_fraction=0.1)

    def in_val(name: str) -> bool:
        digest = hashlib.sha256(name.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64 < 0.1

    assert set(task.val_files) == {f"doc{i:03d}.md" for i in range(200) if in_val(f"doc{i:03d}.md")}
    assert 10 <= len(task.val_files) <= 30  # about 10% of 200 files
    assert len(task.train_files) + len(task.val_files) == 200


def test_windows_never_mix_splits(tmp_path: Path) -> None:
    files = _letter_folder(tmp_path)
    task = load_chars(tmp_path)
    train_letters = {files[n][0] for n in task.train_files}
    val_letters = {files[n][0] for n in task.val_files}
    assert not train_letters & val_letters
    seq_len = min(task.val.numel(), task.train.numel()) - 1
    seen_val: set[int] = set()
    for x, y in task.eval_batches(4, seq_len, max_windows=None):
        seen_val |= set(x.flatten().tolist()) | set(y.flatten().tolist())
    for seed in range(5):
        x, y = task.get_batch("val", 4, seq_len, _gen(seed))
        seen_val |= set(x.flatten().tolist()) | set(y.flatten().tolist())
    assert seen_val and seen_val <= val_letters
    x, y = task.get_batch("train", 16, seq_len, _gen(0))
    seen_train = set(x.flatten().tolist()) | set(y.flatten().tolist())
    assert seen_train and seen_train <= train_letters


def test_cap_truncates_the_last_file(tmp_path: Path) -> None:
    files = _letter_folder(tmp_path, count=4, size=50)
    task = load_chars(tmp_path, max_bytes=75)
    kept = sorted(task.train_files + task.val_files)
    assert kept == sorted(files)[:2]
    assert task.train.numel() + task.val.numel() == 75
    stream = {n: files[n] for n in kept}
    stream[kept[1]] = stream[kept[1]][:25]
    assert bytes(task.train.tolist()) == b"".join(stream[n] for n in task.train_files)
    assert bytes(task.val.tolist()) == b"".join(stream[n] for n in task.val_files)


def test_single_file_is_split_by_position(tmp_path: Path) -> None:
    text = "".join(f"line {i}: héllo wörld\n" for i in range(40)).encode()
    path = tmp_path / "book.txt"
    path.write_bytes(text)
    task = load_chars(path, val_fraction=0.25)
    num_val = math.ceil(0.25 * len(text))
    assert task.val.numel() == num_val
    assert bytes(task.train.tolist()) == text[:-num_val]
    assert bytes(task.val.tolist()) == text[-num_val:]
    assert task.train_files == task.val_files == ("book.txt",)


def test_chars_path_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_chars(missing)
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty"):
        load_chars(empty)
    (empty / "zero.txt").write_bytes(b"")
    (empty / "binary.dat").write_bytes(b"\x00\x00\x00")
    with pytest.raises(ValueError, match="empty_dir"):
        load_chars(empty)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("\xe9t\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"UTF-8.*latin\.txt"):
        load_chars(latin)
    with pytest.raises(ValueError, match="val_fraction"):
        load_chars(tmp_path, val_fraction=1.0)
    with pytest.raises(ValueError, match="max_bytes"):
        load_chars(tmp_path, max_bytes=0)


def test_chars_get_batch_windows_are_contiguous_and_deterministic() -> None:
    task = _bytes_task(bytes(range(200)), bytes(range(100)))
    x, y = task.get_batch("train", 32, 10, _gen(3))
    assert x.shape == y.shape == (32, 10)
    # Every window is contiguous data: with data = 0, 1, 2, ... consecutive bytes rise by 1.
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(32, 9, dtype=torch.int64))
    assert torch.equal(y, x + 1)
    assert int(y.max()) <= 199
    x_again, y_again = task.get_batch("train", 32, 10, _gen(3))
    assert torch.equal(x, x_again) and torch.equal(y, y_again)
    x_other, _ = task.get_batch("train", 32, 10, _gen(4))
    assert not torch.equal(x, x_other)
    # The longest possible window covers the whole split.
    x_full, y_full = task.get_batch("val", 2, 99, _gen(0))
    assert torch.equal(x_full[0], torch.arange(99)) and torch.equal(y_full[1], torch.arange(1, 100))


def test_chars_get_batch_errors() -> None:
    task = _bytes_task(bytes(range(20)), bytes(range(10)))
    with pytest.raises(ValueError, match="seq_len"):
        task.get_batch("val", 1, 10, _gen(0))
    with pytest.raises(ValueError, match="split"):
        task.get_batch("test", 1, 4, _gen(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        task.get_batch("train", 0, 4, _gen(0))
    with pytest.raises(TypeError, match="generator"):
        task.get_batch("train", 1, 4, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_len"):
        task.eval_batches(1, 10)
    with pytest.raises(ValueError, match="train"):
        CharsTask(torch.zeros(3), torch.zeros(3, dtype=torch.uint8), (), (), "x")


def test_chars_eval_windows_are_fixed() -> None:
    task = _bytes_task(bytes(range(50)), bytes(range(100)))
    # 99 usable bytes -> 9 non-overlapping windows of 10 starting at 0, 10, ..., 80.
    assert task.num_eval_windows(10, max_windows=None) == 9
    xs = torch.cat([x for x, _ in task.eval_batches(4, 10, max_windows=None)])
    ys = torch.cat([y for _, y in task.eval_batches(4, 10, max_windows=None)])
    assert torch.equal(xs[:, 0], torch.arange(0, 90, 10))
    assert torch.equal(ys, xs + 1)
    sizes = [x.shape[0] for x, _ in task.eval_batches(4, 10, max_windows=None)]
    assert sizes == [4, 4, 1]
    # Independent of batch size and of calls; the cap keeps evenly spaced windows.
    xs_other = torch.cat([x for x, _ in task.eval_batches(7, 10, max_windows=None)])
    assert torch.equal(xs, xs_other)
    capped = torch.cat([x for x, _ in task.eval_batches(8, 10, max_windows=3)])
    assert torch.equal(capped[:, 0], torch.tensor([0, 30, 60]))
    assert task.num_eval_windows(10, max_windows=3) == 3
    # their starts, and the windows cut there (what the masked task's analysis labels)
    assert torch.equal(task.eval_starts(10, max_windows=3), torch.tensor([0, 30, 60]))
    assert torch.equal(task.windows("val", task.eval_starts(10, None), 10)[0], xs)
    starts = task.random_starts("train", 5, 10, _gen(3))
    assert torch.equal(
        task.windows("train", starts, 10)[0], task.get_batch("train", 5, 10, _gen(3))[0]
    )


def test_bits_per_char() -> None:
    assert bits_per_char(math.log(256)) == pytest.approx(8.0)
    assert bits_per_char(math.log(2)) == pytest.approx(1.0)
    values = bits_per_char(torch.tensor([0.0, math.log(4)]))
    assert torch.allclose(values, torch.tensor([0.0, 2.0]))


# --------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> DigitsTask:
    return load_digits_task()


def test_digits_shapes_and_scale(digits: DigitsTask) -> None:
    assert digits.train_images.shape == (1437, 1, 8, 8)
    assert digits.test_images.shape == (360, 1, 8, 8)
    assert digits.image_shape == (1, 8, 8)
    assert digits.num_classes == 10
    assert digits.train_images.dtype == torch.float32
    assert digits.train_labels.dtype == digits.test_labels.dtype == torch.int64
    both = torch.cat([digits.train_images, digits.test_images])
    assert float(both.min()) == 0.0 and float(both.max()) == 1.0
    from sklearn.datasets import load_digits

    bunch = load_digits()
    expected = torch.from_numpy(bunch.images[digits.test_index.numpy()] / 16.0).float()
    assert torch.allclose(digits.test_images[:, 0], expected)
    assert torch.equal(digits.test_labels, torch.from_numpy(bunch.target[digits.test_index]))


def test_digits_split_is_disjoint_covering_stratified_and_fixed(digits: DigitsTask) -> None:
    train, test = digits.train_index, digits.test_index
    assert not set(train.tolist()) & set(test.tolist())
    assert torch.equal(torch.cat([train, test]).sort().values, torch.arange(1797))
    all_labels = torch.empty(1797, dtype=torch.int64)
    all_labels[train], all_labels[test] = digits.train_labels, digits.test_labels
    per_class = torch.bincount(all_labels, minlength=10)
    per_class_test = torch.bincount(digits.test_labels, minlength=10)
    assert torch.all((per_class_test.double() - 0.2 * per_class.double()).abs() <= 1.0)
    again = load_digits_task()
    assert torch.equal(again.test_index, test) and torch.equal(
        again.train_images, digits.train_images
    )
    other = load_digits_task(seed=1)
    assert not torch.equal(other.test_index, test)


def test_digits_batches(digits: DigitsTask) -> None:
    images, labels = digits.get_batch("train", 64, _gen(0))
    assert images.shape == (64, 1, 8, 8) and labels.shape == (64,)
    rows = {tuple(row.flatten().tolist()) for row in images}
    assert len(rows) > 50  # sampled without replacement (a few digits may repeat pixels)
    images_again, labels_again = digits.get_batch("train", 64, _gen(0))
    assert torch.equal(images, images_again) and torch.equal(labels, labels_again)
    assert not torch.equal(labels, digits.get_batch("train", 64, _gen(1))[1])
    seen = torch.cat([y for _, y in digits.eval_batches(100)])
    assert torch.equal(seen, digits.test_labels)
    assert [x.shape[0] for x, _ in digits.eval_batches(100)] == [100, 100, 100, 60]
    with pytest.raises(ValueError, match="batch_size"):
        digits.get_batch("test", 361, _gen(0))
    with pytest.raises(ValueError, match="split"):
        digits.get_batch("val", 4, _gen(0))  # type: ignore[arg-type]


def _write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_npz_grayscale_and_channels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 10)  # 30 samples, 3 classes
    images = rng.integers(10, 200, size=(30, 5, 6)).astype(np.uint8)
    task = load_digits_task(_write_npz(tmp_path / "g.npz", images=images, labels=labels))
    assert task.train_images.shape == (24, 1, 5, 6) and task.test_images.shape == (6, 1, 5, 6)
    assert task.num_classes == 3
    assert torch.equal(torch.bincount(task.test_labels), torch.tensor([2, 2, 2]))
    lo, hi = images.min(), images.max()
    expected = (images[task.train_index.numpy()].astype(np.float64) - lo) / (hi - lo)
    assert np.allclose(task.train_images[:, 0].numpy(), expected)

    color = rng.random((30, 3, 4, 4)) * 5 - 2
    task = load_digits_task(
        _write_npz(tmp_path / "c.npz", images=color, labels=labels.astype(np.float32)),
        test_fraction=0.5,
    )
    assert task.image_shape == (3, 4, 4)
    assert task.test_images.shape[0] == 15 and task.train_labels.dtype == torch.int64
    both = torch.cat([task.train_images, task.test_images])
    assert float(both.min()) == 0.0 and float(both.max()) == pytest.approx(1.0)


def test_npz_errors(tmp_path: Path) -> None:
    labels = np.repeat(np.arange(2), 5)
    images = np.zeros((10, 4, 4))
    with pytest.raises(FileNotFoundError, match=r"missing\.npz"):
        load_digits_task(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="'images'"):
        load_digits_task(_write_npz(tmp_path / "a.npz", pixels=images, labels=labels))
    with pytest.raises(ValueError, match="'labels'"):
        load_digits_task(_write_npz(tmp_path / "b.npz", images=images, targets=labels))
    with pytest.raises(ValueError, match=r"images: expected shape"):
        load_digits_task(_write_npz(tmp_path / "c.npz", images=np.zeros((10, 16)), labels=labels))
    with pytest.raises(ValueError, match=r"labels: expected shape \(10,\)"):
        load_digits_task(_write_npz(tmp_path / "d.npz", images=images, labels=labels[:9]))
    with pytest.raises(ValueError, match="labels: expected integer"):
        load_digits_task(_write_npz(tmp_path / "e.npz", images=images, labels=labels + 0.5))
    with pytest.raises(ValueError, match="labels: expected at least 2"):
        one_of_a_kind = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
        load_digits_task(_write_npz(tmp_path / "f.npz", images=images, labels=one_of_a_kind))
    with pytest.raises(ValueError, match="labels: expected non-negative"):
        load_digits_task(_write_npz(tmp_path / "g.npz", images=images, labels=labels - 1))
    with pytest.raises(ValueError, match="images: expected finite"):
        bad = images.copy()
        bad[0, 0, 0] = np.nan
        load_digits_task(_write_npz(tmp_path / "h.npz", images=bad, labels=labels))
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits_task(test_fraction=0.0)


# --------------------------------------------------------------------------------------
# recall
# --------------------------------------------------------------------------------------


def _scan_target(row: list[int], num_pairs: int) -> int:
    """The value after the query key among the leading pairs, found by a plain scan."""
    query = row[-1]
    for i in range(num_pairs):
        if row[2 * i] == query:
            return row[2 * i + 1]
    raise AssertionError("query key not found among the pairs")


def _check_recall_batch(task: RecallTask, x: torch.Tensor, target: torch.Tensor) -> None:
    num_keys, num_values, pairs = task.num_keys, task.num_values, task.num_pairs
    assert x.dtype == target.dtype == torch.int64
    assert x.shape[1] == task.seq_len and target.shape == (x.shape[0],)
    keys, values = x[:, 0 : 2 * pairs : 2], x[:, 1 : 2 * pairs : 2]
    filler = x[:, 2 * pairs : -1]
    assert bool(((keys >= 0) & (keys < num_keys)).all())
    assert bool(((values >= num_keys) & (values < num_keys + num_values)).all())
    assert bool(((filler >= num_keys + num_values) & (filler < task.vocab_size)).all())
    for row_keys in keys.tolist():
        assert len(set(row_keys)) == pairs
    for row, t in zip(x.tolist(), target.tolist()):
        assert row[-1] in row[0 : 2 * pairs : 2]
        assert t == _scan_target(row, pairs)


@pytest.mark.parametrize(
    ("num_keys", "num_values", "num_pairs", "seq_len", "num_filler"),
    [(64, 64, 16, 512, 16), (5, 3, 5, 11, 1), (1000, 7, 3, 16_384, 2)],
)
def test_recall_target_is_the_paired_value(
    num_keys: int, num_values: int, num_pairs: int, seq_len: int, num_filler: int
) -> None:
    task = RecallTask(
        num_keys=num_keys,
        num_values=num_values,
        num_pairs=num_pairs,
        seq_len=seq_len,
        num_filler=num_filler,
    )
    assert task.vocab_size == num_keys + num_values + num_filler
    x, target = task.get_batch(8, _gen(0))
    assert x.shape == (8, seq_len)
    _check_recall_batch(task, x, target)


@settings(max_examples=30, deadline=None)
@given(
    num_keys=st.integers(1, 40),
    num_values=st.integers(1, 40),
    num_filler=st.integers(1, 5),
    extra=st.integers(0, 40),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_recall_target_property(
    num_keys: int, num_values: int, num_filler: int, extra: int, seed: int, data: st.DataObject
) -> None:
    num_pairs = data.draw(st.integers(1, num_keys))
    task = RecallTask(
        num_keys=num_keys,
        num_values=num_values,
        num_pairs=num_pairs,
        seq_len=2 * num_pairs + 1 + extra,
        num_filler=num_filler,
    )
    x, target = task.get_batch(4, _gen(seed))
    _check_recall_batch(task, x, target)


def test_recall_queries_vary_over_pair_positions() -> None:
    task = RecallTask(num_pairs=8, seq_len=64)
    x, _ = task.get_batch(512, _gen(0))
    keys = x[:, 0:16:2]  # (B, P)
    position = (keys == x[:, -1:]).int().argmax(dim=1)  # (B,)
    counts = torch.bincount(position, minlength=8)
    assert bool((counts > 30).all())  # ~64 expected per position


def test_recall_determinism_and_fixed_validation() -> None:
    task = RecallTask(num_pairs=4, seq_len=40, val_size=150)
    x, t = task.get_batch(16, _gen(5))
    x2, t2 = task.get_batch(16, _gen(5))
    assert torch.equal(x, x2) and torch.equal(t, t2)
    assert not torch.equal(x, task.get_batch(16, _gen(6))[0])
    batches = list(task.eval_batches(32))
    assert [b[0].shape[0] for b in batches] == [32, 32, 32, 32, 22]
    val_x = torch.cat([b[0] for b in batches])
    val_t = torch.cat([b[1] for b in batches])
    assert val_x.shape == (150, 40)
    _check_recall_batch(task, val_x, val_t)
    for batch_size in (1, 64, 500):
        assert torch.equal(torch.cat([b[0] for b in task.eval_batches(batch_size)]), val_x)
    other_seed = RecallTask(num_pairs=4, seq_len=40, val_size=150, val_seed=7)
    assert not torch.equal(torch.cat([b[0] for b in other_seed.eval_batches(150)]), val_x)
    # The first examples do not depend on val_size.
    longer = RecallTask(num_pairs=4, seq_len=40, val_size=300)
    assert torch.equal(torch.cat([b[0] for b in longer.eval_batches(300)])[:150], val_x)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_pairs": 4, "seq_len": 8}, "seq_len"),
        ({"num_keys": 0}, "num_keys"),
        ({"num_values": 0}, "num_values"),
        ({"num_filler": 0}, "num_filler"),
        ({"num_pairs": 0}, "num_pairs"),
        ({"num_keys": 3, "num_pairs": 4}, "num_pairs"),
        ({"val_size": 0}, "val_size"),
        ({"seq_len": True}, "seq_len"),
        ({"num_keys": 2.5}, "num_keys"),
    ],
)
def test_recall_argument_errors(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RecallTask(**kwargs)  # type: ignore[arg-type]


def test_recall_minimal_length_and_batch_errors() -> None:
    task = RecallTask(num_keys=3, num_values=2, num_pairs=3, seq_len=7, num_filler=1)
    x, target = task.get_batch(6, _gen(0))
    assert x.shape == (6, 7)
    _check_recall_batch(task, x, target)
    with pytest.raises(ValueError, match="batch_size"):
        task.get_batch(0, _gen(0))
    with pytest.raises(ValueError, match="batch_size"):
        task.eval_batches(0)


# --------------------------------------------------------------------------------------
# resolver
# --------------------------------------------------------------------------------------


def test_load_task_resolves_names(tmp_path: Path) -> None:
    assert TASK_NAMES[:5] == ("chars", "digits", "recall", "stdlib", "masked")
    recall = load_task("recall", num_pairs=2, seq_len=9)
    assert isinstance(recall, RecallTask) and recall.seq_len == 9
    (tmp_path / "a.txt").write_text("hello world\n" * 10)
    chars = load_task("chars", text_path=tmp_path / "a.txt")
    assert isinstance(chars, CharsTask) and chars.train.numel() + chars.val.numel() == 120
    with pytest.raises(
        ValueError, match=r"\['chars', 'digits', 'induction', .*, 'stdlib'\].*'char'"
    ):
        load_task("char")
    with pytest.raises(ValueError, match="'mqar' builds its data from its options only"):
        load_task("mqar")
