"""The vision family: Vision Transformer, Swin Transformer and a residual CNN baseline.

Their configs live in :mod:`attnlab.config.vision` (re-exported here); Hugging Face conversion in
:mod:`attnlab.interop.hf.vision`.
"""

from attnlab.config.vision import CNNConfig, SwinConfig, ViTConfig
from attnlab.models.vision.cnn import ResidualCNN
from attnlab.models.vision.swin import SwinTransformer
from attnlab.models.vision.vit import VisionTransformer

__all__ = [
    "ViTConfig",
    "SwinConfig",
    "CNNConfig",
    "VisionTransformer",
    "SwinTransformer",
    "ResidualCNN",
]
