"""The settings every image sweep shares: the images, the training budget and the seeds.

:class:`~attnlab.experiments.inductive_bias.InductiveBiasSettings` (models × data fractions) and
:class:`~attnlab.experiments.patch_size.PatchSizeSettings` (patch sizes) add what they vary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnlab.config.base import Config
from attnlab.config.vision import ImageTaskConfig
from attnlab.errors import UserError
from attnlab.models.vision.factory import build_image_classifier

__all__ = ["DATA_FIELDS", "ImageSweepSettings", "build_classifier"]

#: the settings that choose the data: the same names and meaning as in :class:`ImageTaskConfig`
DATA_FIELDS = ("data", "data_path", "image_size", "channels", "shapes_n", "shapes_label")


@dataclass
class ImageSweepSettings(Config):
    """The images and the budget of a sweep, the same for every run in it.

    Attributes:
        data: image source (``digits`` or ``shapes``; others need ``data_path``).
        data_path, image_size, channels, shapes_n, shapes_label: as for
            :class:`~attnlab.config.vision.ImageTaskConfig`.
        steps, batch_size, lr, warmup, weight_decay: the budget of every run.
        max_time: wall-clock seconds for the whole sweep (then every run gets the same number of
            steps, as many as fit).
        seeds: one run per seed and setting compared.
        device: ``auto``, ``cpu``, ``cuda``...
    """

    data: str = "digits"
    data_path: str | None = None
    image_size: int | None = None
    channels: int = 3
    shapes_n: int = 3000
    shapes_label: str = "shape"
    steps: int = 300
    max_time: float | None = None
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.05
    seeds: list[int] = field(default_factory=lambda: [0])
    device: str = "auto"

    def validate(self) -> None:
        super().validate()
        self.validate_budget()

    def validate_budget(self) -> None:
        """Seeds, ``max_time``, ``steps`` and ``batch_size`` (a subclass may call it after its
        own checks)."""
        if not self.seeds:
            raise ValueError("give at least one seed")
        if self.max_time is not None and not self.max_time > 0:
            raise ValueError(f"max_time must be a positive number of seconds, got {self.max_time}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be at least 1, got {self.steps} and {self.batch_size}"
            )

    def data_config(self) -> ImageTaskConfig:
        """The data settings as the image task's config."""
        return ImageTaskConfig(**{name: getattr(self, name) for name in DATA_FIELDS})


def build_classifier(kind: str, splits: Any, overrides: dict[str, Any], *, named: str) -> nn.Module:
    """:func:`build_image_classifier` of ``kind`` sized for ``splits``; a setting that does not
    build is reported with ``named`` (the flag or value that caused it) in front."""
    try:
        return build_image_classifier(kind, splits.image_shape, splits.classes, overrides=overrides)
    except UserError as err:
        raise UserError(f"{named}: {err}") from None
