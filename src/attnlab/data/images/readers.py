"""Image files on disk and bundled datasets: single files, class folders, MNIST IDX files and
scikit-learn's digits. (CIFAR-10's pickled batches have their own reader: :mod:`.cifar`.)

Every reader returns images in [0, 1], ``(N, C, H, W)`` float32 (one image: ``(C, H, W)``).
None of them unpickles or executes anything from the files it reads.

Shape legend: N images, C channels, H/W height/width.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from attnlab.data.images.splits import ImageSplits, hold_out_val, split_images
from attnlab.errors import UserError

__all__ = [
    "IMAGE_EXTENSIONS",
    "read_image",
    "resize_image",
    "load_image_folder",
    "load_digits",
    "load_mnist",
]

IMAGE_EXTENSIONS = (
    ".png",
    ".jpg",
    ".jpeg",
    ".bmp",
    ".gif",
    ".tif",
    ".tiff",
    ".webp",
    ".ppm",
    ".pgm",
)


def load_digits(*, seed: int = 0) -> ImageSplits:
    """scikit-learn's 8×8 digits (pixel values 0–16 scaled to [0, 1]), 1 channel, 10 classes."""
    # lazy: scikit-learn takes a second or more to import; only this data set needs it
    from sklearn.datasets import load_digits as sk_load_digits

    d = sk_load_digits()
    images = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8)
    labels = torch.tensor(d.target, dtype=torch.long)
    return split_images(images, labels, [str(i) for i in range(10)], "digits", seed)


def resize_image(im, width: int, height: int):
    """A PIL image resized to ``width × height`` the one way every command reads images.

    A whole-number reduction (the 8× copies ``attnlab samples`` and ``attnlab scene`` write) is
    a box filter: each output pixel is the mean of its block, so an enlarged copy reads back as
    the original. Any other size is bilinear (PIL's, which widens the filter when shrinking).
    """
    if im.size == (width, height):
        return im
    fx, fy = im.size[0] / width, im.size[1] / height
    whole = fx == fy and fx >= 1 and fx == int(fx)
    return im.resize((width, height), Image.BOX if whole else Image.BILINEAR)


def read_image(path: str | Path, *, image_size: int | None = None, channels: int = 3) -> Tensor:
    """One image file as ``(C, H, W)`` float32 in [0, 1], optionally resized to a square.

    Args:
        path: an image file PIL can read.
        image_size: resize to ``image_size × image_size`` (:func:`resize_image`); None keeps
            the size.
        channels: 1 (grey) or 3 (RGB); the file is converted.

    Raises:
        FileNotFoundError: no such file.
        UserError: the file is not a readable image (the message names it).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"image file {str(path)!r} does not exist")
    if path.is_dir():
        raise UserError(f"{str(path)!r} is a directory, not an image file")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            if image_size is not None:
                im = resize_image(im, image_size, image_size)
            arr = np.asarray(im, dtype=np.float32) / 255.0
    except (
        UnidentifiedImageError,
        Image.DecompressionBombError,
        OSError,
        SyntaxError,
        ValueError,
    ) as err:
        raise UserError(f"cannot read image {str(path)!r}: {err}") from None
    t = torch.from_numpy(arr.copy())
    return t[None] if channels == 1 else t.permute(2, 0, 1)  # (C, H, W)


def load_image_folder(
    root: str | Path, *, image_size: int = 32, channels: int = 3, seed: int = 0
) -> ImageSplits:
    """A folder with one sub-folder of images per class (``root/cat/1.png`` …), resized.

    Sub-folders are the classes in sorted order. Files with other extensions are ignored.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        UserError: no class sub-folders, an empty class folder, or an unreadable image (each
            message names the folder or file).
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise UserError(f"{str(root)!r} is not a directory of class sub-folders")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise UserError(
            f"image folder {str(root)!r} has no class sub-folders "
            "(expected root/<class>/<image files>)"
        )
    images, labels = [], []
    for k, d in enumerate(class_dirs):
        files = sorted(
            f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not files:
            raise UserError(
                f"class folder {str(d)!r} contains no images "
                f"(extensions {', '.join(IMAGE_EXTENSIONS)})"
            )
        for f in files:
            images.append(read_image(f, image_size=image_size, channels=channels))
            labels.append(k)
    return split_images(
        torch.stack(images), torch.tensor(labels), [d.name for d in class_dirs], "folder", seed
    )


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format): big-endian magic 0x0000 <type> <ndim>, dims, then the data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise UserError(f"cannot read IDX file {str(path)!r}: {err}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise UserError(f"{str(path)!r} is not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(raw) != header + int(np.prod(dims)):
        raise UserError(
            f"{str(path)!r}: IDX header promises dims {dims} but the file has "
            f"{len(raw) - header} data bytes"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find(root: Path, stem: str) -> Path:
    dotted = stem.replace("-idx", ".idx")  # some mirrors name them train-images.idx3-ubyte
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (root / name).exists():
            return root / name
    raise FileNotFoundError(f"MNIST file {stem} (or {stem}.gz) not found in {str(root)!r}")


def load_mnist(path: str | Path, *, seed: int = 0) -> ImageSplits:
    """MNIST (or Fashion-MNIST) from its four IDX files, optionally gzipped.

    10 % of the training images are held out for validation; ``t10k`` is the test split.

    Raises:
        FileNotFoundError: a file is missing. UserError: a file is not in IDX format.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"MNIST directory {str(root)!r} does not exist")

    def pair(prefix: str) -> tuple[Tensor, Tensor]:
        ip = _find(root, f"{prefix}-images-idx3-ubyte")
        lp = _find(root, f"{prefix}-labels-idx1-ubyte")
        x, y = _read_idx(ip), _read_idx(lp)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise UserError(f"MNIST files {ip.name} {x.shape} and {lp.name} {y.shape} do not match")
        return (
            torch.from_numpy(x.astype(np.float32) / 255.0)[:, None],
            torch.from_numpy(y.astype(np.int64)),
        )

    x, y = pair("train")
    test = pair("t10k")
    train, val = hold_out_val(x, y, seed)
    n_cls = int(max(int(y.max()), int(test[1].max()))) + 1
    return ImageSplits(train, val, test, [str(i) for i in range(n_cls)], "mnist")
