"""Transformer building blocks: positions, norms, FFNs, mixture of experts, the block."""

from attnlab.layers.ffn import MLP, SwiGLU
from attnlab.layers.moe import MoE, load_balancing_loss
from attnlab.layers.norm import LayerNorm, RMSNorm, make_norm
from attnlab.layers.position import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    sincos_2d,
    sinusoidal_table,
)

__all__ = [
    "MLP",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MoE",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "alibi_bias",
    "alibi_slopes",
    "build_block",
    "load_balancing_loss",
    "make_norm",
    "sincos_2d",
    "sinusoidal_table",
]


def __getattr__(name: str):
    # block.py needs attnlab.attention, which needs layers.norm/position: import it lazily
    if name in ("TransformerBlock", "build_block"):
        from attnlab.layers import block

        return getattr(block, name)
    raise AttributeError(f"module 'attnlab.layers' has no attribute {name!r}")
