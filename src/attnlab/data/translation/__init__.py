"""Parallel data for translation: generated numbers and dates, TSV files, vocabularies, batches.

- :mod:`~attnlab.data.translation.pairs`: the sentence-pair sources (``numbers``, ``dates``,
  ``tsv``), reproducible from a seed;
- :mod:`~attnlab.data.translation.vocab`: the normaliser, word/char/BPE vocabularies with the four
  specials ``<pad>`` (0), ``<start>`` (1), ``<end>`` (2), ``<unk>`` (3), and a run's
  :class:`TranslationVocabs` (``vocab.json``);
- :mod:`~attnlab.data.translation.dataset`: normalised, filtered, split pairs
  (:func:`build_data`) and padded teacher-forcing batches (:func:`collate`).

The settings are a :class:`attnlab.config.TranslationTaskConfig` (``DataConfig`` is its
first-release name). The trainer's task is :class:`attnlab.tasks.translation.TranslationTask`.
"""

from attnlab.config.translation import TranslationTaskConfig
from attnlab.data.translation.dataset import Batch, TranslationData, build_data, collate
from attnlab.data.translation.pairs import (
    make_dates,
    make_numbers,
    number_languages,
    read_tsv,
    write_tsv,
)
from attnlab.data.translation.vocab import (
    END,
    END_ID,
    LEVELS,
    PAD,
    PAD_ID,
    SPECIALS,
    START,
    START_ID,
    UNK,
    UNK_ID,
    VOCAB_FILE,
    Normalizer,
    TranslationVocabs,
    Vocab,
    load_vocabs,
    normalizer_for,
    split_tokens,
)

#: the first release's name of :class:`TranslationTaskConfig`
DataConfig = TranslationTaskConfig

__all__ = [
    "TranslationTaskConfig",
    "DataConfig",
    # vocab
    "PAD",
    "START",
    "END",
    "UNK",
    "SPECIALS",
    "PAD_ID",
    "START_ID",
    "END_ID",
    "UNK_ID",
    "LEVELS",
    "VOCAB_FILE",
    "Normalizer",
    "normalizer_for",
    "Vocab",
    "split_tokens",
    "TranslationVocabs",
    "load_vocabs",
    # pairs
    "number_languages",
    "make_numbers",
    "make_dates",
    "read_tsv",
    "write_tsv",
    # dataset
    "TranslationData",
    "build_data",
    "Batch",
    "collate",
]
