"""Transformer building blocks: positions, norms, FFNs, mixture of experts, drop-path, patch
embedding, the RNN baselines' recurrent stacks, the cross-entropy, and the ``evaluating`` mode
switch.

The norms, FFNs and absolute positions live in :mod:`attnlab.layers.block` with the block (the
GPT reads in one file). The block itself and the builders (:mod:`attnlab.layers.builders`) are
imported from their modules: the builders need :mod:`attnlab.attention`, whose multi-head layer
needs this package's hook points and positions."""

from attnlab.layers.block import (
    MLP,
    BatchNorm,
    GatedFFN,
    LayerNorm,
    LearnedPositionalEmbedding,
    RMSNorm,
    SinusoidalPositionalEmbedding,
    SwiGLU,
    make_norm,
)
from attnlab.layers.drop_path import DropPath, drop_path
from attnlab.layers.losses import cross_entropy
from attnlab.layers.modes import evaluating
from attnlab.layers.moe import MoE, load_balancing_loss
from attnlab.layers.patch_embed import PatchEmbedding, check_images
from attnlab.layers.position import (
    ALiBi,
    NoPositions,
    PatchGridPositions,
    Positions,
    RelativePositionBias,
    RotaryEmbedding,
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
    "BatchNorm",
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
    "alibi_bias",
    "alibi_slopes",
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
