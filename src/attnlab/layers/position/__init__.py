"""Position information behind one interface (:class:`Positions`): embed, rotate, bias.

- absolute (added to the embeddings): the 1-D tables live in :mod:`attnlab.layers.block`, beside
  the block whose input they feed, so the GPT reads in one file
  (``attnlab.layers.LearnedPositionalEmbedding``, ``attnlab.layers.SinusoidalPositionalEmbedding``;
  importing them here would make the two modules import each other); :func:`sinusoidal_table`;
  2-D patch grids (:class:`PatchGridPositions`,
  :func:`sincos_2d`, :func:`interpolate_positions`);
- inside attention: :class:`RotaryEmbedding` (RoPE rotates q and k), :class:`ALiBi` (a distance
  penalty on the scores), :class:`T5RelativeBias` (a learned score per distance bucket),
  :class:`RelativePositionBias` (Swin's learned window table).

:func:`attnlab.layers.builders.build_positions` turns a config's ``position`` name into the module
a model owns.
"""

from __future__ import annotations

from attnlab.layers.position.alibi import ALiBi, alibi_bias, alibi_slopes
from attnlab.layers.position.base import NoPositions, Positions, sinusoidal_table
from attnlab.layers.position.grid import PatchGridPositions, interpolate_positions, sincos_2d
from attnlab.layers.position.relative import RelativePositionBias
from attnlab.layers.position.rope import RotaryEmbedding, apply_rotary, rotate_half
from attnlab.layers.position.t5 import T5RelativeBias, relative_position_bucket

__all__ = [
    "POSITION_KINDS",
    "Positions",
    "NoPositions",
    "sinusoidal_table",
    "RotaryEmbedding",
    "apply_rotary",
    "rotate_half",
    "ALiBi",
    "alibi_slopes",
    "alibi_bias",
    "sincos_2d",
    "T5RelativeBias",
    "relative_position_bucket",
    "interpolate_positions",
    "PatchGridPositions",
    "RelativePositionBias",
]

#: 1-D schemes :func:`attnlab.layers.builders.build_positions` knows
POSITION_KINDS = ("none", "learned", "sinusoidal", "rope", "alibi", "t5")
