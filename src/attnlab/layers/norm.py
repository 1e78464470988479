"""Normalisation layers: LayerNorm and RMSNorm.

    LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β
    RMSNorm(x)   = x / √(mean(x²) + ε) · γ          (ε inside the square root)

Shapes: x ``(..., D)``; statistics are over the last dimension D.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint, hooks_active

__all__ = ["LayerNorm", "RMSNorm", "make_norm", "NormName"]

NormName = Literal["layernorm", "rmsnorm"]


class LayerNorm(nn.Module):
    """Layer normalisation with an optional bias (GPT-2 style models drop it).

    Args:
        dim: the normalised (last) dimension.
        eps: added to the variance.
        bias: learn β as well as γ.
    """

    def __init__(
        self, dim: int, *, eps: float = 1e-5, bias: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if bias else None
        # hook points: the scale σ = √(var + ε) (..., 1) and (x − mean) / σ (..., D), before γ, β
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if hooks_active(self.hook_scale, self.hook_normalized):  # the formula, step by step
            x = x - x.mean(dim=-1, keepdim=True)
            scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
            x = self.hook_normalized(x / scale)
            return x * self.weight if self.bias is None else x * self.weight + self.bias
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """Root-mean-square normalisation: ``x / √(mean(x²) + ε) · γ``, no centring, no bias.

    Computed in fp32 and cast back, as Llama does, so bf16 activations keep their precision.

    Args:
        dim: the normalised (last) dimension.
        eps: added to the mean square, inside the square root.
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        # hook points: the scale √(mean(x²) + ε) (..., 1) and x / scale (..., D), before γ
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        if hooks_active(self.hook_scale, self.hook_normalized):
            scale = self.hook_scale((xf.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
            return self.weight * self.hook_normalized(xf / scale).to(x.dtype)
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def make_norm(
    name: str, dim: int, *, eps: float = 1e-5, bias: bool = True, device=None, dtype=None
) -> nn.Module:
    """Build a norm by name: ``layernorm`` | ``rmsnorm`` (``bias`` is ignored by RMSNorm)."""
    if name == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)
    if name == "rmsnorm":
        return RMSNorm(dim, eps=eps, device=device, dtype=dtype)
    raise ValueError(f"unknown norm {name!r}; choose 'layernorm' or 'rmsnorm'")
