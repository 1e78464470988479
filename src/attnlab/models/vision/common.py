"""What ViT and Swin do the same way: blocks with their own Q/K/V bias, initialisation, and the
check of an image batch.

Shape legend: C width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from attnlab.config.base import BlockConfig
from attnlab.layers.block import TransformerBlock
from attnlab.layers.builders import build_block
from attnlab.layers.patch_embed import check_images
from attnlab.layers.position import PatchGridPositions, RelativePositionBias

__all__ = ["build_vision_block", "init_vision_weights", "check_patch_images"]


def build_vision_block(
    config: BlockConfig, *, qkv_bias: bool = True, drop_path: float | None = None
) -> TransformerBlock:
    """``build_block(config, drop_path=...)`` with HF ViT/Swin's ``qkv_bias`` switch.

    ``qkv_bias=False`` removes the bias of the Q/K/V projection only; the output projection, the
    MLP and the norms keep theirs (``config.bias``), as in HF ViT and Swin.
    """
    block = build_block(config, drop_path=drop_path)
    if not qkv_bias:
        qkv = block.attn.qkv
        w = qkv.weight
        block.attn.qkv = nn.Linear(
            qkv.in_features, qkv.out_features, bias=False, device=w.device, dtype=w.dtype
        )
    return block


def init_vision_weights(model: nn.Module, std: float, tokens: Sequence[nn.Parameter] = ()) -> None:
    """Truncated-normal init with std ``std`` (ViT / Swin, as in timm), in this order (the first
    release's, so a seed still gives the same ViT): linear and convolution weights (zero biases)
    and window tables in module order, then the learned ``tokens`` (class token), then learned
    patch-grid positions."""
    grids = []
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, RelativePositionBias):
            nn.init.trunc_normal_(m.table, std=std)
        elif isinstance(m, PatchGridPositions) and isinstance(m.weight, nn.Parameter):
            grids.append(m.weight)
    for p in [*tokens, *grids]:
        nn.init.trunc_normal_(p, std=std)


def check_patch_images(images: Tensor, config: Any, what: str, *, any_size: bool = False) -> None:
    """:func:`~attnlab.layers.check_images` for a patch model's config: ``in_channels`` channels,
    ``image_size`` square (with ``any_size``: any multiple of ``patch_size``).

    Raises:
        UserError: wrong rank, channel count or size (the message names the values).
    """
    c = config
    size = None if any_size else c.image_size
    check_images(images, c.in_channels, size, multiple_of=c.patch_size, what=what)
