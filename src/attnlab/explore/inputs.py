"""What ``attnlab explore RUN --input VALUE`` means: an image file or a text, for the run's
kind of input (an image run reads a file with an unusual name as an image too)."""

from __future__ import annotations

from pathlib import Path

from attnlab.explore.explorer import ExploreInput, Explorer
from attnlab.explore.images import looks_like_image, read_image_file

__all__ = ["explore_input"]


def explore_input(
    explorer: Explorer, value: str | None, question: str | None
) -> ExploreInput | None:
    """The input ``value`` stands for (None: none given, and no ``question`` either; only a
    ``question``: the run's default input with it).

    Raises:
        UserError: an image file that cannot be read.
    """
    if value is None:  # only a question: the run's default image
        return None if question is None else explorer.default_input(question)
    path = Path(value)
    as_image = (
        (looks_like_image(value) and (explorer.input_kind == "image" or path.is_file()))
        if len(value) < 4096
        else False
    )
    if explorer.input_kind == "image" and not as_image and path.is_file():
        as_image = True  # an image file with an unusual name
    if as_image:
        return ExploreInput(image=read_image_file(path), image_name=path.name, question=question)
    return ExploreInput(text=value, question=question)
