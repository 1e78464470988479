"""Earlier releases' module of the 1-D absolute positions; they live in :mod:`attnlab.layers.block`
(beside the block whose input they feed). Kept so that old imports keep working."""

from attnlab.layers.block import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
from attnlab.layers.position.base import sinusoidal_table

__all__ = ["LearnedPositionalEmbedding", "SinusoidalPositionalEmbedding", "sinusoidal_table"]
