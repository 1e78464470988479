"""The one position interface: how a model puts order into attention.

Self-attention is permutation-equivariant; every position scheme is one of three hooks, and a
model calls all three whatever scheme it was given (the others are identities):

- ``embed(x, positions)``: absolute schemes add a vector per position to the token embeddings
  (sinusoidal, learned, ViT's learned or 2-D sin-cos patch grids);
- ``rotate(q, k, q_pos, k_pos)``: RoPE rotates queries and keys by their positions;
- ``bias(q_pos, k_pos)``: relative schemes add a score to every (query, key) pair (ALiBi's
  distance penalty, Swin's window table, T5's bucketed table).

And the sinusoidal table (Vaswani et al.) every sinusoidal scheme reads (the 1-D embedding in
:mod:`attnlab.layers.block`, ViT's 2-D grids, the Universal Transformer's step code):
PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); for every offset k there
is one linear map M_k with PE[p + k] = M_k PE[p] (a rotation per frequency pair).

Shapes: B batch, T positions, C model width, H heads, Tq/Tk query/key positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["Positions", "NoPositions", "sinusoidal_table"]


class Positions(nn.Module):
    """Base of every position scheme; each hook defaults to "do nothing".

    Attributes:
        absolute: ``embed`` changes the embeddings (the model must call it).
        relative: ``rotate`` or ``bias`` act inside attention (attention layers must call them).
    """

    absolute: bool = False
    relative: bool = False

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x (B, T, C)`` with position information added (unchanged by default)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Queries ``(B, H, Tq, D)`` and keys ``(B, Hkv, Tk, D)`` rotated (unchanged by default)."""
        return q, k

    def bias(self, q_pos: Tensor | None, k_pos: Tensor | None) -> Tensor | None:
        """Additive scores ``(H, Tq, Tk)`` or ``(B, H, Tq, Tk)``, or None (the default)."""
        return None


class NoPositions(Positions):
    """No position information at all (a bag of tokens)."""


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
