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

    def forward(self, x: Tensor) -> Tensor:
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

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
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
