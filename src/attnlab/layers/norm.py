"""Normalisation layers: LayerNorm, RMSNorm and (for the ablation that shows why Transformers do
not use it) BatchNorm.

    LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β
    RMSNorm(x)   = x / √(mean(x²) + ε) · γ          (ε inside the square root)
    BatchNorm(x) = (x − μ) / √(σ² + ε) · γ + β      μ, σ² per feature over every token of the batch

Shapes: x ``(..., D)``; LayerNorm's and RMSNorm's statistics are over the last dimension D of
each token, BatchNorm's over all the leading dimensions (batch × time) of each feature.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint, hooks_active

__all__ = ["LayerNorm", "RMSNorm", "BatchNorm", "make_norm", "NormName"]

NormName = Literal["layernorm", "rmsnorm", "batchnorm"]


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


class BatchNorm(nn.Module):
    """Batch normalisation of token features: each of the D features is normalised by its mean
    and variance over every token of the batch (all leading dimensions, batch × time), as
    ``nn.BatchNorm1d`` on ``x.reshape(-1, D)``.

    In training mode the statistics are the batch's, so a token's output depends on the other
    tokens in the batch, padding and (in a causal model) later positions included; in evaluation
    mode the running averages (``momentum``) are used and tokens are independent again.

    Args:
        dim: the feature dimension D (last).
        eps: added to the variance.
        bias: learn β as well as γ.
        momentum: the running averages' update rate.
    """

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-5,
        bias: bool = True,
        momentum: float = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if bias else None
        self.register_buffer("running_mean", torch.zeros(dim, device=device, dtype=dtype))
        self.register_buffer("running_var", torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, D), N = every token of the batch
        if self.training and flat.shape[0] < 2:
            raise ValueError(
                "BatchNorm in training mode needs at least 2 tokens per batch (its statistics are "
                "over batch × time); call .eval() to use the running statistics"
            )
        out = F.batch_norm(
            flat,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            training=self.training,
            momentum=self.momentum,
            eps=self.eps,
        )
        return out.view_as(x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


def make_norm(
    name: str, dim: int, *, eps: float = 1e-5, bias: bool = True, device=None, dtype=None
) -> nn.Module:
    """Build a norm by name: ``layernorm`` | ``rmsnorm`` | ``batchnorm`` (``bias`` is ignored by
    RMSNorm)."""
    if name == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)
    if name == "rmsnorm":
        return RMSNorm(dim, eps=eps, device=device, dtype=dtype)
    if name == "batchnorm":
        return BatchNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)
    raise ValueError(f"unknown norm {name!r}; choose 'layernorm', 'rmsnorm' or 'batchnorm'")
