"""The ``stdlib`` task: which standard-library package a snippet of Python source comes from.

The data (:class:`StdlibTask`, :func:`load_stdlib_task`) are windows of ``seq_len`` bytes of real
Python source (a vocabulary of 256 byte values), each labelled with the package it was cut from:
by default the ``.py`` files of the running Python's standard library (no download). The
classes are the ``num_classes`` largest top-level packages (``encodings``, ``asyncio``,
``email``, ...); each package's files are split into train and test *by file*, so every test
snippet comes from a file never seen in training. The task (:class:`Stdlib`) trains a
bidirectional :class:`~heatformer.models.SequenceClassifier` that mean-pools its tokens, and
reports ``test_acc`` and ``test_loss`` on a fixed test set with the same number of snippets of
every class. Real text, many classes, one label per sequence: the per-layer analysis groups each
snippet's mean token state by its package (``nc1``, Neural Collapse), next to the
within-sequence collapse metrics of every task.

Conventions (one rule, for the standard library and for a folder given as ``root``):

- a *package* is a folder directly under the root that holds an ``__init__.py``, whose name is
  not hidden and not one of the folders the ``chars`` corpus skips (``site-packages``,
  ``dist-packages``, ``__pycache__``, ``test``, ``tests``, ``idle_test``);
- its *files* are its ``.py`` files at any depth (hidden entries and the same folders skipped)
  of at least ``seq_len`` bytes: a shorter file holds no window and is left out, so no snippet
  is ever padded, and no window crosses from one file into another;
- a package with fewer than 2 such files cannot be split and is not a class (in Python 3.11:
  ``collections`` and ``pydoc_data``, one file each);
- the classes are the remaining packages ranked by the bytes of their files, largest first
  (ties by name); class id = rank.

The class set depends on the Python version, because the standard library changes between
versions (``distutils`` is gone in 3.12, ``lib2to3`` in 3.13), and so do all the numbers of a
run. :attr:`StdlibTask.classes` and the per-class file lists :attr:`StdlibTask.train_files` /
:attr:`StdlibTask.test_files` record what a run used.

Every random draw goes through a caller's CPU ``torch.Generator`` (the test set is fixed).
Tensors are returned on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from heatformer import checks as V
from heatformer.lab.tasks._classifier import SequenceClassifierTask
from heatformer.lab.tasks._corpus import (
    STDLIB_EXCLUDED_DIRS,
    check_byte_stream,
    hash_fraction,
    stdlib_source_root,
    to_uint8,
    walk_files,
)
from heatformer.lab.tasks.options import TaskOptions, option

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["Stdlib", "StdlibOptions", "StdlibTask", "load_stdlib_task"]


@dataclass(frozen=True)
class _WindowIndex:
    """Where the windows of one split's byte stream start, class by class.

    The windows of a split are numbered class by class, file by file, then by offset in the
    file: window ``cum[f] + j`` starts at byte ``start[f] + j`` of the stream.
    """

    start: torch.Tensor  # (F,) int64 byte offset of every file in the stream
    cum: torch.Tensor  # (F + 1,) int64 windows before every file (and the total)
    class_first: torch.Tensor  # (C,) int64 number of the first window of every class
    class_count: torch.Tensor  # (C,) int64 windows of every class

    @classmethod
    def of(cls, sizes: tuple[tuple[int, ...], ...], seq_len: int) -> _WindowIndex:
        import torch

        flat = torch.tensor([s for per_class in sizes for s in per_class], dtype=torch.long)
        zero = torch.zeros(1, dtype=torch.long)
        start = torch.cat((zero, flat.cumsum(0)[:-1]))  # (F,)
        cum = torch.cat((zero, (flat - seq_len + 1).cumsum(0)))  # (F + 1,)
        first_file = torch.tensor([0, *[len(p) for p in sizes]], dtype=torch.long).cumsum(0)
        class_first = cum[first_file[:-1]]  # (C,)
        return cls(start, cum, class_first, cum[first_file[1:]] - class_first)

    def starts(self, labels: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
        """Byte offsets ``(b,)`` of window ``ranks[i]`` of class ``labels[i]``."""
        import torch

        number = self.class_first[labels] + ranks  # (b,) window numbers
        file = torch.searchsorted(self.cum, number, right=True) - 1  # (b,) their files
        return self.start[file] + (number - self.cum[file])


@dataclass(frozen=True, eq=False)
class StdlibTask:
    """Snippets of Python source labelled by package, split into train and test by file.

    Build one with :func:`load_stdlib_task` (see the module docstring for what the classes and
    files are). The byte streams ``train`` and ``test`` are the files of each split
    concatenated class by class (in class order), each class's files in the order of its list;
    a snippet (window) of ``seq_len`` bytes always lies inside one file.

    - Training windows (:meth:`get_batch`): a class drawn uniformly (balanced classes), then a
      window drawn uniformly among every window of that class's training files (a file weighted
      by its number of windows, ``size - seq_len + 1``, then a uniform offset).
    - Test windows (:meth:`eval_set`): ``eval_per_class`` per class at evenly spaced positions
      among the class's test windows (window ``k * W // eval_per_class`` of its ``W``; some
      repeat when ``W < eval_per_class``), interleaved class by class (class ``i %
      num_classes``), so every prefix of the set is balanced too.

    Attributes:
        classes: the package names; class id = position.
        train_files: per class, the relative POSIX paths (from the root) of its training files.
        train_sizes: per class, the byte size of each of its training files (``>= seq_len``).
        test_files: per class, its test files; disjoint from every training file.
        test_sizes: per class, the byte size of each of its test files.
        train: the training bytes, shape ``(sum of train_sizes,)``, dtype ``uint8``.
        test: the test bytes, shape ``(sum of test_sizes,)``, dtype ``uint8``.
        seq_len: the window length ``N``.
        eval_per_class: test windows per class.
        source: where the packages came from (the root folder).

    Examples:
        >>> import torch
        >>> data = StdlibTask(
        ...     classes=("a", "b"), train_files=(("a/x.py",), ("b/x.py",)),
        ...     train_sizes=((6,), (6,)), test_files=(("a/y.py",), ("b/y.py",)),
        ...     test_sizes=((4,), (4,)), train=torch.tensor(list(b"aaaaaabbbbbb")).byte(),
        ...     test=torch.tensor(list(b"wxyzWXYZ")).byte(), seq_len=3, eval_per_class=2,
        ...     source="<bytes>")
        >>> x, y = data.eval_set()
        >>> [bytes(row).decode() for row in x.tolist()], y.tolist()
        (['wxy', 'WXY', 'xyz', 'XYZ'], [0, 1, 0, 1])
        >>> x, y = data.get_batch(4, torch.Generator().manual_seed(0))
        >>> all(bytes(row) == (b"aaa", b"bbb")[label] for row, label in zip(x.tolist(), y))
        True
    """

    classes: tuple[str, ...]
    train_files: tuple[tuple[str, ...], ...]
    train_sizes: tuple[tuple[int, ...], ...]
    test_files: tuple[tuple[str, ...], ...]
    test_sizes: tuple[tuple[int, ...], ...]
    train: torch.Tensor
    test: torch.Tensor
    seq_len: int
    eval_per_class: int
    source: str
    _index: dict[str, _WindowIndex] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        V.check_int("seq_len", self.seq_len, minimum=1)
        V.check_int("eval_per_class", self.eval_per_class, minimum=1)
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise V.bad_value("classes", f"expected distinct class names, got {self.classes!r}")
        for split in ("train", "test"):
            files, sizes = getattr(self, f"{split}_files"), getattr(self, f"{split}_sizes")
            data = getattr(self, split)
            if len(files) != len(self.classes) or len(sizes) != len(self.classes):
                raise V.bad_value(
                    f"{split}_files",
                    f"expected one list of files and of sizes per class ({len(self.classes)}), "
                    f"got {len(files)} and {len(sizes)}",
                )
            for name, names, lengths in zip(self.classes, files, sizes, strict=True):
                if not names or len(names) != len(lengths):
                    raise V.bad_value(
                        f"{split}_files",
                        f"expected at least one file, and one size per file, for class "
                        f"{name!r}, got {len(names)} files and {len(lengths)} sizes",
                    )
                if min(lengths) < self.seq_len:
                    raise V.bad_value(
                        f"{split}_sizes",
                        f"expected files of at least seq_len={self.seq_len} bytes, got "
                        f"{min(lengths)} in class {name!r}",
                    )
            total = sum(sum(lengths) for lengths in sizes)
            check_byte_stream(split, data)
            if data.numel() != total:
                raise V.bad_value(
                    split, f"expected {total} bytes (the sum of its file sizes), got {data.numel()}"
                )
        shared = {f for names in self.train_files for f in names} & {
            f for names in self.test_files for f in names
        }
        if shared:
            raise V.bad_value(
                "test_files", f"expected files disjoint from train_files, got {sorted(shared)}"
            )
        index = {
            split: _WindowIndex.of(getattr(self, f"{split}_sizes"), self.seq_len)
            for split in ("train", "test")
        }
        object.__setattr__(self, "_index", index)

    @property
    def vocab_size(self) -> int:
        """Number of token ids: 256, one per byte value."""
        return 256

    @property
    def num_classes(self) -> int:
        """Number of classes (packages)."""
        return len(self.classes)

    def num_windows(self, split: str) -> tuple[int, ...]:
        """Per class, the number of distinct windows of ``split`` (``"train"`` or ``"test"``)."""
        if split not in self._index:
            raise V.bad_value("split", f"expected 'train' or 'test', got {split!r}")
        return tuple(int(n) for n in self._index[split].class_count)

    def _windows(self, split: str, labels: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
        import torch

        starts = self._index[split].starts(labels, ranks)  # (b,)
        stream = self.train if split == "train" else self.test
        return stream[starts[:, None] + torch.arange(self.seq_len)].long()  # (b, N)

    def get_batch(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw a training batch: a class uniformly, then one of its training windows uniformly.

        Args:
            batch_size: number of snippets ``B``.
            generator: CPU generator that drives the sampling (the only source of randomness:
                the same state gives the same batch).

        Returns:
            ``(x, labels)``: ``(B, N)`` int64 byte values and ``(B,)`` int64 class ids.

        Raises:
            ValueError: a non-positive ``batch_size``, or a generator not on the CPU.
        """
        import torch

        V.check_int("batch_size", batch_size, minimum=1)
        V.check_generator(generator)
        count = self._index["train"].class_count
        labels = torch.randint(self.num_classes, (batch_size,), generator=generator)  # (B,)
        uniform = torch.rand(batch_size, generator=generator, dtype=torch.float64)  # (B,)
        ranks = (uniform * count[labels].double()).long()  # (B,) in [0, count)
        ranks = torch.minimum(ranks, count[labels] - 1)  # against rounding up to count
        return self._windows("train", labels, ranks), labels

    def eval_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed test set: ``eval_per_class`` windows per class, interleaved by class.

        Returns:
            ``(x, labels)``: ``(num_classes * eval_per_class, N)`` int64 byte values and
            ``(num_classes * eval_per_class,)`` int64 class ids, ``labels[i] = i % num_classes``.
        """
        import torch

        size = self.num_classes * self.eval_per_class
        position = torch.arange(size)  # (M,)
        labels, k = position % self.num_classes, position // self.num_classes  # (M,), (M,)
        ranks = k * self._index["test"].class_count[labels] // self.eval_per_class  # (M,)
        return self._windows("test", labels, ranks), labels

    def eval_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate over :meth:`eval_set` in batches of ``batch_size`` (the last may be smaller).

        Yields:
            ``(x, labels)``: ``(b, N)`` and ``(b,)`` int64, ``b <= batch_size``.
        """
        V.check_int("batch_size", batch_size, minimum=1)
        x, labels = self.eval_set()
        return (
            (x[begin : begin + batch_size], labels[begin : begin + batch_size])
            for begin in range(0, labels.numel(), batch_size)
        )


def _package_files(root: Path, seq_len: int) -> dict[str, list[tuple[str, Path, int]]]:
    """Package name -> its files ``(relative path, path, size)`` of at least ``seq_len`` bytes."""
    packages: dict[str, list[tuple[str, Path, int]]] = {}
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        name = folder.name
        if name.startswith(".") or name in STDLIB_EXCLUDED_DIRS:
            continue
        if not (folder.is_dir() and (folder / "__init__.py").is_file()):
            continue
        found = []
        for path in walk_files(folder, suffix=".py", excluded_dirs=STDLIB_EXCLUDED_DIRS):
            size = path.stat().st_size
            if size >= seq_len:
                found.append((path.relative_to(root).as_posix(), path, size))
        packages[name] = found
    return packages


def _split_files(files: list[tuple[str, Path, int]], test_fraction: float) -> list[bool]:
    """Whether each file goes to test: in order of path hash, those that fit the byte budget."""
    budget = test_fraction * sum(size for _, _, size in files)
    order = sorted(range(len(files)), key=lambda i: hash_fraction(files[i][0]))
    is_test = [False] * len(files)
    used = 0
    for i in order:
        if used + files[i][2] <= budget:
            is_test[i] = True
            used += files[i][2]
    if not any(is_test):  # every file is larger than the budget: the first in hash order
        is_test[order[0]] = True
    return is_test


def _classes(
    folder: Path, seq_len: int, num_classes: int
) -> dict[str, list[tuple[str, Path, int]]]:
    """The ``num_classes`` largest packages that can be split, largest first, with their files.

    Raises:
        ValueError: no package can be split, or fewer than ``num_classes``.
    """
    packages = _package_files(folder, seq_len)
    splittable = {name: files for name, files in packages.items() if len(files) >= 2}
    if not splittable:
        raise V.bad_value(
            "root",
            "expected package folders (with an __init__.py) holding at least 2 .py files of "
            f"seq_len={seq_len} bytes or more, got none in {folder}",
        )
    ranked = sorted(splittable, key=lambda n: (-sum(s for _, _, s in splittable[n]), n))
    if len(ranked) < num_classes:
        raise V.bad_value(
            "num_classes",
            f"expected at most {len(ranked)}, the packages in {folder} with at least 2 .py "
            f"files of seq_len={seq_len} bytes or more ({', '.join(ranked)}), got {num_classes}",
        )
    return {name: splittable[name] for name in ranked[:num_classes]}


def load_stdlib_task(
    root: str | os.PathLike[str] | None = None,
    *,
    num_classes: int = 16,
    seq_len: int = 128,
    eval_per_class: int = 32,
    test_fraction: float = 0.2,
) -> StdlibTask:
    """Load the package-classification data: the largest packages, split into train and test.

    The packages, their files and the ranking follow the module docstring. Each class's files
    are then split by file: in increasing order of a SHA-256 hash of their relative paths, a
    file goes to test when it fits in what is left of a budget of ``test_fraction`` of the
    class's bytes (if no file fits, the first file in that order goes to test); the others are
    the training files. A class therefore has at least one file on each side, its test part
    holds at most ``test_fraction`` of its bytes unless a single file is larger, and the split
    depends only on the files taken, those of at least ``seq_len`` bytes (no seed).

    Args:
        root: a folder of packages; ``None`` for the running Python's standard library
            (:func:`~heatformer.lab.tasks.stdlib_source_root`).
        num_classes: how many of the largest packages are the classes (at least 2).
        seq_len: bytes per snippet ``N``.
        eval_per_class: test snippets per class.
        test_fraction: the share of each class's bytes that goes to test, in ``(0, 1)``.

    Returns:
        The :class:`StdlibTask`.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: ``root`` is not a folder or holds no package that can be split, fewer than
            ``num_classes`` packages can be split (the message says how many and which), or an
            argument is out of range.
    """
    V.check_int("num_classes", num_classes, minimum=2)
    V.check_int("seq_len", seq_len, minimum=1)
    V.check_int("eval_per_class", eval_per_class, minimum=1)
    test_fraction = V.check_fraction("test_fraction", test_fraction)
    if root is None:
        folder = stdlib_source_root()
    else:
        folder = Path(root)
        if not folder.exists():
            raise V.ArgumentFileNotFoundError("root", f"no such folder: {folder}")
        if not folder.is_dir():
            raise V.bad_value("root", f"expected a folder of packages, got the file {folder}")

    classes = _classes(folder, seq_len, num_classes)
    names: dict[bool, list[tuple[str, ...]]] = {False: [], True: []}  # is test -> per class
    sizes: dict[bool, list[tuple[int, ...]]] = {False: [], True: []}
    chunks: dict[bool, list[bytes]] = {False: [], True: []}
    for files in classes.values():
        is_test = _split_files(files, test_fraction)
        for side in (False, True):
            chosen = [
                (rel, path.read_bytes())
                for (rel, path, _), test in zip(files, is_test, strict=True)
                if test == side
            ]
            names[side].append(tuple(rel for rel, _ in chosen))
            sizes[side].append(tuple(len(data) for _, data in chosen))
            chunks[side].extend(data for _, data in chosen)
    return StdlibTask(
        classes=tuple(classes),
        train_files=tuple(names[False]),
        train_sizes=tuple(sizes[False]),
        test_files=tuple(names[True]),
        test_sizes=tuple(sizes[True]),
        train=to_uint8(chunks[False]),
        test=to_uint8(chunks[True]),
        seq_len=seq_len,
        eval_per_class=eval_per_class,
        source=str(folder),
    )


# --------------------------------------------------------------------------------------
# the task
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StdlibOptions(TaskOptions):
    """Options of the ``stdlib`` task (``--num-classes``, ``--seq-len``, ``--root``, ...)."""

    num_classes: int = option(16, "number of classes: the largest packages (at least 2)")
    seq_len: int = option(128, "sequence length")
    eval_per_class: int = option(32, "test snippets per class")
    analysis_size: int = option(
        256, "sequences in the analysis batch (capped by the test set)", numbers=False
    )
    root: str | None = option(
        None, "a folder of packages, one class per folder with an __init__.py "
        "(default: the Python standard library)", path=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        V.check_int("num_classes", self.num_classes, minimum=2)
        for name in ("seq_len", "eval_per_class", "analysis_size"):
            V.check_positive_int(name, getattr(self, name))
        if self.root is not None and not isinstance(self.root, str):
            raise V.bad_value("root", f"expected a path or None, got {self.root!r}")

    def max_tokens(self) -> int:
        return self.seq_len


class Stdlib(SequenceClassifierTask):
    """Which package a source snippet comes from, with a bidirectional mean-pooling classifier.

    See the module docstring. The analysis pools each snippet's token states by their mean
    (:meth:`SequenceClassifierTask.pooled` with ``pool="mean"``), what the classifier reads.
    """

    name = "stdlib"
    Options = StdlibOptions
    data_factory = staticmethod(load_stdlib_task)

    options: StdlibOptions
    data: StdlibTask

    def load_data(self) -> StdlibTask:
        o = self.options
        return load_stdlib_task(
            o.root, num_classes=o.num_classes, seq_len=o.seq_len, eval_per_class=o.eval_per_class
        )

    def check_data(self) -> None:
        # the graph kinds were checked against options.max_tokens(): the windows must agree
        if self.data.seq_len != self.options.seq_len:
            raise V.bad_value(
                "seq_len",
                f"expected data with seq_len={self.options.seq_len}, got {self.data.seq_len}",
            )

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        x, labels = self.data.eval_set()
        size = min(self.options.analysis_size, labels.numel())
        return x[:size], labels[:size]  # the first snippets of the test set: balanced
