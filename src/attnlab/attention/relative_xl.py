"""Transformer-XL attention (Dai et al. 2019): a segment attends to itself and to a memory of
the previous segment's hidden states, with relative positions.

With queries from the segment and keys from [memory; segment], the score of query i and key j is

    A_ij = q_iᵀ k_j + q_iᵀ W_R R_{i−j} + uᵀ k_j + vᵀ W_R R_{i−j}
         = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_R R_{i−j}          (paper eq. in §3.3, terms a–d)

with q = W_q x, k = W_k x̃ (x̃ the concatenated keys' inputs), R the sinusoid of the distance
(:mod:`attnlab.layers.position.xl`), W_R a projection of R, and u, v two learned vectors per head
that replace the query in the content and position terms (the same for every query position).
The position term is computed for every (query, distance) pair as one matmul and moved into
(query, key) order by :func:`rel_shift`. Attention is causal across the memory: query i (at
absolute index M + i) sees keys 0 … M + i. Scores are scaled by 1/√D as usual.

The memory is held outside the layer, in a :class:`SegmentMemory` per layer, which the model
passes in like a KV cache: it reads the stored states and records this call's inputs.

Shape legend: B batch, T segment (queries), M memory, K = M + T keys, C d_model, H heads,
D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint, capturing_attention, report_attention
from attnlab.layers.position.xl import XLRelativePositions

__all__ = ["XLAttention", "SegmentMemory", "rel_shift"]


def rel_shift(x: Tensor) -> Tensor:
    """Scores per (query i, distance column c) -> scores per (query i, key j).

    ``x (..., T, K)`` has column c for distance K − 1 − c (R's order); the result's entry
    (i, j) is ``x[..., i, j + T − 1 − i]``, the score of distance M + i − j, wherever
    j ≤ M + i (the other entries are filler that the causal mask removes). Dai et al.'s trick:
    pad one zero column on the left, read the buffer as ``(K + 1, T)``, drop its first row.
    """
    *lead, T, K = x.shape
    padded = F.pad(x, (1, 0))  # (..., T, K + 1)
    shifted = padded.reshape(*lead, K + 1, T)[..., 1:, :]  # (..., K, T)
    return shifted.reshape(*lead, T, K)


@dataclass
class SegmentMemory:
    """One layer's memory: the attention inputs of the previous segment(s), without gradient.

    Attributes:
        states: ``(B, M, C)``, detached (M may be 0).
        written: this call's inputs ``(B, T, C)``, recorded by :meth:`context` (the model builds
            the next segment's memory from them; a recomputation writes the same values).
    """

    states: Tensor
    written: Tensor | None = None

    def context(self, x: Tensor) -> Tensor:
        """``[memory; x]`` ``(B, M + T, C)``; records ``x``."""
        self.written = x
        return torch.cat([self.states.to(x.dtype), x], dim=1)

    def next(self, mem_len: int) -> Tensor:
        """The following segment's memory: the last ``mem_len`` states of ``[memory; written]``,
        detached (no gradient crosses a segment boundary)."""
        if self.written is None:
            raise ValueError("this memory has not been read by a forward pass yet")
        both = torch.cat([self.states.to(self.written.dtype), self.written], dim=1)  # (B, M+T, C)
        return both[:, max(0, both.shape[1] - mem_len) :].detach()


class XLAttention(nn.Module):
    """Multi-head causal self-attention over [memory; segment] with Transformer-XL's relative
    positions.

    Args:
        n_heads: H.
        qkv: the fused projection C -> 3·H·D (queries from the segment, keys and values from
            memory and segment).
        r_proj: W_R, C -> H·D, applied to the relative sinusoids R (no bias, as in the paper).
        out_proj: W_O, H·D -> C.
        dropout: on the attention weights (training only).

    Parameters ``u`` and ``v`` ``(H, D)`` are the paper's global content and position biases
    (one pair per layer, as Hugging Face's ``untie_r=True``).
    """

    def __init__(
        self,
        n_heads: int,
        qkv: nn.Module,
        r_proj: nn.Module,
        out_proj: nn.Module,
        *,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        width = out_proj.in_features
        if width % n_heads != 0 or qkv.out_features != 3 * width or r_proj.out_features != width:
            raise ValueError(
                f"qkv must map to 3·H·D, r_proj and out_proj's input to H·D = {width} with "
                f"H = {n_heads} dividing it"
            )
        self.n_heads, self.head_dim = n_heads, width // n_heads
        self.qkv, self.r_proj, self.out_proj = qkv, r_proj, out_proj
        self.u = nn.Parameter(torch.zeros(n_heads, self.head_dim))  # content bias
        self.v = nn.Parameter(torch.zeros(n_heads, self.head_dim))  # position bias
        self.dropout = dropout
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()  # (B, H, T, K)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = True,
        positions: Tensor | None = None,
        bias: Tensor | None = None,
        cache: SegmentMemory | None = None,
        pos_emb: XLRelativePositions | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from the segment ``x (B, T, C)`` to ``[cache.states; x]``.

        Args:
            x: the segment's attention inputs.
            mask: extra boolean mask broadcastable to ``(B, H, T, K)`` (True = may attend),
                combined with the causal one.
            is_causal: must be True (Transformer-XL is a causal LM).
            positions: must be None: distances come from the key count alone.
            bias: additive scores broadcastable to ``(B, H, T, K)``.
            cache: this layer's :class:`SegmentMemory` (None: no memory).
            pos_emb: the model's :class:`XLRelativePositions` (required).

        Returns:
            ``(out (B, T, C), weights (B, H, T, K))``.
        """
        if not is_causal or positions is not None:
            raise ValueError("XLAttention is causal and measures distances itself (positions=None)")
        if pos_emb is None:
            raise ValueError("XLAttention needs the model's XLRelativePositions (pos_emb=)")
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        ctx = x if cache is None else cache.context(x)  # (B, K, C)
        K = ctx.shape[1]
        M = K - T
        q, k, v = self.qkv(ctx).split(H * D, dim=-1)  # each (B, K, H·D)
        q = q[:, M:].view(B, T, H, D).transpose(1, 2)  # (B, H, T, D): the segment's queries
        k = k.view(B, K, H, D).transpose(1, 2)  # (B, H, K, D)
        v = v.view(B, K, H, D).transpose(1, 2)  # (B, H, K, D)
        R = pos_emb(K, device=x.device, dtype=x.dtype)  # (K, C), distances K-1 … 0
        r = self.r_proj(R).view(K, H, D).transpose(0, 1)  # (H, K, D): W_R R
        content = (q + self.u[:, None]) @ k.transpose(-1, -2)  # (B, H, T, K): terms a + c
        position = rel_shift((q + self.v[:, None]) @ r.transpose(-1, -2))  # terms b + d
        scores = (content + position) / D**0.5
        if bias is not None:
            scores = scores + bias
        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(K, device=x.device)[None, :]
        allowed = j <= M + i  # (T, K): causal across memory and segment
        if mask is not None:
            allowed = allowed & mask
        scores = self.hook_attn_scores(scores.masked_fill(~allowed, float("-inf")))
        weights = self.hook_pattern(scores.softmax(dim=-1))  # (B, H, T, K)
        if capturing_attention():
            report_attention(self, weights)
        attn = F.dropout(weights, p=self.dropout) if self.training and self.dropout else weights
        out = (attn @ v).transpose(1, 2).reshape(B, T, H * D)  # (B, T, H·D)
        return self.out_proj(out), weights
