"""Swin Transformer (Liu et al. 2021): windowed self-attention, shifted windows, patch merging.

A ViT attends globally, so its cost grows with N² and it has no built-in notion of locality or
scale. Swin puts both back:

- **Window attention (W-MSA).** Tokens attend only inside non-overlapping w×w windows, with a
  learned bias B[Δrow, Δcol] per head added to the scores (a ``(2w−1)² × heads`` table indexed
  by the relative offset of the two tokens): softmax(QKᵀ/√d + B) V. Cost is linear in the area.
- **Shifted windows (SW-MSA).** Every second block rolls the feature map by (−w/2, −w/2) before
  partitioning, so windows straddle the previous block's window borders and information crosses
  them. Rolled windows contain pixels from opposite image edges; a mask stops tokens from different
  original regions from attending to each other. The map is rolled back afterwards.
- **Patch merging.** Between stages each 2×2 group of neighbours is concatenated (4C), normalised
  and projected to 2C: the resolution halves and the width doubles, giving a CNN-like hierarchy.

Norms, the MLP and the residuals act on each token alone, and rolling and window partitioning only
reorder tokens, so a Swin block is the shared :class:`~attnlab.layers.block.TransformerBlock` run on the
windows as a batch, with the window table (and the shift mask) as its attention bias: see
:class:`SwinBlock`. Hugging Face ``SwinModel`` / ``SwinForImageClassification`` checkpoints
convert through :mod:`attnlab.interop.hf.vision`.

Shape legend: B batch, Cin image channels, H/W feature-map height/width (in tokens), C width of
the current stage, w window side, nW windows per image, Nw = w² tokens per window, Hh heads,
L classes.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.config.base import BlockConfig
from attnlab.config.vision import SwinConfig
from attnlab.layers.block import TransformerBlock, make_norm
from attnlab.layers.drop_path import DropPath, drop_path_rates
from attnlab.layers.patch_embed import PatchEmbedding
from attnlab.layers.position import NoPositions, Positions
from attnlab.layers.position.grid import PatchGridPositions
from attnlab.layers.position.relative import RelativePositionBias
from attnlab.models.registry import register_kind
from attnlab.models.vision.common import (
    build_vision_block,
    check_patch_images,
    init_vision_weights,
)

__all__ = [
    "SwinTransformer",
    "SwinBlock",
    "SwinStage",
    "PatchMerging",
    "build_swin_block",
    "window_partition",
    "window_reverse",
    "shifted_window_mask",
    "upgrade_swin_weights",
]


# ----------------------------------------------------------------------------------------------
# windows


def window_partition(x: Tensor, w: int) -> Tensor:
    """``(B, H, W, C) -> (B·nW, w², C)``: non-overlapping w×w windows, row-major inside each."""
    B, H, W, C = x.shape
    x = x.view(B, H // w, w, W // w, w, C)  # (B, H/w, w, W/w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, C)  # (B·nW, w², C)


def window_reverse(windows: Tensor, w: int, H: int, W: int) -> Tensor:
    """Inverse of :func:`window_partition`: ``(B·nW, w², C) -> (B, H, W, C)``."""
    C = windows.shape[-1]
    x = windows.view(-1, H // w, W // w, w, w, C)  # (B, H/w, W/w, w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


def shifted_window_mask(H: int, W: int, w: int, shift: int, device=None) -> Tensor:
    """Boolean ``(nW, w², w²)`` mask for shifted windows; True = may attend.

    After rolling the map by −shift, the bottom/right strips of the windows hold pixels that were
    at the opposite edges. Label each position by which of the 3×3 regions (split at ``size − w``
    and ``size − shift`` along each axis) it came from; two tokens may attend to each other only
    when their labels agree.
    """

    def region(n: int) -> Tensor:
        idx = torch.arange(n, device=device)
        return (idx >= n - w).long() + (idx >= n - shift).long()  # 0, 1, 2

    labels = region(H)[:, None] * 3 + region(W)[None, :]  # (H, W)
    lw = window_partition(labels[None, :, :, None], w).squeeze(-1)  # (nW, w²)
    return lw[:, :, None] == lw[:, None, :]  # (nW, w², w²)


class SwinBlock(nn.Module):
    """A :class:`TransformerBlock` applied window by window on a ``resolution²`` token grid.

    ``x (B, H·W, C)`` is rolled by ``−shift``, cut into windows ``(B·nW, w², C)``, run through
    ``block`` with attention bias ``rel_pos.bias()`` ``(Hh, w², w²)`` (and, when shifted, the
    region mask), then put back and rolled by ``+shift``. Norms, MLP and residuals are per token,
    so this is exactly Swin's block; its stochastic depth drops whole images (the windows of one
    image share one draw).

    Args:
        block: the Transformer block of this stage's width.
        rel_pos: the window table (:class:`RelativePositionBias`) or :class:`NoPositions`.
        resolution: token-grid side of the stage.
        window_size, shift: w and the roll (0 or w/2), already clamped to the grid.
    """

    def __init__(
        self,
        block: TransformerBlock,
        rel_pos: Positions,
        *,
        resolution: int,
        window_size: int,
        shift: int,
    ) -> None:
        super().__init__()
        if resolution % window_size or not 0 <= shift < window_size:
            raise ValueError(
                f"window {window_size} (shift {shift}) does not tile a {resolution}² grid"
            )
        self.block, self.rel_pos = block, rel_pos
        self.resolution, self.window_size, self.shift = resolution, window_size, shift
        self.n_windows = (resolution // window_size) ** 2
        mask = shifted_window_mask(resolution, resolution, window_size, shift) if shift else None
        if mask is not None:
            mask = mask[:, None]  # (nW, 1, Nw, Nw): one mask for every head
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H·W, C) -> (B, H·W, C)`` on a ``resolution × resolution`` grid."""
        B, N, C = x.shape
        r, w, s = self.resolution, self.window_size, self.shift
        x = x.view(B, r, r, C)
        if s:
            x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
        windows = window_partition(x, w)  # (B·nW, Nw, C)
        mask = None if self.mask is None else self.mask.repeat(B, 1, 1, 1)  # (B·nW, 1, Nw, Nw)
        windows = self.block(windows, mask=mask, attn_bias=self.rel_pos.bias(None, None))
        x = window_reverse(windows, w, r, r)  # (B, H, W, C)
        if s:
            x = torch.roll(x, shifts=(s, s), dims=(1, 2))
        return x.reshape(B, N, C)


def build_swin_block(
    config: BlockConfig,
    *,
    resolution: int,
    window_size: int,
    shift: int,
    qkv_bias: bool = True,
    relative: bool = True,
    drop_path: float = 0.0,
) -> SwinBlock:
    """A :class:`SwinBlock` from a stage's block fields.

    A map no larger than a window gets one window covering it and no shift (as in HF and timm).

    Args:
        config: the stage's :class:`BlockConfig` (``SwinConfig.stage_block(s)``).
        resolution: token-grid side of the stage.
        window_size, shift: w and the roll of this block (0 or w // 2).
        qkv_bias: biases in the Q/K/V projection.
        relative: add the learned window table (Swin); False leaves attention without positions.
        drop_path: this block's stochastic-depth rate.
    """
    if resolution <= window_size:
        window_size, shift = resolution, 0
    block = build_vision_block(config, qkv_bias=qkv_bias, drop_path=drop_path)
    if drop_path > 0:  # the block sees windows as its batch; drop whole images, not windows
        block.drop_path = DropPath(drop_path, group=(resolution // window_size) ** 2)
    rel_pos = RelativePositionBias(window_size, config.n_heads) if relative else NoPositions()
    return SwinBlock(block, rel_pos, resolution=resolution, window_size=window_size, shift=shift)


class PatchMerging(nn.Module):
    """2×2 neighbours → one token: concatenate (4C), LayerNorm, Linear 4C → 2C (no bias).

    The concatenation order is (even row, even col), (odd, even), (even, odd), (odd, odd), as in
    the Swin reference code, HF and timm.
    """

    def __init__(self, dim: int, resolution: int) -> None:
        super().__init__()
        self.resolution = resolution
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H·W, C) -> (B, H/2·W/2, 2C)``."""
        B, _, C = x.shape
        r = self.resolution
        x = x.view(B, r, r, C)
        x = torch.cat(
            [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1
        )  # (B, H/2, W/2, 4C)
        return self.reduction(self.norm(x.view(B, -1, 4 * C)))  # (B, H/2·W/2, 2C)


class SwinStage(nn.Module):
    """A stage: ``depth`` blocks alternating regular and shifted windows, then patch merging."""

    def __init__(self, blocks: list[SwinBlock], downsample: nn.Module | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample if downsample is not None else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.downsample(x)


class SwinTransformer(nn.Module):
    """Swin image classifier; see the module docstring.

    Args:
        config: a :class:`~attnlab.config.vision.SwinConfig`.
    """

    kind: ClassVar[str] = "swin"

    def __init__(self, config: SwinConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbedding(c.in_channels, c.d_model, c.patch_size)
        self.embed_norm = nn.LayerNorm(c.d_model)  # ε 1e-5, fixed in HF and timm
        grid = c.image_size // c.patch_size
        self.pos_embed = (
            PatchGridPositions((grid, grid), c.d_model, kind="learned", n_prefix=0, init_std=None)
            if c.absolute_positions
            else NoPositions()
        )
        self.drop = nn.Dropout(c.dropout)
        rates = iter(drop_path_rates(c.drop_path, sum(c.depths)))
        self.stages = nn.ModuleList()
        for s, depth in enumerate(c.depths):
            dim, res, block_cfg = c.stage_dims[s], c.stage_resolutions[s], c.stage_block(s)
            blocks = [
                build_swin_block(
                    block_cfg,
                    resolution=res,
                    window_size=c.window_size,
                    shift=0 if j % 2 == 0 else c.window_size // 2,
                    qkv_bias=c.qkv_bias,
                    relative=c.position == "relative",
                    drop_path=next(rates),
                )
                for j in range(depth)
            ]
            last = s == len(c.depths) - 1
            self.stages.append(SwinStage(blocks, None if last else PatchMerging(dim, res)))
        self.norm = make_norm(c.norm, c.num_features, eps=c.norm_eps, bias=c.bias)
        self.head = nn.Linear(c.num_features, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal init (std ``init_std``) for weights, bias tables and positions."""
        init_vision_weights(self, self.config.init_std)

    @property
    def feature_dim(self) -> int:
        """Width of :meth:`features` and :meth:`pooled_features` (the last stage's)."""
        return self.config.num_features

    def encode(self, images: Tensor) -> Tensor:
        """Last stage's tokens after the final norm (HF ``last_hidden_state``), ``(B, N_last, C)``.

        Raises:
            UserError: wrong rank, channel count or size (the message names the values).
        """
        c = self.config
        check_patch_images(images, c, f"Swin (patch size {c.patch_size}, window {c.window_size})")
        x = self.embed_norm(self.patch_embed(images))  # (B, N, C)
        x = self.drop(self.pos_embed.embed(x, None))
        for stage in self.stages:
            x = stage(x)
        return self.norm(x)

    def features(self, images: Tensor, **kw: Any) -> Tensor:
        """Grid tokens of the last stage ``(B, N_last, C)``, row by row."""
        return self.encode(images, **kw)

    def pooled_features(self, images: Tensor, **kw: Any) -> Tensor:
        """Mean of the last stage's tokens ``(B, C)`` (HF ``pooler_output``)."""
        return self.encode(images, **kw).mean(dim=1)

    def forward(
        self, images: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Class scores ``(B, L)`` (pooled features when ``num_classes == 0``).

        With ``need_weights=True`` returns ``(scores, weights)``: per block, first block first, the
        window attention ``(B·nW, Hh, Nw, Nw)`` (windows of image b are rows ``b·nW … b·nW+nW−1``,
        in the rolled frame of shifted blocks), read through
        :func:`attnlab.attention.capture_attention`.
        """
        if need_weights:
            with capture_attention(self) as maps:
                out = self(images)
            return out, maps.select("attn")
        return self.head(self.pooled_features(images))


_OLD_BLOCK_PART = re.compile(r"^(stages\.\d+\.blocks\.\d+\.)(attn|ffn|norm1|norm2)\.")


def upgrade_swin_weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """First-release weight names -> today's: a block's attention, FFN and norms sit in its
    shared ``block`` (``stages.0.blocks.1.attn.qkv`` -> ``stages.0.blocks.1.block.attn.qkv``),
    and absolute positions are ``pos_embed.weight``."""
    out = {}
    for k, v in state.items():
        k = "pos_embed.weight" if k == "pos_embed" else _OLD_BLOCK_PART.sub(r"\1block.\2.", k)
        out[k] = v
    return out


register_kind("swin", SwinConfig, SwinTransformer, artifacts="labels", upgrade=upgrade_swin_weights)
