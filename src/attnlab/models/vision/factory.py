"""Image classifiers sized for a dataset: the preset of a kind, with the data's image size, channels
and classes filled in, then the caller's overrides.

    model = build_image_classifier("vit", (1, 8, 8), classes, overrides={"pooling": "mean"})

Used by ``attnlab train image`` and the inductive-bias experiment.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.config.base import Config, ConfigError
from attnlab.config.vision import CNNConfig, DeiTConfig, SwinConfig, ViTConfig
from attnlab.errors import UserError, did_you_mean
from attnlab.models.registry import build_model

__all__ = ["IMAGE_CLASSIFIERS", "build_image_classifier"]

#: model kind -> its config class
IMAGE_CLASSIFIERS: dict[str, type[Config]] = {
    "vit": ViTConfig,
    "deit": DeiTConfig,
    "swin": SwinConfig,
    "cnn": CNNConfig,
}


def build_image_classifier(
    kind: str,
    image_shape: tuple[int, int, int],
    classes: list[str],
    *,
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> nn.Module:
    """A ``kind`` classifier (ViT, DeiT, Swin or CNN) for ``(C, H, W)`` images and these classes.

    Its config starts from ``preset`` (default ``tiny`` for images up to 16 pixels, ``small``
    above), takes ``image_size``, ``in_channels``, ``num_classes`` and ``labels`` from the data,
    then ``overrides`` (any config field, a first-release name too).

    Raises:
        UserError: an unknown kind, preset or field (named, with the known ones), non-square
            images, or values that do not fit together (e.g. a patch size not dividing the image).
    """
    if kind not in IMAGE_CLASSIFIERS:
        raise UserError(
            f"unknown model {kind!r}{did_you_mean(kind, IMAGE_CLASSIFIERS)}; choose from {', '.join(IMAGE_CLASSIFIERS)}"
        )
    cfg_cls = IMAGE_CLASSIFIERS[kind]
    c, h, w = image_shape
    if h != w:
        raise UserError(f"images must be square, got {h}×{w}")
    preset = preset or ("tiny" if h <= 16 else "small")
    if preset not in cfg_cls.PRESETS:
        raise UserError(
            f"unknown {kind} preset {preset!r}{did_you_mean(preset, cfg_cls.PRESETS)}; "
            f"known: {', '.join(cfg_cls.PRESETS)}"
        )
    overrides = dict(overrides or {})
    known = cfg_cls.field_names()
    unknown = sorted(set(overrides) - set(known) - set(cfg_cls.RENAMED))
    if unknown:
        raise UserError(
            f"{kind} has no config field {', '.join(map(repr, unknown))}; "
            f"its fields: {', '.join(sorted(known))}"
        )
    fields = dict(image_size=h, in_channels=c, num_classes=len(classes), labels=list(classes))
    try:
        config = cfg_cls.preset(preset, **{**fields, **overrides})
    except ConfigError as err:
        raise UserError(
            f"cannot build {kind} (preset {preset!r}) for {h}×{w} images: {err}"
        ) from None
    return build_model(kind, config)
