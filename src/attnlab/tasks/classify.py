"""Classifying one image file with a trained image run (``attnlab classify``): the file read
at the run's size and channels, a brightness notice, the top classes.

    pred = classify_file(model, settings, "digit.png", top_k=3)
    for name, p in pred.top: print(name, p)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.data.images import read_image
from attnlab.data.images.settings import ImageSettings
from attnlab.errors import UserError

__all__ = ["Prediction", "classify_file"]


@dataclass
class Prediction:
    """What :func:`classify_file` found.

    Attributes:
        top: ``(class name, probability)`` of the most probable classes, best first.
        image: the image as read (``(C, H, W)`` in [0, 1], inverted if asked).
        normalized: the model's input (``image`` normalised as in training).
        notice: a line when the image's brightness is the opposite of the training images'.
    """

    top: list[tuple[str, float]]
    image: Tensor
    normalized: Tensor
    notice: str | None


def classify_file(
    model: nn.Module,
    settings: ImageSettings,
    path: str | Path,
    *,
    top_k: int,
    resize: bool = True,
    invert: bool = False,
) -> Prediction:
    """Read ``path`` as the run's images are (channels; size unless ``resize`` is off), classify.

    Args:
        model, settings: a loaded image run (its classes, image shape, normalisation).
        top_k: the classes to return (at most the number of classes).
        resize: resize to the model's size; off: refuse another size.
        invert: classify the negative (1 - pixel).

    Raises:
        UserError: an image of another size with ``resize`` off; an unreadable file.
    """
    c, h, w = settings.image_shape
    image = read_image(path, image_size=h if resize else None, channels=c)
    if not resize and tuple(image.shape[1:]) != (h, w):
        raise UserError(
            f"{path}: image is {image.shape[2]}×{image.shape[1]}, the model "
            f"expects {w}×{h} (drop --no-resize to resize it)"
        )
    if invert:
        image = 1.0 - image
    notice = settings.polarity_notice(image)
    if notice is not None:
        fix = "drop --invert" if invert else "add --invert to classify its negative"
        if invert:
            notice = notice.replace("this image", "its negative (--invert)", 1)
        notice = f"notice: {notice}; {fix}"
    x = settings.prepare(image[None])
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    top = probs.topk(min(top_k, len(settings.classes)))
    pairs = [(settings.classes[i], p) for p, i in zip(top.values.tolist(), top.indices.tolist())]
    return Prediction(pairs, image, x[0], notice)
