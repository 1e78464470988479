"""Transformer building blocks: positions, norms, FFNs, mixture of experts, drop-path, patch
embedding, the RNN baselines' recurrent stacks, the cross-entropy, and the ``evaluating`` mode
switch.

The block (:mod:`attnlab.layers.block`) and the builders (:mod:`attnlab.layers.builders`) are
imported from their modules: they need :mod:`attnlab.attention`, whose multi-head layer needs
this package's norms and positions, so importing them here would make the two packages' inits
import each other."""

from attnlab.layers.drop_path import DropPath, drop_path
from attnlab.layers.ffn import MLP, GatedFFN, SwiGLU
from attnlab.layers.losses import cross_entropy
from attnlab.layers.modes import evaluating
from attnlab.layers.moe import MoE, load_balancing_loss
from attnlab.layers.norm import BatchNorm, LayerNorm, RMSNorm, make_norm
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
