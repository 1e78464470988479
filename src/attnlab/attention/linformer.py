"""Linformer (Wang et al. 2020): low-rank attention by projecting keys and values along the sequence.

The N × N attention matrix of a long sequence is close to low rank, so Linformer mixes the N keys
and values into k ≪ N rows with learned matrices E, F ∈ ℝ^{k×N} before attending:

    head = softmax(Q (E K)ᵀ / √d) (F V)          scores (N × k) instead of (N × N)

Time and memory are O(N·k). A sequence shorter than N uses the first S columns of E and F (as if it
were zero-padded to N); padded keys are zeroed before the projection so they add nothing.

Each projected row is a weighted sum over *all* positions, the future included, so there is no way
to hide later tokens from a query: Linformer is for non-causal (encoder) attention, and this module
refuses causal use. E and F are shared by the heads of a layer (the paper's head-wise sharing).

Shape legend: B batch, H heads, S key positions (≤ N), D head width, k projected rows.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["LinformerProjection"]


class LinformerProjection(nn.Module):
    """The learned sequence projections ``E, F (k, N)`` of one attention layer.

    Args:
        k: projected length (rows of E and F), ``1 ≤ k ≤ max_seq_len``.
        max_seq_len: N, the longest sequence the layer accepts.

    Raises:
        ValueError: ``k`` or ``max_seq_len`` not a positive integer, or ``k > max_seq_len``.
    """

    def __init__(self, k: int, max_seq_len: int, *, device=None, dtype=None) -> None:
        super().__init__()
        for name, value in (("linformer_k", k), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Linformer: {name} must be a positive integer, got {value!r}")
        if k > max_seq_len:
            raise ValueError(
                f"Linformer: linformer_k={k} exceeds the sequence length N={max_seq_len} "
                "(the projection must not have more rows than the sequence)"
            )
        self.k, self.max_seq_len = k, max_seq_len
        self.E = nn.Parameter(torch.empty(k, max_seq_len, device=device, dtype=dtype))
        self.F = nn.Parameter(torch.empty(k, max_seq_len, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 1/k): a random (Johnson–Lindenstrauss) projection; rows of E K keep their scale."""
        for p in (self.E, self.F):
            nn.init.normal_(p, std=1.0 / math.sqrt(self.k))

    def extra_repr(self) -> str:
        return f"k={self.k}, max_seq_len={self.max_seq_len}"

    def forward(
        self, keys: Tensor, values: Tensor, key_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``keys (B, H, S, D)``, ``values (B, H, S, Dv)`` -> ``(E K (B, H, k, D), F V (B, H, k, Dv))``.

        Args:
            keys, values: per-head keys and values of S ≤ N positions.
            key_mask: optional boolean ``(B, 1, S, 1)`` (True = real token): padded positions are
                zeroed before they are mixed.

        Raises:
            ValueError: more than N positions.
        """
        S = keys.shape[-2]
        if S > self.max_seq_len:
            raise ValueError(
                f"Linformer: {S} positions exceed its sequence length N={self.max_seq_len}"
            )
        if key_mask is not None:
            keys = keys.masked_fill(~key_mask, 0.0)
            values = values.masked_fill(~key_mask, 0.0)
        E, F = self.E[:, :S].to(keys.dtype), self.F[:, :S].to(values.dtype)  # (k, S)
        return E @ keys, F @ values  # (B, H, k, D), (B, H, k, Dv)
