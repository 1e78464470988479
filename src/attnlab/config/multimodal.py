"""Configs of the captioners and VQA models on generated scenes, with their presets.

Both inherit :class:`~attnlab.config.block.BlockConfig`, so the Transformer captioner and the
Transformer VQA model get grouped-query attention, RoPE/ALiBi, QK-norm, SwiGLU, mixture of experts
and every attention backend from the block fields; the LSTM variants read only ``d_model``,
``n_layers`` and ``dropout`` of them.

    CaptionConfig.preset("tiny", arch="lstm", vocab_size=59)
    VQAConfig.preset("tiny", **VQA_MODELS["lstm-product"], vocab_size=59, n_answers=25)

Defaults of the block fields are the first release's (tanh-free GELU, an MLP of 2·d_model), so a
first-release ``config.json`` builds the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.config.base import ConfigError
from attnlab.config.block import Activation, BlockConfig

__all__ = ["SceneModelConfig", "CaptionConfig", "VQAConfig", "VQA_MODELS"]

_SIZES: dict[str, dict[str, Any]] = {
    # a few seconds of CPU per hundred steps on 32x32 scenes
    "tiny": dict(encoder_width=16, encoder_depth=3, n_layers=1, n_heads=2),
    "small": dict(encoder_width=32, encoder_depth=3, d_model=128, n_layers=2, n_heads=4),
}

#: the ``--model`` names of ``attnlab train vqa`` -> VQAConfig fields
VQA_MODELS: dict[str, dict[str, str]] = {
    "blind": dict(arch="lstm", fusion="none"),
    "lstm-concat": dict(arch="lstm", fusion="concat"),
    "lstm-product": dict(arch="lstm", fusion="product"),
    "transformer": dict(arch="transformer", fusion="concat"),
}


@dataclass
class SceneModelConfig(BlockConfig):
    """What the captioners and the VQA models share: the image encoder and the text side.

    Attributes:
        arch: ``lstm`` or ``transformer``.
        vocab_size: words including the 4 special tokens.
        image_size: side of the square input image.
        encoder: ``cnn`` (the vision family's residual CNN: grid tokens of its last feature map)
            or ``vit`` (its Vision Transformer: patch tokens).
        encoder_width: CNN channels of the last stage / ViT d_model.
        encoder_depth: CNN stages (each after the first halves the resolution) / ViT layers.
        patch_size: ViT patch size.
        n_layers: LSTM layers / Transformer blocks.
        max_len: longest caption or question in tokens (``<start>`` and ``<end>`` included);
            the learned position table has this many rows.
        d_model, n_heads, ...: the block fields (:class:`BlockConfig`); ``ffn_hidden`` defaults
            to 2·d_model for the MLP.
    """

    arch: Literal["lstm", "transformer"] = "transformer"
    vocab_size: int = 64
    image_size: int = 32
    encoder: Literal["cnn", "vit"] = "cnn"
    encoder_width: int = 32
    encoder_depth: int = 3
    patch_size: int = 4
    n_layers: int = 2
    max_len: int = 24
    d_model: int = 128
    activation: Activation = "gelu"

    def validate(self) -> None:
        # the first release's MLP was 2·d_model wide; fill it in before BlockConfig's 4·d_model
        if self.ffn_hidden is None and self.ffn == "mlp":
            self.ffn_hidden = 2 * self.d_model
        super().validate()
        self.positive(
            "vocab_size",
            "image_size",
            "encoder_width",
            "encoder_depth",
            "patch_size",
            "n_layers",
            "max_len",
        )
        if self.vocab_size < 5:
            raise ConfigError(
                f"vocab_size={self.vocab_size} cannot hold the 4 special tokens and a word"
            )
        if self.encoder == "vit" and self.image_size % self.patch_size:
            raise ConfigError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}"
            )
        if self.arch == "transformer" and self.d_model % 4:
            raise ConfigError(
                f"d_model={self.d_model} must be divisible by 4 (2-D sin-cos image positions)"
            )


@dataclass
class CaptionConfig(SceneModelConfig):
    """A captioner: ``caption_lstm`` (CNN features -> LSTM initial state) or
    ``caption_transformer`` (image tokens + causal decoder with cross-attention).

    Attributes:
        num_classes: the encoder's classification head (pre-training as a shape classifier).
        features: what the LSTM captioner reads from the encoder: ``penultimate`` features or the
            classifier's ``logits`` (the lecture's FC4096-vs-FC1000 comparison).
        freeze_encoder: keep the encoder's weights (and batch-norm statistics) fixed.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(_SIZES["tiny"], d_model=48),
        "small": dict(_SIZES["small"]),
    }

    num_classes: int = 3
    features: Literal["penultimate", "logits"] = "penultimate"
    freeze_encoder: bool = False

    def validate(self) -> None:
        super().validate()
        if self.features == "logits" and self.arch != "lstm":
            raise ConfigError(
                f"features='logits' is for the LSTM captioner (arch='lstm'); arch={self.arch!r} "
                "reads the encoder's grid of image tokens"
            )
        if self.features == "logits" and self.num_classes < 1:
            raise ConfigError(
                f"features='logits' needs an encoder head: num_classes >= 1, got {self.num_classes}"
            )
        self.positive("num_classes", allow_zero=True)


@dataclass
class VQAConfig(SceneModelConfig):
    """A VQA model: ``vqa_lstm`` (question LSTM fused with the image vector) or
    ``vqa_transformer`` (question tokens cross-attend to image tokens).

    Attributes:
        fusion: LSTM model only: ``concat``, ``product`` (element-wise), or ``none`` — the blind,
            question-only model (no image encoder at all).
        n_answers: size of the answer list.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(_SIZES["tiny"], d_model=64),
        "small": dict(_SIZES["small"]),
    }

    arch: Literal["lstm", "transformer"] = "lstm"
    fusion: Literal["concat", "product", "none"] = "concat"
    n_answers: int = 25
    n_layers: int = 1

    def validate(self) -> None:
        super().validate()
        if self.arch == "transformer" and self.fusion == "none":
            raise ConfigError("the blind (fusion='none') model is the LSTM one: use arch='lstm'")
        self.positive("n_answers")
