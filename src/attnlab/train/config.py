"""``TrainConfig`` lives in :mod:`attnlab.config.train` (one config system); kept importable here."""

from attnlab.config.train import AMP_MODES, SCHEDULES, TrainConfig

__all__ = ["TrainConfig", "SCHEDULES", "AMP_MODES"]
