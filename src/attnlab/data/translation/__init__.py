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
from attnlab.data.translation import dataset, pairs, vocab

# the package's names are its modules' (each lists them in its __all__)
from attnlab.data.translation.dataset import *  # noqa: F403
from attnlab.data.translation.pairs import *  # noqa: F403
from attnlab.data.translation.vocab import *  # noqa: F403

#: the first release's name of :class:`TranslationTaskConfig`
DataConfig = TranslationTaskConfig

__all__ = ["TranslationTaskConfig", "DataConfig", *vocab.__all__, *pairs.__all__, *dataset.__all__]
