"""Built-in data for the ``heatformer compare`` experiments.

Three tasks, each one frozen dataclass that owns its data (or its generator settings)
and hands out batches. Nothing here touches the network: the data comes from files
that ship with Python (the standard library's own source code), from scikit-learn's
bundled ``load_digits`` images, from a random generator, or from a path the user gives.

- ``chars`` (:class:`CharsTask`, :func:`load_chars`): byte-level language modelling,
  vocabulary of 256 byte values. Train and validation are split *by file*, so no file
  contributes to both.
- ``digits`` (:class:`DigitsTask`, :func:`load_digits_task`): 8×8 digit images, 10
  classes, a fixed stratified train/test split.
- ``recall`` (:class:`RecallTask`): synthetic associative recall over long sequences,
  generated on the fly; the loss is taken on the final position only.

Conventions:

- ``B`` batch, ``N`` sequence length, ``C``/``H``/``W`` image channels/height/width.
- Every random draw goes through a caller-supplied CPU ``torch.Generator``; the same
  seed gives the same batches. Evaluation batches never use the caller's generator:
  they are a fixed set, so validation numbers are comparable across configurations.
- Tensors are returned on the CPU; move them with ``.to(device)``.
- Bad input raises ``ValueError`` naming the argument, what was expected and what came;
  a missing path raises ``FileNotFoundError`` naming it.

Examples:
    >>> task = load_task("recall", num_pairs=4, seq_len=32)
    >>> x, target = task.get_batch(2, torch.Generator().manual_seed(0))
    >>> tuple(x.shape), tuple(target.shape), x.dtype
    ((2, 32), (2,), torch.int64)
"""

from __future__ import annotations

import codecs
import hashlib
import math
import os
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias, TypeVar

import numpy as np
import torch

__all__ = [
    "TASK_NAMES",
    "CharsTask",
    "DigitsTask",
    "RecallTask",
    "Task",
    "bits_per_char",
    "load_chars",
    "load_digits_task",
    "load_task",
    "stdlib_source_root",
]

_NumberT = TypeVar("_NumberT", float, torch.Tensor)

#: Directory names never entered when collecting the default stdlib corpus.
_STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


# --------------------------------------------------------------------------------------
# argument checks (kept local: this module must not depend on the rest of heatformer)
# --------------------------------------------------------------------------------------


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def _check_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a float in (0, 1), got {value!r}")
    if not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name}: expected a float in (0, 1), got {value}")
    return float(value)


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator: expected a CPU torch.Generator, got {generator.device}")
    return generator


def bits_per_char(loss_nats: _NumberT) -> _NumberT:
    """Convert a mean cross-entropy in nats per byte to bits per character.

    Bits per character is ``loss_nats / ln 2``; for the byte-level ``chars`` task a
    "character" is one byte.

    Args:
        loss_nats: mean cross-entropy in nats, a float or a tensor of any shape.

    Returns:
        The same quantity in bits, same type (and shape) as ``loss_nats``.

    Examples:
        >>> bits_per_char(math.log(2))
        1.0
        >>> bits_per_char(torch.tensor([0.0, 2 * math.log(2)]))
        tensor([0., 2.])
    """
    return loss_nats / math.log(2)


# --------------------------------------------------------------------------------------
# chars: byte-level language modelling
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CharsTask:
    """Byte-level language modelling data, split into train and validation by file.

    Build one with :func:`load_chars`. The byte streams are the concatenation of the
    files of each split, in sorted order of their relative paths.

    Attributes:
        train: training bytes, shape ``(num_train_bytes,)``, dtype ``uint8``.
        val: validation bytes, shape ``(num_val_bytes,)``, dtype ``uint8``.
        train_files: relative paths (POSIX form) of the files in ``train``, sorted.
        val_files: relative paths of the files in ``val``, sorted; disjoint from
            ``train_files`` except for a single-file corpus, whose one file is split
            by position (head for training, tail for validation).
        source: where the corpus came from (a directory or a file path).

    Examples:
        >>> task = CharsTask(
        ...     train=torch.tensor(list(b"abcdefgh"), dtype=torch.uint8),
        ...     val=torch.tensor(list(b"xyz!"), dtype=torch.uint8),
        ...     train_files=("a.txt",), val_files=("b.txt",), source="<bytes>")
        >>> x, y = task.get_batch("train", 2, 3, torch.Generator().manual_seed(0))
        >>> bool((x[:, 1:] == y[:, :-1]).all()), x.dtype
        (True, torch.int64)
        >>> [x.tolist() for x, _ in task.eval_batches(4, 1)]
        [[[120], [121], [122]]]
    """

    train: torch.Tensor
    val: torch.Tensor
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        for name in ("train", "val"):
            data = getattr(self, name)
            if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.ndim != 1:
                got = (
                    f"{data.dtype} tensor of shape {tuple(data.shape)}"
                    if isinstance(data, torch.Tensor)
                    else type(data).__name__
                )
                raise ValueError(f"{name}: expected a 1-D uint8 tensor, got {got}")

    @property
    def vocab_size(self) -> int:
        """Number of token ids: 256, one per byte value."""
        return 256

    def _split(self, split: str) -> torch.Tensor:
        if split == "train":
            return self.train
        if split == "val":
            return self.val
        raise ValueError(f"split: expected 'train' or 'val', got {split!r}")

    def _check_seq_len(self, data: torch.Tensor, split: str, seq_len: int) -> None:
        _check_int("seq_len", seq_len, minimum=1)
        if data.numel() < seq_len + 1:
            raise ValueError(
                f"seq_len: expected at most {data.numel() - 1} (the {split!r} split has "
                f"{data.numel()} bytes and a window needs seq_len + 1), got {seq_len}"
            )

    def get_batch(
        self,
        split: Literal["train", "val"],
        batch_size: int,
        seq_len: int,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample random windows of a split for next-byte prediction.

        Window starts are drawn uniformly (with replacement) from ``generator``, so the
        same generator state gives the same batch.

        Args:
            split: ``"train"`` or ``"val"``.
            batch_size: number of windows ``B``.
            seq_len: window length ``N``; the split must hold at least ``N + 1`` bytes.
            generator: CPU generator that drives the sampling.

        Returns:
            ``(x, y)``, both ``(B, N)`` int64 byte values in ``[0, 256)``, with
            ``y[:, i]`` the byte that follows ``x[:, i]`` (``y`` is ``x`` shifted by one).

        Raises:
            ValueError: unknown ``split``, non-positive ``batch_size``/``seq_len``, or
                ``seq_len`` too long for the split.
        """
        data = self._split(split)
        _check_int("batch_size", batch_size, minimum=1)
        self._check_seq_len(data, split, seq_len)
        _check_generator(generator)
        starts = torch.randint(
            0, data.numel() - seq_len, (batch_size,), generator=generator
        )  # (B,)
        return _windows(data, starts, seq_len)

    def num_eval_windows(self, seq_len: int, max_windows: int | None = 256) -> int:
        """Number of windows :meth:`eval_batches` yields for these arguments.

        Args:
            seq_len: window length ``N``.
            max_windows: cap on the number of windows, ``None`` for no cap.

        Returns:
            ``min((num_val_bytes - 1) // seq_len, max_windows)``.
        """
        self._check_seq_len(self.val, "val", seq_len)
        count = (self.val.numel() - 1) // seq_len
        if max_windows is not None:
            count = min(count, _check_int("max_windows", max_windows, minimum=1))
        return count

    def eval_batches(
        self, batch_size: int, seq_len: int, *, max_windows: int | None = 256
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate over a fixed set of validation windows.

        The validation stream is cut into consecutive non-overlapping windows of
        ``seq_len`` inputs (window ``j`` starts at byte ``j * seq_len``). If there are
        more than ``max_windows`` of them, ``max_windows`` evenly spaced ones are kept.
        The set depends only on the data, ``seq_len`` and ``max_windows`` -- never on a
        seed or on ``batch_size`` -- so losses are comparable across configurations.

        Args:
            batch_size: windows per batch; the last batch may be smaller.
            seq_len: window length ``N``; the validation split must hold ``N + 1`` bytes.
            max_windows: cap on the number of windows, ``None`` to use all.

        Yields:
            ``(x, y)``, both ``(b, N)`` int64 with ``b <= batch_size``; ``y`` is ``x``
            shifted by one byte.

        Raises:
            ValueError: non-positive arguments or ``seq_len`` too long for the split.
        """
        _check_int("batch_size", batch_size, minimum=1)
        count = self.num_eval_windows(seq_len, max_windows)
        total = (self.val.numel() - 1) // seq_len
        picks = torch.arange(count) * total // count  # (count,) evenly spaced window ids
        starts = picks * seq_len  # (count,)
        return (
            _windows(self.val, starts[begin : begin + batch_size], seq_len)
            for begin in range(0, count, batch_size)
        )


def _windows(
    data: torch.Tensor, starts: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(x, y)`` windows of ``seq_len`` from ``data`` at ``starts`` (b,)."""
    index = starts[:, None] + torch.arange(seq_len + 1)  # (b, N + 1)
    window = data[index].long()  # (b, N + 1)
    return window[:, :-1], window[:, 1:]


def stdlib_source_root() -> Path:
    """Directory of the running Python's standard library (the default ``chars`` corpus).

    Returns:
        ``sysconfig.get_paths()["stdlib"]`` as a :class:`~pathlib.Path`.

    Raises:
        FileNotFoundError: the directory does not exist (e.g. a zipped stdlib).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"standard library source directory not found: {root}")
    return root


def _walk_files(root: Path, *, suffix: str | None, excluded_dirs: frozenset[str]) -> list[Path]:
    """All files under ``root``, sorted by POSIX relative path; hidden entries skipped."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in excluded_dirs and not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or (suffix is not None and not name.endswith(suffix)):
                continue
            path = Path(dirpath, name)
            if path.is_file():
                found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


def _read_text_prefix(path: Path, limit: int) -> bytes | None:
    """Read at most ``limit`` bytes of ``path``; ``None`` if it is not UTF-8 text.

    A file counts as text when it has no NUL byte and its bytes decode as UTF-8 (a
    multi-byte character cut by ``limit`` is accepted).
    """
    with path.open("rb") as handle:
        data = handle.read(limit)
        complete = handle.read(1) == b""
    if b"\x00" in data:
        return None
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=complete)
    except UnicodeDecodeError:
        return None
    return data


def _hash_fraction(relpath: str) -> float:
    """A stable number in [0, 1) from a relative path (SHA-256, platform independent)."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _to_uint8(chunks: list[bytes]) -> torch.Tensor:
    """Concatenate byte strings into a 1-D uint8 tensor (which owns its memory)."""
    data = bytearray(b"".join(chunks))
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8)


def load_chars(
    text_path: str | os.PathLike[str] | None = None,
    *,
    max_bytes: int = 2_000_000,
    val_fraction: float = 0.1,
) -> CharsTask:
    """Load the byte-level language-modelling corpus.

    With ``text_path=None`` the corpus is the ``.py`` source of the running Python's
    standard library (:func:`stdlib_source_root`), without ``site-packages``,
    ``dist-packages``, ``__pycache__`` and test directories (``test``, ``tests``,
    ``idle_test``). With a folder, every UTF-8 text file below it (recursively; no NUL
    byte, valid UTF-8; hidden files and folders skipped) is used. With a file, that
    file is used and must be UTF-8 text.

    Files are read in sorted order of their relative POSIX paths until ``max_bytes``
    bytes are collected (the last file is truncated). Each file then goes to
    validation when a SHA-256 hash of its relative path falls below ``val_fraction``,
    else to training, so the split is deterministic, stable as the corpus grows, and no
    file is in both. If the hash leaves a split empty, the file with the smallest
    (for validation) or largest (for training) hash is moved over. A single-file corpus
    is split by position instead: the last ``ceil(val_fraction * size)`` bytes are the
    validation split.

    Note that the default corpus depends on the Python version that runs it.

    Args:
        text_path: a text file or a folder of text files; ``None`` for the stdlib.
        max_bytes: cap on the total number of bytes read.
        val_fraction: fraction of files (in expectation) used for validation.

    Returns:
        The :class:`CharsTask`.

    Raises:
        FileNotFoundError: ``text_path`` does not exist.
        ValueError: the corpus is empty, a given file is not UTF-8 text, a single-file
            corpus has fewer than 2 bytes, or an argument is out of range.
    """
    _check_int("max_bytes", max_bytes, minimum=2)
    val_fraction = _check_fraction("val_fraction", val_fraction)

    if text_path is None:
        root = stdlib_source_root()
        paths = _walk_files(root, suffix=".py", excluded_dirs=_STDLIB_EXCLUDED_DIRS)
        single = False
    else:
        given = Path(text_path)
        if not given.exists():
            raise FileNotFoundError(f"text_path: no such file or directory: {given}")
        if given.is_dir():
            root, single = given, False
            paths = _walk_files(root, suffix=None, excluded_dirs=frozenset())
        else:
            root, single = given.parent, True
            paths = [given]

    files: list[tuple[str, bytes]] = []
    remaining = max_bytes
    for path in paths:
        if remaining == 0:
            break
        data = _read_text_prefix(path, remaining)
        if data is None:
            if single:
                raise ValueError(f"text_path: expected a UTF-8 text file, got {path}")
            continue
        if data:
            files.append((path.relative_to(root).as_posix(), data))
            remaining -= len(data)

    source = str(root if not single else paths[0])
    if not files:
        raise ValueError(f"corpus at {source} is empty: expected non-empty text files, got none")

    if len(files) == 1:
        name, data = files[0]
        if len(data) < 2:
            raise ValueError(
                f"text_path: expected at least 2 bytes of text to split, got {len(data)} "
                f"in {source}"
            )
        num_val = min(max(math.ceil(val_fraction * len(data)), 1), len(data) - 1)
        return CharsTask(
            train=_to_uint8([data[:-num_val]]),
            val=_to_uint8([data[-num_val:]]),
            train_files=(name,),
            val_files=(name,),
            source=source,
        )

    scores = [_hash_fraction(name) for name, _ in files]
    is_val = [score < val_fraction for score in scores]
    if not any(is_val):
        is_val[min(range(len(files)), key=scores.__getitem__)] = True
    if all(is_val):
        is_val[max(range(len(files)), key=scores.__getitem__)] = False
    train = [item for item, v in zip(files, is_val) if not v]
    val = [item for item, v in zip(files, is_val) if v]
    return CharsTask(
        train=_to_uint8([data for _, data in train]),
        val=_to_uint8([data for _, data in val]),
        train_files=tuple(name for name, _ in train),
        val_files=tuple(name for name, _ in val),
        source=source,
    )


# --------------------------------------------------------------------------------------
# digits: small image classification
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DigitsTask:
    """Image classification data with a fixed stratified train/test split.

    Build one with :func:`load_digits_task`.

    Attributes:
        train_images: ``(num_train, C, H, W)`` float32 in ``[0, 1]``.
        train_labels: ``(num_train,)`` int64 in ``[0, num_classes)``.
        test_images: ``(num_test, C, H, W)`` float32 in ``[0, 1]``.
        test_labels: ``(num_test,)`` int64.
        train_index: ``(num_train,)`` int64 positions of the training samples in the
            source arrays, sorted.
        test_index: ``(num_test,)`` int64 positions of the test samples, sorted;
            disjoint from ``train_index``, together they cover every sample.
        num_classes: number of classes (largest label + 1).
    """

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    train_index: torch.Tensor
    test_index: torch.Tensor
    num_classes: int

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        channels, height, width = self.train_images.shape[1:]
        return int(channels), int(height), int(width)

    def _split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split == "train":
            return self.train_images, self.train_labels
        if split == "test":
            return self.test_images, self.test_labels
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")

    def get_batch(
        self, split: Literal["train", "test"], batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample a batch of distinct images of a split.

        Args:
            split: ``"train"`` or ``"test"``.
            batch_size: number of images ``B``, at most the size of the split.
            generator: CPU generator that drives the sampling.

        Returns:
            ``(images, labels)``: ``(B, C, H, W)`` float32 and ``(B,)`` int64.

        Raises:
            ValueError: unknown ``split`` or ``batch_size`` out of range.
        """
        images, labels = self._split(split)
        _check_int("batch_size", batch_size, minimum=1)
        if batch_size > labels.numel():
            raise ValueError(
                f"batch_size: expected at most {labels.numel()} (size of the {split!r} "
                f"split), got {batch_size}"
            )
        _check_generator(generator)
        picks = torch.randperm(labels.numel(), generator=generator)[:batch_size]  # (B,)
        return images[picks], labels[picks]

    def eval_batches(
        self, batch_size: int, split: Literal["train", "test"] = "test"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate over a whole split in its fixed order.

        Args:
            batch_size: images per batch; the last batch may be smaller.
            split: ``"test"`` (default) or ``"train"``.

        Yields:
            ``(images, labels)``: ``(b, C, H, W)`` float32 and ``(b,)`` int64,
            ``b <= batch_size``.
        """
        images, labels = self._split(split)
        _check_int("batch_size", batch_size, minimum=1)
        return (
            (images[begin : begin + batch_size], labels[begin : begin + batch_size])
            for begin in range(0, labels.numel(), batch_size)
        )


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and check ``images``/``labels`` from an ``.npz`` file."""
    if not path.is_file():
        raise FileNotFoundError(f"npz_path: no such file: {path}")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"npz_path: expected a NumPy .npz archive, got {path} ({error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"npz_path: expected a .npz archive of named arrays, got {path}")
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for key in ("images", "labels"):
            if key not in archive.files:
                raise ValueError(
                    f"{key}: expected an array named {key!r} in {path}, "
                    f"got keys {sorted(archive.files)}"
                )
            try:
                arrays[key] = archive[key]
            except ValueError as error:  # object arrays refused with allow_pickle=False
                raise ValueError(
                    f"{key}: expected a numeric array in {path}, got {error}"
                ) from None
    images, labels = arrays["images"], arrays["labels"]

    if images.ndim not in (3, 4):
        raise ValueError(
            f"images: expected shape (num, H, W) or (num, C, H, W), got {images.shape}"
        )
    if not (np.issubdtype(images.dtype, np.number) and not np.iscomplexobj(images)):
        raise ValueError(f"images: expected a real numeric array, got dtype {images.dtype}")
    if not np.all(np.isfinite(images)):
        raise ValueError("images: expected finite values, got NaN or inf")
    if images.ndim == 3:
        images = images[:, None]  # (num, 1, H, W)
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"labels: expected shape ({images.shape[0]},) to match images, got {labels.shape}"
        )
    if np.issubdtype(labels.dtype, np.floating):
        if not np.all(np.isfinite(labels)) or not np.all(labels == np.round(labels)):
            raise ValueError("labels: expected integer class ids, got non-integral floats")
    elif not np.issubdtype(labels.dtype, np.integer) or np.issubdtype(labels.dtype, np.bool_):
        raise ValueError(f"labels: expected integer class ids, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels: expected non-negative class ids, got {labels.min()}")
    return images, labels


def load_digits_task(
    npz_path: str | os.PathLike[str] | None = None,
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DigitsTask:
    """Load an image classification dataset with a fixed stratified split.

    With ``npz_path=None``: scikit-learn's bundled ``load_digits()`` (1797 images of
    8×8 pixels, 10 classes), no download. With a path: a ``.npz`` archive holding
    ``images`` of shape ``(num, H, W)`` or ``(num, C, H, W)`` (any real dtype) and
    ``labels`` of shape ``(num,)`` (integer class ids ``>= 0``).

    Pixel values are rescaled to ``[0, 1]`` with the global minimum and maximum,
    ``(x - min) / (max - min)`` (for the bundled digits, whose values are 0..16, that is
    ``x / 16``); a constant image set becomes all zeros. The split is
    ``sklearn.model_selection.train_test_split(..., stratify=labels, random_state=seed)``;
    both parts are stored in ascending sample order.

    Args:
        npz_path: a user ``.npz`` file, ``None`` for the bundled digits.
        test_fraction: fraction of the samples in the test split, in ``(0, 1)``.
        seed: seed of the split.

    Returns:
        The :class:`DigitsTask`.

    Raises:
        FileNotFoundError: ``npz_path`` does not exist.
        ValueError: a missing key (named), a bad shape or dtype, a class with fewer
            than 2 samples, or an argument out of range.
    """
    from sklearn.model_selection import train_test_split

    test_fraction = _check_fraction("test_fraction", test_fraction)
    _check_int("seed", seed, minimum=0)
    if npz_path is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images = np.asarray(bunch.images)[:, None]  # (1797, 1, 8, 8)
        labels = np.asarray(bunch.target, dtype=np.int64)  # (1797,)
    else:
        images, labels = _load_npz(Path(npz_path))

    num = labels.shape[0]
    counts = np.bincount(labels) if num else np.zeros(0, dtype=np.int64)
    present = counts[counts > 0]
    if present.size == 0 or present.min() < 2:
        raise ValueError(
            "labels: expected at least 2 samples of every class for a stratified split, "
            f"got class counts {counts.tolist()}"
        )
    num_test = math.ceil(test_fraction * num)
    if num_test < present.size or num - num_test < present.size:
        raise ValueError(
            f"test_fraction: expected train and test parts of at least {present.size} "
            f"samples (one per class) out of {num}, got test_fraction={test_fraction}"
        )

    lo, hi = float(images.min()), float(images.max())
    scaled = (images.astype(np.float64) - lo) / (hi - lo) if hi > lo else np.zeros(images.shape)
    train_idx, test_idx = train_test_split(
        np.arange(num), test_size=test_fraction, stratify=labels, random_state=seed
    )
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    image_tensor = torch.from_numpy(scaled.astype(np.float32))  # (num, C, H, W)
    label_tensor = torch.from_numpy(labels)  # (num,)
    train_index = torch.from_numpy(train_idx.astype(np.int64))
    test_index = torch.from_numpy(test_idx.astype(np.int64))
    return DigitsTask(
        train_images=image_tensor[train_index],
        train_labels=label_tensor[train_index],
        test_images=image_tensor[test_index],
        test_labels=label_tensor[test_index],
        train_index=train_index,
        test_index=test_index,
        num_classes=int(labels.max()) + 1,
    )


# --------------------------------------------------------------------------------------
# recall: synthetic associative recall
# --------------------------------------------------------------------------------------

#: Examples generated per random draw when building the fixed validation set; fixed so
#: the set does not depend on the evaluation batch size.
_RECALL_VAL_CHUNK = 64


@dataclass(frozen=True)
class RecallTask:
    """Synthetic associative recall over long sequences, generated on the fly.

    Token ids: keys ``[0, num_keys)``, values ``[num_keys, num_keys + num_values)``,
    filler ``[num_keys + num_values, vocab_size)``. A sequence of length ``seq_len`` is::

        k_1 v_1 k_2 v_2 ... k_P v_P  f f f ... f  q

    with ``P = num_pairs`` distinct keys drawn without replacement, values drawn with
    replacement, filler drawn uniformly from the filler tokens, and the query ``q``
    one of the ``k_i``; the target is the paired ``v_i`` (a token id in the value range).
    Only the final position is scored.

    Attributes:
        num_keys: number of key tokens, at least ``num_pairs``.
        num_values: number of value tokens.
        num_pairs: key/value pairs per sequence ``P``.
        seq_len: sequence length ``N``, at least ``2 * num_pairs + 1``.
        num_filler: number of filler (noise) tokens.
        val_size: number of examples in the fixed validation set.
        val_seed: seed of the validation set (separate from any training generator).

    Examples:
        >>> task = RecallTask(num_keys=4, num_values=4, num_pairs=2, seq_len=8, num_filler=1)
        >>> x, target = task.get_batch(1, torch.Generator().manual_seed(0))
        >>> pairs = dict(zip(x[0, 0:4:2].tolist(), x[0, 1:4:2].tolist()))
        >>> pairs[x[0, -1].item()] == target[0].item(), x[0, 4:7].tolist()
        (True, [8, 8, 8])
    """

    num_keys: int = 64  # key tokens
    num_values: int = 64  # value tokens
    num_pairs: int = 16  # key/value pairs at the start of each sequence
    seq_len: int = 512  # total length, filler fills the gap before the query
    num_filler: int = 16  # distinct filler (noise) tokens
    val_size: int = 512  # examples in the fixed validation set
    val_seed: int = 1_000_003  # seed of the validation set

    def __post_init__(self) -> None:
        _check_int("num_keys", self.num_keys, minimum=1)
        _check_int("num_values", self.num_values, minimum=1)
        _check_int("num_pairs", self.num_pairs, minimum=1)
        _check_int("num_filler", self.num_filler, minimum=1)
        _check_int("val_size", self.val_size, minimum=1)
        _check_int("val_seed", self.val_seed, minimum=0)
        _check_int("seq_len", self.seq_len, minimum=1)
        if self.num_pairs > self.num_keys:
            raise ValueError(
                f"num_pairs: expected at most num_keys={self.num_keys} (keys in a sequence "
                f"are distinct), got {self.num_pairs}"
            )
        if self.seq_len < 2 * self.num_pairs + 1:
            raise ValueError(
                f"seq_len: expected at least 2 * num_pairs + 1 = {2 * self.num_pairs + 1}, "
                f"got {self.seq_len}"
            )

    @property
    def vocab_size(self) -> int:
        """Total number of token ids: ``num_keys + num_values + num_filler``."""
        return self.num_keys + self.num_values + self.num_filler

    @property
    def num_classes(self) -> int:
        """Alias of :attr:`vocab_size`: targets are token ids of the full vocabulary."""
        return self.vocab_size

    def _generate(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        num_pairs, num_keys = self.num_pairs, self.num_keys
        keys = torch.rand(batch_size, num_keys, generator=generator).argsort(dim=1)
        keys = keys[:, :num_pairs]  # (B, P) distinct keys per row
        values = num_keys + torch.randint(
            self.num_values, (batch_size, num_pairs), generator=generator
        )  # (B, P)
        filler = (num_keys + self.num_values) + torch.randint(
            self.num_filler, (batch_size, self.seq_len - 2 * num_pairs - 1), generator=generator
        )  # (B, N - 2P - 1)
        which = torch.randint(num_pairs, (batch_size, 1), generator=generator)  # (B, 1)
        query = keys.gather(1, which)  # (B, 1)
        target = values.gather(1, which).squeeze(1)  # (B,)
        pairs = torch.stack((keys, values), dim=2).reshape(batch_size, 2 * num_pairs)  # (B, 2P)
        x = torch.cat((pairs, filler, query), dim=1)  # (B, N)
        return x, target

    def get_batch(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generate a fresh training batch.

        Args:
            batch_size: number of sequences ``B``.
            generator: CPU generator that drives the sampling.

        Returns:
            ``(x, target)``: ``x`` is ``(B, N)`` int64 token ids, ``target`` is ``(B,)``
            int64, the value token paired with the query ``x[:, -1]``; predict it from
            the output at the last position.
        """
        _check_int("batch_size", batch_size, minimum=1)
        x, target = self._generate(batch_size, _check_generator(generator))
        return x, target

    def eval_batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate over the fixed validation set of ``val_size`` examples.

        The set is drawn from a generator seeded with ``val_seed``, in chunks of a fixed
        size, so it is the same for every ``batch_size`` and every call.

        Args:
            batch_size: sequences per batch; the last batch may be smaller.

        Yields:
            ``(x, target)``: ``(b, N)`` and ``(b,)`` int64, ``b <= batch_size``.
        """
        _check_int("batch_size", batch_size, minimum=1)
        return _rebatch(self._val_chunks(), batch_size)

    def _val_chunks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(self.val_seed)
        for begin in range(0, self.val_size, _RECALL_VAL_CHUNK):
            x, target = self._generate(_RECALL_VAL_CHUNK, generator)
            keep = min(_RECALL_VAL_CHUNK, self.val_size - begin)
            yield x[:keep], target[:keep]


def _rebatch(
    chunks: Iterator[tuple[torch.Tensor, torch.Tensor]], batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Regroup ``(x, target)`` chunks of any sizes into batches of ``batch_size``."""
    xs: list[torch.Tensor] = []
    ts: list[torch.Tensor] = []
    buffered = 0
    for x, target in chunks:
        xs.append(x)
        ts.append(target)
        buffered += target.numel()
        while buffered >= batch_size:
            x_all, t_all = torch.cat(xs), torch.cat(ts)  # (buffered, N), (buffered,)
            yield x_all[:batch_size], t_all[:batch_size]
            xs, ts = [x_all[batch_size:]], [t_all[batch_size:]]
            buffered -= batch_size
    if buffered:
        yield torch.cat(xs), torch.cat(ts)


# --------------------------------------------------------------------------------------
# resolver
# --------------------------------------------------------------------------------------

#: A built-in task.
Task: TypeAlias = CharsTask | DigitsTask | RecallTask

_FACTORIES: dict[str, Callable[..., Task]] = {
    "chars": load_chars,
    "digits": load_digits_task,
    "recall": RecallTask,
}

#: Names accepted by :func:`load_task`.
TASK_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def load_task(name: str, **kwargs: Any) -> Task:
    """Build a built-in task from its name (the CLI/config boundary).

    Args:
        name: ``"chars"`` (:func:`load_chars`), ``"digits"`` (:func:`load_digits_task`)
            or ``"recall"`` (:class:`RecallTask`).
        **kwargs: keyword arguments of that factory.

    Returns:
        The task object.

    Raises:
        ValueError: unknown ``name`` (the valid names are listed).
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"name: expected one of {list(TASK_NAMES)}, got {name!r}")
    return factory(**kwargs)
