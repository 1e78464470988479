"""Configs of the captioners and VQA models on generated scenes, with their presets.

Both inherit :class:`~attnlab.config.base.BlockConfig`, so the Transformer captioner and the
Transformer VQA model get grouped-query attention, RoPE/ALiBi, QK-norm, SwiGLU, mixture of experts
and every attention backend from the block fields; the LSTM variants read only ``d_model``,
``n_layers`` and ``dropout`` of them.

    CaptionConfig.preset("tiny", arch="lstm", vocab_size=59)
    VQAConfig.preset("tiny", **VQA_MODELS["lstm-product"], vocab_size=59, n_answers=25)

The image encoder is the vision family's own model and keeps its own config: ``encoder`` is a
:class:`~attnlab.config.CNNConfig` or a :class:`~attnlab.config.ViTConfig` (config.json:
``{"kind": "cnn", ...its fields}``). The first release described it by three flat keys
(``encoder: "cnn" | "vit"``, ``encoder_width``, ``encoder_depth``, ``patch_size``) with the ViT's
heads and FFN width fixed; ``from_dict`` still reads them (:func:`scene_encoder`), so presets,
``--encoder vit`` and first-release runs build the same models.

Defaults of the block fields are the first release's (tanh-free GELU, an MLP of 2·d_model), so a
first-release ``config.json`` builds the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from attnlab.config.base import Activation, BlockConfig, Config, ConfigError
from attnlab.config.vision import CNNConfig, ViTConfig

__all__ = [
    "SceneModelConfig",
    "CaptionConfig",
    "VQAConfig",
    "VQA_MODELS",
    "EncoderKind",
    "scene_encoder",
]

EncoderKind = Literal["cnn", "vit"]
ENCODER_CONFIGS: dict[str, type[Config]] = {"cnn": CNNConfig, "vit": ViTConfig}
#: the first release's flat encoder keys, read into ``encoder``
FLAT_ENCODER_KEYS = ("encoder_width", "encoder_depth", "patch_size")


def scene_encoder(
    kind: str = "cnn",
    width: int = 32,
    depth: int = 3,
    patch_size: int = 4,
    *,
    image_size: int = 32,
) -> CNNConfig | ViTConfig:
    """The image encoder a scene model of ``width`` and ``depth`` had in the first release.

    CNN: ``depth`` stages of one residual block, ``width // 2`` channels first and ``width``
    after (each stage after the first halves the resolution). ViT: ``depth`` layers of width
    ``width``, 4 heads (1 when the width does not divide by 4), an FFN of 2·width, mean pooling
    and 2-D sin-cos positions. Both read RGB images of ``image_size`` and have no head (the model
    adds one when it needs it).

    Raises:
        ConfigError: an unknown kind or sizes that do not fit (named).
    """
    if kind not in ENCODER_CONFIGS:
        raise ConfigError(f"unknown encoder {kind!r}; choose from {sorted(ENCODER_CONFIGS)}")
    for name, v in (("encoder_width", width), ("encoder_depth", depth), ("patch_size", patch_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    return ENCODER_CONFIGS[kind](**_scene_fields(kind, width, depth, patch_size, image_size))


def _scene_fields(kind: str, width: int, depth: int, patch_size: int, image_size: int) -> dict:
    """The fields :func:`scene_encoder` sets (the rest are the vision config's defaults)."""
    if kind == "cnn":
        return dict(
            image_size=image_size,
            in_channels=3,
            num_classes=0,
            channels=[max(1, width // 2)] + [width] * (depth - 1),
            blocks=[1] * depth,
        )
    return dict(
        image_size=image_size,
        patch_size=patch_size,
        in_channels=3,
        num_classes=0,
        d_model=width,
        n_layers=depth,
        n_heads=4 if width % 4 == 0 else 1,
        ffn_hidden=2 * width,
        pooling="mean",
        position="sincos",
    )


def _encoder_kind(encoder: Config) -> str:
    return "vit" if isinstance(encoder, ViTConfig) else "cnn"


def _read_encoder(value: Any, flat: dict[str, Any], image_size: Any) -> Config:
    """The nested encoder from config.json's ``encoder`` (a kind name, a mapping with ``kind``, or
    a config) and the first release's flat keys (which override the mapping's sizes)."""
    image_size = image_size if isinstance(image_size, int) else 32
    if isinstance(value, (CNNConfig, ViTConfig)):
        value = {"kind": _encoder_kind(value), **value.to_dict()}
    if value is None or isinstance(value, str):
        sizes = {
            "width": flat.get("encoder_width", 32),
            "depth": flat.get("encoder_depth", 3),
            "patch_size": flat.get("patch_size", 4),
        }
        return scene_encoder(value or "cnn", **sizes, image_size=image_size)
    if not isinstance(value, Mapping):
        raise ConfigError(f"encoder must be 'cnn', 'vit' or a mapping of fields, got {value!r}")
    fields = dict(value)
    kind = fields.pop("kind", None)
    if kind not in ENCODER_CONFIGS:
        raise ConfigError(
            f"the encoder mapping needs kind: one of {sorted(ENCODER_CONFIGS)}, got {kind!r}"
        )
    cls = ENCODER_CONFIGS[kind]
    base = _scene_fields(kind, 32, 3, 4, fields.get("image_size", image_size))
    if set(fields) - set(cls.field_names()):  # the kind was switched (--encoder vit)
        other = "vit" if kind == "cnn" else "cnn"
        was = _read_encoder({**fields, "kind": other}, {}, image_size)
        if isinstance(was, ViTConfig):
            sizes = {"encoder_width": was.d_model, "encoder_depth": was.n_layers}
            sizes["patch_size"] = was.patch_size
        else:
            sizes = {"encoder_width": was.channels[-1], "encoder_depth": len(was.channels)}
        return _read_encoder(kind, {**sizes, **flat}, image_size)
    if flat:  # first-release size keys on top of a nested encoder: they describe a new one
        width = flat.get("encoder_width")
        depth = flat.get("encoder_depth")
        if kind == "cnn":
            old = CNNConfig.from_dict({**base, **fields})
            width = width or old.channels[-1]
            depth = depth or len(old.channels)
            fields.update(channels=[max(1, width // 2)] + [width] * (depth - 1), blocks=[1] * depth)
        else:
            if width is not None:
                fields.update(d_model=width, n_heads=4 if width % 4 == 0 else 1)
                fields.update(ffn_hidden=2 * width, head_dim=None, n_kv_heads=None)
            if depth is not None:
                fields["n_layers"] = depth
            if "patch_size" in flat:
                fields["patch_size"] = flat["patch_size"]
    return cls.from_dict({**base, **fields})


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
        arch: ``lstm``, ``transformer`` (cross-attention to the image tokens) or ``prefix``
            (captioner only: the image tokens prepended to the words of a decoder-only LM).
        vocab_size: words including the 4 special tokens.
        image_size: side of the square input image (the encoder's ``image_size`` follows it).
        encoder: the image encoder's own config: a :class:`~attnlab.config.CNNConfig` (the
            vision family's residual CNN: grid tokens of its last feature map) or a
            :class:`~attnlab.config.ViTConfig` (its Vision Transformer: patch tokens). Given as
            ``"cnn"`` / ``"vit"`` (with the flat ``encoder_width``, ``encoder_depth`` and
            ``patch_size`` of the first release), it is :func:`scene_encoder`'s.
        n_layers: LSTM layers / Transformer blocks.
        max_len: longest caption or question in tokens (``<start>`` and ``<end>`` included);
            the learned position table has this many rows.
        d_model, n_heads, ...: the block fields (:class:`BlockConfig`); ``ffn_hidden`` defaults
            to 2·d_model for the MLP.
    """

    arch: Literal["lstm", "transformer", "prefix"] = "transformer"
    vocab_size: int = 64
    image_size: int = 32
    encoder: CNNConfig | ViTConfig = field(default_factory=scene_encoder)
    n_layers: int = 2
    max_len: int = 24
    d_model: int = 128
    activation: Activation = "gelu"

    def validate(self) -> None:
        # the first release's MLP was 2·d_model wide; fill it in before BlockConfig's 4·d_model
        if self.ffn_hidden is None and self.ffn == "mlp":
            self.ffn_hidden = 2 * self.d_model
        super().validate()
        self.positive("vocab_size", "image_size", "n_layers", "max_len")
        if self.vocab_size < 5:
            raise ConfigError(
                f"vocab_size={self.vocab_size} cannot hold the 4 special tokens and a word"
            )
        if (self.encoder.image_size, self.encoder.in_channels) != (self.image_size, 3):
            # the scene decides: the encoder reads the model's RGB images
            self.encoder = self.encoder.replace(image_size=self.image_size, in_channels=3)
        if self.arch != "lstm" and self.d_model % 4:
            raise ConfigError(
                f"d_model={self.d_model} must be divisible by 4 (2-D sin-cos image positions)"
            )

    @property
    def encoder_kind(self) -> str:
        """``cnn`` or ``vit``."""
        return _encoder_kind(self.encoder)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["encoder"] = {"kind": self.encoder_kind, **d["encoder"]}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SceneModelConfig:
        """Read config.json's model section, the first release's flat encoder keys included."""
        if isinstance(d, Mapping):
            d = dict(d)
            flat = {k: d.pop(k) for k in FLAT_ENCODER_KEYS if k in d}
            d["encoder"] = _read_encoder(d.get("encoder"), flat, d.get("image_size", 32))
        return super().from_dict(d)


@dataclass
class CaptionConfig(SceneModelConfig):
    """A captioner: ``caption_lstm`` (CNN features -> LSTM initial state),
    ``caption_transformer`` (image tokens + causal decoder with cross-attention) or
    ``caption_prefix`` (LLaVA-style: projected image tokens prepended to a decoder-only LM).

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
        if self.arch == "prefix" and self.position not in ("learned", "sinusoidal", "none"):
            raise ConfigError(
                f"the prefix captioner adds positions to the words (learned, sinusoidal or "
                f"none); position={self.position!r} would rotate or bias the image tokens too"
            )


@dataclass
class VQAConfig(SceneModelConfig):
    """A VQA model: ``vqa_lstm`` (question LSTM fused with the image vector) or
    ``vqa_transformer`` (question tokens cross-attend to image tokens).

    Attributes:
        fusion: LSTM model only: ``concat``, ``product`` (element-wise), or ``none`` — the blind,
            question-only model (no image encoder at all).
        n_answers: size of the answer list.
        answers: ``softmax`` (a classifier with one output per answer) or ``choice`` (multiple
            choice: each answer's word embedding, projected, scored against the fused feature;
            :mod:`attnlab.models.multimodal.answers`).
        answer_ids: the word id of each answer (``choice`` reads them; the task fills them in).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(_SIZES["tiny"], d_model=64),
        "small": dict(_SIZES["small"]),
    }

    arch: Literal["lstm", "transformer"] = "lstm"
    fusion: Literal["concat", "product", "none"] = "concat"
    n_answers: int = 25
    n_layers: int = 1
    answers: Literal["softmax", "choice"] = "softmax"
    answer_ids: list[int] = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        if self.answers == "choice":
            if len(self.answer_ids) != self.n_answers:
                raise ConfigError(
                    f"answers='choice' needs the word id of each of the n_answers={self.n_answers} "
                    f"answers, got {len(self.answer_ids)} answer_ids"
                )
            bad = [i for i in self.answer_ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ConfigError(
                    f"answer_ids {bad} are not word ids of vocab_size={self.vocab_size}"
                )
        if self.arch == "transformer" and self.fusion == "none":
            raise ConfigError("the blind (fusion='none') model is the LSTM one: use arch='lstm'")
        self.positive("n_answers")
