"""Images in and out of the explorer: bytes (a file, or an upload to the local server) to the
model's input, and the shown image back to an inline ``data:`` URL (the page loads nothing).

Shape legend: C channels, H/W pixels.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from attnlab.data.images.readers import resize_image
from attnlab.errors import UserError

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_IMAGE_BYTES",
    "looks_like_image",
    "decode_image",
    "png_bytes",
    "png_data_url",
]

#: file name endings read as images by ``attnlab explore --input``
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".ppm", ".pgm", ".tif", ".tiff")
#: largest image file the explorer reads (the server refuses bigger uploads)
MAX_IMAGE_BYTES = 8 * 1024 * 1024
_MAX_PIXELS = 40_000_000  # refuse decompression bombs before decoding them


def looks_like_image(value: str) -> bool:
    """True when ``value`` names an image file (by its ending) rather than being text."""
    return value.lower().endswith(IMAGE_SUFFIXES) and "\n" not in value and len(value) < 4096


def read_image_file(path: str | Path) -> bytes:
    """The bytes of an image file.

    Raises:
        UserError: no such file, a directory, or a file over :data:`MAX_IMAGE_BYTES`.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"image file {str(path)!r} does not exist")
    if not path.is_file():
        raise UserError(f"{str(path)!r} is not an image file")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise UserError(f"image {str(path)!r} is larger than {MAX_IMAGE_BYTES // 2**20} MB")
    return path.read_bytes()


def decode_image(
    data: bytes, *, size: tuple[int, int], channels: int, name: str = "image"
) -> Tensor:
    """Decode an image and resize it to the model's input: ``(C, H, W)`` float32 in [0, 1].

    Args:
        data: the encoded file (PNG, JPEG...).
        size: ``(H, W)`` the model reads.
        channels: 1 (grey) or 3 (RGB).
        name: how messages name the image.

    Raises:
        UserError: empty, oversized or undecodable data.
    """
    if not data:
        raise UserError(f"{name} is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise UserError(f"{name} is larger than {MAX_IMAGE_BYTES // 2**20} MB")
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.size[0] * im.size[1] > _MAX_PIXELS:
                raise UserError(f"{name} is {im.size[0]}×{im.size[1]} pixels: too large")
            im = im.convert("L" if channels == 1 else "RGB")
            h, w = size
            im = resize_image(im, w, h)  # as classify and caption do
            arr = np.asarray(im, dtype=np.float32) / 255.0
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError) as err:
        raise UserError(f"cannot read {name} as an image: {err}") from None
    t = torch.from_numpy(arr.copy())
    return t[None] if channels == 1 else t.permute(2, 0, 1).contiguous()  # (C, H, W)


def png_bytes(image: Tensor) -> bytes:
    """``(C, H, W)`` in [0, 1] (C = 1 or 3) -> the bytes of a PNG file."""
    a = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    arr = a[0].numpy() if a.shape[0] == 1 else a.permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")  # (H, W) grey or (H, W, 3) RGB
    return buf.getvalue()


def png_data_url(image: Tensor) -> str:
    """``(C, H, W)`` in [0, 1] -> ``data:image/png;base64,...`` (what the page draws)."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def image_payload(image: Tensor) -> dict:
    """The payload's ``image``: ``{"src": data URL, "width", "height"}``."""
    return {"src": png_data_url(image), "width": int(image.shape[2]), "height": int(image.shape[1])}
