"""attnlab.config: one config system for every family (see :mod:`attnlab.config.base`).

``ModelConfig`` (decoder-only LMs) and ``PRESETS`` keep their first-release import path here.
"""

from attnlab.config.base import Config, ConfigError
from attnlab.config.block import BlockConfig, swiglu_hidden
from attnlab.config.lm import PRESETS, BigramConfig, LSTMConfig, ModelConfig
from attnlab.config.translation import (
    RNNSeq2SeqConfig,
    ScheduledSamplingConfig,
    Seq2SeqConfig,
    TranslationTaskConfig,
)

__all__ = [
    "Config",
    "ConfigError",
    "BlockConfig",
    "ModelConfig",
    "LSTMConfig",
    "BigramConfig",
    "PRESETS",
    "Seq2SeqConfig",
    "RNNSeq2SeqConfig",
    "TranslationTaskConfig",
    "ScheduledSamplingConfig",
    "swiglu_hidden",
]
