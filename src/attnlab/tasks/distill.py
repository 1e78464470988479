"""The teacher of a distilled image classifier (DeiT): a trained model, fixed, that scores every
training batch of the student.

The teacher may have been trained with another normalisation (its own training split's mean and
std), so a batch normalised for the student is mapped back to pixels and normalised the teacher's
way before it is scored. A teacher must read images of the student's shape and score the same
classes in the same order: anything else is refused, naming both.

Shape legend: B batch, C channels, H/W height/width, L classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.data.images import ImageSettings, normalize
from attnlab.errors import RunDirError, UserError

__all__ = ["Teacher"]


class Teacher:
    """A fixed, trained classifier whose scores a student learns (eval mode, no gradients).

    Args:
        model: the trained classifier (``model(images) -> (B, L)``).
        settings: what it reads (its run's ``labels.json``: classes, image shape, mean, std).
        source: its name in messages (the run directory).
    """

    def __init__(self, model: nn.Module, settings: ImageSettings, source: str = "the teacher"):
        self.model = model.eval().requires_grad_(False)
        self.settings, self.source = settings, source

    @classmethod
    def from_run(cls, run: Any, source: str) -> Teacher:
        """The teacher in a loaded run (``attnlab.load(source)``: its model and labels.json).

        Raises:
            RunDirError: the run has no labels.json (a converted checkpoint).
        """
        if not isinstance(run.tokenizer, ImageSettings):
            raise RunDirError(
                f"teacher {source} lacks labels.json (classes, image shape, normalisation): "
                "a teacher must be a run of 'attnlab train image'"
            )
        return cls(run.model, run.tokenizer, source)

    def check_student(
        self, image_shape: Sequence[int], classes: Sequence[str], *, what: str = "the student"
    ) -> None:
        """Refuse a student that reads other images or scores other classes than the teacher.

        Raises:
            UserError: another image shape (C, H, W) or another class count or order, naming both.
        """
        mine, theirs = tuple(self.settings.image_shape), tuple(image_shape)
        if mine != theirs:
            raise UserError(
                f"teacher {self.source} reads {_shape(mine)} images, {what} {_shape(theirs)}: "
                "train the teacher at the student's image size and channels"
            )
        if len(self.settings.classes) != len(classes):
            raise UserError(
                f"teacher {self.source} scores {len(self.settings.classes)} classes, {what} "
                f"{len(classes)}: distillation needs the same classes"
            )
        if list(self.settings.classes) != list(classes):
            raise UserError(
                f"teacher {self.source} has the classes {list(self.settings.classes)}, {what} "
                f"{list(classes)}: distillation needs the same classes in the same order"
            )

    @torch.no_grad()
    def logits(self, images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
        """The teacher's scores ``(B, L)`` for a batch normalised with ``mean`` / ``std``."""
        dev = images.device
        if next(self.model.parameters()).device != dev:
            self.model.to(dev)
        m = torch.tensor(list(mean), dtype=images.dtype, device=dev).view(1, -1, 1, 1)
        s = torch.tensor(list(std), dtype=images.dtype, device=dev).view(1, -1, 1, 1)
        pixels = images * s + m  # (B, C, H, W) back in [0, 1] units
        return self.model(normalize(pixels, self.settings.mean, self.settings.std)).float()


def _shape(shape: Sequence[int]) -> str:
    c, h, w = shape
    return f"{w}×{h}, {c}-channel"
