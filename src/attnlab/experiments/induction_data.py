"""The data of the induction-heads experiment (:mod:`attnlab.experiments.induction`): windows with
a span repeated to their end, the ``[r, r]`` probe, and the two settings' base sequences.

Shape legend: B batch, T sequence length.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from attnlab.data.textstream import pydoc_text
from attnlab.errors import UserError


class WindowSettings(Protocol):
    """What :class:`TokenSource` reads of a config (:class:`~attnlab.experiments.induction.InductionConfig`)."""

    seq_len: int
    vocab_size: int
    max_chars: int | None


__all__ = ["SETTINGS", "TokenSource", "insert_repeats", "repeated_spans", "repeated_tokens"]

SETTINGS = ("random", "pydoc")


def insert_repeats(
    x: Tensor, gen: torch.Generator, *, min_span: float = 0.125, max_span: float = 0.5
) -> tuple[Tensor, Tensor]:
    """Repeat one span of each row of ``x`` ``(B, T)`` until the row ends.

    The span's length L is uniform in ``min_span·T … max_span·T`` (at least 2), its start ``p``
    uniform in ``0 … T − 2L``; positions ``p + L …`` are overwritten with ``x[p : p + L]``
    repeated. Returns the new rows and a mask ``(B, T)``, True on the copied tokens (the ones
    predictable from the context).
    """
    B, T = x.shape
    x = x.clone()
    copied = torch.zeros(B, T, dtype=torch.bool)
    lo = max(2, round(min_span * T))
    hi = max(lo, min(T // 2, int(max_span * T)))
    for b in range(B):
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        p = int(torch.randint(0, T - 2 * n + 1, (1,), generator=gen))
        span = x[b, p : p + n]
        x[b, p + n :] = span.repeat((T - p) // n + 1)[: T - p - n]
        copied[b, p + n :] = True
    return x, copied


def repeated_spans(
    batch: int,
    seq_len: int,
    vocab: int,
    gen: torch.Generator,
    *,
    min_span: float = 0.125,
    max_span: float = 0.5,
) -> Tensor:
    """``(B, T)`` uniform random tokens with one span repeated to the end (:func:`insert_repeats`)."""
    x = torch.randint(vocab, (batch, seq_len), generator=gen)
    return insert_repeats(x, gen, min_span=min_span, max_span=max_span)[0]


def repeated_tokens(batch: int, seq_len: int, vocab: int, gen: torch.Generator) -> Tensor:
    """The probe: ``(B, T)`` rows ``[r, r]``, ``r`` of ``T/2`` uniform random tokens."""
    r = torch.randint(vocab, (batch, seq_len // 2), generator=gen)
    return torch.cat([r, r], dim=1)


class TokenSource:
    """The base sequences of one setting: ``sample(B, gen)`` gives ``(B, T)`` windows.

    ``random``: uniform tokens of ``vocab_size``. ``pydoc``: windows of CPython's help topics
    read by characters (vocabulary: the corpus's characters, sorted); training windows from the
    first 90 % of the text, held-out ones from the rest.
    """

    def __init__(self, setting: str, cfg: WindowSettings) -> None:
        if setting not in SETTINGS:
            raise UserError(f"unknown setting {setting!r}; choose from {', '.join(SETTINGS)}")
        self.setting, self.seq_len = setting, cfg.seq_len
        self.chars: str | None = None
        if setting == "random":
            self.vocab_size = cfg.vocab_size
            return
        text = pydoc_text()[: cfg.max_chars]
        self.chars = "".join(sorted(set(text)))
        lookup = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        cut = int(0.9 * len(ids))
        if len(ids) - cut <= cfg.seq_len:
            raise UserError(
                f"--max-chars {cfg.max_chars} is too short for windows of {cfg.seq_len}"
            )
        self.vocab_size = len(self.chars)
        self._split = {"train": ids[:cut], "val": ids[cut:]}

    def sample(self, batch: int, gen: torch.Generator, split: str = "train") -> Tensor:
        """``(B, T)`` base windows (before :func:`insert_repeats`)."""
        if self.setting == "random":
            return torch.randint(self.vocab_size, (batch, self.seq_len), generator=gen)
        ids = self._split[split]
        starts = torch.randint(len(ids) - self.seq_len, (batch,), generator=gen)
        return torch.stack([ids[s : s + self.seq_len] for s in starts.tolist()])
