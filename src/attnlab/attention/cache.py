"""A key/value cache for incremental decoding.

At step t the decoder needs K and V for positions 0..t; they never change once computed, so each
attention layer keeps them in static buffers and appends the new step's keys/values. Decoding a
token then costs O(t) instead of recomputing the whole prefix.

Two ways to read the buffers back:

- dynamic (default): :meth:`KVCache.update` returns views of the ``length`` slots written so
  far, so the attention's key length grows by one per step (simple; every step has new shapes);
- static (``static=True``): the write position is a tensor (``cursor``), :meth:`KVCache.update`
  writes at it with ``index_copy_`` and returns the whole ``T_max`` buffers, and the model masks
  the slots not written yet. Every decoding step then has the same shapes and touches no Python
  state, so ``torch.compile`` compiles it once (and CUDA graphs can replay it).

Shapes: B batch (or beams), Hkv key/value heads, T_max capacity, D head width, T new tokens.
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
        v_dim: value width (default ``head_dim``).
        static: fixed shapes: write at the tensor ``cursor`` and return all ``T_max`` slots (see
            the module docstring); the caller masks the slots at or after the cursor.
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
        static: bool = False,
    ) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.static = static
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
        # the next slot to write, as a tensor so that a compiled step reads it without a guard
        self.register_buffer(
            "cursor", torch.zeros((), dtype=torch.long, device=device), persistent=False
        )
        self._length = 0

    @property
    def length(self) -> int:
        """Slots written so far (a static cache reads its cursor: a device sync, eager code only)."""
        return int(self.cursor) if self.static else self._length

    def update(self, k_new: Tensor, v_new: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``(B, Hkv, T, D)`` keys/values after those cached.

        Returns:
            dynamic: views of the ``length`` slots written so far ``(B, Hkv, length, D)``;
            static: the whole buffers ``(B, Hkv, T_max, D)`` (unwritten slots hold stale values).

        Raises:
            ValueError: a dynamic cache would overflow (a static one cannot check without a sync:
                its caller keeps count).
        """
        if self.static:
            slots = self.cursor + torch.arange(k_new.shape[-2], device=self.k.device)  # (T,)
            self.k.index_copy_(2, slots, k_new.to(self.k.dtype))
            self.v.index_copy_(2, slots, v_new.to(self.v.dtype))
            self.cursor += k_new.shape[-2]
            return self.k, self.v
        t = k_new.shape[-2]
        end = self.length + t
        if end > self.max_seq_len:
            raise ValueError(
                f"KV cache overflow: {self.length} cached + {t} new > "
                f"max_seq_len={self.max_seq_len}"
            )
        self.k[:, :, self.length : end] = k_new.to(self.k.dtype)
        self.v[:, :, self.length : end] = v_new.to(self.v.dtype)
        self._length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def newest_slot(self) -> int | Tensor:
        """The slot of the last key written: where the newest query sits (relative positions)."""
        return self.cursor - 1 if self.static else self._length - 1

    def get(self) -> tuple[Tensor, Tensor]:
        """Views of the cached keys and values (a static cache: all ``T_max`` slots)."""
        if self.static:
            return self.k, self.v
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): row b becomes old row ``index[b]``."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached tokens and forget the rest (speculative decoding rolls
        back the positions it rejected; the next update overwrites them).

        Raises:
            ValueError: ``length`` negative or beyond the tokens cached.
        """
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a KV cache of {self.length} tokens to {length}")
        if self.static:
            self.cursor.fill_(length)  # in place: a compiled step reads this very tensor
        else:
            self._length = length

    def reset(self) -> None:
        """Forget the cached tokens (the buffers are kept and overwritten)."""
        self._length = 0
        self.cursor.zero_()


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
