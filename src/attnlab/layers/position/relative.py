"""Learned relative-position bias inside a window (Swin): one score per head and 2-D offset.

Tokens attend only inside w×w windows, so a query and a key differ by an offset
(Δr, Δc) ∈ [−(w−1), w−1]²: a ``(2w−1)² × heads`` table holds one learned score per offset and head,
added to the attention scores, softmax(QKᵀ/√d + B) V. Every window of a layer shares it.

Shapes: H heads, w window side, Nw = w² tokens per window.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.layers.position.base import Positions

__all__ = ["RelativePositionBias", "window_relative_index"]


def window_relative_index(w: int) -> Tensor:
    """``(w², w²)`` table row of each token pair of a w×w window (tokens numbered row by row).

    Pair (i, j) with offset (Δr, Δc) = (r_i − r_j, c_i − c_j) reads row
    ``(Δr + w − 1)·(2w − 1) + (Δc + w − 1)``, the index of HF's and timm's
    ``relative_position_index``.
    """
    rows, cols = torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")
    r, c = rows.flatten(), cols.flatten()  # (w²,)
    return (r[:, None] - r[None, :] + w - 1) * (2 * w - 1) + (c[:, None] - c[None, :] + w - 1)


class RelativePositionBias(Positions):
    """Swin's window table as a :class:`Positions`: ``bias() -> (H, w², w²)``.

    ``table`` is ``((2w−1)², H)`` (HF's ``relative_position_bias_table``); ``index`` the
    non-persistent ``(w², w²)`` :func:`window_relative_index`.

    Args:
        window_size: w.
        n_heads: H.
    """

    relative = True

    def __init__(self, window_size: int, n_heads: int, *, device=None, dtype=None) -> None:
        super().__init__()
        w = window_size
        self.window_size, self.n_heads = w, n_heads
        self.table = nn.Parameter(
            torch.zeros((2 * w - 1) ** 2, n_heads, device=device, dtype=dtype)
        )
        nn.init.trunc_normal_(self.table, std=0.02)
        index = window_relative_index(w).to(device)
        self.register_buffer("index", index, persistent=False)  # (w², w²)

    def bias(self, q_pos: Tensor | None = None, k_pos: Tensor | None = None) -> Tensor:
        """``(H, w², w²)`` additive scores of every (query, key) pair of a window; the positions
        are implied (a window's tokens row by row), so ``q_pos`` and ``k_pos`` are unused."""
        return self.table[self.index].permute(2, 0, 1)  # (H, w², w²)

    def extra_repr(self) -> str:
        return f"window_size={self.window_size}, n_heads={self.n_heads}"
