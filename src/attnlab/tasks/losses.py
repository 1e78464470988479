"""Losses shared by the tasks (they live in :mod:`attnlab.layers.losses`, next to the fused
output projection + cross-entropy that :class:`attnlab.DecoderLM` uses)."""

from attnlab.layers.losses import cross_entropy, linear_cross_entropy

__all__ = ["cross_entropy", "linear_cross_entropy"]
