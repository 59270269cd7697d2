"""The ``digits`` task: image classification with a ViT, on a fixed stratified split.

The data (:class:`DigitsTask`, :func:`load_digits_task`) are scikit-learn's bundled 8×8 digit
images (10 classes, no download) or the images and labels of a user's ``.npz`` (the ``npz``
option). The task (:class:`Digits`) trains a :class:`~heatformer.models.ViT` on batches of
distinct training images and reports ``test_acc`` and ``test_loss`` on the whole test split.
Its analysis groups each image's mean token state by the image's class (``nc1``).

Every random draw goes through a caller-supplied CPU ``torch.Generator``. Tensors are returned
on the CPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from heatformer import checks as V
from heatformer.lab.tasks._classifier import ClassificationTask
from heatformer.lab.tasks.options import TaskOptions, option

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import Tensor, nn

__all__ = ["VIT_RECIPES", "Digits", "DigitsOptions", "DigitsTask", "load_digits_task"]

#: The ViT settings each ``recipe`` option stands for (fields of
#: :class:`~heatformer.models.ViTConfig`). ``deit3`` is the recipe of the DeiT-3 models of
#: Zhang & Papyan's ViT experiments: pre-LN blocks with QK-norm, LayerScale initialised at
#: 1e-6 on both residual branches, LayerNorm eps 1e-6 everywhere, and no position embedding
#: on the cls token (timm's ``no_embed_class``).
VIT_RECIPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "deit3": {
        "qk_norm": True,
        "layer_scale_init": 1e-6,
        "norm_eps": 1e-6,
        "qk_norm_eps": 1e-6,
        "pos_embed_cls": False,
    },
}


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
        raise V.bad_value("split", f"expected 'train' or 'test', got {split!r}")

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
        import torch

        images, labels = self._split(split)
        V.check_int("batch_size", batch_size, minimum=1)
        if batch_size > labels.numel():
            raise V.bad_value(
                "batch_size",
                f"expected at most {labels.numel()} (size of the {split!r} "
                f"split), got {batch_size}",
            )
        V.check_generator(generator)
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
        V.check_int("batch_size", batch_size, minimum=1)
        return (
            (images[begin : begin + batch_size], labels[begin : begin + batch_size])
            for begin in range(0, labels.numel(), batch_size)
        )


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and check ``images``/``labels`` from an ``.npz`` file."""
    import numpy as np

    if not path.is_file():
        raise V.ArgumentFileNotFoundError("npz_path", f"no such file: {path}")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise V.bad_value(
            "npz_path", f"expected a NumPy .npz archive, got {path} ({error})"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise V.bad_value("npz_path", f"expected a .npz archive of named arrays, got {path}")
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for key in ("images", "labels"):
            if key not in archive.files:
                raise V.bad_value(
                    key,
                    f"expected an array named {key!r} in {path}, got keys {sorted(archive.files)}",
                )
            try:
                arrays[key] = archive[key]
            except ValueError as error:  # object arrays refused with allow_pickle=False
                raise V.bad_value(
                    key,
                    f"expected a numeric array in {path}, got {error}",
                ) from None
    images, labels = arrays["images"], arrays["labels"]

    if images.ndim not in (3, 4):
        raise V.bad_value(
            "images",
            f"expected shape (num, H, W) or (num, C, H, W), got {images.shape}",
        )
    if not (np.issubdtype(images.dtype, np.number) and not np.iscomplexobj(images)):
        raise V.bad_value("images", f"expected a real numeric array, got dtype {images.dtype}")
    if not np.all(np.isfinite(images)):
        raise V.bad_value("images", "expected finite values, got NaN or inf")
    if images.ndim == 3:
        images = images[:, None]  # (num, 1, H, W)
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise V.bad_value(
            "labels",
            f"expected shape ({images.shape[0]},) to match images, got {labels.shape}",
        )
    if np.issubdtype(labels.dtype, np.floating):
        if not np.all(np.isfinite(labels)) or not np.all(labels == np.round(labels)):
            raise V.bad_value("labels", "expected integer class ids, got non-integral floats")
    elif not np.issubdtype(labels.dtype, np.integer) or np.issubdtype(labels.dtype, np.bool_):
        raise V.bad_value("labels", f"expected integer class ids, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise V.bad_value("labels", f"expected non-negative class ids, got {labels.min()}")
    return images, labels


def _check_stratifiable(labels: np.ndarray, test_fraction: float) -> None:
    """Refuse ``labels`` that a stratified split with ``test_fraction`` cannot split: a class
    with fewer than 2 samples, or a part with fewer samples than there are classes."""
    import numpy as np

    num = labels.shape[0]
    counts = np.bincount(labels) if num else np.zeros(0, dtype=np.int64)
    present = counts[counts > 0]
    if present.size == 0 or present.min() < 2:
        raise V.bad_value(
            "labels",
            "expected at least 2 samples of every class for a stratified split, "
            f"got class counts {counts.tolist()}",
        )
    num_test = math.ceil(test_fraction * num)
    if num_test < present.size or num - num_test < present.size:
        raise V.bad_value(
            "test_fraction",
            f"expected train and test parts of at least {present.size} "
            f"samples (one per class) out of {num}, got test_fraction={test_fraction}",
        )


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
    import numpy as np
    import torch
    from sklearn.model_selection import train_test_split

    test_fraction = V.check_fraction("test_fraction", test_fraction)
    V.check_int("seed", seed, minimum=0)
    if npz_path is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images = np.asarray(bunch.images)[:, None]  # (1797, 1, 8, 8)
        labels = np.asarray(bunch.target, dtype=np.int64)  # (1797,)
    else:
        images, labels = _load_npz(Path(npz_path))

    _check_stratifiable(labels, test_fraction)
    num = labels.shape[0]
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
# the task
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DigitsOptions(TaskOptions):
    """Options of the ``digits`` task (``--npz``, ``--patch-size``, ...)."""

    npz: str | None = option(
        None, "an .npz with 'images' (num, [C,] H, W) and 'labels' (num,) "
        "(default: scikit-learn's 8x8 digits)", path=True,
    )  # fmt: skip
    patch_size: int = option(2, "ViT patch size")
    recipe: str = option(
        "plain", "ViT recipe: plain | deit3 (QK-norm, LayerScale 1e-6, LayerNorm eps 1e-6, "
        "no position embedding on the cls token)",
    )  # fmt: skip
    drop_path: float = option(0.0, "ViT stochastic depth rate of the last block")
    analysis_size: int = option(
        512, "images in the analysis batch (capped by the test split)", numbers=False
    )

    def __post_init__(self) -> None:
        for name in ("patch_size", "analysis_size"):
            V.check_positive_int(name, getattr(self, name))
        V.check_choice("recipe", self.recipe, sorted(VIT_RECIPES))
        if not 0.0 <= self.drop_path < 1.0:  # NaN fails too
            raise V.bad_value("drop_path", f"expected a float in [0, 1), got {self.drop_path}")
        if self.npz is not None and not isinstance(self.npz, str):
            raise V.bad_value("npz", f"expected a path or None, got {self.npz!r}")


class Digits(ClassificationTask):
    """Image classification with a ViT (see the module docstring)."""

    name = "digits"
    Options = DigitsOptions
    data_factory = staticmethod(load_digits_task)

    options: DigitsOptions
    data: DigitsTask

    def load_data(self) -> DigitsTask:
        return load_digits_task(self.options.npz)

    def check_data(self) -> None:
        _, height, width = self.data.image_shape
        if height != width:
            raise V.bad_value("npz", f"expected square images, got {height}x{width}")
        if height % self.options.patch_size:
            raise V.bad_value(
                "patch_size",
                f"expected a divisor of the image size {height}, got {self.options.patch_size}",
            )

    def model_config(self, heads: str) -> Any:
        from heatformer.models import ViTConfig

        channels, size, _ = self.data.image_shape
        return ViTConfig(
            image_size=size, patch_size=self.options.patch_size, in_channels=channels,
            num_classes=self.data.num_classes, drop_path=self.options.drop_path,
            **VIT_RECIPES[self.options.recipe], **self.model_kwargs(heads),
        )  # fmt: skip

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import ViT

        return ViT(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.get_batch("train", batch_size, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.eval_batches(256, "test")

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        size = min(self.options.analysis_size, self.data.test_labels.numel())
        return self.data.test_images[:size], self.data.test_labels[:size]
