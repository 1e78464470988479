"""Recurrent stacks for the RNN baselines: the LSTM language model, the RNN encoder–decoders and
the LSTM captioner and VQA model.

Shape legend: B batch, T time, E input width, H hidden width.
"""

from __future__ import annotations

from typing import Literal

from torch import nn

__all__ = ["stacked_rnn"]


def stacked_rnn(
    cell: Literal["lstm", "gru"],
    input_size: int,
    hidden: int,
    n_layers: int,
    *,
    dropout: float = 0.0,
    bidirectional: bool = False,
) -> nn.LSTM | nn.GRU:
    """A batch-first ``nn.LSTM`` or ``nn.GRU`` of ``n_layers``: ``(B, T, E) -> (B, T, H)``.

    Args:
        cell: ``lstm`` or ``gru``.
        input_size, hidden: E and H (per direction).
        n_layers: stacked layers.
        dropout: between stacked layers (torch applies it after every layer but the last, so a
            single layer gets none).
        bidirectional: a backward RNN too (outputs ``2·H`` wide).
    """
    rnn = nn.LSTM if cell == "lstm" else nn.GRU
    return rnn(
        input_size,
        hidden,
        num_layers=n_layers,
        batch_first=True,
        bidirectional=bidirectional,
        dropout=dropout if n_layers > 1 else 0.0,
    )
