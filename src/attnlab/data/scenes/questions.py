"""Questions about a scene with their answers, computed from the layout.

Question types: non-relational ``colour`` / ``shape`` / ``position`` of a named object, and
relational ``closest`` / ``farthest`` / ``count`` / ``left_of``. Answers come from a fixed list
(:func:`answer_list`), so VQA is classification. A question is only asked when its answer is
unambiguous: named objects are unique in the scene, and distances and left/right comparisons that
decide an answer differ by at least ``margin`` pixels.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.data.scenes.captions import plural
from attnlab.data.scenes.world import COLOURS, NUMBER_WORDS, SHAPES, Scene, SceneObject

__all__ = [
    "NON_RELATIONAL",
    "RELATIONAL",
    "QUESTION_TYPES",
    "QA",
    "scene_questions",
    "answer_list",
]

NON_RELATIONAL = ("colour", "shape", "position")
RELATIONAL = ("closest", "farthest", "count", "left_of")
QUESTION_TYPES = NON_RELATIONAL + RELATIONAL


@dataclass(frozen=True)
class QA:
    """A question, its answer and its type (one of :data:`QUESTION_TYPES`)."""

    qtype: str
    question: str
    answer: str


#: the position questions: (coordinate, how the question puts it, answer below / above the centre)
_SIDES = (
    ("x", "on the left or the right", "left", "right"),
    ("y", "at the top or the bottom", "top", "bottom"),
)


def _unique(scene: Scene, key) -> dict[Any, SceneObject]:
    counts = Counter(key(o) for o in scene.objects)
    return {key(o): o for o in scene.objects if counts[key(o)] == 1}


def _dist(a: SceneObject, b: SceneObject) -> float:
    return float(np.hypot(a.x - b.x, a.y - b.y))


def scene_questions(scene: Scene, margin: float = 1.5) -> list[QA]:
    """Every unambiguous question about ``scene`` with its answer (deterministic order).

    Args:
        scene: the layout.
        margin: pixels by which a deciding comparison must win (left/right of the image centre,
            nearest vs second nearest, ...); closer calls are not asked.

    Returns:
        The list of :class:`QA`.
    """
    qs: list[QA] = []
    objs = scene.objects
    centre = scene.image_size / 2
    by_shape = _unique(scene, lambda o: o.shape)
    by_colour = _unique(scene, lambda o: o.colour)
    named = list(_unique(scene, lambda o: o.name).values())

    for shape, o in by_shape.items():
        qs.append(QA("colour", f"what colour is the {shape} ?", o.colour))
    for colour, o in by_colour.items():
        qs.append(QA("shape", f"what shape is the {colour} object ?", o.shape))
    for o in named:
        for coord, where, low, high in _SIDES:
            offset = getattr(o, coord) - centre
            if abs(offset) >= margin:
                qs.append(QA("position", f"is the {o.name} {where} ?", low if offset < 0 else high))

    for o in named:
        others = sorted((x for x in objs if x is not o), key=lambda x: _dist(o, x))
        if not others:
            continue
        near, far = others[0], others[-1]
        if len(others) == 1 or _dist(o, others[1]) - _dist(o, near) >= margin:
            qs.append(
                QA("closest", f"what shape is the object closest to the {o.name} ?", near.shape)
            )
            qs.append(
                QA("closest", f"what colour is the object closest to the {o.name} ?", near.colour)
            )
        if len(others) == 1 or _dist(o, far) - _dist(o, others[-2]) >= margin:
            qs.append(
                QA("farthest", f"what shape is the object farthest from the {o.name} ?", far.shape)
            )
            qs.append(
                QA(
                    "farthest",
                    f"what colour is the object farthest from the {o.name} ?",
                    far.colour,
                )
            )

    shape_counts = Counter(o.shape for o in objs)
    colour_counts = Counter(o.colour for o in objs)
    for shape in SHAPES:
        qs.append(
            QA("count", f"how many {plural(shape)} are there ?", NUMBER_WORDS[shape_counts[shape]])
        )
    for colour in COLOURS:
        qs.append(
            QA(
                "count",
                f"how many {colour} objects are there ?",
                NUMBER_WORDS[colour_counts[colour]],
            )
        )

    for a in named:
        for b in named:
            if a is not b and abs(a.x - b.x) >= margin:
                qs.append(
                    QA(
                        "left_of",
                        f"is the {a.name} left of the {b.name} ?",
                        "yes" if a.x < b.x else "no",
                    )
                )
    return qs


def answer_list() -> list[str]:
    """The fixed answer vocabulary (class index = position in this list)."""
    return (
        list(COLOURS)
        + list(SHAPES)
        + ["left", "right", "top", "bottom", "yes", "no"]
        + list(NUMBER_WORDS)
    )
