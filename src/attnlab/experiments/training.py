"""How the runs of an ``attnlab experiment`` train: :func:`train_settings`; the settings, numbers
data and translation models of the translation experiments (:class:`NumbersExperimentConfig`,
:func:`numbers_data`, :func:`translation_model`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnlab.config.base import Config
from attnlab.config.train import TrainConfig
from attnlab.config.translation import TranslationTaskConfig
from attnlab.data.translation import build_data
from attnlab.models.translation import build_translation_model

__all__ = ["train_settings", "NumbersExperimentConfig", "numbers_data", "translation_model"]


@dataclass
class NumbersExperimentConfig(Config):
    """The settings every translation experiment on the ``numbers`` task shares (each
    experiment's config adds its own, and may change these defaults).

    Args:
        max_time: seconds for the whole experiment.
        steps: train every run for exactly this many steps instead (no timing; repeatable).
        lang, high, n_examples: the numbers data (``high`` sets the lengths).
        batch_size: examples per step.
        max_test: held-out pairs scored.
        reserve: share of ``max_time`` kept for data, evaluation and plots.
        device, seed, progress: as for training.
    """

    max_time: float = 300.0
    steps: int | None = None
    lang: str = "it"
    high: int = 10**6 - 1
    n_examples: int = 2000
    batch_size: int = 32
    max_test: int = 1000
    reserve: float = 0.15
    device: str = "auto"
    seed: int = 0
    progress: bool = True


def train_settings(cfg: Any, **settings: Any) -> TrainConfig:
    """The :class:`~attnlab.config.train.TrainConfig` of an experiment's runs.

    Every run of an experiment takes ``batch_size``, ``device``, ``seed`` and ``progress`` from the
    experiment's settings ``cfg`` and validates once, at its end; ``settings`` add to that (and
    win).
    """
    shared = {name: getattr(cfg, name) for name in ("batch_size", "device", "seed", "progress")}
    return TrainConfig(**{**shared, "eval_every": 10**9, **settings})


def numbers_data(cfg: Any, **settings: Any) -> Any:
    """The numbers task of a translation experiment: ``cfg``'s ``lang``, ``high``, ``n_examples``
    and ``seed``, plus ``settings`` (``low``, split fractions...); a
    :class:`~attnlab.data.translation.TranslationData`."""
    shared = {name: getattr(cfg, name) for name in ("lang", "high", "n_examples", "seed")}
    return build_data(TranslationTaskConfig(task="numbers", **shared, **settings))


def translation_model(kind: str, data: Any, preset: str, **overrides: Any) -> Any:
    """A translation model of ``kind`` sized for ``data``'s vocabularies, with positions for
    twice its longest sentence (plus 16); ``overrides`` are config fields (``score="dot"``)."""
    longest = max(data.stats["max_src_len"], data.stats["max_tgt_len"])
    return build_translation_model(
        kind,
        len(data.src_vocab),
        len(data.tgt_vocab),
        preset=preset,
        max_seq_len=2 * longest + 16,
        **overrides,
    )
