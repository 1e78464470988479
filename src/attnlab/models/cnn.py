"""A small residual CNN: the convolutional baseline for the inductive-bias comparison.

Convolutions build in what a ViT has to learn from data: locality (a 3×3 kernel sees only its
neighbours) and translation equivariance (the same kernel everywhere), stacked into a hierarchy of
ever larger receptive fields. Each stage is a few residual blocks (He et al. 2016)

    y = ReLU(x + BN(conv(ReLU(BN(conv(x))))))

and every stage after the first halves the resolution (stride 2) and widens the channels. The head
is the ViT's: global average pooling of the last feature map, a LayerNorm, and one linear layer.
``features`` returns the last feature map as a grid of tokens, so captioning/VQA models can attend
over it like over ViT patches.

Shape legend: B batch, Cin image channels, H/W image size, Ck channels of stage k, h/w feature-map
size, N = h·w grid tokens, C = feature width (last stage's channels), L classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from attnlab.models.vit import check_images
from attnlab.models.registry import register_kind

__all__ = ["CNNConfig", "ResidualCNN", "ResidualBlock", "CNN_PRESETS"]

CNN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(image_size=8, in_channels=1, num_classes=10, channels=[32, 64], blocks=[1, 1]),
    "small": dict(
        image_size=32, in_channels=3, num_classes=10, channels=[32, 64, 128], blocks=[2, 2, 2]
    ),
    "resnet-ish": dict(
        image_size=224,
        in_channels=3,
        num_classes=1000,
        channels=[64, 128, 256, 512],
        blocks=[2, 2, 2, 2],
    ),
}


@dataclass
class CNNConfig:
    """Hyper-parameters of a :class:`ResidualCNN`.

    Attributes:
        image_size: side of the square input image (0 = any size).
        in_channels: image channels.
        num_classes: classifier outputs (0 = no head).
        channels: channels of each stage; stage k > 0 starts with a stride-2 block.
        blocks: residual blocks per stage.
        dropout: dropout before the classifier.
    """

    image_size: int = 8
    in_channels: int = 1
    num_classes: int = 10
    channels: list[int] = field(default_factory=lambda: [32, 64])
    blocks: list[int] = field(default_factory=lambda: [1, 1])
    dropout: float = 0.0
    norm_eps: float = 1e-5
    labels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.channels, self.blocks = list(self.channels), list(self.blocks)
        if not self.channels or len(self.channels) != len(self.blocks):
            raise ValueError(
                f"channels {self.channels} and blocks {self.blocks} must be non-empty "
                "lists of the same length"
            )
        if min(self.channels) < 1 or min(self.blocks) < 1:
            raise ValueError(f"channels {self.channels} and blocks {self.blocks} must be positive")
        if self.in_channels < 1 or self.num_classes < 0 or self.image_size < 0:
            raise ValueError(
                f"bad CNNConfig sizes: in_channels={self.in_channels}, "
                f"num_classes={self.num_classes}, image_size={self.image_size}"
            )
        if self.labels and len(self.labels) != self.num_classes:
            raise ValueError(f"{len(self.labels)} labels given for num_classes={self.num_classes}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CNNConfig:
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> CNNConfig:
        """A named configuration (``CNN_PRESETS``) with fields overridden."""
        if name not in CNN_PRESETS:
            raise ValueError(f"unknown CNN preset {name!r}; known: {sorted(CNN_PRESETS)}")
        return cls(**{**CNN_PRESETS[name], **overrides})


class ResidualBlock(nn.Module):
    """Two 3×3 convolutions with batch norm and a skip connection (1×1 conv when the shape changes).

    Args:
        c_in, c_out: channels in and out.
        stride: 2 halves the resolution.
    """

    def __init__(self, c_in: int, c_out: int, stride: int = 1, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out, eps=eps)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out, eps=eps)
        self.act = nn.ReLU()
        if stride != 1 or c_in != c_out:
            self.skip: nn.Module = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out, eps=eps)
            )
        else:
            self.skip = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``(B, c_in, H, W) -> (B, c_out, H/stride, W/stride)``."""
        h = self.act(self.bn1(self.conv1(x)))
        return self.act(self.skip(x) + self.bn2(self.conv2(h)))


class ResidualCNN(nn.Module):
    """Residual CNN classifier with ViT-style head and token features.

    Args:
        config: a :class:`CNNConfig`.
    """

    kind: ClassVar[str] = "cnn"

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = c = config
        self.stem = nn.Sequential(
            nn.Conv2d(c.in_channels, c.channels[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(c.channels[0], eps=c.norm_eps),
            nn.ReLU(),
        )
        layers: list[nn.Module] = []
        c_prev = c.channels[0]
        for k, (ch, n) in enumerate(zip(c.channels, c.blocks, strict=True)):
            for j in range(n):
                layers.append(
                    ResidualBlock(c_prev, ch, stride=2 if (k > 0 and j == 0) else 1, eps=c.norm_eps)
                )
                c_prev = ch
        self.stages = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(c_prev, eps=1e-6)
        self.drop = nn.Dropout(c.dropout)
        self.head = nn.Linear(c_prev, c.num_classes) if c.num_classes > 0 else nn.Identity()
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    @property
    def feature_dim(self) -> int:
        """Width C of :meth:`features` and :meth:`pooled_features`."""
        return self.config.channels[-1]

    def feature_map(self, images: Tensor) -> Tensor:
        """Last stage's activations ``(B, C, h, w)``.

        Raises:
            UserError: wrong rank, channel count or size (the message names the values).
        """
        c = self.config
        check_images(images, c.in_channels, c.image_size or None, what="CNN")
        # a channels-last view hangs or crashes oneDNN's convolution backward on some CPUs
        return self.stages(self.stem(images.contiguous()))

    def features(self, images: Tensor) -> Tensor:
        """Grid tokens ``(B, N = h·w, C)``, numbered row by row (like ViT patches)."""
        return self.feature_map(images).flatten(2).transpose(1, 2)  # (B, h·w, C)

    def pooled_features(self, images: Tensor) -> Tensor:
        """Penultimate features ``(B, C)``: normalised global average of the last feature map."""
        return self.norm(self.feature_map(images).mean(dim=(2, 3)))

    def forward(self, images: Tensor, *, need_weights: bool = False) -> Tensor:
        """Class scores ``(B, L)`` (``need_weights`` only keeps the interface uniform)."""
        return self.head(self.drop(self.pooled_features(images)))


register_kind("cnn", CNNConfig, ResidualCNN, artifacts="labels")
