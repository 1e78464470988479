"""The vision family: Vision Transformer, DeiT (a ViT with a distillation token), Swin Transformer
and a residual CNN baseline.

Their configs live in :mod:`attnlab.config.vision` (re-exported here); Hugging Face conversion in
:mod:`attnlab.interop.hf.vision`.
"""

from attnlab.config.vision import CNNConfig, DeiTConfig, SwinConfig, ViTConfig
from attnlab.models.vision.cnn import ResidualCNN
from attnlab.models.vision.deit import DeiT
from attnlab.models.vision.swin import SwinTransformer
from attnlab.models.vision.vit import VisionTransformer

__all__ = [
    "ViTConfig",
    "DeiTConfig",
    "SwinConfig",
    "CNNConfig",
    "VisionTransformer",
    "DeiT",
    "SwinTransformer",
    "ResidualCNN",
]
