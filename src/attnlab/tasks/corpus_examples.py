"""What the pre-training tasks that turn windows of a corpus into examples share (masked LM,
span corruption): the corpus loaded as for language modelling, the windows of a batch, the
fixed validation windows, and a rank's share of a global batch.

Window starts of training batch ``step`` come from a generator seeded by ``(seed, split, step)``
(the same draws on every rank and after a resume); the validation set is the consecutive windows
of the held-out split, with the generator ``(seed, 2)`` for whatever the task draws on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.config.lm import CorpusTaskConfig, LMTaskConfig
from attnlab.data.tokenizers import TokenizerWithSpecials
from attnlab.tasks.lm import CorpusTask, LMTask

__all__ = ["CorpusExamplesTask"]

_SPLITS = {"train": 0, "val": 1}
_VAL_STREAM = 2  # the generator stream of the validation set


class CorpusExamplesTask(CorpusTask):
    """A task whose examples are made from windows of an :class:`LMTask`'s corpus.

    Args:
        corpus: the language-modelling task that holds the corpus's ids and splits.
        tokenizer: the plain tokenizer with the task's specials after its ids.
        config: the settings; ``seed`` None means 0.
    """

    def __init__(self, corpus: LMTask, tokenizer: TokenizerWithSpecials, config: Any) -> None:
        if config.seed is None:
            config = config.replace(seed=0)
        self.corpus, self.tokenizer, self.config = corpus, tokenizer, config
        self._val: Any = None

    @staticmethod
    def load_corpus(
        config: CorpusTaskConfig, tokenizer: Any, window: int
    ) -> tuple[LMTask, CorpusTaskConfig]:
        """The corpus read, tokenised and split as for language modelling, windows of ``window``
        tokens; and ``config`` with the corpus as found (absolute path) and the plain tokenizer's
        vocabulary size. ``tokenizer``: a run's (with or without specials), or None for a new one.

        Raises:
            UserError: an unknown or empty corpus, a bad tokenizer setting, too few tokens.
        """
        base = tokenizer.base if isinstance(tokenizer, TokenizerWithSpecials) else tokenizer
        shared = ("data", "tokenizer", "vocab_size", "seed", "val_fraction", "max_chars")
        lm_config = LMTaskConfig(seq_len=window, **{k: getattr(config, k) for k in shared})
        corpus = LMTask.build(lm_config, tokenizer=base)
        c = corpus.config
        return corpus, config.replace(data=c.data, tokenizer=c.tokenizer, vocab_size=c.vocab_size)

    @property
    def splits(self) -> dict[str, Any]:
        """Token ids (plain tokenizer) of the ``train`` and ``val`` splits."""
        return self.corpus.splits

    @property
    def n_tokens(self) -> dict[str, int]:
        return self.corpus.n_tokens

    # -- windows --------------------------------------------------------------------------------

    def windows(self, split: str, starts: np.ndarray, length: int) -> np.ndarray:
        """``(B, length)`` int64 ids of the windows of ``split`` starting at ``starts (B,)``."""
        ids = self.splits[split]
        return np.asarray(ids[starts[:, None] + np.arange(length)[None, :]], dtype=np.int64)

    def batch_starts(
        self, split: str, step: int, batch_size: int, length: int
    ) -> tuple[np.random.Generator, np.ndarray]:
        """The generator of global batch ``step`` and the ``(batch_size,)`` window starts it drew
        first (windows of ``length`` tokens)."""
        if split not in _SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        rng = np.random.default_rng([self.seed, _SPLITS[split], step])
        starts = rng.integers(0, len(self.splits[split]) - length + 1, size=batch_size)
        return rng, starts

    def val_starts(self, length: int) -> tuple[np.random.Generator, np.ndarray]:
        """The validation set's generator and starts: consecutive windows of the held-out split."""
        starts = np.arange(0, len(self.splits["val"]) - length + 1, length)
        return np.random.default_rng([self.seed, _VAL_STREAM]), starts

    @staticmethod
    def rank_share(batch_size: int, rank: int, world: int) -> slice:
        """The rows of a global batch that are ``rank``'s (of ``world``)."""
        per = batch_size // world
        return slice(rank * per, (rank + 1) * per)

    @staticmethod
    def eval_slices(n_rows: int, batch_size: int, n_batches: int | None) -> Iterator[slice]:
        """Rows of the validation set in batches of ``batch_size``, at most ``n_batches``."""
        n = n_rows if n_batches is None else min(n_rows, batch_size * n_batches)
        for i in range(0, n, batch_size):
            yield slice(i, min(i + batch_size, n))

    def save_artifacts(self, run_dir: str | Path) -> None:
        self.tokenizer.save(run_dir)
