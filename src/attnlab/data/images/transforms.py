"""Augmentation and normalisation of image batches.

Shape legend: B batch, C channels, H/W height/width.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["random_crop", "random_flip", "normalize"]


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
    """``(x − mean_c) / std_c`` per channel of ``(B, C, H, W)`` images."""
    m = torch.tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return (images - m) / s
