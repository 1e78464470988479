"""Bahdanau (additive) attention, as used inside an RNN decoder.

    e_j = vᵀ tanh(W_s s + W_h h_j)        score of source position j for decoder state s
    α   = softmax(e) over the (unpadded) source
    c   = Σ_j α_j h_j                      the context vector for this decoder step

The weights α are returned, and reported to an open :func:`attnlab.attention.capture_attention`
(as ``(B, S)`` for one query, ``(B, T, S)`` for several); the layer keeps nothing.

Shape legend: B batch, S source length, Ds decoder state width, Dh encoder state width, A
attention width, T decoder steps (optional: several queries at once).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint, report_attention

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention.

    Args:
        query_dim: decoder state width Ds.
        key_dim: encoder state width Dh.
        attn_dim: width A of the hidden scoring layer (default ``key_dim``).
    """

    def __init__(
        self, query_dim: int, key_dim: int, attn_dim: int | None = None, *, device=None, dtype=None
    ) -> None:
        super().__init__()
        attn_dim = key_dim if attn_dim is None else attn_dim
        kw = {"device": device, "dtype": dtype}
        self.W_s = nn.Linear(query_dim, attn_dim, bias=False, **kw)
        self.W_h = nn.Linear(key_dim, attn_dim, bias=True, **kw)
        self.v = nn.Linear(attn_dim, 1, bias=False, **kw)
        # hook points: energies e and weights α (B, T, S), context c (B, T, Dh); T = 1 per step
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_context = HookPoint()

    def project_keys(self, keys: Tensor) -> Tensor:
        """``W_h h`` for all source positions ``(B, S, A)``; compute once per source sentence."""
        return self.W_h(keys)

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        mask: Tensor | None = None,
        *,
        keys_proj: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Score every source position for the decoder state(s).

        Args:
            query: decoder state ``(B, Ds)`` or ``(B, T, Ds)``.
            keys: encoder states ``(B, S, Dh)`` (they are also the values).
            mask: boolean ``(B, S)``, True for real (not padding) source positions.
            keys_proj: precomputed :meth:`project_keys` output, to save work at each step.

        Returns:
            ``context (B, Dh)`` and ``weights (B, S)`` (or ``(B, T, Dh)`` and ``(B, T, S)``).
        """
        single = query.dim() == 2
        if single:
            query = query[:, None]  # (B, 1, Ds)
        if keys.dim() != 3 or keys.shape[0] != query.shape[0]:
            raise ValueError(f"keys must be (B={query.shape[0]}, S, Dh), got {tuple(keys.shape)}")
        if mask is not None and mask.shape != keys.shape[:2]:
            raise ValueError(
                f"mask must be (B, S) = {tuple(keys.shape[:2])}, got {tuple(mask.shape)}"
            )
        kp = self.W_h(keys) if keys_proj is None else keys_proj  # (B, S, A)
        e = self.v(torch.tanh(self.W_s(query)[:, :, None, :] + kp[:, None, :, :])).squeeze(
            -1
        )  # (B, T, S)
        if mask is not None:
            e = e.masked_fill(~mask[:, None, :], float("-inf"))
            empty = ~mask.any(dim=-1)[:, None, None]  # (B, 1, 1)
            e = e.masked_fill(empty, 0.0)
        weights = self.hook_attn_scores(e).softmax(dim=-1)
        if mask is not None:
            weights = weights.masked_fill(empty, 0.0)
        weights = self.hook_pattern(weights)
        context = self.hook_context(weights @ keys)  # (B, T, Dh)
        if single:
            context, weights = context[:, 0], weights[:, 0]  # (B, Dh), (B, S)
        report_attention(self, weights)
        return context, weights
