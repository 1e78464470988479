"""Configs of the vision family: ViT, Swin, the residual CNN, and the image-classification task.

``ViTConfig`` and ``SwinConfig`` embed every :class:`~attnlab.config.base.BlockConfig` field, so
grouped-query attention, QK-norm, SwiGLU, mixture of experts, every attention backend and
drop-path work for vision without new code; their own fields describe the image side (patches,
pooling, grid positions, windows, stages). ``CNNConfig`` is a plain :class:`Config`.
``DeiTConfig`` is a ViT with a distillation token (the same fields). ``ImageTaskConfig`` holds the
data options of ``attnlab train image`` (config.json's ``task``), the teacher of a DeiT among them.

    ViTConfig.preset("tiny", pooling="mean", ffn="swiglu")
    SwinConfig.preset("swin-t", num_classes=10)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from attnlab.config.base import Activation, BlockConfig, Config, ConfigError

__all__ = [
    "ViTConfig",
    "DeiTConfig",
    "SwinConfig",
    "CNNConfig",
    "ImageTaskConfig",
    "ImageSource",
    "VIT_PRESETS",
    "SWIN_PRESETS",
    "CNN_PRESETS",
]

#: where ``attnlab train image`` reads its images (see :mod:`attnlab.data.images`)
ImageSource = Literal["digits", "shapes", "folder", "cifar10", "mnist"]


def _square(n: int) -> dict[str, Any]:
    return dict(image_size=n, in_channels=3, num_classes=1000)


_VIT_16 = dict(_square(224), patch_size=16)
# Presets are data. "tiny" is the CPU default sized for 8×8 digits; the vit-* ones follow the paper
# (Ti/S from DeiT) at 224×224 with 16×16 patches (196 tokens + class token).
VIT_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        image_size=8, patch_size=2, in_channels=1, num_classes=10, d_model=64, n_layers=2,
        n_heads=4, ffn_hidden=128,
    ),
    "small": dict(
        image_size=32, patch_size=4, in_channels=3, num_classes=10, d_model=128, n_layers=6,
        n_heads=4, ffn_hidden=256,
    ),
    "vit-ti16": dict(_VIT_16, d_model=192, n_layers=12, n_heads=3, ffn_hidden=768),
    "vit-s16": dict(_VIT_16, d_model=384, n_layers=12, n_heads=6, ffn_hidden=1536),
    "vit-b16": dict(_VIT_16, d_model=768, n_layers=12, n_heads=12, ffn_hidden=3072),
    "vit-l16": dict(_VIT_16, d_model=1024, n_layers=24, n_heads=16, ffn_hidden=4096),
}  # fmt: skip

_SWIN_T = dict(_square(224), patch_size=4, d_model=96, window_size=7, mlp_ratio=4.0)
SWIN_PRESETS: dict[str, dict[str, Any]] = {
    # 8×8 digits: 2×2 patches; stage 1 is a 4×4 map of 2×2 windows (shifted by 1 every other
    # block), stage 2 a 2×2 map (one window). 1-pixel patches learn far slower on digits.
    "tiny": dict(
        image_size=8, patch_size=2, in_channels=1, num_classes=10, d_model=32, depths=[2, 2],
        n_heads=[2, 4], window_size=2, mlp_ratio=2.0,
    ),
    "small": dict(
        image_size=32, patch_size=2, in_channels=3, num_classes=10, d_model=48,
        depths=[2, 2, 2], n_heads=[3, 6, 12], window_size=4, mlp_ratio=4.0,
    ),
    "swin-t": dict(_SWIN_T, depths=[2, 2, 6, 2], n_heads=[3, 6, 12, 24]),
    "swin-s": dict(_SWIN_T, depths=[2, 2, 18, 2], n_heads=[3, 6, 12, 24]),
    "swin-b": dict(_SWIN_T, d_model=128, depths=[2, 2, 18, 2], n_heads=[4, 8, 16, 32]),
}  # fmt: skip

CNN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(image_size=8, in_channels=1, num_classes=10, channels=[32, 64], blocks=[1, 1]),
    "small": dict(
        image_size=32, in_channels=3, num_classes=10, channels=[32, 64, 128], blocks=[2, 2, 2]
    ),
    "resnet-ish": dict(_square(224), channels=[64, 128, 256, 512], blocks=[2, 2, 2, 2]),
}  # fmt: skip


def _check_head(cfg: Config) -> None:
    """Sizes every image classifier config shares: positive image sides, a head, its labels."""
    cfg.positive("in_channels")
    cfg.positive("num_classes", allow_zero=True)
    if cfg.labels and len(cfg.labels) != cfg.num_classes:
        raise ConfigError(f"{len(cfg.labels)} labels given for num_classes={cfg.num_classes}")


@dataclass
class ViTConfig(BlockConfig):
    """A :class:`~attnlab.models.vision.VisionTransformer`: the block fields plus the image side.

    Defaults reproduce the first release's ViT: pre-LayerNorm blocks with ε 1e-6, exact GELU,
    an MLP of 4·d_model, learned positions, class-token pooling.

    Attributes:
        image_size: side of the (square) input image in pixels.
        patch_size: side P of a patch; must divide ``image_size``.
        in_channels: image channels (1 grey, 3 RGB).
        num_classes: classifier outputs; 0 = no head (``forward`` returns pooled features).
        n_layers: encoder depth.
        qkv_bias: biases in the Q/K/V projections (the output projection keeps its own when
            ``bias``); HF ViT's ``qkv_bias``.
        pooling: ``cls`` (class token, the paper) or ``mean`` (average of the patch outputs).
        position: ``learned`` (one trained vector per token) or ``sincos`` (fixed 2-D sin-cos),
            added to the patch tokens; resampled to other patch grids.
        pooler: HF ``ViTModel``'s pooler, ``tanh(W · cls)``; only for checkpoint parity.
        patch_bias: a bias in the patch projection (CLIP's image tower has none).
        embed_norm: a norm over the embedded tokens before the first block (CLIP's
            ``pre_layrnorm``).
        init_std: standard deviation of the truncated-normal initialisation.
        labels: class names (optional; as many as ``num_classes``).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = VIT_PRESETS

    activation: Activation = "gelu"
    norm_eps: float = 1e-6
    position: Literal["learned", "sincos"] = "learned"
    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    n_layers: int = 2
    qkv_bias: bool = True
    pooling: Literal["cls", "mean"] = "cls"
    pooler: bool = False
    patch_bias: bool = True
    embed_norm: bool = False
    init_std: float = 0.02
    labels: list[str] = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        self.positive("image_size", "patch_size", "n_layers", "init_std")
        _check_head(self)
        if self.image_size % self.patch_size != 0:
            raise ConfigError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}"
            )
        if self.position == "sincos" and self.d_model % 4 != 0:
            raise ConfigError(
                f"2-D sin-cos positions need d_model divisible by 4, got {self.d_model}"
            )
        if self.pooler and self.pooling != "cls":
            raise ConfigError(
                "the HF pooler reads the class token: pooler=True needs pooling='cls'"
            )

    @property
    def grid_size(self) -> int:
        """Patches per side, ``image_size // patch_size``."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        """N = HW / P²."""
        return self.grid_size**2


@dataclass
class DeiTConfig(ViTConfig):
    """A :class:`~attnlab.models.vision.DeiT`: a ViT with a distillation token and head (Touvron
    et al. 2021). The fields are the ViT's; the presets too. The class token is read by the class
    head, the distillation token by the distillation head, so ``pooling`` must be ``cls``."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = VIT_PRESETS

    def validate(self) -> None:
        super().validate()
        if self.pooling != "cls":
            raise ConfigError(
                f"DeiT reads its class and distillation tokens: pooling must be 'cls', "
                f"got {self.pooling!r}"
            )


@dataclass
class SwinConfig(BlockConfig):
    """A :class:`~attnlab.models.vision.SwinTransformer`: block fields per stage, plus the image side.

    The block fields apply to every stage, except the ones that grow with the stage: stage s has
    width ``d_model · 2**s``, ``n_heads[s]`` heads (``n_kv_heads[s]`` key/value heads) and an FFN
    of ``int(mlp_ratio · width)``. :meth:`stage_block` gives each stage's plain
    :class:`BlockConfig`. Defaults reproduce the first release's Swin.

    Attributes:
        d_model: width C of the first stage (``embed_dim`` in HF and the first release).
        n_heads: attention heads per stage.
        n_kv_heads: key/value heads per stage (None = ``n_heads``; fewer = grouped-query).
        position: ``relative`` (the learned ``(2w−1)²`` × heads window table, Swin's) or
            ``none`` (an ablation without it).
        image_size, patch_size, in_channels, num_classes: as for ViT (num_classes 0 = no head).
        depths: blocks per stage; odd-numbered blocks (1, 3, …) use shifted windows.
        window_size: window side w. Every stage's resolution must be a multiple of w, or at most w
            (then the window covers the whole map and there is no shift, as in HF and timm).
        mlp_ratio: FFN width = ``int(mlp_ratio · C)`` of the stage (``ffn_hidden`` stays unset).
        qkv_bias: biases in the Q/K/V projections.
        absolute_positions: add learned absolute positions after the patch embedding (HF
            ``use_absolute_embeddings``; off in Swin).
        drop_path: stochastic-depth rate of the last block (linearly increasing from 0 over all
            blocks of all stages).
        init_std, labels: as for ViT.

    The norms of the patch embedding and of patch merging are LayerNorms with ε 1e-5, as in HF and
    timm; ``norm`` / ``norm_eps`` set the blocks' and the final norm.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = SWIN_PRESETS
    RENAMED: ClassVar[dict[str, str]] = {"embed_dim": "d_model"}

    d_model: int = 32
    n_heads: list[int] = field(default_factory=lambda: [2, 4])
    n_kv_heads: list[int] | None = None
    activation: Activation = "gelu"
    position: Literal["relative", "none"] = "relative"
    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    depths: list[int] = field(default_factory=lambda: [2, 2])
    window_size: int = 2
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    absolute_positions: bool = False
    init_std: float = 0.02
    labels: list[str] = field(default_factory=list)

    def validate(self) -> None:
        # Config's checks only: BlockConfig's would read n_heads as one number, and a Swin has one
        # per stage. Every stage's plain BlockConfig (stage_block) runs those checks below.
        Config.validate(self)
        if not self.depths or len(self.depths) != len(self.n_heads):
            raise ConfigError(
                f"depths {self.depths} and n_heads {self.n_heads} must be non-empty "
                "lists of the same length"
            )
        if self.n_kv_heads is not None and len(self.n_kv_heads) != len(self.depths):
            raise ConfigError(f"n_kv_heads {self.n_kv_heads} needs one entry per stage")
        if min(self.depths) < 1 or min(self.n_heads) < 1:
            raise ConfigError(f"depths {self.depths} and n_heads {self.n_heads} must be positive")
        if self.ffn_hidden is not None:
            raise ConfigError("Swin sizes each stage's FFN with mlp_ratio; leave ffn_hidden unset")
        self.positive("image_size", "patch_size", "d_model", "window_size", "mlp_ratio")
        self.positive("init_std")
        _check_head(self)
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}"
            )
        for s, (dim, h) in enumerate(zip(self.stage_dims, self.n_heads, strict=True)):
            if self.head_dim is None and dim % h:
                raise ConfigError(f"stage {s}: width {dim} is not divisible by n_heads={h}")
        res = self.image_size // self.patch_size
        for s in range(len(self.depths)):
            if res > self.window_size and res % self.window_size:
                raise ConfigError(
                    f"stage {s} resolution {res}×{res} (image_size={self.image_size}, "
                    f"patch_size={self.patch_size}) is not divisible by "
                    f"window_size={self.window_size}"
                )
            if s < len(self.depths) - 1:
                if res % 2:
                    raise ConfigError(
                        f"stage {s} resolution {res}×{res} is odd: patch merging "
                        f"needs even sizes (image_size={self.image_size})"
                    )
                res //= 2
        for s in range(len(self.depths)):
            self.stage_block(s)  # each stage's block fields must fit together

    def stage_block(self, stage: int) -> BlockConfig:
        """The plain :class:`BlockConfig` of the blocks of ``stage`` (what ``build_block`` reads).

        Raises:
            ConfigError: block fields that do not fit this stage's width (named by the stage).
        """
        dim = self.stage_dims[stage]
        d = self.block_fields()
        d.update(
            d_model=dim,
            n_heads=self.n_heads[stage],
            n_kv_heads=None if self.n_kv_heads is None else self.n_kv_heads[stage],
            ffn_hidden=int(self.mlp_ratio * dim),
            position="none",  # the window table is added by the Swin block, not the attention
        )
        try:
            return BlockConfig(**d)
        except ConfigError as err:
            raise ConfigError(f"stage {stage} (width {dim}): {err}") from None

    @property
    def block(self) -> BlockConfig:
        """The first stage's :class:`BlockConfig` (later stages: :meth:`stage_block`)."""
        return self.stage_block(0)

    @property
    def stage_dims(self) -> list[int]:
        """Width of each stage: C, 2C, 4C, …"""
        return [self.d_model * 2**s for s in range(len(self.depths))]

    @property
    def stage_resolutions(self) -> list[int]:
        """Token-grid side of each stage."""
        g = self.image_size // self.patch_size
        return [g // 2**s for s in range(len(self.depths))]

    @property
    def num_features(self) -> int:
        """Width of the last stage (the feature/pooled width)."""
        return self.stage_dims[-1]


@dataclass
class CNNConfig(Config):
    """A :class:`~attnlab.models.vision.ResidualCNN`.

    Attributes:
        image_size: side of the square input image (0 = any size).
        in_channels: image channels.
        num_classes: classifier outputs (0 = no head).
        channels: channels of each stage; stage k > 0 starts with a stride-2 block.
        blocks: residual blocks per stage.
        dropout: dropout before the classifier.
        norm_eps: ε of the batch norms.
        labels: class names (optional).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = CNN_PRESETS

    image_size: int = 8
    in_channels: int = 1
    num_classes: int = 10
    channels: list[int] = field(default_factory=lambda: [32, 64])
    blocks: list[int] = field(default_factory=lambda: [1, 1])
    dropout: float = 0.0
    norm_eps: float = 1e-5
    labels: list[str] = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        if not self.channels or len(self.channels) != len(self.blocks):
            raise ConfigError(
                f"channels {self.channels} and blocks {self.blocks} must be non-empty "
                "lists of the same length"
            )
        if min(self.channels) < 1 or min(self.blocks) < 1:
            raise ConfigError(f"channels {self.channels} and blocks {self.blocks} must be positive")
        self.positive("image_size", allow_zero=True)
        self.positive("norm_eps")
        self.fraction("dropout")
        _check_head(self)


@dataclass
class ImageTaskConfig(Config):
    """The data options of ``attnlab train image`` (config.json's ``task``).

    Attributes:
        data: ``digits`` (scikit-learn's 8×8), ``shapes`` (generated), ``folder`` (class
            sub-folders), ``cifar10`` / ``mnist`` (files on disk).
        data_path: the folder / CIFAR-10 batches / MNIST IDX files.
        image_size: square side in pixels: folder images are resized to it (default 32), shapes
            drawn at it (default 32); digits, CIFAR-10 and MNIST keep their size unless it is set.
        channels: channels of folder images (1 or 3).
        shapes_n, shapes_label: number of generated shapes, and what their class is.
        train_fraction: share of the training split used (a seeded subset).
        augment: random crop (+ flips where they keep the class); None = on for images of 16 px
            or more.
        crop_padding: zero padding of the random crop (None = max(1, side // 8)).
        teacher: run directory of a trained image classifier to distil from (a DeiT student
            only); None = no teacher.
        distillation: ``hard`` (the distillation head learns the teacher's argmax) or ``soft``
            (τ²·KL between the temperature-τ softmaxes of teacher and distillation head).
        distill_alpha: weight of the distillation head's loss; the class head's is 1 − α.
        distill_temperature: τ of soft distillation.
        init_from: run directory of a trained image classifier of the same architecture whose
            weights start this run (pre-training, then fine-tuning here); its head is copied
            when it scores the same classes, else the head starts afresh
            (:mod:`attnlab.models.vision.transfer`). None = a fresh initialisation.

    The task records what it derived next to these (the seed, class names, image shape,
    normalisation, split sizes): ``from_dict`` drops them (``IGNORED``).
    """

    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"name", "seed", "flip", "image_shape", "classes", "mean", "std", "sizes"}
    )

    data: ImageSource = "digits"
    data_path: str | None = None
    image_size: int | None = None
    channels: Literal[1, 3] = 3
    shapes_n: int = 3000
    shapes_label: Literal["shape", "colour", "both"] = "shape"
    train_fraction: float = 1.0
    augment: bool | None = None
    crop_padding: int | None = None
    teacher: str | None = None
    distillation: Literal["hard", "soft"] = "hard"
    distill_alpha: float = 0.5
    distill_temperature: float = 1.0
    init_from: str | None = None

    def validate(self) -> None:
        super().validate()
        self.positive("image_size", "shapes_n", "distill_temperature")
        if not 0.0 <= self.distill_alpha <= 1.0:
            raise ConfigError(f"distill_alpha must be in [0, 1], got {self.distill_alpha}")
        self.positive("crop_padding", allow_zero=True)
        if not 0.0 < self.train_fraction <= 1.0:
            raise ConfigError(f"train_fraction must be in (0, 1], got {self.train_fraction}")
