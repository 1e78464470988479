"""Baseline language models: an LSTM LM and a bigram table, trained by the same code as DecoderLM.

    bigram:  p(x_t | x_<t) = softmax(W[x_{t−1}])            one row of logits per previous token
    LSTM:    h_t = LSTM(E[x_t], h_{t−1}),  logits_t = W_out h_t

The bigram model is the floor any context-using model must beat; the LSTM is the recurrent
baseline the Transformer replaced. Both take ``(B, T)`` token ids and return ``(B, T, V)`` logits,
like :class:`attnlab.DecoderLM`, so the LM task and ``attnlab eval`` work on them unchanged.
The LSTM implements the decoding interface of :mod:`attnlab.decoding` (its ``(h, c)`` is the
decoding state, so generation feeds one token per step); the bigram table needs no state and is
run by recomputation. Neither supports left padding.

Shape legend: B batch, T time, V vocab_size, E emb_dim, Hd hidden size, L LSTM layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState
from attnlab.config.lm import BigramConfig, LSTMConfig
from attnlab.layers.rnn import stacked_rnn
from attnlab.models.registry import register_kind

__all__ = ["LSTMConfig", "LSTMLM", "LSTMDecodeState", "BigramConfig", "BigramLM"]


def _check_unpadded(attention_mask: Tensor | None) -> None:
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("recurrent and bigram LMs do not support padded batches")


@dataclass
class LSTMDecodeState(DecodeState):
    """Incremental decoding of an :class:`LSTMLM`: the recurrent state after the tokens fed so far,
    batch first (so that beam search's ``reorder`` selects rows of it)."""

    h: Tensor  # (B, L, Hd)
    c: Tensor  # (B, L, Hd)


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
        self.lstm = stacked_rnn("lstm", c.emb_dim, c.hidden, c.n_layers, dropout=c.dropout)
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
        """``idx (B, T)`` -> logits ``(B, T, V)``; ``state`` ``(h, c)``, each ``(L, B, Hd)``,
        continues from an earlier chunk."""
        _check_unpadded(attention_mask)
        x = self.drop(self.tok_emb(idx))  # (B, T, E)
        h, _ = self.lstm(x, state)  # (B, T, Hd)
        return self.lm_head(self.drop(h))  # (B, T, V)

    # -- incremental decoding (the interface of attnlab.decoding) -------------------------------

    def start_decoding(
        self, batch_size: int, max_len: int | None = None, *, device=None
    ) -> LSTMDecodeState:
        """The zero state for ``batch_size`` rows (``max_len`` is not needed: the state is fixed
        size, and is accepted for the common interface)."""
        w = self.tok_emb.weight
        shape = (batch_size, self.config.n_layers, self.config.hidden)
        zeros = torch.zeros(shape, device=device or w.device, dtype=w.dtype)
        return LSTMDecodeState(h=zeros, c=zeros.clone())

    def decode_step(
        self, tokens: Tensor, state: LSTMDecodeState, *, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, LSTMDecodeState]:
        """Feed ``tokens (B, T)`` (the prompt, then one token at a time).

        Returns:
            ``(logits (B, V) of the next token, state)``.
        """
        _check_unpadded(attention_mask)
        x = self.drop(self.tok_emb(tokens))  # (B, T, E)
        hc = (state.h.transpose(0, 1).contiguous(), state.c.transpose(0, 1).contiguous())
        out, (h, c) = self.lstm(x, hc)  # out (B, T, Hd); h, c (L, B, Hd)
        logits = self.lm_head(self.drop(out[:, -1]))  # (B, V)
        return logits, LSTMDecodeState(h=h.transpose(0, 1), c=c.transpose(0, 1))


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
