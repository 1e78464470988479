"""What a trained image classifier needs to read new images: classes, input shape, normalisation.

A run of ``attnlab train image`` writes them as ``labels.json``; ``attnlab.runs.load`` returns
them as the run's "tokenizer".

Shape legend: B batch, C channels, H/W height/width.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from attnlab.data.images.transforms import normalize
from attnlab.errors import RunDirError

__all__ = ["ImageSettings", "LABELS_FILE", "DATA_DESCRIPTIONS"]

#: what the images of each bundled or generated source look like (what a model of it expects)
DATA_DESCRIPTIONS = {
    "digits": "white strokes on a black background, as scikit-learn's digits",
    "mnist": "white strokes on a black background, as MNIST",
    "shapes": "a coloured shape on a noisy background (attnlab's generated shapes)",
    "cifar10": "small colour photographs, as CIFAR-10",
}

LABELS_FILE = "labels.json"


@dataclass
class ImageSettings:
    """Class names, the input shape ``(C, H, W)`` and the per-channel normalisation of a run.

    Attributes:
        classes: class names, index = label.
        image_shape: ``(channels, height, width)`` the model takes.
        mean, std: per-channel statistics of the training images (in [0, 1] units).
        data: name of the data source the run was trained on.
    """

    classes: list[str]
    image_shape: tuple[int, int, int]
    mean: list[float]
    std: list[float]
    data: str | None = None

    def prepare(self, images: Tensor) -> Tensor:
        """Raw ``(B, C, H, W)`` images in [0, 1] normalised the way the model was trained."""
        return normalize(images, self.mean, self.std)

    def describe(self) -> str:
        """What the model reads: ``8×8 grey images: white strokes on a black background, ...``."""
        c, h, w = self.image_shape
        text = f"{w}×{h} {'grey' if c == 1 else 'colour'} images"
        what = DATA_DESCRIPTIONS.get(self.data or "")
        return f"{text} ({what})" if what else text

    def polarity_notice(self, image: Tensor) -> str | None:
        """A note when ``image`` (``(C, H, W)`` in [0, 1]) is light where the training images
        were dark, or the other way round (a black-on-white drawing for a white-on-black
        model): None when its mean brightness is on the training side of 0.5.

        The rule: the training images' mean brightness and the image's lie on opposite sides of
        0.5, each at least 0.15 away from it.
        """
        trained = sum(self.mean) / len(self.mean)
        seen = float(image.mean())
        if abs(trained - 0.5) < 0.15 or abs(seen - 0.5) < 0.15 or (trained < 0.5) == (seen < 0.5):
            return None
        light, dark = "mostly light", "mostly dark"
        return (
            f"this image is {light if seen > 0.5 else dark} (mean brightness {seen:.2f}) but the "
            f"model was trained on {dark if trained < 0.5 else light} images (mean "
            f"{trained:.2f}): it expects {self.describe()}"
        )

    def to_dict(self) -> dict:
        """The ``labels.json`` content."""
        return {
            "classes": list(self.classes),
            "image_shape": list(self.image_shape),
            "mean": list(self.mean),
            "std": list(self.std),
            "data": self.data,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_run(cls, run_dir: str | Path, config: dict | None = None) -> ImageSettings | None:
        """Read ``labels.json`` of ``run_dir`` (falling back to config.json's ``task``).

        Returns:
            The settings, or None for a run converted from a checkpoint (no labels.json and no
            task in config.json: its normalisation is unknown), which still loads.

        Raises:
            RunDirError: labels.json or the task lacks the classes, image shape or normalisation.
        """
        path = Path(run_dir) / LABELS_FILE
        if not path.exists() and not (config or {}).get("task"):
            return None
        try:
            info = json.loads(path.read_text()) if path.exists() else (config or {}).get("task", {})
            return cls(
                list(info["classes"]),
                tuple(info["image_shape"]),
                list(info["mean"]),
                list(info["std"]),
                info.get("data"),
            )
        except (KeyError, ValueError, TypeError, AttributeError):
            raise RunDirError(
                f"{str(run_dir)!r} lacks labels.json (classes, image shape, normalisation)"
            ) from None
