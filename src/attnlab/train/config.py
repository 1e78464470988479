"""``TrainConfig`` lives in :mod:`attnlab.config.train` (one config system); kept importable here."""

from attnlab.config.train import AMP_MODES, FSDP_DTYPES, SCHEDULES, STRATEGIES, TrainConfig

__all__ = ["TrainConfig", "SCHEDULES", "AMP_MODES", "STRATEGIES", "FSDP_DTYPES"]
