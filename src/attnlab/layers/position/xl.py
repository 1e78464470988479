"""Transformer-XL's relative position embeddings R (Dai et al. 2019, §3.3).

A key j seen from a query i is described by its distance i − j alone, through a fixed sinusoid
R_{i−j} (no learned table, so any distance has one); the attention layer projects R with its own
W_R and adds the terms (q_i + v)·W_R R_{i−j} to the scores (:mod:`attnlab.attention.relative_xl`).

Shape legend: K keys (memory + segment), C d_model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint

__all__ = ["XLRelativePositions", "relative_sinusoids"]


def relative_sinusoids(n_keys: int, d_model: int, *, device=None, dtype=None) -> Tensor:
    """``R (n_keys, d_model)``: row c is the sinusoid of distance ``n_keys − 1 − c``, from the
    farthest key down to distance 0, the order :func:`attnlab.attention.relative_xl.rel_shift`
    expects; sines in the first half of the channels, cosines in the second (Dai et al.'s code).

    Raises:
        ValueError: an odd ``d_model``.
    """
    if d_model % 2 != 0:
        raise ValueError(f"relative sinusoids need an even d_model, got {d_model}")
    distance = torch.arange(n_keys - 1, -1, -1, device=device, dtype=torch.float64)  # (K,)
    inv_freq = 10000.0 ** (
        -torch.arange(0, d_model, 2, device=device, dtype=torch.float64) / d_model
    )
    angles = distance[:, None] * inv_freq  # (K, C/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype or torch.float32)  # (K, C)


class XLRelativePositions(nn.Module):
    """The model's one source of R, shared by every layer (no weights).

    Args:
        d_model: C, the width of R.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.hook_rel_pos = HookPoint()  # R (K, C)

    def forward(self, n_keys: int, *, device=None, dtype=None) -> Tensor:
        """``R (n_keys, C)`` for distances ``n_keys − 1 … 0``."""
        return self.hook_rel_pos(
            relative_sinusoids(n_keys, self.d_model, device=device, dtype=dtype)
        )
