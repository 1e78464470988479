"""ALiBi (Press et al.): no embedding; head h adds −m_h·|i − j| to its scores, with geometric slopes.

Shapes: B batch, H heads, Tq/Tk query/key positions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.layers.position.base import Positions

__all__ = ["ALiBi", "alibi_slopes", "alibi_bias"]


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's head slopes: 2^(−8/n), 2^(−16/n), … for n a power of two (8 heads: 1/2 … 1/256).

    For other head counts, the slopes of the closest smaller power of two are followed by every
    other slope of the next power of two, as in the paper's reference code.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Additive scores ``−m_h · |i − j|`` of shape ``(H, Tq, Tk)`` (or ``(B, H, Tq, Tk)``)."""
    dist = (q_pos[..., :, None] - k_pos[..., None, :]).abs().float()  # (B?, Tq, Tk)
    return -slopes.float()[:, None, None] * dist.unsqueeze(-3)


class ALiBi(Positions):
    """The ALiBi scheme as a :class:`Positions`: ``bias(q_pos, k_pos) -> (H, Tq, Tk)``."""

    relative = True

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def bias(self, q_pos: Tensor | None, k_pos: Tensor | None) -> Tensor | None:
        return alibi_bias(self.slopes, q_pos, k_pos)
