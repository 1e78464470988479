"""Image classification data, all offline: bundled, generated, or read from the user's files.

Sources (:func:`load_image_data` picks one by name):

- ``digits``: scikit-learn's bundled 8×8 grey handwritten digits (1 797 images, 10 classes).
- ``shapes``: generated coloured shapes (circle, square, triangle, cross) on a noisy background at
  any resolution; the class is the shape, the colour, or both.
- ``folder``: a directory with one sub-folder per class, read with PIL and resized.
- ``cifar10``: the CIFAR-10 "python version" batches (``data_batch_1`` … ``test_batch``) the user
  downloaded.
- ``mnist``: MNIST-format IDX files (``train-images-idx3-ubyte`` …, optionally ``.gz``).

``load_image_data(..., image_size=S)`` resizes the fixed-size sources too (:func:`resize_splits`).
Every source ends as an :class:`ImageSplits` of float images in [0, 1], shape ``(N, C, H, W)``,
split into train / val / test. :class:`ImageClassificationTask` serves batches to the shared
trainer, normalised with the training set's per-channel mean and std, with optional augmentation
(random crop after zero padding; horizontal flips only where a mirrored image keeps its class).

Shape legend: N images, B batch, C channels, H/W height/width.
"""

from __future__ import annotations

import gzip
import json
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.errors import RunDirError, UserError

__all__ = [
    "DATA_SOURCES",
    "IMAGE_EXTENSIONS",
    "ImageSplits",
    "ImageClassificationTask",
    "load_image_data",
    "load_digits",
    "make_shapes",
    "load_image_folder",
    "load_cifar10",
    "load_mnist",
    "resize_splits",
    "read_image",
    "random_crop",
    "random_flip",
    "normalize",
    "accuracy",
]

DATA_SOURCES = ("digits", "shapes", "folder", "cifar10", "mnist")
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
SHAPE_NAMES = ("circle", "square", "triangle", "cross")
COLOUR_NAMES = {"red": (0.9, 0.15, 0.15), "green": (0.15, 0.8, 0.25), "blue": (0.2, 0.35, 0.95)}
# Mirroring keeps the class of these sources (a digit mirrored is not the same digit).
FLIP_OK = {"digits": False, "mnist": False, "shapes": True, "folder": True, "cifar10": True}


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
        if name not in ("train", "val", "test"):
            raise ValueError(f"unknown split {name!r}; choose 'train', 'val' or 'test'")
        return getattr(self, name)


def _split(
    images: Tensor,
    labels: Tensor,
    classes: list[str],
    name: str,
    seed: int,
    val_frac: float = 0.1,
    test_frac: float = 0.2,
) -> ImageSplits:
    """Shuffle with ``seed`` and cut into train / val / test."""
    n = len(labels)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test, n_val = max(1, round(test_frac * n)), max(1, round(val_frac * n))
    if n - n_test - n_val < 1:
        raise UserError(f"{name}: {n} images are too few to split into train/val/test")
    te, va, tr = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
    return ImageSplits(
        (images[tr], labels[tr]), (images[va], labels[va]), (images[te], labels[te]), classes, name
    )


def _train_val(images: Tensor, labels: Tensor, seed: int, val_frac: float = 0.1):
    n = len(labels)
    if n < 2:
        raise UserError(f"{n} training images are too few to hold out a validation split")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(val_frac * n))
    tr, va = perm[n_val:], perm[:n_val]
    return (images[tr], labels[tr]), (images[va], labels[va])


# ----------------------------------------------------------------------------------------------
# sources


@dataclass
class ImageSettings:
    """What an image classifier's run needs to read new images: class names, the input shape and
    the normalisation (``labels.json`` of the run; the task section of older runs)."""

    classes: list[str]
    image_shape: tuple[int, int, int]  # (channels, height, width)
    mean: list[float]
    std: list[float]
    data: str | None = None

    @classmethod
    def from_run(cls, run_dir: str | Path, config: dict | None = None) -> ImageSettings:
        """Read ``labels.json`` of ``run_dir`` (falling back to config.json's ``task``).

        Raises:
            RunDirError: neither holds the classes, image shape and normalisation.
        """
        path = Path(run_dir) / "labels.json"
        try:
            info = json.loads(path.read_text()) if path.exists() else (config or {}).get("task", {})
            return cls(
                list(info["classes"]),
                tuple(info["image_shape"]),
                list(info["mean"]),
                list(info["std"]),
                info.get("data"),
            )
        except (KeyError, ValueError, TypeError):
            raise RunDirError(
                f"{str(run_dir)!r} lacks labels.json (classes, image shape, normalisation)"
            ) from None


def load_digits(*, seed: int = 0) -> ImageSplits:
    """scikit-learn's 8×8 digits (pixel values 0–16 scaled to [0, 1]), 1 channel, 10 classes."""
    from sklearn.datasets import load_digits as sk_load_digits

    d = sk_load_digits()
    images = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8)
    labels = torch.tensor(d.target, dtype=torch.long)
    return _split(images, labels, [str(i) for i in range(10)], "digits", seed)


def make_shapes(
    n: int = 3000, image_size: int = 32, *, label: str = "shape", seed: int = 0
) -> ImageSplits:
    """Generated images of one coloured shape each on a noisy dark background.

    Position, size, colour shade and noise are random; the class is the shape
    (circle/square/triangle/cross), the colour (red/green/blue) or both (12 classes).

    Args:
        n: total images (split 70/10/20 into train/val/test).
        image_size: side in pixels (any size ≥ 8).
        label: ``shape`` | ``colour`` | ``both``.
        seed: generator seed.

    Raises:
        ValueError: bad ``label`` / ``image_size`` / ``n``.
    """
    if label not in ("shape", "colour", "both"):
        raise ValueError(f"shapes label must be 'shape', 'colour' or 'both', got {label!r}")
    if image_size < 8:
        raise ValueError(f"shapes need image_size >= 8, got {image_size}")
    if n < 10:
        raise ValueError(f"shapes need at least 10 images, got n={n}")
    rng = np.random.default_rng(seed)
    colours = list(COLOUR_NAMES)
    shape_id = rng.integers(0, len(SHAPE_NAMES), n)
    colour_id = rng.integers(0, len(colours), n)
    radius = rng.uniform(0.18, 0.32, n)
    cx = rng.uniform(radius, 1 - radius)
    cy = rng.uniform(radius, 1 - radius)
    coords = (np.arange(image_size) + 0.5) / image_size
    y, x = np.meshgrid(coords, coords, indexing="ij")  # (H, W)
    images = np.empty((n, 3, image_size, image_size), dtype=np.float32)
    for i in range(n):
        dx, dy, r = x - cx[i], y - cy[i], radius[i]
        s = SHAPE_NAMES[shape_id[i]]
        if s == "circle":
            m = dx**2 + dy**2 <= r**2
        elif s == "square":
            m = (np.abs(dx) <= 0.8 * r) & (np.abs(dy) <= 0.8 * r)
        elif s == "triangle":  # apex up: half-width grows linearly from the top
            m = (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
        else:  # cross
            t = r / 3
            m = ((np.abs(dx) <= t) & (np.abs(dy) <= r)) | ((np.abs(dy) <= t) & (np.abs(dx) <= r))
        colour = np.array(COLOUR_NAMES[colours[colour_id[i]]]) * rng.uniform(0.75, 1.0)
        img = rng.uniform(0.0, 0.15, (3, image_size, image_size))
        img[:, m] = colour[:, None] + rng.normal(0, 0.03, (3, int(m.sum())))
        images[i] = np.clip(img, 0.0, 1.0)
    if label == "shape":
        labels, classes = shape_id, list(SHAPE_NAMES)
    elif label == "colour":
        labels, classes = colour_id, colours
    else:
        labels = shape_id * len(colours) + colour_id
        classes = [f"{c} {s}" for s in SHAPE_NAMES for c in colours]
    return _split(
        torch.from_numpy(images),
        torch.tensor(labels, dtype=torch.long),
        classes,
        "shapes",
        seed,
        val_frac=0.1,
        test_frac=0.2,
    )


def read_image(path: str | Path, *, image_size: int | None = None, channels: int = 3) -> Tensor:
    """One image file as ``(C, H, W)`` float32 in [0, 1], optionally resized to a square.

    Args:
        path: an image file PIL can read.
        image_size: resize to ``image_size × image_size`` (bilinear); None keeps the size.
        channels: 1 (grey) or 3 (RGB); the file is converted.

    Raises:
        FileNotFoundError: no such file.
        UserError: the file is not a readable image (the message names it).
    """
    from PIL import Image, UnidentifiedImageError

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
            if image_size is not None and im.size != (image_size, image_size):
                im = im.resize((image_size, image_size), Image.BILINEAR)
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
    return _split(
        torch.stack(images), torch.tensor(labels), [d.name for d in class_dirs], "folder", seed
    )


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="bytes")
    except (pickle.UnpicklingError, EOFError, OSError, ValueError) as err:
        raise UserError(f"cannot read CIFAR-10 batch {str(path)!r}: {err}") from None


def load_cifar10(path: str | Path, *, seed: int = 0) -> ImageSplits:
    """CIFAR-10 from its "python version" files (``data_batch_1..5``, ``test_batch``).

    ``path`` is the ``cifar-10-batches-py`` directory or its parent. Each batch is a pickled dict
    with ``b"data"`` (N, 3072) uint8 rows (1024 red, 1024 green, 1024 blue, row-major 32×32) and
    ``b"labels"``; ``batches.meta`` holds ``b"label_names"``. 10 % of the training images are
    held out for validation; ``test_batch`` is the test split.

    Raises:
        FileNotFoundError: no batches found under ``path``.
        UserError: a batch that is not in this format (the message names the file).
    """
    root = Path(path)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    train_files = sorted(root.glob("data_batch_*"))
    test_file = root / "test_batch"
    if not root.is_dir() or not train_files or not test_file.exists():
        raise FileNotFoundError(
            f"no CIFAR-10 python batches (data_batch_1…5, test_batch) in {str(path)!r}"
        )

    def read(f: Path) -> tuple[Tensor, Tensor]:
        d = _unpickle(f)
        if not isinstance(d, dict):
            raise UserError(f"{str(f)!r} is not a CIFAR-10 batch (a pickled {type(d).__name__})")
        data, labels = d.get(b"data"), d.get(b"labels", d.get(b"fine_labels"))
        if data is None or labels is None:
            raise UserError(f"{str(f)!r} is not a CIFAR-10 batch (needs b'data' and b'labels')")
        data = np.asarray(data, dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise UserError(
                f"{str(f)!r}: CIFAR-10 data must be (N, 3072) with N labels, got "
                f"{data.shape} and {len(labels)} labels"
            )
        y = torch.tensor(list(labels), dtype=torch.long)
        if len(y) and int(y.min()) < 0:
            raise UserError(f"{str(f)!r}: negative class label {int(y.min())}")
        x = torch.from_numpy(data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
        return x, y

    parts = [read(f) for f in train_files]
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    test = read(test_file)
    meta = root / "batches.meta"
    if meta.exists():
        classes = [
            n.decode() if isinstance(n, bytes) else str(n)
            for n in _unpickle(meta).get(b"label_names", [])
        ]
    else:
        classes = []
    n_cls = int(max(int(y.max()), int(test[1].max()))) + 1
    if len(classes) < n_cls:
        classes = [str(i) for i in range(n_cls)]
    train, val = _train_val(x, y, seed)
    return ImageSplits(train, val, test, classes, "cifar10")


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
    train, val = _train_val(x, y, seed)
    n_cls = int(max(int(y.max()), int(test[1].max()))) + 1
    return ImageSplits(train, val, test, [str(i) for i in range(n_cls)], "mnist")


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

    Raises:
        UserError: unknown source, or a missing ``path``.
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


# ----------------------------------------------------------------------------------------------
# augmentation and normalisation


def random_crop(images: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero-pad by ``padding`` pixels and cut a random crop of the original size per image.

    ``(B, C, H, W) -> (B, C, H, W)``; each image is shifted by up to ±padding pixels.
    """
    if padding <= 0:
        return images
    B, C, H, W = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4)  # (B, C, H+2p, W+2p)
    dy = torch.randint(0, 2 * padding + 1, (B,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (B,), generator=generator)
    rows = (dy[:, None] + torch.arange(H))[:, None, :, None].expand(B, C, H, W + 2 * padding)
    out = padded.gather(2, rows)  # (B, C, H, W+2p)
    cols = (dx[:, None] + torch.arange(W))[:, None, None, :].expand(B, C, H, W)
    return out.gather(3, cols)  # (B, C, H, W)


def random_flip(images: Tensor, generator: torch.Generator | None = None, p: float = 0.5) -> Tensor:
    """Mirror each image left–right with probability ``p``."""
    flip = torch.rand(images.shape[0], generator=generator) < p
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def normalize(images: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """``(x − mean_c) / std_c`` per channel."""
    m = torch.tensor(mean, dtype=images.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=images.dtype).view(1, -1, 1, 1)
    return (images - m) / s


@torch.no_grad()
def accuracy(
    model: torch.nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` of ``model`` on already normalised ``images``."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for i in range(0, len(labels), batch_size):
        x, y = images[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
        logits = model(x).float()
        loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(-1) == y).sum())
    model.train(was_training)
    n = max(len(labels), 1)
    return correct / n, loss_sum / n


# ----------------------------------------------------------------------------------------------
# the task


class ImageClassificationTask:
    """Image classification for the shared trainer: batches ``(images (B, C, H, W), labels (B,))``.

    Training batches walk through a fresh permutation of the training set every epoch (seeded by
    ``seed`` and the epoch), so a batch depends only on (seed, step) and resuming is exact.

    Args:
        data: the loaded splits.
        seed: batch order and augmentation seed.
        train_fraction: use only this fraction of the training set (a seeded, class-agnostic subset;
            the inductive-bias experiment grows it).
        augment: random crop (padding ``crop_padding``) and, where sensible, horizontal flips.
            None (default) = on for images of at least 16×16: on 8×8 digits a one-pixel shift
            moves an eighth of the image, which measurably hurts a small ViT.
        crop_padding: pixels of zero padding for the random crop (default ``max(1, H // 8)``).
        source: data source name (stored in config.json); ``source_args`` likewise (path, size...).
    """

    def __init__(
        self,
        data: ImageSplits,
        *,
        seed: int = 0,
        train_fraction: float = 1.0,
        augment: bool | None = None,
        crop_padding: int | None = None,
        source_args: dict | None = None,
    ) -> None:
        if not 0.0 < train_fraction <= 1.0:
            raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
        self.data, self.seed = data, seed
        self.augment = bool(data.train[0].shape[-1] >= 16) if augment is None else bool(augment)
        self.train_fraction = train_fraction
        x, y = data.train
        if train_fraction < 1.0:
            keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 1))
            keep = keep[: max(1, round(train_fraction * len(y)))]
            x, y = x[keep], y[keep]
        self.train_x, self.train_y = x, y
        self.classes = list(data.classes)
        c = x.shape[1]
        self.mean = [float(v) for v in x.transpose(0, 1).reshape(c, -1).mean(1)]
        self.std = [max(float(v), 1e-3) for v in x.transpose(0, 1).reshape(c, -1).std(1)]
        self.flip = FLIP_OK.get(data.name, False)
        self.crop_padding = max(1, x.shape[-1] // 8) if crop_padding is None else crop_padding
        self.source_args = dict(source_args or {})
        self._perms: dict[int, Tensor] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]

    def prepare(self, images: Tensor) -> Tensor:
        """Normalise raw [0, 1] images the way the model was trained."""
        return normalize(images, self.mean, self.std)

    def _perm(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(len(self.train_y), generator=g)}
        return self._perms[epoch]

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> tuple[Tensor, Tensor]:
        """Rank's share of global batch ``step`` of ``split`` (normalised; augmented if train)."""
        per_rank = batch_size // world
        if split == "train":
            n = len(self.train_y)
            pos = step * batch_size + rank * per_rank + torch.arange(per_rank)
            idx = torch.stack([self._perm(int(p) // n)[int(p) % n] for p in pos]) if n else pos
            x, y = self.train_x[idx], self.train_y[idx]
            if self.augment:
                g = torch.Generator().manual_seed((self.seed * 7919 + step) * 131 + rank)
                x = random_crop(x, self.crop_padding, g)
                if self.flip:
                    x = random_flip(x, g)
        else:
            xs, ys = self.data.split(split)
            g = torch.Generator().manual_seed(self.seed * 7919 + step)
            idx = torch.randint(0, len(ys), (batch_size,), generator=g)[
                rank * per_rank : (rank + 1) * per_rank
            ]
            x, y = xs[idx], ys[idx]
        return self.prepare(x), y

    def loss(
        self, model: torch.nn.Module, batch: tuple[Tensor, Tensor], cfg: Any
    ) -> tuple[Tensor, dict[str, float]]:
        """Cross-entropy (with the run's label smoothing) and accuracy."""
        from attnlab.tasks.losses import cross_entropy

        images, labels = batch
        logits = model(images)
        loss = cross_entropy(
            logits.float(), labels, label_smoothing=getattr(cfg, "label_smoothing", 0.0)
        )
        acc = float((logits.argmax(-1) == labels).float().mean())
        return loss, {"acc": acc}

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterable[tuple[Tensor, Tensor]]:
        """The first ``n_batches × batch_size`` validation images, in order (fixed)."""
        x, y = self.data.val
        x = self.prepare(x)

        def it() -> Iterator[tuple[Tensor, Tensor]]:
            for i in range(n_batches):
                s = i * batch_size
                if s >= len(y):
                    break
                yield x[s : s + batch_size], y[s : s + batch_size]

        return list(it())

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Accuracy on the whole validation split."""
        device = next(model.parameters()).device
        acc, _ = accuracy(model, self.prepare(self.data.val[0]), self.data.val[1], device=device)
        return {"val_acc": acc}

    def test_accuracy(
        self, model: torch.nn.Module, *, split: str = "test", device: str | torch.device = "cpu"
    ) -> tuple[float, float]:
        """``(accuracy, loss)`` on a whole split."""
        x, y = self.data.split(split)
        return accuracy(model, self.prepare(x), y, device=device)

    def count(self, batch: tuple[Tensor, Tensor]) -> int:
        return int(batch[1].shape[0])

    def config_dict(self) -> dict:
        return {
            "name": "image",
            "data": self.data.name,
            **self.source_args,
            "seed": self.seed,
            "train_fraction": self.train_fraction,
            "augment": self.augment,
            "crop_padding": self.crop_padding,
            "flip": self.flip,
            "image_shape": list(self.image_shape),
            "classes": self.classes,
            "mean": self.mean,
            "std": self.std,
            "sizes": {s: len(self.data.split(s)[1]) for s in ("train", "val", "test")},
        }

    def save_artifacts(self, run_dir: Path) -> None:
        """``labels.json``: class names, image shape and normalisation (read by ``classify``)."""
        from attnlab.fileio import atomic_write_text

        info = {
            "classes": self.classes,
            "image_shape": list(self.image_shape),
            "mean": self.mean,
            "std": self.std,
            "data": self.data.name,
        }
        atomic_write_text(Path(run_dir) / "labels.json", json.dumps(info, indent=1))
