"""The translation data set: pairs normalised, length-filtered, split, with their vocabularies,
and padded teacher-forcing batches.

The decoder reads ``<start> y_1 … y_n`` and is trained to predict ``y_1 … y_n <end>``
(:func:`collate`); the held-out splits never share a source sentence with the training split.

Shape legend: B batch, S source length, T target length.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnlab.config.translation import TranslationTaskConfig
from attnlab.data.translation.pairs import make_dates, make_numbers, read_tsv
from attnlab.data.translation.vocab import (
    END_ID,
    PAD_ID,
    START_ID,
    TranslationVocabs,
    Vocab,
    normalizer_for,
    split_tokens,
)
from attnlab.errors import UserError

__all__ = ["TranslationData", "build_data", "Batch", "collate"]

log = logging.getLogger(__name__)


@dataclass
class TranslationData:
    """Normalised, filtered, split pairs and the two vocabularies built on the training split."""

    config: TranslationTaskConfig
    splits: dict[str, list[tuple[str, str]]]
    src_vocab: Vocab
    tgt_vocab: Vocab
    n_filtered: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    def encoded(self, split: str) -> tuple[list[list[int]], list[list[int]]]:
        """Source and target id lists of a split (targets without ``<start>``/``<end>``)."""
        pairs = self.splits[split]
        return (
            [self.src_vocab.encode(s) for s, _ in pairs],
            [self.tgt_vocab.encode(t) for _, t in pairs],
        )

    @property
    def max_tgt_len(self) -> int:
        """Tokens in the longest target (of every split): sets the default decoding limit."""
        return int(self.stats["max_tgt_len"])

    def vocabs(self) -> TranslationVocabs:
        """The vocabularies and normaliser, as a run directory stores them."""
        return TranslationVocabs(
            self.src_vocab, self.tgt_vocab, normalizer_for(self.config), self.max_tgt_len
        )


def build_data(config: TranslationTaskConfig) -> TranslationData:
    """Generate or read the pairs, normalise, filter by length, split, and build vocabularies.

    The held-out splits never share a source sentence with the training split.

    Raises:
        UserError: bad task options, unreadable TSV, or nothing left after filtering.
    """
    c = config
    if c.task == "numbers":
        raw = make_numbers(c.lang, c.n_examples, low=c.low, high=c.high, seed=c.seed)
    elif c.task == "dates":
        raw = make_dates(c.n_examples, seed=c.seed)
    else:
        raw = read_tsv(c.path, src_col=c.src_col, tgt_col=c.tgt_col)
    norm = normalizer_for(c)
    # one sentence pair per source (the first one): a source in two splits would leak
    pairs: dict[str, str] = {}
    for s, t in raw:
        s, t = norm(s), norm(t)
        if s and t and s not in pairs:
            pairs[s] = t
    kept, n_filtered = [], 0
    for s, t in pairs.items():
        ls, lt = len(split_tokens(s, c.src_level)), len(split_tokens(t, c.tgt_level))
        if c.min_len <= ls <= c.max_len and c.min_len <= lt <= c.max_len:
            kept.append((s, t))
        else:
            n_filtered += 1
    if len(kept) < 3:
        why = (
            f"after length filtering (min_len={c.min_len}, max_len={c.max_len})"
            if n_filtered
            else f"in the {c.task} data (distinct sources)"
        )
        raise UserError(f"only {len(kept)} sentence pairs {why}; need at least 3")
    random.Random(f"split-{c.seed}").shuffle(kept)
    n_val = max(1, round(c.val_frac * len(kept))) if c.val_frac > 0 else 0
    n_test = max(1, round(c.test_frac * len(kept))) if c.test_frac > 0 else 0
    splits = {
        "val": kept[:n_val],
        "test": kept[n_val : n_val + n_test],
        "train": kept[n_val + n_test :],
    }
    if not splits["train"]:
        raise UserError(
            f"no training pairs left ({len(kept)} pairs, val_frac={c.val_frac}, "
            f"test_frac={c.test_frac})"
        )
    src_vocab = Vocab.build(
        (s for s, _ in splits["train"]),
        c.src_level,
        min_freq=c.min_freq,
        bpe_vocab_size=c.bpe_vocab_size,
    )
    tgt_vocab = Vocab.build(
        (t for _, t in splits["train"]),
        c.tgt_level,
        min_freq=c.min_freq,
        bpe_vocab_size=c.bpe_vocab_size,
    )
    data = TranslationData(c, splits, src_vocab, tgt_vocab, n_filtered)
    src_lens = [len(src_vocab.tokenize(s)) for s, _ in kept]
    tgt_lens = [len(tgt_vocab.tokenize(t)) for _, t in kept]
    data.stats = {
        "pairs": len(kept),
        "filtered": n_filtered,
        "max_src_len": max(src_lens),
        "max_tgt_len": max(tgt_lens),
        **{f"n_{k}": len(v) for k, v in splits.items()},
    }
    if n_filtered:
        log.info("dropped %d pairs outside the length limits", n_filtered)
    return data


# ----------------------------------------------------------------------------------------------
# batches


@dataclass
class Batch:
    """A padded batch. ``tgt_in = <start> y``, ``tgt_out = y <end>`` (teacher forcing).

    ``step`` is the training batch's number (what the task's ``get_batch`` was asked for; None
    for validation batches): scheduled sampling reads its schedule from it.
    """

    src: Tensor  # (B, S) long, <pad>-padded on the right
    src_mask: Tensor  # (B, S) bool, True = real token
    tgt_in: Tensor  # (B, T) long
    tgt_out: Tensor  # (B, T) long, <pad> where there is no target
    step: int | None = None

    def to(self, device) -> Batch:
        tensors = (self.src, self.src_mask, self.tgt_in, self.tgt_out)
        return Batch(*(t.to(device) for t in tensors), step=self.step)


def collate(
    src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]] | None = None
) -> Batch:
    """Pad id lists into a :class:`Batch` (without targets ``tgt_in``/``tgt_out`` are empty)."""
    B = len(src_ids)
    S = max(1, max(len(s) for s in src_ids))
    src = torch.full((B, S), PAD_ID, dtype=torch.long)
    for i, s in enumerate(src_ids):
        src[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    src_mask = src != PAD_ID
    if tgt_ids is None:
        empty = torch.zeros(B, 0, dtype=torch.long)
        return Batch(src, src_mask, empty, empty)
    T = max(len(t) for t in tgt_ids) + 1
    tgt_in = torch.full((B, T), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((B, T), PAD_ID, dtype=torch.long)
    for i, t in enumerate(tgt_ids):
        tgt_in[i, : len(t) + 1] = torch.tensor([START_ID, *t], dtype=torch.long)
        tgt_out[i, : len(t) + 1] = torch.tensor([*t, END_ID], dtype=torch.long)
    return Batch(src, src_mask, tgt_in, tgt_out)
