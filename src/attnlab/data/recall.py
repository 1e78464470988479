"""Recall at a distance, the sequence-primitives task: a key token D positions before the end
must be reproduced at the last position.

    [f f … f  k  f … f  ?]          length T; the key k at position T − 1 − D, the query ? at T − 1
                ^—— D positions ——^

Token ids: keys 0 … n_keys − 1, fillers n_keys … n_keys + n_fillers − 1, the query marker last
(:func:`recall_vocab_size`). Every position but the key's holds a random filler (the query's
holds the marker), so the key is the only key-type token and the fillers say nothing about it:
a model that cannot see the key position from the query is at chance, 1 / n_keys, whatever it
predicts.

Shape legend: B batch, T seq_len.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.errors import UserError

__all__ = ["recall_batch", "recall_vocab_size"]


def recall_vocab_size(n_keys: int, n_fillers: int) -> int:
    """Keys, fillers and the query marker."""
    return n_keys + n_fillers + 1


def recall_batch(
    distances: Tensor, seq_len: int, n_keys: int, n_fillers: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """One sequence per distance D (``1 ≤ D ≤ seq_len − 1``): the key at ``seq_len − 1 − D``.

    Returns:
        ``(idx (B, T), keys (B,))``: the tokens, and the key each last position must predict.

    Raises:
        UserError: a distance outside ``1 … seq_len − 1``, or no keys or fillers.
    """
    if n_keys < 1 or n_fillers < 1:
        raise UserError(f"the recall task needs keys and fillers, got {n_keys} and {n_fillers}")
    if len(distances) and (int(distances.min()) < 1 or int(distances.max()) > seq_len - 1):
        raise UserError(
            f"a recall distance must be between 1 and seq_len - 1 = {seq_len - 1}, "
            f"got {distances.tolist()}"
        )
    B = len(distances)
    idx = n_keys + torch.randint(0, n_fillers, (B, seq_len), generator=generator)  # (B, T)
    keys = torch.randint(0, n_keys, (B,), generator=generator)  # (B,)
    idx[torch.arange(B), seq_len - 1 - distances] = keys
    idx[:, -1] = n_keys + n_fillers  # the query marker
    return idx, keys
