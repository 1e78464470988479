"""The ``t5-span`` family of :func:`attnlab.runspec.resolve` (``attnlab train t5-span``): T5
pre-trained by span corruption on a text corpus.

A corpus family like ``mlm``: the corpus settings of ``lm`` plus the corruption's, presets of
:class:`~attnlab.config.T5Config` (``tiny`` unless named), the vocabulary from the tokenizer
plus T5's specials (``<pad> </s>`` and ``n_sentinels`` sentinels) and the resume checks, all from
:func:`attnlab.runspec.resolve` and :func:`attnlab.runspec.build_run`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnlab.config.t5 import SpanTaskConfig
from attnlab.runspec.spec import Family
from attnlab.tasks.t5_span import SpanCorruptionTask

__all__ = ["T5_SPAN", "span_specials"]


def span_specials(task: Mapping[str, Any]) -> int:
    """``<pad>``, ``</s>`` and the sentinels a span task with settings ``task`` adds."""
    return 2 + int(task.get("n_sentinels") or SpanTaskConfig.n_sentinels)


T5_SPAN = Family(
    "t5-span",
    "span-corruption T5",
    ("t5_span",),
    SpanTaskConfig,
    SpanCorruptionTask,
    {
        "data": "--data",
        "tokenizer": "--tokenizer",
        "vocab_size": "--vocab-size",
        "seq_len": "--seq-len",
        "max_chars": "--max-chars",
        "noise_density": "--noise-density",
        "mean_span_length": "--mean-span-length",
    },
    n_specials=span_specials,
)
