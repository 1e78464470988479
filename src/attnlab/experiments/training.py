"""How the runs of an ``attnlab experiment`` train: :func:`train_settings`."""

from __future__ import annotations

from typing import Any

from attnlab.config.train import TrainConfig

__all__ = ["train_settings"]


def train_settings(cfg: Any, **settings: Any) -> TrainConfig:
    """The :class:`~attnlab.config.train.TrainConfig` of an experiment's runs.

    Every run of an experiment takes ``batch_size``, ``device``, ``seed`` and ``progress`` from the
    experiment's settings ``cfg`` and validates once, at its end; ``settings`` add to that (and
    win).
    """
    shared = {name: getattr(cfg, name) for name in ("batch_size", "device", "seed", "progress")}
    return TrainConfig(**{**shared, "eval_every": 10**9, **settings})
