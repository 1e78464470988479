"""Image encoders of the captioners and VQA models: the vision family's CNN or ViT, read as a
grid of image tokens.

This is the one module of the multimodal family that imports the vision models, and it uses only
their public face (``features``, ``pooled_features``, ``feature_dim``, ``forward`` and their
configs). :class:`ImageEncoder` states its token grid ``(Gh, Gw)`` from the config — the CNN's
last feature map (every stage after the first halves the resolution) or the ViT's patch grid —
so the models build their 2-D positions for it and never guess it from a token count.

Shape legend: B batch, H = W image size, Gh/Gw token grid, N = Gh·Gw image tokens, C encoder
width, L classes.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.config.multimodal import SceneModelConfig
from attnlab.config.vision import CNNConfig, ViTConfig
from attnlab.errors import UserError
from attnlab.layers import evaluating
from attnlab.models.vision.cnn import ResidualCNN
from attnlab.models.vision.vit import VisionTransformer

__all__ = ["ImageEncoder", "Reads", "check_images", "token_grid", "upgrade_weights"]

#: what a model reads from its encoder: the token grid, the pooled vector, or the class logits
Reads = Literal["tokens", "vector", "logits"]


def check_images(images: Tensor, image_size: int) -> None:
    """Raise a :class:`UserError` naming the shape unless ``images`` is ``(B, 3, S, S)``."""
    if images.dim() != 4 or tuple(images.shape[1:]) != (3, image_size, image_size):
        raise UserError(
            f"this model expects images (B, 3, {image_size}, {image_size}), "
            f"got {tuple(images.shape)}"
        )


def token_grid(config: SceneModelConfig) -> tuple[int, int]:
    """``(Gh, Gw)`` of the encoder's image tokens for ``config``.

    CNN: every stage after the first is a stride-2 3×3 convolution with padding 1, which maps a
    side s to ⌈s / 2⌉. ViT: ``image_size / patch_size`` patches per side.
    """
    enc = config.encoder
    if isinstance(enc, ViTConfig):
        g = enc.image_size // enc.patch_size
        return g, g
    side = enc.image_size
    for _ in range(len(enc.channels) - 1):
        side = (side + 1) // 2
    return side, side


def _build_net(config: SceneModelConfig, num_classes: int) -> nn.Module:
    """The vision family's CNN or ViT of ``config.encoder``, with a head of ``num_classes``."""
    enc = config.encoder.replace(num_classes=num_classes, labels=[])
    if isinstance(enc, CNNConfig):
        return ResidualCNN(enc)
    return VisionTransformer(enc)


class ImageEncoder(nn.Module):
    """A CNN or ViT image encoder with its token grid stated.

    Args:
        config: the model config (its ``encoder``: a CNN or ViT config, and ``image_size``).
        num_classes: classes of the encoder's own head (0: none).
        reads: what the model reads (``tokens``, ``vector`` or ``logits``); parameters that do not
            take part in it are frozen, since DDP needs every trainable parameter in the loss.
        frozen: keep all weights and the batch-norm statistics fixed (a pre-trained encoder).

    Attributes:
        net: the vision model.
        grid: ``(Gh, Gw)`` of :meth:`tokens`, numbered row by row.
        feature_dim: C.
    """

    def __init__(
        self,
        config: SceneModelConfig,
        *,
        num_classes: int = 0,
        reads: Reads = "tokens",
        frozen: bool = False,
    ) -> None:
        super().__init__()
        self.image_size = config.image_size
        self.grid = token_grid(config)
        self.net = _build_net(config, num_classes)
        self.feature_dim = int(self.net.feature_dim)
        self.frozen = frozen
        if frozen:
            self.net.requires_grad_(False)
            self.net.eval()
        else:
            self._freeze_unused(reads)

    def _freeze_unused(self, reads: Reads) -> None:
        """Freeze the parameters ``reads`` never touches, found by one backward on a blank image
        (the head when reading tokens or the vector; the CNN's pooled-vector norm for tokens)."""
        read = {"tokens": self.tokens, "vector": self.vector, "logits": self.logits}[reads]
        # eval mode: no batch-norm statistics from the blank image
        with evaluating(self.net), torch.enable_grad():
            read(torch.zeros(1, 3, self.image_size, self.image_size)).float().sum().backward()
        for p in self.net.parameters():
            if p.grad is None:
                p.requires_grad_(False)
            p.grad = None

    def train(self, mode: bool = True) -> ImageEncoder:
        super().train(mode)
        if self.frozen:  # frozen means frozen batch-norm statistics too
            self.net.eval()
        return self

    def tokens(self, images: Tensor) -> Tensor:
        """Image tokens ``(B, N, C)`` on the grid :attr:`grid`."""
        check_images(images, self.image_size)
        feats = self.net.features(images)  # (B, N, C)
        if feats.shape[1] != self.grid[0] * self.grid[1]:
            raise RuntimeError(
                f"the encoder gave {feats.shape[1]} tokens, not the {self.grid} grid it states"
            )
        return feats

    def vector(self, images: Tensor) -> Tensor:
        """One feature vector per image ``(B, C)`` (the classifier's penultimate features)."""
        check_images(images, self.image_size)
        return self.net.pooled_features(images)

    def logits(self, images: Tensor) -> Tensor:
        """The encoder's class scores ``(B, L)``."""
        check_images(images, self.image_size)
        return self.net(images)


#: first-release weight names -> today's (the encoder moved into ImageEncoder.net)
_RENAMED_PREFIXES = {"encoder.": "encoder.net."}


def upgrade_weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename first-release weights (``encoder.X`` -> ``encoder.net.X``, and the ViT's own
    renames inside it); today's names pass unchanged."""
    out = {}
    for name, t in state.items():
        for old, new in _RENAMED_PREFIXES.items():
            if name.startswith(old) and not name.startswith(new):
                name = new + name[len(old) :]
        if name == "encoder.net.pos_embed":  # the ViT's position table became a module
            name = "encoder.net.pos_embed.weight"
        out[name] = t
    return out
