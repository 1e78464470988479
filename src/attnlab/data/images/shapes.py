"""Generated images: one coloured shape (circle, square, triangle, cross) on a noisy background.

Any resolution, fully offline; the class is the shape, the colour, or both.

Shape legend: N images, H/W height/width.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.data.images.splits import ImageSplits, split_images

__all__ = ["make_shapes", "relabel_shapes", "SHAPE_NAMES", "COLOUR_NAMES"]

SHAPE_NAMES = ("circle", "square", "triangle", "cross")
COLOUR_NAMES = {"red": (0.9, 0.15, 0.15), "green": (0.15, 0.8, 0.25), "blue": (0.2, 0.35, 0.95)}


def make_shapes(
    n: int = 3000,
    image_size: int = 32,
    *,
    label: str = "shape",
    seed: int = 0,
    val_frac: float = 0.1,
    test_frac: float = 0.2,
) -> ImageSplits:
    """Generated images of one coloured shape each on a noisy dark background.

    Position, size, colour shade and noise are random; the class is the shape
    (circle/square/triangle/cross), the colour (red/green/blue) or both (12 classes).

    Args:
        n: total images (split into train / val / test: by default 70/10/20).
        image_size: side in pixels (any size ≥ 8).
        label: ``shape`` | ``colour`` | ``both``.
        seed: generator seed.
        val_frac, test_frac: shares of the validation and test splits.

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
    return split_images(
        torch.from_numpy(images),
        torch.tensor(labels, dtype=torch.long),
        classes,
        "shapes",
        seed,
        val_frac=val_frac,
        test_frac=test_frac,
    )


def relabel_shapes(splits: ImageSplits, label: str) -> ImageSplits:
    """The same images (shared, not copied) with another class: ``splits`` labelled ``both``
    (class ``shape · 3 + colour``, as :func:`make_shapes` numbers them) relabelled by ``shape``
    (``y // 3``), ``colour`` (``y mod 3``) or left as ``both``.

    Raises:
        ValueError: ``splits`` are not generated shapes labelled ``both``, or an unknown label.
    """
    both = [f"{c} {s}" for s in SHAPE_NAMES for c in COLOUR_NAMES]
    if splits.name != "shapes" or list(splits.classes) != both:
        raise ValueError("relabel_shapes needs generated shapes labelled 'both'")
    k = len(COLOUR_NAMES)
    if label == "both":
        return splits
    if label == "shape":
        classes, f = list(SHAPE_NAMES), (lambda y: y // k)
    elif label == "colour":
        classes, f = list(COLOUR_NAMES), (lambda y: y % k)
    else:
        raise ValueError(f"shapes label must be 'shape', 'colour' or 'both', got {label!r}")
    part = lambda p: (p[0], f(p[1]))  # noqa: E731
    return ImageSplits(part(splits.train), part(splits.val), part(splits.test), classes, "shapes")
