"""Parity strings, the adaptive-computation task: ``[CLS] b_1 … b_n`` with n random bits, the
label the parity of their sum (Graves 2016 used parity to show ACT pondering).

Token ids: the bits are 0 and 1, ``[CLS]`` is 2, padding 3 (:data:`VOCAB`).

Shape legend: B batch, T = 1 + the longest string.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.errors import UserError

__all__ = ["CLS", "PAD", "VOCAB", "parity_batch", "encode_bits"]

CLS, PAD = 2, 3
#: what each id reads as
VOCAB = ("0", "1", "[CLS]", "[PAD]")


def parity_batch(lengths: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Random bit strings of the given lengths as ``[CLS] bits [PAD]…``.

    Returns:
        ``(idx (B, T), attention_mask (B, T) bool, labels (B,))``, the labels the parity of each
        string.
    """
    B, T = len(lengths), 1 + int(lengths.max())
    bits = torch.randint(0, 2, (B, T - 1), generator=generator)
    real = torch.arange(T - 1)[None, :] < lengths[:, None]  # (B, T-1)
    bits = torch.where(real, bits, torch.full_like(bits, PAD))
    idx = torch.cat([torch.full((B, 1), CLS), bits], dim=1)  # (B, T)
    mask = torch.cat([torch.ones(B, 1, dtype=torch.bool), real], dim=1)
    labels = (torch.where(real, bits, 0).sum(1) % 2).long()
    return idx, mask, labels


def encode_bits(text: str) -> list[int]:
    """``"0110"`` -> ``[CLS, 0, 1, 1, 0]`` (spaces ignored).

    Raises:
        UserError: a character other than 0, 1 or a space, or no bits.
    """
    bits = text.replace(" ", "")
    bad = sorted(set(bits) - {"0", "1"})
    if bad:
        raise UserError(f"a parity string is made of 0 and 1; found {', '.join(map(repr, bad))}")
    if not bits:
        raise UserError("the parity string is empty: give some bits, e.g. 0110")
    return [CLS, *(int(b) for b in bits)]
