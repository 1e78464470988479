"""A causal dilated-convolution language model: the 1-D CNN of the lecture's RNN / CNN /
self-attention comparison.

    h_0 = E[x]
    h_l = h_{l−1} + W_l · GELU(CausalConv_{k, d_l}(LN(h_{l−1})))      l = 1 … L
    logits = W_out LN(h_L)

Every position is computed at once (no recurrence: parallel over time like attention), but the
output at t sees only the R = 1 + Σ_l (k − 1)·d_l tokens t − R + 1 … t
(:attr:`ConvLMConfig.receptive_field`): the reach grows with depth and kernel size, never to the
whole sequence. The layer norms and the 1×1 projections W_l act per position and widen nothing.
Takes ``(B, T)`` token ids and returns ``(B, T, V)`` logits like :class:`attnlab.DecoderLM`, so
the LM task, ``attnlab train lm --arch conv`` and ``attnlab eval`` work on it; generation runs
by recomputation over the last ``max_seq_len`` tokens. It does not support padded batches.

Shape legend: B batch, T time, V vocab_size, C width.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from attnlab.config.lm import ConvLMConfig
from attnlab.layers.causal_conv import CausalConv1d
from attnlab.models.registry import register_kind

__all__ = ["ConvLMConfig", "CausalConvLM", "ConvBlock"]


class ConvBlock(nn.Module):
    """``h + W · GELU(CausalConv(LN(h)))``: one residual layer of dilation ``dilation``."""

    def __init__(self, width: int, kernel_size: int, dilation: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.conv = CausalConv1d(width, width, kernel_size, dilation)
        self.act = nn.GELU()
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.drop(self.proj(self.act(self.conv(self.norm(h)))))  # (B, T, C)


class CausalConvLM(nn.Module):
    """Embedding → residual causal dilated convolutions → LayerNorm → linear head.

    Args:
        config: :class:`ConvLMConfig`.
    """

    kind: ClassVar[str] = "conv_lm"

    def __init__(self, config: ConvLMConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.width)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            ConvBlock(c.width, c.kernel_size, d, c.dropout) for d in c.dilations
        )
        self.norm = nn.LayerNorm(c.width)
        self.lm_head = nn.Linear(c.width, c.vocab_size, bias=True)
        nn.init.normal_(self.tok_emb.weight, std=0.1)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    @property
    def receptive_field(self) -> int:
        """R = 1 + Σ_l (k − 1)·d_l: the tokens (itself included) one output depends on."""
        return self.config.receptive_field

    def forward(self, idx: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """``idx (B, T)`` -> logits ``(B, T, V)``; the logits at t depend on ``idx[:, t−R+1 : t+1]``
        only."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("the convolutional LM does not support padded batches")
        h = self.drop(self.tok_emb(idx))  # (B, T, C)
        for block in self.blocks:
            h = block(h)  # (B, T, C)
        return self.lm_head(self.norm(h))  # (B, T, V)


register_kind(CausalConvLM.kind, ConvLMConfig, CausalConvLM, artifacts="tokenizer")
