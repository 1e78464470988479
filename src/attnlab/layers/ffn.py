"""Position-wise feed-forward networks: MLP (ReLU / GELU / tanh-GELU) and the gated ones.

    MLP(x)      = act(x W₁ + b₁) W₂ + b₂                  (hidden = 4·d_model by default)
    GatedFFN(x) = (act(x W₁) ⊙ x W₂) W₃                   (Shazeer 2020, "GLU variants")
    SwiGLU(x)   = GatedFFN with act = SiLU                 (Llama's FFN); GEGLU: act = GELU (T5 1.1)

Shapes: x ``(..., d_model)`` -> ``(..., d_model)``; the same weights act on every position.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint

__all__ = ["MLP", "GatedFFN", "SwiGLU", "ACTIVATIONS", "Activation"]

Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "relu2", "quick_gelu"]

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,
    "relu2": lambda x: F.relu(x).square(),  # ReLU² (So et al. 2021, Primer; modded-nanogpt)
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's x·σ(1.702x)
}


class MLP(nn.Module):
    """Two linear layers with an activation between them.

    Args:
        d_model: input and output width.
        hidden: inner width (default ``4 * d_model``).
        activation: ``relu`` | ``gelu`` | ``gelu_tanh`` | ``silu`` | ``relu2`` (ReLU²) |
            ``quick_gelu`` (CLIP).
        bias: use biases in both layers.
        dropout: dropout on the output.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        *,
        activation: str = "gelu_tanh",
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}"
            )
        hidden = 4 * d_model if hidden is None else hidden
        self.fc1 = nn.Linear(d_model, hidden, bias=bias, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden, d_model, bias=bias, device=device, dtype=dtype)
        self.act = ACTIVATIONS[activation]
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()  # (..., hidden): before/after act

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(self.hook_post(self.act(self.hook_pre(self.fc1(x))))))


class GatedFFN(nn.Module):
    """Gated FFN ``(act(x W₁) ⊙ x W₂) W₃``: one linear map gates another, element by element.

    The lecture's W₁, W₂, W₃ are ``gate``, ``up`` and ``down`` here (HF Llama's gate_proj, up_proj,
    down_proj; HF T5's wi_0, wi_1, wo; Meta's w1, w3, w2).

    Args:
        d_model: input and output width.
        hidden: inner width (default ≈ 8/3 · d_model, so the parameters match a 4× MLP).
        activation: the gate's ``relu`` | ``gelu`` | ``gelu_tanh`` (GEGLU, T5 1.1) | ``silu``.
        bias: use biases.
        dropout: dropout on the output.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        *,
        activation: str = "gelu_tanh",
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}"
            )
        hidden = _swiglu_hidden(d_model) if hidden is None else hidden
        self.gate = nn.Linear(d_model, hidden, bias=bias, device=device, dtype=dtype)
        self.up = nn.Linear(d_model, hidden, bias=bias, device=device, dtype=dtype)
        self.down = nn.Linear(hidden, d_model, bias=bias, device=device, dtype=dtype)
        self.act = ACTIVATIONS[activation]
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        # hook points (..., hidden): x W₁ (gate), x W₂ (up), and act(x W₁) ⊙ x W₂ (the neurons)
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        gated = self.act(self.hook_pre(self.gate(x))) * self.hook_pre_linear(self.up(x))
        return self.dropout(self.down(self.hook_post(gated)))


class SwiGLU(GatedFFN):
    """Gated FFN ``(SiLU(x W₁) ⊙ x W₂) W₃`` (Llama's): :class:`GatedFFN` gated by SiLU.

    Args:
        d_model: input and output width.
        hidden: inner width (Llama uses about 8/3 · d_model so parameters match a 4× MLP).
        bias: use biases (Llama does not).
        dropout: dropout on the output.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        *,
        bias: bool = False,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            d_model,
            hidden,
            activation="silu",
            bias=bias,
            dropout=dropout,
            device=device,
            dtype=dtype,
        )


def _swiglu_hidden(d_model: int, multiple_of: int = 8) -> int:
    h = int(8 * d_model / 3)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)
