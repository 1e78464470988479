"""Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16×16 Words").

An image is cut into P×P patches; each patch is flattened and linearly projected to a token, so an
H×W image becomes N = HW/P² tokens (224×224 with P = 16 → 14·14 = 196). A class token may be
prepended, positions are added (learned, or fixed 2-D sin-cos), and the tokens go through the same
pre-norm Transformer encoder blocks as a language model — without any causal mask: every patch may
attend to every other patch. The class token's output (or the mean of the patch outputs) is
classified by one linear layer.

    x = [cls; patch_1 W_E; …; patch_N W_E] + E_pos
    x = x + MHA(LN(x));  x = x + MLP(LN(x))          (× n_layers)
    logits = W_head · pool(LN(x))

Weights are laid out so that Hugging Face ``ViTModel`` / ``ViTForImageClassification`` checkpoints
load through :func:`vit_from_hf_state_dict` (and go back with :func:`vit_to_hf`).

Shape legend: B batch, Cin image channels, H/W image height/width, P patch size, Gh/Gw patch-grid
height/width, N = Gh·Gw patches, T tokens (N, or N + 1 with a class token), C d_model, L classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers.block import build_block
from attnlab.layers.norm import make_norm
from attnlab.layers.position import sincos_2d
from attnlab.models.registry import register_kind

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "PatchEmbedding",
    "check_images",
    "interpolate_positions",
    "vit_config_from_hf",
    "vit_from_hf_state_dict",
    "vit_to_hf",
    "VIT_PRESETS",
]

POOLINGS = ("cls", "mean")
POSITIONS = ("learned", "sincos")

# Presets are data. "tiny" is the CPU default sized for 8×8 digits; the vit-* ones follow the paper
# (Ti/S from DeiT) at 224×224 with 16×16 patches (196 tokens + class token).
VIT_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        image_size=8,
        patch_size=2,
        in_channels=1,
        num_classes=10,
        d_model=64,
        n_layers=2,
        n_heads=4,
        ffn_hidden=128,
    ),
    "small": dict(
        image_size=32,
        patch_size=4,
        in_channels=3,
        num_classes=10,
        d_model=128,
        n_layers=6,
        n_heads=4,
        ffn_hidden=256,
    ),
    "vit-ti16": dict(
        image_size=224,
        patch_size=16,
        in_channels=3,
        num_classes=1000,
        d_model=192,
        n_layers=12,
        n_heads=3,
        ffn_hidden=768,
    ),
    "vit-s16": dict(
        image_size=224,
        patch_size=16,
        in_channels=3,
        num_classes=1000,
        d_model=384,
        n_layers=12,
        n_heads=6,
        ffn_hidden=1536,
    ),
    "vit-b16": dict(
        image_size=224,
        patch_size=16,
        in_channels=3,
        num_classes=1000,
        d_model=768,
        n_layers=12,
        n_heads=12,
        ffn_hidden=3072,
    ),
    "vit-l16": dict(
        image_size=224,
        patch_size=16,
        in_channels=3,
        num_classes=1000,
        d_model=1024,
        n_layers=24,
        n_heads=16,
        ffn_hidden=4096,
    ),
}


@dataclass
class ViTConfig:
    """Hyper-parameters of a :class:`VisionTransformer`.

    Attributes:
        image_size: side of the (square) input image in pixels.
        patch_size: side P of a patch; must divide ``image_size``.
        in_channels: image channels (1 grey, 3 RGB).
        num_classes: classifier outputs; 0 = no head (``forward`` returns pooled features).
        d_model, n_layers, n_heads: encoder width, depth and heads.
        ffn_hidden: MLP inner width (default ``4 * d_model``, the paper's ratio).
        activation: MLP activation (ViT uses exact ``gelu``).
        norm_eps: LayerNorm ε (HF ViT default 1e-12; timm and our default 1e-6).
        qkv_bias: biases in the Q/K/V projections (the output projection always has one).
        pooling: ``cls`` (class token, the paper) or ``mean`` (average of the patch outputs).
        position: ``learned`` (one trained vector per token) or ``sincos`` (fixed 2-D sin-cos).
        pooler: HF ``ViTModel``'s pooler, ``tanh(W · cls)``; only for checkpoint parity.
        dropout, attn_dropout: residual/embedding and attention-weight dropout.
        backend: attention backend name (see :mod:`attnlab.attention.core`).
    """

    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    ffn_hidden: int | None = None
    activation: str = "gelu"
    norm_eps: float = 1e-6
    qkv_bias: bool = True
    pooling: str = "cls"
    position: str = "learned"
    pooler: bool = False
    dropout: float = 0.0
    attn_dropout: float = 0.0
    backend: str = "auto"
    init_std: float = 0.02
    labels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ffn_hidden is None:
            self.ffn_hidden = 4 * self.d_model
        for name in (
            "image_size",
            "patch_size",
            "in_channels",
            "d_model",
            "n_layers",
            "n_heads",
            "ffn_hidden",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ViTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_classes < 0:
            raise ValueError(f"ViTConfig.num_classes must be >= 0, got {self.num_classes}")
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}"
            )
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose from {POOLINGS}")
        if self.position not in POSITIONS:
            raise ValueError(f"unknown position {self.position!r}; choose from {POSITIONS}")
        if self.position == "sincos" and self.d_model % 4 != 0:
            raise ValueError(
                f"2-D sin-cos positions need d_model divisible by 4, got {self.d_model}"
            )
        if self.pooler and self.pooling != "cls":
            raise ValueError("the HF pooler reads the class token: pooler=True needs pooling='cls'")
        if self.labels and len(self.labels) != self.num_classes:
            raise ValueError(f"{len(self.labels)} labels given for num_classes={self.num_classes}")

    @property
    def grid_size(self) -> int:
        """Patches per side, ``image_size // patch_size``."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        """N = HW / P²."""
        return self.grid_size**2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ViTConfig:
        """A named configuration (see ``VIT_PRESETS``) with fields overridden.

        Raises:
            ValueError: unknown preset name (the message lists the known ones).
        """
        if name not in VIT_PRESETS:
            raise ValueError(f"unknown ViT preset {name!r}; known: {sorted(VIT_PRESETS)}")
        return cls(**{**VIT_PRESETS[name], **overrides})


# ----------------------------------------------------------------------------------------------
# pieces shared with Swin and the CNN


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
    """

    def __init__(self, in_channels: int, d_model: int, patch_size: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        """``(B, Cin, H, W) -> (B, N, C)`` with patches numbered row by row."""
        x = self.proj(images)  # (B, C, Gh, Gw)
        return x.flatten(2).transpose(1, 2)  # (B, Gh·Gw, C)


def interpolate_positions(
    pos: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], n_prefix: int = 1
) -> Tensor:
    """Resample learned patch positions to another patch grid (bicubic, as HF ViT does).

    The ``n_prefix`` leading rows (the class token's) are kept; the ``old_grid`` rows are reshaped
    into a grid, resized with bicubic interpolation (align_corners=False, no antialias) and
    flattened back. The same grid returns ``pos`` itself.

    Args:
        pos: ``(1, n_prefix + Gh·Gw, C)``.
        old_grid, new_grid: ``(Gh, Gw)`` before and after.
        n_prefix: rows that are not patch positions.

    Returns:
        ``(1, n_prefix + Gh'·Gw', C)``.
    """
    if tuple(old_grid) == tuple(new_grid):
        return pos
    prefix, grid = pos[:, :n_prefix], pos[:, n_prefix:]
    C = pos.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], C).permute(0, 3, 1, 2)  # (1, C, Gh, Gw)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], C)  # (1, N', C)
    return torch.cat((prefix, grid), dim=1)


# ----------------------------------------------------------------------------------------------
# the model


class VisionTransformer(nn.Module):
    """ViT image classifier; see the module docstring.

    Args:
        config: a :class:`ViTConfig`.

    After ``forward(..., need_weights=True)``, ``attn_weights`` holds one ``(B, H, T, T)`` tensor
    per layer (T includes the class token at index 0 when ``pooling == "cls"``).
    """

    kind: ClassVar[str] = "vit"

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbedding(c.in_channels, c.d_model, c.patch_size)
        self.n_prefix = 1 if c.pooling == "cls" else 0
        if self.n_prefix:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        n_tokens = self.n_prefix + c.num_patches
        if c.position == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, n_tokens, c.d_model))
        else:
            table = self._sincos(c.grid_size, c.grid_size)  # (1, T, C)
            self.register_buffer("pos_embed", table, persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList()
        for _ in range(c.n_layers):
            blk = build_block(
                c.d_model,
                c.n_heads,
                ffn="mlp",
                ffn_hidden=c.ffn_hidden,
                activation=c.activation,
                norm="layernorm",
                norm_eps=c.norm_eps,
                norm_position="pre",
                bias=True,
                position="none",
                dropout=c.dropout,
                attn_dropout=c.attn_dropout,
                backend=c.backend,
            )
            if not c.qkv_bias:  # HF's qkv_bias=False keeps the output projection's bias
                blk.attn.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
            self.blocks.append(blk)
        self.norm = make_norm("layernorm", c.d_model, eps=c.norm_eps)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None
        self.head = nn.Linear(c.d_model, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.attn_weights: list[Tensor] = []
        self.reset_parameters()

    def _sincos(self, gh: int, gw: int) -> Tensor:
        pos = sincos_2d(gh, gw, self.config.d_model)  # (N, C)
        if self.n_prefix:  # the class token gets the zero vector (MAE's convention)
            pos = torch.cat((torch.zeros(1, self.config.d_model), pos), dim=0)
        return pos[None]  # (1, T, C)

    def reset_parameters(self) -> None:
        """Truncated-normal init (std ``init_std``) for linear/patch weights and positions."""
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.n_prefix:
            nn.init.trunc_normal_(self.cls_token, std=std)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=std)

    @property
    def feature_dim(self) -> int:
        """Width C of :meth:`features` and :meth:`pooled_features`."""
        return self.config.d_model

    def positions_for(self, grid: tuple[int, int]) -> Tensor:
        """Position table ``(1, T, C)`` for a ``(Gh, Gw)`` patch grid.

        Learned positions are interpolated (:func:`interpolate_positions`); sin-cos ones are
        recomputed. The trained grid gives the stored table unchanged.
        """
        g = self.config.grid_size
        if self.config.position == "sincos":
            if tuple(grid) == (g, g):
                return self.pos_embed
            return self._sincos(*grid).to(self.pos_embed)
        return interpolate_positions(self.pos_embed, (g, g), grid, self.n_prefix)

    def encode(
        self, images: Tensor, *, need_weights: bool = False, interpolate_pos_encoding: bool = False
    ) -> Tensor:
        """All output tokens after the final norm (HF ``last_hidden_state``).

        Args:
            images: ``(B, Cin, H, W)``; H = W = ``image_size`` unless ``interpolate_pos_encoding``,
                in which case H and W need only be multiples of the patch size.
            need_weights: keep each layer's attention weights in ``self.attn_weights``.
            interpolate_pos_encoding: resample the positions to the image's patch grid.

        Returns:
            ``(B, T, C)``; token 0 is the class token when ``pooling == "cls"``.

        Raises:
            UserError: wrong rank, channel count or size (the message names the values).
        """
        c = self.config
        check_images(
            images,
            c.in_channels,
            None if interpolate_pos_encoding else c.image_size,
            multiple_of=c.patch_size,
            what=f"ViT (patch size {c.patch_size})",
        )
        B, _, H, W = images.shape
        x = self.patch_embed(images)  # (B, N, C)
        if self.n_prefix:
            x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)  # (B, 1 + N, C)
        x = self.drop(x + self.positions_for((H // c.patch_size, W // c.patch_size)))
        weights = []
        for blk in self.blocks:
            x = blk(x, need_weights=need_weights)  # bidirectional: no mask, is_causal=False
            if need_weights:
                weights.append(blk.attn_weights)
        self.attn_weights = weights
        return self.norm(x)

    def features(self, images: Tensor, **kw: Any) -> Tensor:
        """Patch tokens ``(B, N, C)`` after the final norm (class token dropped), row by row."""
        return self.encode(images, **kw)[:, self.n_prefix :]

    def pool(self, tokens: Tensor) -> Tensor:
        """``(B, T, C) -> (B, C)``: the class token, or the mean of the patch tokens."""
        if self.config.pooling == "cls":
            return tokens[:, 0]
        return tokens[:, self.n_prefix :].mean(dim=1)

    def pooled_features(self, images: Tensor, **kw: Any) -> Tensor:
        """One vector per image ``(B, C)``: the input of the classification head."""
        return self.pool(self.encode(images, **kw))

    def pooler_output(self, images: Tensor, **kw: Any) -> Tensor:
        """HF ``ViTModel``'s ``pooler_output``: ``tanh(W · cls + b)`` (needs ``pooler=True``)."""
        if self.pooler is None:
            raise ValueError("this ViT has no pooler (build with pooler=True)")
        return torch.tanh(self.pooler(self.encode(images, **kw)[:, 0]))

    def forward(
        self, images: Tensor, *, need_weights: bool = False, interpolate_pos_encoding: bool = False
    ) -> Tensor:
        """Class scores ``(B, L)`` (pooled features ``(B, C)`` when ``num_classes == 0``)."""
        tokens = self.encode(
            images, need_weights=need_weights, interpolate_pos_encoding=interpolate_pos_encoding
        )
        return self.head(self.pool(tokens))


register_kind("vit", ViTConfig, VisionTransformer, artifacts="labels")


# ----------------------------------------------------------------------------------------------
# Hugging Face interop (also used by attnlab.interop.from_hf)

# transformers < 5.9 names (also the 4.x names) -> current names, per layer
_VIT_OLD_LAYER_NAMES = {
    "attention.attention.query.": "attention.q_proj.",
    "attention.attention.key.": "attention.k_proj.",
    "attention.attention.value.": "attention.v_proj.",
    "attention.output.dense.": "attention.o_proj.",
    "intermediate.dense.": "mlp.fc1.",
    "output.dense.": "mlp.fc2.",
}


def _square(v: Any, name: str) -> int:
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise UserError(f"only square {name} are supported, got {v}")
        v = v[0]
    return int(v)


_HF_ACT = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def hf_activation(name: str) -> str:
    """Our activation name for an HF ``hidden_act``."""
    if name not in _HF_ACT:
        raise UserError(f"unsupported hidden_act {name!r}; supported: {sorted(_HF_ACT)}")
    return _HF_ACT[name]


def hf_num_labels(cfg_dict: dict) -> tuple[int, list[str]]:
    """``(num_labels, label names)`` from an HF config dict (``id2label`` or ``num_labels``)."""
    id2label = cfg_dict.get("id2label")
    if id2label:
        items = sorted(((int(k), str(v)) for k, v in id2label.items()))
        return len(items), [v for _, v in items]
    n = int(cfg_dict.get("num_labels", 2))
    return n, []


def _strip_prefix(state_dict: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    if any(k.startswith(prefix) for k in state_dict):
        return {(k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in state_dict.items()}
    return dict(state_dict)


def _rename_vit_keys(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Accept transformers < 5.9 key names (``encoder.layer.{i}.attention.attention.query``...)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("encoder.layer."):
            rest = k[len("encoder.layer.") :]
            i, name = rest.split(".", 1)
            for old, new in _VIT_OLD_LAYER_NAMES.items():
                if name.startswith(old):
                    name = new + name[len(old) :]
                    break
            k = f"layers.{i}.{name}"
        out[k] = v
    return out


def vit_config_from_hf(cfg_dict: dict, state_dict: dict[str, Tensor] | None = None) -> ViTConfig:
    """Our :class:`ViTConfig` for an HF ViT ``config.json`` dict.

    The classification head and the pooler are included when ``state_dict`` holds their weights
    (``classifier.weight``, ``pooler.dense.weight``); without a state dict, a head is assumed when
    the architecture is ``ViTForImageClassification``.
    """
    sd = _strip_prefix(state_dict or {}, "vit.")
    archs = cfg_dict.get("architectures") or []
    has_head = (
        ("classifier.weight" in sd)
        if state_dict is not None
        else ("ViTForImageClassification" in archs)
    )
    n_labels, labels = hf_num_labels(cfg_dict)
    hidden = int(cfg_dict.get("hidden_size", 768))
    return ViTConfig(
        image_size=_square(cfg_dict.get("image_size", 224), "images"),
        patch_size=_square(cfg_dict.get("patch_size", 16), "patches"),
        in_channels=int(cfg_dict.get("num_channels", 3)),
        num_classes=n_labels if has_head else 0,
        labels=labels if has_head else [],
        d_model=hidden,
        n_layers=int(cfg_dict.get("num_hidden_layers", 12)),
        n_heads=int(cfg_dict.get("num_attention_heads", 12)),
        ffn_hidden=int(cfg_dict.get("intermediate_size", 4 * hidden)),
        activation=hf_activation(cfg_dict.get("hidden_act", "gelu")),
        norm_eps=float(cfg_dict.get("layer_norm_eps", 1e-12)),
        qkv_bias=bool(cfg_dict.get("qkv_bias", True)),
        pooling="cls",
        position="learned",
        pooler=("pooler.dense.weight" in sd) if state_dict is not None else False,
    )


def vit_from_hf_state_dict(cfg_dict: dict, state_dict: dict[str, Tensor]) -> VisionTransformer:
    """Our ViT from an HF ViT config dict and state dict (ViTModel / ViTForImageClassification).

    Q, K and V are stacked into our fused ``qkv`` (rows Q|K|V). Key names of transformers < 5.9
    (``encoder.layer.{i}.attention.attention.query`` ...) are accepted as well as the current ones.

    Raises:
        UserError: missing or unexpected weights (the message names them).
    """
    cfg = vit_config_from_hf(cfg_dict, state_dict)
    model = VisionTransformer(cfg)
    sd = _rename_vit_keys(_strip_prefix(state_dict, "vit."))
    ours: dict[str, Tensor] = {}

    def take(src: str, dst: str) -> None:
        if src not in sd:
            raise UserError(f"HF ViT state dict lacks {src!r}")
        ours[dst] = sd.pop(src)

    take("embeddings.cls_token", "cls_token")
    take("embeddings.position_embeddings", "pos_embed")
    for p in ("weight", "bias"):
        take(f"embeddings.patch_embeddings.projection.{p}", f"patch_embed.proj.{p}")
    for i in range(cfg.n_layers):
        a, b = f"layers.{i}.", f"blocks.{i}."
        for p in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            parts = [sd.pop(f"{a}attention.{n}_proj.{p}", None) for n in "qkv"]
            if any(t is None for t in parts):
                raise UserError(f"HF ViT state dict lacks {a}attention.q/k/v_proj.{p}")
            ours[f"{b}attn.qkv.{p}"] = torch.cat(parts, dim=0)  # (3C, C) rows Q|K|V
        for p in ("weight", "bias"):
            take(f"{a}attention.o_proj.{p}", f"{b}attn.out_proj.{p}")
            take(f"{a}layernorm_before.{p}", f"{b}norm1.{p}")
            take(f"{a}layernorm_after.{p}", f"{b}norm2.{p}")
            take(f"{a}mlp.fc1.{p}", f"{b}ffn.fc1.{p}")
            take(f"{a}mlp.fc2.{p}", f"{b}ffn.fc2.{p}")
    for p in ("weight", "bias"):
        take(f"layernorm.{p}", f"norm.{p}")
        if cfg.pooler:
            take(f"pooler.dense.{p}", f"pooler.{p}")
        if cfg.num_classes:
            take(f"classifier.{p}", f"head.{p}")
    if sd:
        raise UserError(f"unexpected HF ViT weights: {sorted(sd)[:8]}")
    model.load_state_dict(ours, strict=True)
    return model


def vit_to_hf(model: VisionTransformer) -> tuple[dict, dict[str, Tensor]]:
    """``(config dict, state dict)`` in the layout of HF ViT (transformers >= 5.9 names).

    A model with a head maps to ``ViTForImageClassification`` (``vit.`` prefix), one without to
    ``ViTModel``. Only class-token pooling with learned positions has an HF counterpart.
    """
    c = model.config
    if c.pooling != "cls" or c.position != "learned":
        raise UserError("HF ViT needs pooling='cls' and position='learned'")
    act = {v: k for k, v in _HF_ACT.items() if k in ("gelu", "gelu_new", "relu", "silu")}
    has_head = c.num_classes > 0
    cfg = {
        "model_type": "vit",
        "architectures": ["ViTForImageClassification" if has_head else "ViTModel"],
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.in_channels,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "intermediate_size": c.ffn_hidden,
        "hidden_act": act[c.activation],
        "layer_norm_eps": c.norm_eps,
        "qkv_bias": c.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if has_head:
        names = c.labels or [f"LABEL_{i}" for i in range(c.num_classes)]
        cfg["id2label"] = {str(i): n for i, n in enumerate(names)}
        cfg["label2id"] = {n: i for i, n in enumerate(names)}
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pre = "vit." if has_head else ""
    out: dict[str, Tensor] = {
        f"{pre}embeddings.cls_token": sd["cls_token"],
        f"{pre}embeddings.position_embeddings": sd["pos_embed"],
    }
    for p in ("weight", "bias"):
        out[f"{pre}embeddings.patch_embeddings.projection.{p}"] = sd[f"patch_embed.proj.{p}"]
    for i in range(c.n_layers):
        a, b = f"{pre}layers.{i}.", f"blocks.{i}."
        for p in ("weight", "bias") if c.qkv_bias else ("weight",):
            for n, t in zip("qkv", sd[f"{b}attn.qkv.{p}"].chunk(3, dim=0), strict=True):
                out[f"{a}attention.{n}_proj.{p}"] = t.clone()
        for p in ("weight", "bias"):
            out[f"{a}attention.o_proj.{p}"] = sd[f"{b}attn.out_proj.{p}"]
            out[f"{a}layernorm_before.{p}"] = sd[f"{b}norm1.{p}"]
            out[f"{a}layernorm_after.{p}"] = sd[f"{b}norm2.{p}"]
            out[f"{a}mlp.fc1.{p}"] = sd[f"{b}ffn.fc1.{p}"]
            out[f"{a}mlp.fc2.{p}"] = sd[f"{b}ffn.fc2.{p}"]
    for p in ("weight", "bias"):
        out[f"{pre}layernorm.{p}"] = sd[f"norm.{p}"]
        if c.pooler:
            out[f"{pre}pooler.dense.{p}"] = sd[f"pooler.{p}"]
        if has_head:
            out[f"classifier.{p}"] = sd[f"head.{p}"]
    return cfg, out
