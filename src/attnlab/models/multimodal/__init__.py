"""Captioning and VQA models on generated scenes.

- :mod:`~attnlab.models.multimodal.encoders`: the vision family's CNN/ViT as a grid of image
  tokens (:class:`ImageEncoder`);
- :mod:`~attnlab.models.multimodal.trunk`: the Transformer trunk both Transformer models share;
- :mod:`~attnlab.models.multimodal.captioner`: ``caption_lstm`` and ``caption_transformer``;
- :mod:`~attnlab.models.multimodal.vqa`: ``vqa_lstm`` (incl. the blind model) and
  ``vqa_transformer``.

Their configs are :class:`attnlab.config.CaptionConfig` and :class:`attnlab.config.VQAConfig`.
"""

from attnlab.models.multimodal.captioner import (
    LSTMCaptioner,
    LSTMCaptionState,
    TransformerCaptioner,
    TransformerCaptionState,
    build_captioner,
)
from attnlab.models.multimodal.encoders import ImageEncoder, token_grid
from attnlab.models.multimodal.vqa import LSTMVQA, TransformerVQA, build_vqa

__all__ = [
    "ImageEncoder",
    "token_grid",
    "LSTMCaptioner",
    "TransformerCaptioner",
    "LSTMCaptionState",
    "TransformerCaptionState",
    "build_captioner",
    "LSTMVQA",
    "TransformerVQA",
    "build_vqa",
]
