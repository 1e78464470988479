"""Losses shared by the tasks: the cross-entropy (:mod:`attnlab.layers.losses`) and its form fused
with the output projection (:mod:`attnlab.fast.loss`), which the LM task chooses."""

from attnlab.fast.loss import linear_cross_entropy
from attnlab.layers.losses import cross_entropy

__all__ = ["cross_entropy", "linear_cross_entropy"]
