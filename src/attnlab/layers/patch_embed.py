"""Images in, tokens out: checking an image batch, and cutting it into projected patches.

Shared by ViT, Swin, the CNN's token view, the captioner and VQA.

Shape legend: B batch, Cin image channels, H/W image height/width, P patch size, Gh/Gw patch-grid
height/width, N = Gh·Gw patches, C d_model.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers.hook import HookPoint

__all__ = ["PatchEmbedding", "check_images"]


def check_images(
    images: Tensor,
    in_channels: int,
    image_size: int | None,
    *,
    multiple_of: int = 1,
    what: str = "model",
) -> None:
    """Raise a :class:`UserError` naming the values when ``images`` cannot go into the model.

    Args:
        images: ``(B, Cin, H, W)``.
        in_channels: the channel count the model was built for.
        image_size: required side, or None to accept any size that is a multiple of ``multiple_of``.
        multiple_of: H and W must be multiples of this (patch size, patch size × window...).
        what: the model's name for the messages.
    """
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise UserError(f"{what} expects images (B, C, H, W), got {shape}")
    _, c, h, w = images.shape
    if c != in_channels:
        raise UserError(
            f"{what} was built for {in_channels}-channel images, got {c} channels "
            f"(images of shape {tuple(images.shape)})"
        )
    if image_size is not None and (h, w) != (image_size, image_size):
        raise UserError(f"{what} was built for {image_size}×{image_size} images, got {h}×{w}")
    if h % multiple_of or w % multiple_of:
        raise UserError(f"image size {h}×{w} is not divisible by {multiple_of} ({what})")


class PatchEmbedding(nn.Module):
    """Cut an image into P×P patches and project each to ``d_model``.

    Flattening a patch and multiplying by W_E (P²·Cin × C) is exactly a convolution with kernel and
    stride P, which is how it is computed (and stored, as in HF/timm).

    Args:
        in_channels: Cin.
        d_model: output width C.
        patch_size: P.
        bias: a bias in the projection (CLIP's has none).
    """

    def __init__(
        self,
        in_channels: int,
        d_model: int,
        patch_size: int,
        *,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(
            in_channels,
            d_model,
            kernel_size=patch_size,
            stride=patch_size,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        self.hook_embed = HookPoint()  # the patch embeddings (B, N, C)

    def forward(self, images: Tensor) -> Tensor:
        """``(B, Cin, H, W) -> (B, N, C)`` with patches numbered row by row."""
        x = self.proj(images)  # (B, C, Gh, Gw)
        return self.hook_embed(x.flatten(2).transpose(1, 2))  # (B, Gh·Gw, C)
