"""A key/value cache for incremental decoding.

At step t the decoder needs K and V for positions 0..t; they never change once computed, so each
attention layer keeps them in static buffers and appends the new step's keys/values. Decoding a
token then costs O(t) instead of recomputing the whole prefix.

Shapes: B batch (or beams), Hkv key/value heads, T_max capacity, D head width.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["KVCache", "DecodeState"]


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


@dataclasses.dataclass
class DecodeState:
    """Base of every model's incremental-decoding state (see :mod:`attnlab.decoding`).

    A model's state is a dataclass of tensors whose first dimension is the batch (encoder output,
    masks, recurrent states), :class:`KVCache` objects and lists of them, and plain values.
    :meth:`reorder` keeps batch rows ``index`` of all of them — what beam search needs after each
    step — so no model writes its own.
    """

    def reorder(self, index: Tensor) -> DecodeState:
        """Row b of every batched field becomes old row ``index[b]``; returns ``self``."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, _reorder(getattr(self, f.name), index))
        return self


def _reorder(value: Any, index: Tensor) -> Any:
    if isinstance(value, Tensor):
        return value.index_select(0, index.to(value.device)) if value.dim() > 0 else value
    if isinstance(value, KVCache):
        value.reorder(index.to(value.k.device))
        return value
    if isinstance(value, list):
        return [_reorder(v, index) for v in value]
    if isinstance(value, tuple):
        return tuple(_reorder(v, index) for v in value)
    return value
