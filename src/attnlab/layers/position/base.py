"""The one position interface: how a model puts order into attention.

Self-attention is permutation-equivariant; every position scheme is one of three hooks, and a
model calls all three whatever scheme it was given (the others are identities):

- ``embed(x, positions)``: absolute schemes add a vector per position to the token embeddings
  (sinusoidal, learned, ViT's learned or 2-D sin-cos patch grids);
- ``rotate(q, k, q_pos, k_pos)``: RoPE rotates queries and keys by their positions;
- ``bias(q_pos, k_pos)``: relative schemes add a score to every (query, key) pair (ALiBi's
  distance penalty, Swin's window table, T5's bucketed table).

Shapes: B batch, T positions, C model width, H heads, Tq/Tk query/key positions.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["Positions", "NoPositions"]


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
