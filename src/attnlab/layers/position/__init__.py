"""Position information behind one interface (:class:`Positions`): embed, rotate, bias.

- absolute (added to the embeddings): :class:`SinusoidalPositionalEmbedding`,
  :class:`LearnedPositionalEmbedding`, 2-D patch grids (:class:`PatchGridPositions`,
  :func:`sincos_2d`, :func:`interpolate_positions`);
- inside attention: :class:`RotaryEmbedding` (RoPE rotates q and k), :class:`ALiBi` (a distance
  penalty on the scores), :class:`T5RelativeBias` (a learned score per distance bucket),
  :class:`RelativePositionBias` (Swin's learned window table).

:func:`build_positions` turns a config's ``position`` name into the module a model owns.
"""

from __future__ import annotations

from typing import Any

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
from attnlab.layers.position.t5 import T5RelativeBias, relative_position_bucket

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
    "T5RelativeBias",
    "relative_position_bucket",
    "interpolate_positions",
    "PatchGridPositions",
    "RelativePositionBias",
]

#: 1-D schemes :func:`build_positions` knows
POSITION_KINDS = ("none", "learned", "sinusoidal", "rope", "alibi", "t5")


def build_positions(
    kind: Any,
    *,
    d_model: int | None = None,
    n_heads: int | None = None,
    head_dim: int | None = None,
    max_seq_len: int | None = None,
    rope_theta: float = 10000.0,
    causal: bool = False,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Positions:
    """The position module for a config's ``position`` name (one per model, shared by its layers).

    Two ways to call it (like :func:`attnlab.layers.build_block`): ``build_positions(config)``
    reads ``position``, ``d_model``, ``n_heads``, ``head_dim``, ``max_seq_len`` and
    ``rope_theta`` from a config; ``build_positions(name, d_model=..., ...)`` takes them as
    keywords (each scheme needs only some: tables their length and width, RoPE the head width,
    ALiBi the head count).

    Args:
        kind: a config, or ``none`` | ``learned`` | ``sinusoidal`` | ``rope`` | ``alibi`` | ``t5``.
        d_model, n_heads, head_dim, max_seq_len, rope_theta: the model's sizes (with a config,
            ``max_seq_len`` may still be given, for a config that names its length otherwise).
        causal: the model's self-attention is causal: T5's table then has buckets only for
            earlier keys (T5's decoder); otherwise for both sides (T5's encoder).
        num_buckets, max_distance: T5's bucketing (32 and 128 in T5).

    Raises:
        ValueError: an unknown name, or bad T5 bucket settings.
    """
    if not isinstance(kind, str):
        c = kind
        return build_positions(
            c.position,
            d_model=c.d_model,
            n_heads=c.n_heads,
            head_dim=c.head_dim,
            max_seq_len=c.max_seq_len if max_seq_len is None else max_seq_len,
            rope_theta=c.rope_theta,
            causal=causal,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
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
    if kind == "t5":
        return T5RelativeBias(
            n_heads, num_buckets=num_buckets, max_distance=max_distance, bidirectional=not causal
        )
    raise ValueError(f"unknown position {kind!r}; choose from {list(POSITION_KINDS)}")
