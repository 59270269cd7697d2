"""The ``chars`` task: byte-level language modelling with a GPT, split by file.

The data (:class:`CharsTask`, :func:`load_chars`) are byte streams, a vocabulary of 256 byte
values: by default the ``.py`` source of the running Python's standard library (no download),
split into train and validation *by file*. The task (:class:`Chars`) trains a causal
:class:`~heatformer.models.GPT` on random windows of ``seq_len`` bytes and reports, on fixed
validation windows, ``val_bpc`` (:func:`bits_per_char`) and ``val_loss`` (nats per byte); its
analysis groups tokens by the next byte (:func:`~heatformer.analysis.next_token_separability`).

Every random draw goes through a caller's CPU ``torch.Generator`` (the validation windows are
fixed). Tensors are returned on the CPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from heatformer import checks as V
from heatformer.lab.tasks._corpus import (
    STDLIB_EXCLUDED_DIRS,
    check_byte_stream,
    hash_fraction,
    read_text_prefix,
    stdlib_source_root,
    to_uint8,
    walk_files,
)
from heatformer.lab.tasks.base import NextTokenGrouping
from heatformer.lab.tasks.options import TaskOptions, option

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = [
    "Chars",
    "CharsOptions",
    "CharsTask",
    "bits_per_char",
    "load_chars",
    "stdlib_source_root",
]

_NumberT = TypeVar("_NumberT", float, "torch.Tensor")


def bits_per_char(loss_nats: _NumberT) -> _NumberT:
    """Convert a mean cross-entropy in nats per byte to bits per character.

    Bits per character is ``loss_nats / ln 2``; for the byte-level ``chars`` task a
    "character" is one byte.

    Args:
        loss_nats: mean cross-entropy in nats, a float or a tensor of any shape.

    Returns:
        The same quantity in bits, same type (and shape) as ``loss_nats``.

    Examples:
        >>> import math, torch
        >>> bits_per_char(math.log(2))
        1.0
        >>> bits_per_char(torch.tensor([0.0, 2 * math.log(2)]))
        tensor([0., 2.])
    """
    return loss_nats / math.log(2)


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
        >>> import torch
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
            check_byte_stream(name, getattr(self, name))

    @property
    def vocab_size(self) -> int:
        """Number of token ids: 256, one per byte value."""
        return 256

    def _split(self, split: str) -> torch.Tensor:
        if split == "train":
            return self.train
        if split == "val":
            return self.val
        raise V.bad_value("split", f"expected 'train' or 'val', got {split!r}")

    def _check_seq_len(self, data: torch.Tensor, split: str, seq_len: int) -> None:
        V.check_int("seq_len", seq_len, minimum=1)
        if data.numel() < seq_len + 1:
            raise V.bad_value(
                "seq_len",
                f"expected at most {data.numel() - 1} (the {split!r} split has "
                f"{data.numel()} bytes and a window needs seq_len + 1), got {seq_len}",
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
        starts = self.random_starts(split, batch_size, seq_len, generator)  # (B,)
        return _windows(self._split(split), starts, seq_len)

    def random_starts(
        self,
        split: Literal["train", "val"],
        batch_size: int,
        seq_len: int,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """The ``(B,)`` int64 window starts :meth:`get_batch` draws (the same arguments and
        generator state give the same starts); :meth:`windows` cuts the windows there.

        Raises:
            ValueError: as :meth:`get_batch`.
        """
        import torch

        data = self._split(split)
        V.check_int("batch_size", batch_size, minimum=1)
        self._check_seq_len(data, split, seq_len)
        V.check_generator(generator)
        return torch.randint(0, data.numel() - seq_len, (batch_size,), generator=generator)

    def windows(
        self, split: Literal["train", "val"], starts: torch.Tensor, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` ``(b, N)`` int64: the windows of ``seq_len`` bytes of a split at ``starts``
        ``(b,)`` (each at most ``num_bytes - seq_len - 1``), ``y`` shifted by one byte."""
        data = self._split(split)
        self._check_seq_len(data, split, seq_len)
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
            count = min(count, V.check_int("max_windows", max_windows, minimum=1))
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
        V.check_int("batch_size", batch_size, minimum=1)
        starts = self.eval_starts(seq_len, max_windows)  # (count,)
        count = starts.numel()
        return (
            _windows(self.val, starts[begin : begin + batch_size], seq_len)
            for begin in range(0, count, batch_size)
        )

    def eval_starts(self, seq_len: int, max_windows: int | None = 256) -> torch.Tensor:
        """The ``(count,)`` int64 starts of the validation windows of :meth:`eval_batches`, in
        its order (:meth:`num_eval_windows` of them).

        Raises:
            ValueError: as :meth:`num_eval_windows`.
        """
        import torch

        count = self.num_eval_windows(seq_len, max_windows)
        total = (self.val.numel() - 1) // seq_len
        picks = torch.arange(count) * total // count  # (count,) evenly spaced window ids
        return picks * seq_len  # (count,)


def _windows(
    data: torch.Tensor, starts: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``(x, y)`` windows of ``seq_len`` from ``data`` at ``starts`` (b,)."""
    import torch

    index = starts[:, None] + torch.arange(seq_len + 1)  # (b, N + 1)
    window = data[index].long()  # (b, N + 1)
    return window[:, :-1], window[:, 1:]


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
    V.check_int("max_bytes", max_bytes, minimum=2)
    val_fraction = V.check_fraction("val_fraction", val_fraction)
    root, paths, single = _corpus_paths(text_path)
    files = _read_files(root, paths, max_bytes, single=single)
    source = str(root if not single else paths[0])
    if not files:
        raise V.bad_value(
            "text_path", f"expected non-empty text files, got an empty corpus at {source}"
        )
    if len(files) == 1:
        return _split_by_position(files[0], val_fraction, source)
    return _split_by_hash(files, val_fraction, source)


def _corpus_paths(text_path: str | os.PathLike[str] | None) -> tuple[Path, list[Path], bool]:
    """``(root, files, single)`` of :func:`load_chars`' corpus: the stdlib's ``.py`` files,
    a folder's files, or one file (``single``); relative paths are taken from ``root``."""
    if text_path is None:
        root = stdlib_source_root()
        return root, walk_files(root, suffix=".py", excluded_dirs=STDLIB_EXCLUDED_DIRS), False
    given = Path(text_path)
    if not given.exists():
        raise V.ArgumentFileNotFoundError("text_path", f"no such file or directory: {given}")
    if given.is_dir():
        return given, walk_files(given, suffix=None, excluded_dirs=frozenset()), False
    return given.parent, [given], True


def _read_files(
    root: Path, paths: list[Path], max_bytes: int, *, single: bool
) -> list[tuple[str, bytes]]:
    """``(relative path, bytes)`` of the text files in ``paths``, in order, until ``max_bytes``
    bytes are read (the last file truncated); a file that is not text is skipped, or refused
    when it is the ``single`` file given."""
    files: list[tuple[str, bytes]] = []
    remaining = max_bytes
    for path in paths:
        if remaining == 0:
            break
        data = read_text_prefix(path, remaining)
        if data is None:
            if single:
                raise V.bad_value("text_path", f"expected a UTF-8 text file, got {path}")
            continue
        if data:
            files.append((path.relative_to(root).as_posix(), data))
            remaining -= len(data)
    return files


def _split_by_position(file: tuple[str, bytes], val_fraction: float, source: str) -> CharsTask:
    """A single-file corpus: the last ``ceil(val_fraction * size)`` bytes are validation."""
    name, data = file
    if len(data) < 2:
        raise V.bad_value(
            "text_path",
            f"expected at least 2 bytes of text to split, got {len(data)} in {source}",
        )
    num_val = min(max(math.ceil(val_fraction * len(data)), 1), len(data) - 1)
    return CharsTask(
        train=to_uint8([data[:-num_val]]),
        val=to_uint8([data[-num_val:]]),
        train_files=(name,),
        val_files=(name,),
        source=source,
    )


def _split_by_hash(files: list[tuple[str, bytes]], val_fraction: float, source: str) -> CharsTask:
    """Files whose path hash is below ``val_fraction`` are validation, each split non-empty."""
    scores = [hash_fraction(name) for name, _ in files]
    is_val = [score < val_fraction for score in scores]
    if not any(is_val):
        is_val[min(range(len(files)), key=scores.__getitem__)] = True
    if all(is_val):
        is_val[max(range(len(files)), key=scores.__getitem__)] = False
    train = [item for item, v in zip(files, is_val) if not v]
    val = [item for item, v in zip(files, is_val) if v]
    return CharsTask(
        train=to_uint8([data for _, data in train]),
        val=to_uint8([data for _, data in val]),
        train_files=tuple(name for name, _ in train),
        val_files=tuple(name for name, _ in val),
        source=source,
    )


# --------------------------------------------------------------------------------------
# the task
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CharsOptions(TaskOptions):
    """Options of the ``chars`` task (``--seq-len``, ``--text``, ...)."""

    seq_len: int = option(128, "sequence length")
    text: str | None = option(
        None, "a UTF-8 text file or folder (default: the Python standard library's source)",
        path=True,
    )  # fmt: skip
    max_bytes: int = option(2_000_000, "corpus cap in bytes")
    eval_size: int = option(128, "validation windows")
    analysis_size: int = option(32, "sequences in the analysis batch", numbers=False)

    def __post_init__(self) -> None:
        for name in ("seq_len", "eval_size", "analysis_size"):
            V.check_positive_int(name, getattr(self, name))
        V.check_int("max_bytes", self.max_bytes, minimum=2)
        if self.text is not None and not isinstance(self.text, str):
            raise V.bad_value("text", f"expected a path or None, got {self.text!r}")

    def max_tokens(self) -> int:
        return self.seq_len


class Chars(NextTokenGrouping):
    """Byte-level language modelling with a GPT (see the module docstring); its analysis groups
    tokens by the next byte (:class:`~heatformer.lab.tasks.base.NextTokenGrouping`)."""

    name = "chars"
    Options = CharsOptions
    metric_names: ClassVar[tuple[str, ...]] = ("val_bpc", "val_loss")
    higher_is_better: ClassVar[tuple[bool, ...]] = (False, False)
    eval_loss_name = "val_loss"
    data_factory = staticmethod(load_chars)

    options: CharsOptions
    data: CharsTask

    def load_data(self) -> CharsTask:
        return load_chars(self.options.text, max_bytes=self.options.max_bytes)

    def check_data(self) -> None:
        self.data.num_eval_windows(self.options.seq_len, self.options.eval_size)  # seq_len fits

    def model_config(self, heads: str) -> Any:
        from heatformer.models import GPTConfig

        return GPTConfig(
            vocab_size=self.data.vocab_size, block_size=self.options.seq_len,
            **self.model_kwargs(heads),
        )  # fmt: skip

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import GPT

        return GPT(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.get_batch("train", batch_size, self.options.seq_len, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.eval_batches(64, self.options.seq_len, max_windows=self.options.eval_size)

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        size = self.options.analysis_size
        x, y = next(iter(self.data.eval_batches(size, self.options.seq_len, max_windows=size)))
        return x, y  # (b, N) inputs and their next bytes

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"val_bpc": bits_per_char(loss), "val_loss": loss}
