"""Drawing scenes as RGB images, and reading scene images back as model inputs.

Shape legend: N images, H = W image size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from attnlab.data.images.readers import resize_image
from attnlab.data.scenes.world import COLOURS, Scene
from attnlab.errors import UserError

__all__ = ["BACKGROUND", "render_scene", "images_to_tensor", "read_scene_image"]

BACKGROUND = (20, 20, 20)


def _shape_mask(shape: str, x: float, y: float, r: float, size: int) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] + 0.5  # pixel centres
    if shape == "circle":
        return (xx - x) ** 2 + (yy - y) ** 2 <= r**2
    if shape == "square":
        h = 0.85 * r  # about the circle's area
        return (np.abs(xx - x) <= h) & (np.abs(yy - y) <= h)
    if shape == "triangle":  # apex up, base at y + r
        return (yy >= y - r) & (yy <= y + r) & (np.abs(xx - x) <= (yy - (y - r)) / 2)
    raise ValueError(f"unknown shape {shape!r}")


def render_scene(scene: Scene) -> np.ndarray:
    """Draw ``scene`` as an RGB ``uint8`` array ``(H, W, 3)`` on a dark background."""
    s = scene.image_size
    img = np.empty((s, s, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    for o in scene.objects:
        img[_shape_mask(o.shape, o.x, o.y, scene.radius, s)] = COLOURS[o.colour]
    return img


def images_to_tensor(images: np.ndarray) -> Tensor:
    """``uint8 (N, H, W, 3)`` or ``(H, W, 3)`` -> ``float (N, 3, H, W)`` in [0, 1]."""
    t = torch.from_numpy(np.array(images, dtype=np.uint8))  # a writable copy
    if t.dim() == 3:
        t = t.unsqueeze(0)
    # contiguous: a channels-last view hangs or crashes oneDNN's convolution backward on some
    # CPUs (seen on AMD EPYC with torch 2.13)
    return t.permute(0, 3, 1, 2).float().div_(255.0).contiguous()  # (N, 3, H, W)


def read_scene_image(path: str | Path, image_size: int, *, resize: bool = True) -> Tensor:
    """Read an RGB image file as ``(1, 3, H, W)`` floats of ``image_size`` square.

    An image of another size is resized as ``attnlab classify`` resizes
    (:func:`attnlab.data.images.resize_image`: the 8× copies ``attnlab scene`` writes read back
    as the scene), unless ``resize`` is False.

    Raises:
        UserError: the file is missing, not an image, or of the wrong size and not ``resize``.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"image file {str(path)!r} does not exist")
    if not path.is_file():
        raise UserError(f"{str(path)!r} is not an image file")
    try:
        with Image.open(path) as im:
            # The header gives the size: a wrong-sized (or huge) image is refused undecoded.
            if not resize and im.size != (image_size, image_size):
                raise UserError(
                    f"image {str(path)!r} is {im.size[0]}x{im.size[1]} pixels; this model "
                    f"was trained on {image_size}x{image_size} scenes (drop --no-resize to "
                    "resize it)"
                )
            arr = np.asarray(resize_image(im.convert("RGB"), image_size, image_size))
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as err:
        raise UserError(f"cannot read {str(path)!r} as an image: {err}") from None
    return images_to_tensor(arr)
