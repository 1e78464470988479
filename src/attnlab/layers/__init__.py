"""Transformer building blocks: positions, norms, FFNs, mixture of experts, drop-path, patch
embedding, the block, the RNN baselines' recurrent stacks, the cross-entropy, and the ``evaluating``
mode switch."""

from attnlab.layers.drop_path import DropPath, drop_path
from attnlab.layers.ffn import MLP, GatedFFN, SwiGLU
from attnlab.layers.losses import cross_entropy
from attnlab.layers.modes import evaluating
from attnlab.layers.moe import MoE, load_balancing_loss
from attnlab.layers.norm import LayerNorm, RMSNorm, make_norm
from attnlab.layers.patch_embed import PatchEmbedding, check_images
from attnlab.layers.position import (
    ALiBi,
    LearnedPositionalEmbedding,
    NoPositions,
    PatchGridPositions,
    Positions,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    sincos_2d,
    sinusoidal_table,
)
from attnlab.layers.position.grid import interpolate_positions
from attnlab.layers.rnn import stacked_rnn

__all__ = [
    "ALiBi",
    "DropPath",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MLP",
    "MoE",
    "NoPositions",
    "PatchEmbedding",
    "PatchGridPositions",
    "Positions",
    "RelativePositionBias",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "SwiGLU",
    "GatedFFN",
    "T5RelativeBias",
    "TransformerBlock",
    "alibi_bias",
    "alibi_slopes",
    "build_attention",
    "build_block",
    "build_ffn",
    "build_final_norm",
    "build_positions",
    "check_images",
    "cross_entropy",
    "drop_path",
    "evaluating",
    "interpolate_positions",
    "load_balancing_loss",
    "make_norm",
    "sincos_2d",
    "sinusoidal_table",
    "stacked_rnn",
]


def __getattr__(name: str):
    # block.py and builders.py need attnlab.attention, whose multi-head layer needs layers.norm/position:
    # importing it here eagerly would make the two package inits import each other
    if name == "TransformerBlock":
        from attnlab.layers import block

        return block.TransformerBlock
    if name in (
        "build_attention",
        "build_block",
        "build_ffn",
        "build_final_norm",
        "build_positions",
    ):
        from attnlab.layers import builders

        return getattr(builders, name)
    raise AttributeError(f"module 'attnlab.layers' has no attribute {name!r}")
