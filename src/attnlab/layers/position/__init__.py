"""Position information behind one interface (:class:`Positions`): embed, rotate, bias.

- absolute (added to the embeddings): :class:`SinusoidalPositionalEmbedding`,
  :class:`LearnedPositionalEmbedding`, 2-D patch grids (:class:`PatchGridPositions`,
  :func:`sincos_2d`, :func:`interpolate_positions`);
- inside attention: :class:`RotaryEmbedding` (RoPE rotates q and k), :class:`ALiBi` (a distance
  penalty on the scores), :class:`RelativePositionBias` (Swin's learned window table).

:func:`build_positions` turns a config's ``position`` name into the module a model owns.
"""

from __future__ import annotations

from attnlab.layers.position.absolute import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    sinusoidal_table,
)
from attnlab.layers.position.alibi import ALiBi, alibi_bias, alibi_slopes
from attnlab.layers.position.base import NoPositions, Positions
from attnlab.layers.position.grid import PatchGridPositions, interpolate_positions, sincos_2d
from attnlab.layers.position.relative import RelativePositionBias
from attnlab.layers.position.rope import RotaryEmbedding, apply_rotary, rotate_half

__all__ = [
    "Positions",
    "NoPositions",
    "build_positions",
    "sinusoidal_table",
    "SinusoidalPositionalEmbedding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "apply_rotary",
    "rotate_half",
    "ALiBi",
    "alibi_slopes",
    "alibi_bias",
    "sincos_2d",
    "interpolate_positions",
    "PatchGridPositions",
    "RelativePositionBias",
]

#: 1-D schemes :func:`build_positions` knows
POSITION_KINDS = ("none", "learned", "sinusoidal", "rope", "alibi")


def build_positions(
    kind: str,
    *,
    d_model: int,
    n_heads: int,
    head_dim: int,
    max_seq_len: int,
    rope_theta: float = 10000.0,
) -> Positions:
    """The position module for a config's ``position`` name (one per model, shared by its layers).

    Raises:
        ValueError: an unknown name.
    """
    if kind == "none":
        return NoPositions()
    if kind == "learned":
        return LearnedPositionalEmbedding(max_seq_len, d_model)
    if kind == "sinusoidal":
        return SinusoidalPositionalEmbedding(max_seq_len, d_model)
    if kind == "rope":
        return RotaryEmbedding(head_dim, theta=rope_theta)
    if kind == "alibi":
        return ALiBi(n_heads)
    raise ValueError(f"unknown position {kind!r}; choose from {list(POSITION_KINDS)}")
