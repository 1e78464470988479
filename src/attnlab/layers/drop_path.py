"""Stochastic depth ("drop path", Huang et al. 2016): skip a residual branch for whole samples.

During training each sample's branch output is zeroed with probability p and the survivors are
scaled by 1/(1 − p), so the expected output is unchanged; at evaluation it is the identity.
Deep vision Transformers (DeiT, Swin) use rates growing linearly with depth.

Shape legend: B batch, then any dimensions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["DropPath", "drop_path", "drop_path_rates"]


def drop_path(x: Tensor, p: float, training: bool, group: int = 1) -> Tensor:
    """Zero whole samples of ``x (B, ...)`` with probability ``p`` and rescale the rest.

    ``group`` consecutive rows are one sample and share their fate: Swin runs its blocks on the
    windows of an image (``B = images · windows``), and stochastic depth drops whole images.
    """
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    if x.shape[0] % group:
        raise ValueError(f"drop_path: batch {x.shape[0]} is not a multiple of group={group}")
    shape = (x.shape[0] // group,) + (1,) * (x.dim() - 1)
    mask = x.new_empty(shape).bernoulli_(keep)  # (B/group, 1, ..., 1)
    return x * mask.repeat_interleave(group, dim=0) / keep


class DropPath(nn.Module):
    """:func:`drop_path` as a module (identity when ``p == 0``).

    Args:
        p: drop rate in [0, 1).
        group: consecutive rows that form one sample (see :func:`drop_path`).
    """

    def __init__(self, p: float = 0.0, *, group: int = 1) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop-path rate must be in [0, 1), got {p}")
        if group < 1:
            raise ValueError(f"drop-path group must be positive, got {group}")
        self.p, self.group = p, group

    def forward(self, x: Tensor) -> Tensor:
        return drop_path(x, self.p, self.training, self.group)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (f", group={self.group}" if self.group > 1 else "")


def drop_path_rates(max_rate: float, depth: int) -> list[float]:
    """Linearly increasing rates 0 … ``max_rate`` over ``depth`` blocks (DeiT/Swin)."""
    if depth <= 1:
        return [max_rate] * depth
    return torch.linspace(0, max_rate, depth, device="cpu").tolist()  # (also under a meta device)
