"""attnlab.tasks: what the shared trainer asks of each family: batches and the loss.

A :class:`Task` owns the data and the loss; the trainer (:mod:`attnlab.train`) owns the loop.
"""

from attnlab.tasks.base import Task, to_device
from attnlab.tasks.losses import cross_entropy

__all__ = ["Task", "to_device", "cross_entropy"]
