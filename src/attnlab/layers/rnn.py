"""Recurrent stacks for the RNN baselines: the LSTM language model, the RNN encoder–decoders and
the LSTM captioner and VQA model.

The cells: ``lstm``, ``gru``, and the vanilla ``rnn`` of the lecture notes,
h_t = tanh(W x_t + U h_{t-1} + b) (torch's ``nn.RNN`` with ``nonlinearity="tanh"``; its two bias
vectors add up to b).

Shape legend: B batch, T time, E input width, H hidden width.
"""

from __future__ import annotations

from typing import Literal

from torch import nn

__all__ = ["stacked_rnn", "rnn_cell", "RNN_CELLS"]

RNNCellName = Literal["lstm", "gru", "rnn"]
#: the recurrent stack and the single cell of each name
RNN_CELLS: dict[str, tuple[type[nn.RNNBase], type[nn.RNNCellBase]]] = {
    "lstm": (nn.LSTM, nn.LSTMCell),
    "gru": (nn.GRU, nn.GRUCell),
    "rnn": (nn.RNN, nn.RNNCell),
}


def _check(cell: str) -> None:
    if cell not in RNN_CELLS:
        raise ValueError(f"unknown RNN cell {cell!r}; choose from {list(RNN_CELLS)}")


def rnn_cell(cell: RNNCellName, input_size: int, hidden: int) -> nn.RNNCellBase:
    """One ``nn.LSTMCell``, ``nn.GRUCell`` or tanh ``nn.RNNCell``: ``(B, E), state -> (B, H)``."""
    _check(cell)
    extra = {"nonlinearity": "tanh"} if cell == "rnn" else {}
    return RNN_CELLS[cell][1](input_size, hidden, **extra)


def stacked_rnn(
    cell: RNNCellName,
    input_size: int,
    hidden: int,
    n_layers: int,
    *,
    dropout: float = 0.0,
    bidirectional: bool = False,
) -> nn.RNNBase:
    """A batch-first ``nn.LSTM``, ``nn.GRU`` or tanh ``nn.RNN`` of ``n_layers``:
    ``(B, T, E) -> (B, T, H)``.

    Args:
        cell: ``lstm``, ``gru`` or ``rnn``.
        input_size, hidden: E and H (per direction).
        n_layers: stacked layers.
        dropout: between stacked layers (torch applies it after every layer but the last, so a
            single layer gets none).
        bidirectional: a backward RNN too (outputs ``2·H`` wide).
    """
    _check(cell)
    extra = {"nonlinearity": "tanh"} if cell == "rnn" else {}
    return RNN_CELLS[cell][0](
        input_size,
        hidden,
        num_layers=n_layers,
        batch_first=True,
        bidirectional=bidirectional,
        dropout=dropout if n_layers > 1 else 0.0,
        **extra,
    )
