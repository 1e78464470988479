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

from typing import ClassVar

from torch import Tensor, nn

from attnlab.config.vision import CNNConfig
from attnlab.layers.patch_embed import check_images
from attnlab.models.registry import register_kind

__all__ = ["ResidualCNN", "ResidualBlock"]


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
        config: a :class:`~attnlab.config.vision.CNNConfig`.
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

    def forward(
        self, images: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Class scores ``(B, L)``; ``(scores, [])`` with ``need_weights`` (a CNN has no
        attention: the empty list keeps the vision models' interface uniform)."""
        logits = self.head(self.drop(self.pooled_features(images)))
        return (logits, []) if need_weights else logits


register_kind("cnn", CNNConfig, ResidualCNN, artifacts="labels")
