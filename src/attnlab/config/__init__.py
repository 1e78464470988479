"""attnlab.config: one config system for every family (see :mod:`attnlab.config.base`).

``ModelConfig`` (decoder-only LMs) and ``PRESETS`` keep their first-release import path here.
"""

from attnlab.config.base import BlockConfig, Config, ConfigError, TextStackConfig, swiglu_hidden
from attnlab.config.encoder import EncoderConfig, MLMTaskConfig
from attnlab.config.lm import (
    PRESETS,
    BigramConfig,
    ConvLMConfig,
    CorpusTaskConfig,
    LMTaskConfig,
    LSTMConfig,
    ModelConfig,
)
from attnlab.config.multimodal import VQA_MODELS, CaptionConfig, VQAConfig
from attnlab.config.t5 import SpanTaskConfig, T5Config, T5SpanConfig
from attnlab.config.translation import (
    RNNSeq2SeqConfig,
    ScheduledSamplingConfig,
    Seq2SeqConfig,
    TranslationTaskConfig,
)
from attnlab.config.vision import CNNConfig, DeiTConfig, ImageTaskConfig, SwinConfig, ViTConfig

__all__ = [
    "Config",
    "ConfigError",
    "BlockConfig",
    "TextStackConfig",
    "CorpusTaskConfig",
    "ModelConfig",
    "LSTMConfig",
    "ConvLMConfig",
    "BigramConfig",
    "LMTaskConfig",
    "PRESETS",
    "Seq2SeqConfig",
    "RNNSeq2SeqConfig",
    "TranslationTaskConfig",
    "ScheduledSamplingConfig",
    "ViTConfig",
    "DeiTConfig",
    "SwinConfig",
    "CNNConfig",
    "ImageTaskConfig",
    "CaptionConfig",
    "VQAConfig",
    "VQA_MODELS",
    "EncoderConfig",
    "MLMTaskConfig",
    "T5Config",
    "T5SpanConfig",
    "SpanTaskConfig",
    "swiglu_hidden",
]
