"""One entry point for every image source: :func:`load_image_data` picks a reader by name.

Shape legend: N images, C channels, H/W height/width.
"""

from __future__ import annotations

import typing
from pathlib import Path

from attnlab.config.vision import ImageSource
from attnlab.data.images.cifar import load_cifar10
from attnlab.data.images.readers import load_digits, load_image_folder, load_mnist
from attnlab.data.images.shapes import make_shapes
from attnlab.data.images.splits import ImageSplits, resize_splits
from attnlab.errors import UserError

__all__ = ["DATA_SOURCES", "FLIP_OK", "load_image_data"]

DATA_SOURCES: tuple[str, ...] = typing.get_args(ImageSource)
#: whether mirroring keeps the class (a digit mirrored is not the same digit)
FLIP_OK = {"digits": False, "mnist": False, "shapes": True, "folder": True, "cifar10": True}


def load_image_data(
    source: str = "digits",
    *,
    path: str | Path | None = None,
    image_size: int | None = None,
    channels: int = 3,
    seed: int = 0,
    shapes_n: int = 3000,
    shapes_label: str = "shape",
) -> ImageSplits:
    """Load one of :data:`DATA_SOURCES` (``path`` for folder/cifar10/mnist).

    Args:
        source: ``digits``, ``shapes``, ``folder``, ``cifar10`` or ``mnist``.
        path: the folder / batches / IDX files of the on-disk sources.
        image_size: square side: folder images are resized to it (default 32), shapes drawn at it
            (default 32), the fixed-size sources resized to it when given.
        channels: channels of folder images.
        seed: split seed.
        shapes_n, shapes_label: see :func:`~attnlab.data.images.make_shapes`.

    Raises:
        UserError: unknown source, a missing ``path``, or a non-positive ``image_size``.
    """
    if source not in DATA_SOURCES:
        raise UserError(f"unknown image data {source!r}; choose from {', '.join(DATA_SOURCES)}")
    if source in ("folder", "cifar10", "mnist") and not path:
        raise UserError(f"--data {source} needs --data-path pointing at the files on disk")
    if image_size is not None and image_size < 1:
        raise UserError(f"image size must be positive, got {image_size}")
    if source == "shapes":
        return make_shapes(shapes_n, image_size or 32, label=shapes_label, seed=seed)
    if source == "folder":
        return load_image_folder(path, image_size=image_size or 32, channels=channels, seed=seed)
    if source == "digits":
        splits = load_digits(seed=seed)
    elif source == "cifar10":
        splits = load_cifar10(path, seed=seed)
    else:
        splits = load_mnist(path, seed=seed)
    return resize_splits(splits, image_size) if image_size else splits
