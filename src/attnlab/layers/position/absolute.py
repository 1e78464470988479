"""Absolute positions: a vector per position added to the token embeddings.

- Sinusoidal (Vaswani et al.): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)).
  For every offset k there is one linear map M_k with PE[p + k] = M_k PE[p] (a rotation per
  frequency pair).
- Learned: one trained vector per position (GPT-2's ``wpe``).

Shapes: B batch, T positions, D width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint
from attnlab.layers.position.base import Positions

__all__ = ["sinusoidal_table", "SinusoidalPositionalEmbedding", "LearnedPositionalEmbedding"]


def sinusoidal_table(n_positions: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """``(n_positions, dim)`` table, sin on even channels and cos on odd ones."""
    if dim % 2 != 0:
        raise ValueError(f"sinusoidal positions need an even width, got dim={dim}")
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    angles = pos * inv_freq  # (T, D/2)
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()
    return table.float()


class SinusoidalPositionalEmbedding(Positions):
    """Fixed sinusoidal positions; ``forward(positions) -> (..., dim)``, ``embed`` adds them."""

    absolute = True

    def __init__(self, max_seq_len: int, dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.register_buffer(
            "table", sinusoidal_table(max_seq_len, dim, base=base), persistent=False
        )
        self.hook_pos_embed = HookPoint()  # the added positions, (B, T, D)

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_seq_len)
        return self.table[positions]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.hook_pos_embed(self(positions).to(x.dtype).expand_as(x))


class LearnedPositionalEmbedding(Positions):
    """A trained vector per position (GPT-2 ``wpe``); ``forward(positions) -> (..., dim)``."""

    absolute = True

    def __init__(self, max_seq_len: int, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.weight = nn.Parameter(torch.zeros(max_seq_len, dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)
        self.hook_pos_embed = HookPoint()  # the added positions, (B, T, D)

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_seq_len)
        return self.weight[positions]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.hook_pos_embed(self(positions).expand_as(x))


def _check_positions(positions: Tensor, max_seq_len: int) -> None:
    if torch.compiler.is_compiling():
        return  # reading the maximum would split a compiled graph; eager calls check
    if positions.numel() and int(positions.max()) >= max_seq_len:
        raise ValueError(f"position {int(positions.max())} is beyond max_seq_len={max_seq_len}")
