"""Training/evaluation mode switches.

Dropout, drop-path and batch norm behave differently in training and evaluation; code that
evaluates or generates in the middle of training must put the model in evaluation mode and hand
it back in the mode it was in, even when it fails half-way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from torch import nn

__all__ = ["evaluating"]

M = TypeVar("M", bound=nn.Module)


@contextmanager
def evaluating(module: M) -> Iterator[M]:
    """Put ``module`` in evaluation mode for the ``with`` block, then restore its training flag.

    The flag saved on entry (``module.training``) is restored with ``module.train(flag)`` on the
    way out, also when the block raises, or when a generator suspended inside the block is
    finished or closed.

    Args:
        module: any ``nn.Module``.

    Returns:
        A context manager yielding ``module`` itself.

    Example:
        >>> import torch
        >>> net = torch.nn.Dropout(0.5)  # a new module is in training mode
        >>> with evaluating(net):
        ...     net.training
        False
        >>> net.training
        True
    """
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
