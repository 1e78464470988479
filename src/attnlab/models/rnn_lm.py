"""Baseline language models: an LSTM LM and a bigram table, trained by the same code as DecoderLM.

    bigram:  p(x_t | x_<t) = softmax(W[x_{t−1}])            one row of logits per previous token
    LSTM:    h_t = LSTM(E[x_t], h_{t−1}),  logits_t = W_out h_t

The bigram model is the floor any context-using model must beat; the LSTM is the recurrent
baseline the Transformer replaced. Both take ``(B, T)`` token ids and return ``(B, T, V)`` logits,
like :class:`attnlab.DecoderLM`, so the LM task, ``attnlab eval`` and ``attnlab generate`` (without
a KV cache) work on them unchanged. Neither supports left padding.

Shape legend: B batch, T time, V vocab_size, E emb_dim, Hd hidden size.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from attnlab.config.lm import BigramConfig, LSTMConfig
from attnlab.models.registry import register_kind

__all__ = ["LSTMConfig", "LSTMLM", "BigramConfig", "BigramLM"]


def _check_unpadded(attention_mask: Tensor | None) -> None:
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("recurrent and bigram LMs do not support padded batches")


class LSTMLM(nn.Module):
    """Embedding → multi-layer LSTM → linear head.

    Args:
        config: :class:`LSTMConfig`.
    """

    kind: ClassVar[str] = "lstm_lm"

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.emb_dim)
        self.drop = nn.Dropout(c.dropout)
        self.lstm = nn.LSTM(
            c.emb_dim,
            c.hidden,
            num_layers=c.n_layers,
            batch_first=True,
            dropout=c.dropout if c.n_layers > 1 else 0.0,
        )
        self.lm_head = nn.Linear(c.hidden, c.vocab_size, bias=True)
        nn.init.normal_(self.tok_emb.weight, std=0.1)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(
        self,
        idx: Tensor,
        *,
        attention_mask: Tensor | None = None,
        state: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """``idx (B, T)`` -> logits ``(B, T, V)``; ``state`` continues from an earlier chunk."""
        _check_unpadded(attention_mask)
        x = self.drop(self.tok_emb(idx))  # (B, T, E)
        h, _ = self.lstm(x, state)  # (B, T, Hd)
        return self.lm_head(self.drop(h))  # (B, T, V)


class BigramLM(nn.Module):
    """``logits[b, t] = table[idx[b, t]]``: the next token depends on the current one only."""

    kind: ClassVar[str] = "bigram_lm"

    def __init__(self, config: BigramConfig) -> None:
        super().__init__()
        self.config = config
        self.table = nn.Embedding(config.vocab_size, config.vocab_size)  # (V, V) logits
        nn.init.zeros_(self.table.weight)  # start at the uniform distribution

    def forward(self, idx: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """``idx (B, T)`` -> logits ``(B, T, V)``."""
        _check_unpadded(attention_mask)
        return self.table(idx)


register_kind(LSTMLM.kind, LSTMConfig, LSTMLM, artifacts="tokenizer")
register_kind(BigramLM.kind, BigramConfig, BigramLM, artifacts="tokenizer")
