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

Weights load from Hugging Face ``SwinModel`` / ``SwinForImageClassification`` through
:func:`swin_from_hf_state_dict` (and go back with :func:`swin_to_hf`).

Shape legend: B batch, Cin image channels, H/W feature-map height/width (in tokens), C width of
the current stage, w window side, nW windows per image, Nw = w² tokens per window, Hh heads,
L classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.multihead import MultiHeadAttention
from attnlab.errors import UserError
from attnlab.layers.ffn import MLP
from attnlab.layers.norm import make_norm
from attnlab.models.vit import (
    PatchEmbedding,
    _square,
    _strip_prefix,
    check_images,
    hf_activation,
    hf_num_labels,
)
from attnlab.models.registry import register_kind

__all__ = [
    "SwinConfig",
    "SwinTransformer",
    "SwinBlock",
    "PatchMerging",
    "RelativePositionBias",
    "window_partition",
    "window_reverse",
    "shifted_window_mask",
    "swin_config_from_hf",
    "swin_from_hf_state_dict",
    "swin_to_hf",
    "SWIN_PRESETS",
]

SWIN_PRESETS: dict[str, dict[str, Any]] = {
    # 8×8 digits: 2×2 patches; stage 1 is a 4×4 map of 2×2 windows (shifted by 1 every other
    # block), stage 2 a 2×2 map (one window). 1-pixel patches learn far slower on digits.
    "tiny": dict(
        image_size=8,
        patch_size=2,
        in_channels=1,
        num_classes=10,
        embed_dim=32,
        depths=[2, 2],
        n_heads=[2, 4],
        window_size=2,
        mlp_ratio=2.0,
    ),
    "small": dict(
        image_size=32,
        patch_size=2,
        in_channels=3,
        num_classes=10,
        embed_dim=48,
        depths=[2, 2, 2],
        n_heads=[3, 6, 12],
        window_size=4,
        mlp_ratio=4.0,
    ),
    "swin-t": dict(
        image_size=224,
        patch_size=4,
        in_channels=3,
        num_classes=1000,
        embed_dim=96,
        depths=[2, 2, 6, 2],
        n_heads=[3, 6, 12, 24],
        window_size=7,
        mlp_ratio=4.0,
    ),
    "swin-s": dict(
        image_size=224,
        patch_size=4,
        in_channels=3,
        num_classes=1000,
        embed_dim=96,
        depths=[2, 2, 18, 2],
        n_heads=[3, 6, 12, 24],
        window_size=7,
        mlp_ratio=4.0,
    ),
    "swin-b": dict(
        image_size=224,
        patch_size=4,
        in_channels=3,
        num_classes=1000,
        embed_dim=128,
        depths=[2, 2, 18, 2],
        n_heads=[4, 8, 16, 32],
        window_size=7,
        mlp_ratio=4.0,
    ),
}


@dataclass
class SwinConfig:
    """Hyper-parameters of a :class:`SwinTransformer`.

    Attributes:
        image_size, patch_size, in_channels, num_classes: as for ViT (num_classes 0 = no head).
        embed_dim: width C of the first stage; stage s has ``embed_dim · 2**s``.
        depths: blocks per stage; odd-numbered blocks (1, 3, …) use shifted windows.
        n_heads: attention heads per stage.
        window_size: window side w. Every stage's resolution must be a multiple of w, or at most w
            (then the window covers the whole map and there is no shift, as in HF and timm).
        mlp_ratio: MLP width = ``int(mlp_ratio · C)``.
        norm_eps: ε of the block and final LayerNorms (the patch-embedding and patch-merging norms
            use 1e-5, as in HF/timm).
        qkv_bias: biases in the Q/K/V projections.
        absolute_positions: add learned absolute positions after the patch embedding (HF
            ``use_absolute_embeddings``; off in Swin).
        drop_path: stochastic-depth rate of the last block (linearly increasing from 0).
    """

    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    embed_dim: int = 32
    depths: list[int] = field(default_factory=lambda: [2, 2])
    n_heads: list[int] = field(default_factory=lambda: [2, 4])
    window_size: int = 2
    mlp_ratio: float = 4.0
    activation: str = "gelu"
    norm_eps: float = 1e-5
    qkv_bias: bool = True
    absolute_positions: bool = False
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    backend: str = "auto"
    init_std: float = 0.02
    labels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.depths, self.n_heads = list(self.depths), list(self.n_heads)
        if not self.depths or len(self.depths) != len(self.n_heads):
            raise ValueError(
                f"depths {self.depths} and n_heads {self.n_heads} must be non-empty "
                "lists of the same length"
            )
        for name in ("image_size", "patch_size", "in_channels", "embed_dim", "window_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SwinConfig.{name} must be positive, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}"
            )
        for s, (dim, h) in enumerate(zip(self.stage_dims, self.n_heads, strict=True)):
            if dim % h:
                raise ValueError(f"stage {s}: width {dim} is not divisible by n_heads={h}")
        res = self.image_size // self.patch_size
        for s in range(len(self.depths)):
            if res > self.window_size and res % self.window_size:
                raise ValueError(
                    f"stage {s} resolution {res}×{res} (image_size={self.image_size}, "
                    f"patch_size={self.patch_size}) is not divisible by "
                    f"window_size={self.window_size}"
                )
            if s < len(self.depths) - 1:
                if res % 2:
                    raise ValueError(
                        f"stage {s} resolution {res}×{res} is odd: patch merging "
                        f"needs even sizes (image_size={self.image_size})"
                    )
                res //= 2
        if self.labels and len(self.labels) != self.num_classes:
            raise ValueError(f"{len(self.labels)} labels given for num_classes={self.num_classes}")

    @property
    def stage_dims(self) -> list[int]:
        """Width of each stage: C, 2C, 4C, …"""
        return [self.embed_dim * 2**s for s in range(len(self.depths))]

    @property
    def stage_resolutions(self) -> list[int]:
        """Token-grid side of each stage."""
        g = self.image_size // self.patch_size
        return [g // 2**s for s in range(len(self.depths))]

    @property
    def num_features(self) -> int:
        """Width of the last stage (the feature/pooled width)."""
        return self.stage_dims[-1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SwinConfig:
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SwinConfig:
        """A named configuration (``SWIN_PRESETS``) with fields overridden."""
        if name not in SWIN_PRESETS:
            raise ValueError(f"unknown Swin preset {name!r}; known: {sorted(SWIN_PRESETS)}")
        return cls(**{**SWIN_PRESETS[name], **overrides})


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


class RelativePositionBias(nn.Module):
    """Learned bias per head for each relative offset inside a w×w window.

    ``table`` is ``((2w−1)², Hh)``; token pair (i, j) with offset (Δr, Δc) = (r_i − r_j, c_i − c_j)
    reads row ``(Δr + w − 1)·(2w − 1) + (Δc + w − 1)``.
    """

    def __init__(self, window_size: int, n_heads: int) -> None:
        super().__init__()
        w = window_size
        self.table = nn.Parameter(torch.zeros((2 * w - 1) ** 2, n_heads))
        rows, cols = torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")
        r, c = rows.flatten(), cols.flatten()  # (w²,)
        index = (r[:, None] - r[None, :] + w - 1) * (2 * w - 1) + (c[:, None] - c[None, :] + w - 1)
        self.register_buffer("index", index, persistent=False)  # (w², w²)

    def forward(self) -> Tensor:
        """``(Hh, w², w²)`` additive scores."""
        return self.table[self.index].permute(2, 0, 1)  # (Hh, w², w²)


def _drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Stochastic depth: drop the whole residual branch for a random subset of the batch."""
    if p == 0.0 or not training:
        return x
    keep = torch.rand(x.shape[0], *([1] * (x.dim() - 1)), device=x.device) >= p
    return x * keep.to(x.dtype) / (1 - p)


class SwinBlock(nn.Module):
    """Pre-norm block with (shifted-)window attention and an MLP.

    ``x = x + WindowAttention(LN(x));  x = x + MLP(LN(x))``

    Args:
        dim: width C; n_heads: heads; resolution: token-grid side of this stage.
        window_size, shift: w and the roll (0 or w/2); clamped to (resolution, 0) when the map is
            not larger than a window.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        resolution: int,
        window_size: int,
        shift: int,
        *,
        mlp_ratio: float,
        activation: str,
        norm_eps: float,
        qkv_bias: bool,
        dropout: float,
        attn_dropout: float,
        drop_path: float,
        backend: str,
    ) -> None:
        super().__init__()
        if resolution <= window_size:
            window_size, shift = resolution, 0
        self.window_size, self.shift, self.resolution = window_size, shift, resolution
        self.drop_path = drop_path
        self.norm1 = make_norm("layernorm", dim, eps=norm_eps)
        self.attn = MultiHeadAttention(
            dim, n_heads, bias=qkv_bias, out_bias=True, dropout=attn_dropout, backend=backend
        )
        self.rel_pos = RelativePositionBias(window_size, n_heads)
        self.norm2 = make_norm("layernorm", dim, eps=norm_eps)
        self.ffn = MLP(dim, int(mlp_ratio * dim), activation=activation)
        self.drop = nn.Dropout(dropout)
        if shift:
            mask = shifted_window_mask(resolution, resolution, window_size, shift)
            self.register_buffer("mask", mask[:, None], persistent=False)  # (nW, 1, Nw, Nw)
        else:
            self.mask = None
        self.attn_weights: Tensor | None = None

    def window_attention(self, x: Tensor, need_weights: bool = False) -> Tensor:
        """Attention inside (shifted) windows: ``(B, H, W, C) -> (B, H, W, C)``."""
        B, H, W, C = x.shape
        w, s = self.window_size, self.shift
        if s:
            x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
        windows = window_partition(x, w)  # (B·nW, Nw, C)
        mask = None
        if self.mask is not None:
            nW = self.mask.shape[0]
            mask = self.mask.expand(nW, 1, w * w, w * w).repeat(B, 1, 1, 1)  # (B·nW, 1, Nw, Nw)
        out, weights = self.attn(
            windows, bias=self.rel_pos()[None], mask=mask, need_weights=need_weights
        )  # (B·nW, Nw, C)
        self.attn_weights = weights
        x = window_reverse(out, w, H, W)  # (B, H, W, C)
        if s:
            x = torch.roll(x, shifts=(s, s), dims=(1, 2))
        return x

    def forward(self, x: Tensor, need_weights: bool = False) -> Tensor:
        """``(B, H·W, C) -> (B, H·W, C)`` on a ``resolution × resolution`` grid."""
        B, N, C = x.shape
        r = self.resolution
        h = self.window_attention(self.norm1(x).view(B, r, r, C), need_weights).view(B, N, C)
        x = x + _drop_path(self.drop(h), self.drop_path, self.training)
        return x + _drop_path(self.drop(self.ffn(self.norm2(x))), self.drop_path, self.training)


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

    def forward(self, x: Tensor, need_weights: bool = False) -> Tensor:
        for blk in self.blocks:
            x = blk(x, need_weights)
        return self.downsample(x)


class SwinTransformer(nn.Module):
    """Swin image classifier; see the module docstring.

    Args:
        config: a :class:`SwinConfig`.
    """

    kind: ClassVar[str] = "swin"

    def __init__(self, config: SwinConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbedding(c.in_channels, c.embed_dim, c.patch_size)
        self.embed_norm = nn.LayerNorm(c.embed_dim)
        grid = c.image_size // c.patch_size
        self.pos_embed = (
            nn.Parameter(torch.zeros(1, grid * grid, c.embed_dim)) if c.absolute_positions else None
        )
        self.drop = nn.Dropout(c.dropout)
        n_blocks = sum(c.depths)
        rates = [c.drop_path * i / max(n_blocks - 1, 1) for i in range(n_blocks)]
        self.stages = nn.ModuleList()
        k = 0
        for s, (depth, heads) in enumerate(zip(c.depths, c.n_heads, strict=True)):
            dim, res = c.stage_dims[s], c.stage_resolutions[s]
            blocks = []
            for j in range(depth):
                blocks.append(
                    SwinBlock(
                        dim,
                        heads,
                        res,
                        c.window_size,
                        0 if j % 2 == 0 else c.window_size // 2,
                        mlp_ratio=c.mlp_ratio,
                        activation=c.activation,
                        norm_eps=c.norm_eps,
                        qkv_bias=c.qkv_bias,
                        dropout=c.dropout,
                        attn_dropout=c.attn_dropout,
                        drop_path=rates[k],
                        backend=c.backend,
                    )
                )
                k += 1
            last = s == len(c.depths) - 1
            self.stages.append(SwinStage(blocks, None if last else PatchMerging(dim, res)))
        self.norm = make_norm("layernorm", c.num_features, eps=c.norm_eps)
        self.head = nn.Linear(c.num_features, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal init (std ``init_std``) for weights, bias tables and positions."""
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RelativePositionBias):
                nn.init.trunc_normal_(m.table, std=std)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=std)

    @property
    def feature_dim(self) -> int:
        """Width of :meth:`features` and :meth:`pooled_features` (the last stage's)."""
        return self.config.num_features

    @property
    def attn_weights(self) -> list[Tensor | None]:
        """Per block, the window attention weights ``(B·nW, Hh, Nw, Nw)`` of the last call."""
        return [blk.attn_weights for st in self.stages for blk in st.blocks]

    def encode(self, images: Tensor, *, need_weights: bool = False) -> Tensor:
        """Last stage's tokens after the final norm (HF ``last_hidden_state``), ``(B, N_last, C)``.

        Raises:
            UserError: wrong rank, channel count or size (the message names the values).
        """
        c = self.config
        check_images(
            images,
            c.in_channels,
            c.image_size,
            multiple_of=c.patch_size,
            what=f"Swin (patch size {c.patch_size}, window {c.window_size})",
        )
        x = self.embed_norm(self.patch_embed(images))  # (B, N, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        x = self.drop(x)
        for stage in self.stages:
            x = stage(x, need_weights)
        return self.norm(x)

    def features(self, images: Tensor, **kw: Any) -> Tensor:
        """Grid tokens of the last stage ``(B, N_last, C)``, row by row."""
        return self.encode(images, **kw)

    def pooled_features(self, images: Tensor, **kw: Any) -> Tensor:
        """Mean of the last stage's tokens ``(B, C)`` (HF ``pooler_output``)."""
        return self.encode(images, **kw).mean(dim=1)

    def forward(self, images: Tensor, *, need_weights: bool = False) -> Tensor:
        """Class scores ``(B, L)`` (pooled features when ``num_classes == 0``)."""
        return self.head(self.pooled_features(images, need_weights=need_weights))


register_kind("swin", SwinConfig, SwinTransformer, artifacts="labels")


# ----------------------------------------------------------------------------------------------
# Hugging Face interop (also used by attnlab.interop.from_hf)

_SWIN_OLD_NAMES = {  # transformers < 5.9 (and 4.x) -> current, inside a block
    "attention.self.query.": "attention.q_proj.",
    "attention.self.key.": "attention.k_proj.",
    "attention.self.value.": "attention.v_proj.",
    "attention.self.relative_position_bias_table": "attention.relative_position_bias.relative_position_bias_table",
    "attention.output.dense.": "attention.o_proj.",
    "intermediate.dense.": "mlp.fc1.",
    "output.dense.": "mlp.fc2.",
}


def _rename_swin_keys(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for k, v in sd.items():
        if k.endswith("relative_position_index"):
            continue  # a persistent buffer in transformers 5.0–5.6 (and 4.x); we recompute it
        if ".blocks." in k:
            head, name = k.split(".blocks.", 1)
            j, name = name.split(".", 1)
            for old, new in _SWIN_OLD_NAMES.items():
                if name.startswith(old):
                    name = new + name[len(old) :]
                    break
            k = f"{head}.blocks.{j}.{name}"
        out[k] = v
    return out


def swin_config_from_hf(cfg_dict: dict, state_dict: dict[str, Tensor] | None = None) -> SwinConfig:
    """Our :class:`SwinConfig` for an HF Swin ``config.json`` dict (head from the state dict)."""
    sd = _strip_prefix(state_dict or {}, "swin.")
    archs = cfg_dict.get("architectures") or []
    has_head = (
        ("classifier.weight" in sd)
        if state_dict is not None
        else ("SwinForImageClassification" in archs)
    )
    n_labels, labels = hf_num_labels(cfg_dict)
    return SwinConfig(
        image_size=_square(cfg_dict.get("image_size", 224), "images"),
        patch_size=_square(cfg_dict.get("patch_size", 4), "patches"),
        in_channels=int(cfg_dict.get("num_channels", 3)),
        num_classes=n_labels if has_head else 0,
        labels=labels if has_head else [],
        embed_dim=int(cfg_dict.get("embed_dim", 96)),
        depths=list(cfg_dict.get("depths", [2, 2, 6, 2])),
        n_heads=list(cfg_dict.get("num_heads", [3, 6, 12, 24])),
        window_size=int(cfg_dict.get("window_size", 7)),
        mlp_ratio=float(cfg_dict.get("mlp_ratio", 4.0)),
        activation=hf_activation(cfg_dict.get("hidden_act", "gelu")),
        norm_eps=float(cfg_dict.get("layer_norm_eps", 1e-5)),
        qkv_bias=bool(cfg_dict.get("qkv_bias", True)),
        absolute_positions=bool(cfg_dict.get("use_absolute_embeddings", False)),
    )


def _swin_key_pairs(c: SwinConfig, has_head: bool) -> list[tuple[str, str]]:
    """(HF key without prefix, our key) for every tensor except the fused Q/K/V."""
    pairs = [
        ("embeddings.patch_embeddings.projection.weight", "patch_embed.proj.weight"),
        ("embeddings.patch_embeddings.projection.bias", "patch_embed.proj.bias"),
        ("embeddings.norm.weight", "embed_norm.weight"),
        ("embeddings.norm.bias", "embed_norm.bias"),
    ]
    if c.absolute_positions:
        pairs.append(("embeddings.position_embeddings", "pos_embed"))
    for s, depth in enumerate(c.depths):
        for j in range(depth):
            a, b = f"encoder.layers.{s}.blocks.{j}.", f"stages.{s}.blocks.{j}."
            pairs.append(
                (
                    f"{a}attention.relative_position_bias.relative_position_bias_table",
                    f"{b}rel_pos.table",
                )
            )
            for p in ("weight", "bias"):
                pairs += [
                    (f"{a}attention.o_proj.{p}", f"{b}attn.out_proj.{p}"),
                    (f"{a}layernorm_before.{p}", f"{b}norm1.{p}"),
                    (f"{a}layernorm_after.{p}", f"{b}norm2.{p}"),
                    (f"{a}mlp.fc1.{p}", f"{b}ffn.fc1.{p}"),
                    (f"{a}mlp.fc2.{p}", f"{b}ffn.fc2.{p}"),
                ]
        if s < len(c.depths) - 1:
            a, b = f"encoder.layers.{s}.downsample.", f"stages.{s}.downsample."
            pairs += [
                (f"{a}reduction.weight", f"{b}reduction.weight"),
                (f"{a}norm.weight", f"{b}norm.weight"),
                (f"{a}norm.bias", f"{b}norm.bias"),
            ]
    pairs += [("layernorm.weight", "norm.weight"), ("layernorm.bias", "norm.bias")]
    if has_head:
        pairs += [("classifier.weight", "head.weight"), ("classifier.bias", "head.bias")]
    return pairs


def swin_from_hf_state_dict(cfg_dict: dict, state_dict: dict[str, Tensor]) -> SwinTransformer:
    """Our Swin from an HF Swin config dict and state dict (SwinModel / SwinForImageClassification).

    Q, K and V are stacked into ``qkv``; HF's per-stage ``downsample`` (end of stage s) is our
    ``stages.{s}.downsample``. Key names of transformers < 5.9 (``attention.self.query`` …) and a
    stored ``relative_position_index`` are accepted.

    Raises:
        UserError: missing or unexpected weights (the message names them).
    """
    cfg = swin_config_from_hf(cfg_dict, state_dict)
    model = SwinTransformer(cfg)
    sd = _rename_swin_keys(_strip_prefix(state_dict, "swin."))
    ours: dict[str, Tensor] = {}
    for src, dst in _swin_key_pairs(cfg, cfg.num_classes > 0):
        if src not in sd:
            raise UserError(f"HF Swin state dict lacks {src!r}")
        ours[dst] = sd.pop(src)
    for s, depth in enumerate(cfg.depths):
        for j in range(depth):
            a, b = f"encoder.layers.{s}.blocks.{j}.attention.", f"stages.{s}.blocks.{j}.attn."
            for p in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                parts = [sd.pop(f"{a}{n}_proj.{p}", None) for n in "qkv"]
                if any(t is None for t in parts):
                    raise UserError(f"HF Swin state dict lacks {a}q/k/v_proj.{p}")
                ours[f"{b}qkv.{p}"] = torch.cat(parts, dim=0)  # (3C, C) rows Q|K|V
    if sd:
        raise UserError(f"unexpected HF Swin weights: {sorted(sd)[:8]}")
    model.load_state_dict(ours, strict=True)
    return model


def swin_to_hf(model: SwinTransformer) -> tuple[dict, dict[str, Tensor]]:
    """``(config dict, state dict)`` in HF Swin's layout (transformers >= 5.9 names)."""
    c = model.config
    has_head = c.num_classes > 0
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
    cfg = {
        "model_type": "swin",
        "architectures": ["SwinForImageClassification" if has_head else "SwinModel"],
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.in_channels,
        "embed_dim": c.embed_dim,
        "depths": list(c.depths),
        "num_heads": list(c.n_heads),
        "window_size": c.window_size,
        "mlp_ratio": c.mlp_ratio,
        "hidden_act": act[c.activation],
        "layer_norm_eps": c.norm_eps,
        "qkv_bias": c.qkv_bias,
        "use_absolute_embeddings": c.absolute_positions,
        "drop_path_rate": 0.0,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if has_head:
        names = c.labels or [f"LABEL_{i}" for i in range(c.num_classes)]
        cfg["id2label"] = {str(i): n for i, n in enumerate(names)}
        cfg["label2id"] = {n: i for i, n in enumerate(names)}
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pre = "swin." if has_head else ""
    out = {}
    for hf_key, our_key in _swin_key_pairs(c, has_head):
        out[hf_key if hf_key.startswith("classifier") else pre + hf_key] = sd[our_key]
    for s, depth in enumerate(c.depths):
        for j in range(depth):
            a, b = f"{pre}encoder.layers.{s}.blocks.{j}.attention.", f"stages.{s}.blocks.{j}.attn."
            for p in ("weight", "bias") if c.qkv_bias else ("weight",):
                for n, t in zip("qkv", sd[f"{b}qkv.{p}"].chunk(3, dim=0), strict=True):
                    out[f"{a}{n}_proj.{p}"] = t.clone()
    return cfg, out
