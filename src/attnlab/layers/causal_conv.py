"""A causal 1-D convolution: the output at t reads the inputs t − (k − 1)·d … t and nothing after.

    y_t = b + Σ_{j=0}^{k−1} W_j x_{t − j·d}        (x_s = 0 for s < 0)

Causality comes from padding on the left only, by (k − 1)·d zeros, and no padding on the right,
so the sequence keeps its length and no output sees a later input. Stacking layers of dilations
d_1 … d_L gives the receptive field R = 1 + Σ_l (k − 1)·d_l (WaveNet, van den Oord et al. 2016).

Shape legend: B batch, T time, C channels.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CausalConv1d"]


class CausalConv1d(nn.Module):
    """``(B, T, C_in) -> (B, T, C_out)``, causal: left padding of ``(k − 1)·dilation``.

    Args:
        in_channels, out_channels: C_in and C_out.
        kernel_size: taps k.
        dilation: spacing d between taps.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1):
        super().__init__()
        if kernel_size < 1 or dilation < 1:
            raise ValueError(
                f"kernel_size and dilation must be positive, got {kernel_size} and {dilation}"
            )
        self.left = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        h = F.pad(x.transpose(1, 2), (self.left, 0))  # (B, C_in, left + T)
        return self.conv(h).transpose(1, 2)  # (B, T, C_out)
