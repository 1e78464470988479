"""Images split into train / val / test, and resizing every split at once.

Shape legend: N images, C channels, H/W height/width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.errors import UserError

__all__ = ["ImageSplits", "split_images", "hold_out_val", "resize_splits"]


@dataclass
class ImageSplits:
    """Images in [0, 1] ``(N, C, H, W)`` float32 and labels ``(N,)`` int64 for each split."""

    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    classes: list[str]
    name: str

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        return tuple(self.train[0].shape[1:])  # type: ignore[return-value]

    def split(self, name: str) -> tuple[Tensor, Tensor]:
        """``(images, labels)`` of ``train``, ``val`` or ``test``."""
        if name not in ("train", "val", "test"):
            raise ValueError(f"unknown split {name!r}; choose 'train', 'val' or 'test'")
        return getattr(self, name)


def split_images(
    images: Tensor,
    labels: Tensor,
    classes: list[str],
    name: str,
    seed: int,
    val_frac: float = 0.1,
    test_frac: float = 0.2,
) -> ImageSplits:
    """Shuffle with ``seed`` and cut into train / val / test.

    Raises:
        UserError: too few images for three non-empty splits.
    """
    n = len(labels)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test, n_val = max(1, round(test_frac * n)), max(1, round(val_frac * n))
    if n - n_test - n_val < 1:
        raise UserError(f"{name}: {n} images are too few to split into train/val/test")
    te, va, tr = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
    return ImageSplits(
        (images[tr], labels[tr]), (images[va], labels[va]), (images[te], labels[te]), classes, name
    )


def hold_out_val(
    images: Tensor, labels: Tensor, seed: int, val_frac: float = 0.1
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """``(train, val)``: a seeded ``val_frac`` of a dataset's training split held out.

    Raises:
        UserError: fewer than two images.
    """
    n = len(labels)
    if n < 2:
        raise UserError(f"{n} training images are too few to hold out a validation split")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(val_frac * n))
    tr, va = perm[n_val:], perm[:n_val]
    return (images[tr], labels[tr]), (images[va], labels[va])


def resize_splits(splits: ImageSplits, image_size: int) -> ImageSplits:
    """Every split resized to ``image_size × image_size`` (bilinear, antialiased when shrinking).

    For the fixed-size sources (digits 8×8, CIFAR-10 32×32, MNIST 28×28), e.g. to fit MNIST to a
    Swin whose windows need a multiple of 4 tokens per side.
    """
    if splits.image_shape[1:] == (image_size, image_size):
        return splits

    def resize(part: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x = torch.nn.functional.interpolate(
            part[0], size=(image_size, image_size), mode="bilinear", antialias=True
        )  # (N, C, S, S)
        return x.clamp(0.0, 1.0), part[1]

    return ImageSplits(
        resize(splits.train), resize(splits.val), resize(splits.test), splits.classes, splits.name
    )
