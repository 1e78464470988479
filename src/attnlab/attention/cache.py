"""A key/value cache for incremental decoding.

At step t the decoder needs K and V for positions 0..t; they never change once computed, so each
attention layer keeps them in static buffers and appends the new step's keys/values. Decoding a
token then costs O(t) instead of recomputing the whole prefix.

Shapes: B batch (or beams), Hkv key/value heads, T_max capacity, D head width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["KVCache"]


class KVCache(nn.Module):
    """Static ``(B, Hkv, T_max, D)`` buffers for keys and values, filled left to right.

    Args:
        batch_size: B.
        n_kv_heads: Hkv.
        max_seq_len: capacity T_max.
        head_dim: D (keys and values share it).
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        *,
        device=None,
        dtype=torch.float32,
        v_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        v_dim = head_dim if v_dim is None else v_dim
        self.register_buffer(
            "k",
            torch.zeros(batch_size, n_kv_heads, max_seq_len, head_dim, device=device, dtype=dtype),
            persistent=False,
        )
        self.register_buffer(
            "v",
            torch.zeros(batch_size, n_kv_heads, max_seq_len, v_dim, device=device, dtype=dtype),
            persistent=False,
        )
        self.length = 0

    def update(self, k_new: Tensor, v_new: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``(B, Hkv, t, D)`` keys/values; return views of everything cached so far."""
        t = k_new.shape[-2]
        end = self.length + t
        if end > self.max_seq_len:
            raise ValueError(
                f"KV cache overflow: {self.length} cached + {t} new > "
                f"max_seq_len={self.max_seq_len}"
            )
        self.k[:, :, self.length : end] = k_new.to(self.k.dtype)
        self.v[:, :, self.length : end] = v_new.to(self.v.dtype)
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def get(self) -> tuple[Tensor, Tensor]:
        """Views of the cached keys and values."""
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): row b becomes old row ``index[b]``."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def reset(self) -> None:
        self.length = 0
