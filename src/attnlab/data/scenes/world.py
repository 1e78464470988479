"""The world of the generated scenes: coloured shapes on a square image, and how they are drawn
at random.

A scene is a few coloured shapes (circle, square, triangle) at random non-overlapping positions.
Everything about it is known, so its captions and the answers to its questions are computed from
the layout (:mod:`~attnlab.data.scenes.captions`, :mod:`~attnlab.data.scenes.questions`).

Splits: ``train`` and ``val`` scenes never contain the held-out colour–shape combinations; every
``unseen`` scene contains at least one, so a model that composes "red" and "triangle" can be told
apart from one that memorised the pairs it saw.

Coordinates are pixels, x to the right and y downwards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnlab.config.base import Config, ConfigError

__all__ = [
    "COLOURS",
    "SHAPES",
    "NUMBER_WORDS",
    "SPLITS",
    "SceneConfig",
    "SceneObject",
    "Scene",
    "generate_scene",
    "shape_label",
]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 80, 235),
    "yellow": (235, 220, 40),
    "purple": (150, 60, 200),
    "orange": (245, 140, 30),
}
SHAPES = ("circle", "square", "triangle")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
#: split name -> the second word of its random seed
SPLITS = {"train": 0, "val": 1, "unseen": 2}
MAX_IMAGE_SIZE = 512  # pixels a side: the scenes are toy images (32 by default)


@dataclass
class SceneConfig(Config):
    """How scenes are generated.

    Attributes:
        image_size: side of the square image in pixels.
        min_objects, max_objects: objects per scene (inclusive).
        radius: half-size of a shape in pixels; ``None`` -> ``image_size / 8``.
        colours, shapes: the names drawn from (colours must be keys of :data:`COLOURS`).
        heldout: ``"colour shape"`` combinations absent from train/val, present in ``unseen``.
        duplicate_prob: chance that a scene repeats one object's colour and shape (so that counting
            captions such as "two green triangles" occur).
        colour_bias: chance that an object takes its shape's favourite colour instead of a uniform
            one — a controllable language prior ("what colour is the circle?" -> usually yellow) for
            the blind-model experiment. Favourites: circle yellow, square blue, triangle green.
        margin: minimum gap in pixels that makes a left/right, top/bottom or nearest/farthest
            answer unambiguous; questions closer than that are not asked.
    """

    FAVOURITE: ClassVar[dict[str, str]] = {
        "circle": "yellow",
        "square": "blue",
        "triangle": "green",
    }

    image_size: int = 32
    min_objects: int = 2
    max_objects: int = 4
    radius: float | None = None
    colours: tuple[str, ...] = tuple(COLOURS)
    shapes: tuple[str, ...] = SHAPES
    heldout: tuple[str, ...] = ("red triangle", "green square", "blue circle")
    duplicate_prob: float = 0.3
    colour_bias: float = 0.3
    margin: float = 1.5

    def validate(self) -> None:
        super().validate()
        if self.radius is None:
            self.radius = self.image_size / 8
        if not 16 <= self.image_size <= MAX_IMAGE_SIZE:
            raise ConfigError(
                f"image_size must be between 16 and {MAX_IMAGE_SIZE} pixels, got {self.image_size}"
            )
        if not 1 <= self.min_objects <= self.max_objects:
            raise ConfigError(
                f"need 1 <= min_objects <= max_objects, got min_objects="
                f"{self.min_objects}, max_objects={self.max_objects}"
            )
        if self.max_objects >= len(NUMBER_WORDS):
            raise ConfigError(f"max_objects must be < {len(NUMBER_WORDS)}, got {self.max_objects}")
        unknown = [c for c in self.colours if c not in COLOURS]
        if unknown:
            raise ConfigError(f"unknown colours {unknown}; known: {list(COLOURS)}")
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown:
            raise ConfigError(f"unknown shapes {unknown}; known: {list(SHAPES)}")
        for combo in self.heldout:
            parts = combo.split()
            if len(parts) != 2 or parts[0] not in self.colours or parts[1] not in self.shapes:
                raise ConfigError(
                    f"held-out combination {combo!r} must be 'colour shape' from "
                    f"colours {self.colours} and shapes {self.shapes}"
                )
        if len(self.seen_combos()) == 0:
            raise ConfigError("every colour-shape combination is held out; nothing to train on")
        # Non-overlap: centres at least 2r + 2 apart, inside a border of r + 1.
        cell = 2 * self.radius + 2
        free = self.image_size - 2 * (self.radius + 1)
        if free <= 0 or (free // cell + 1) ** 2 < self.max_objects:
            raise ConfigError(
                f"{self.max_objects} objects of radius {self.radius} do not fit in a "
                f"{self.image_size}x{self.image_size} image"
            )
        for name in ("duplicate_prob", "colour_bias"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    def combos(self) -> list[tuple[str, str]]:
        """Every ``(colour, shape)`` pair of the configured names."""
        return [(c, s) for c in self.colours for s in self.shapes]

    def heldout_combos(self) -> list[tuple[str, str]]:
        """The held-out ``(colour, shape)`` pairs."""
        return [tuple(h.split()) for h in self.heldout]  # type: ignore[misc]

    def seen_combos(self) -> list[tuple[str, str]]:
        """The pairs train and val scenes are drawn from."""
        held = set(self.heldout_combos())
        return [cs for cs in self.combos() if cs not in held]


@dataclass(frozen=True)
class SceneObject:
    """One shape: colour and shape names, centre ``(x, y)`` in pixels (y grows downwards)."""

    colour: str
    shape: str
    x: float
    y: float

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """A layout: objects, image size and shape radius (draw it with
    :func:`~attnlab.data.scenes.render.render_scene`)."""

    objects: tuple[SceneObject, ...]
    image_size: int
    radius: float


def _sample_positions(
    rng: np.random.Generator, n: int, cfg: SceneConfig
) -> list[tuple[float, float]]:
    lo, hi = cfg.radius + 1, cfg.image_size - cfg.radius - 1
    min_dist = 2 * cfg.radius + 2
    for _ in range(1000):
        pts: list[tuple[float, float]] = []
        for _ in range(200):
            x, y = (float(v) for v in rng.uniform(lo, hi, size=2))
            if all((x - a) ** 2 + (y - b) ** 2 >= min_dist**2 for a, b in pts):
                pts.append((x, y))
                if len(pts) == n:
                    return pts
    raise RuntimeError(f"could not place {n} objects without overlap")  # pragma: no cover


def _sample_combo(
    rng: np.random.Generator, cfg: SceneConfig, allowed: list[tuple[str, str]]
) -> tuple[str, str]:
    shape = cfg.shapes[rng.integers(len(cfg.shapes))]
    colours = [c for c, s in allowed if s == shape]
    fav = SceneConfig.FAVOURITE.get(shape)
    if fav in colours and rng.random() < cfg.colour_bias:
        return fav, shape
    if not colours:  # every colour of this shape is held out
        return allowed[rng.integers(len(allowed))]
    return colours[rng.integers(len(colours))], shape


def generate_scene(rng: np.random.Generator, cfg: SceneConfig, split: str = "train") -> Scene:
    """Sample a scene for ``split``: "train"/"val" without held-out combinations, "unseen" with one.

    Args:
        rng: the random generator (the caller seeds it).
        cfg: generation settings.
        split: which distribution to sample from.

    Returns:
        A :class:`Scene`.

    Raises:
        ValueError: an unknown split, or ``unseen`` without held-out combinations.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    n = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
    seen = cfg.seen_combos()
    combos = [_sample_combo(rng, cfg, seen) for _ in range(n)]
    if n >= 2 and rng.random() < cfg.duplicate_prob:
        combos[-1] = combos[0]
    if split == "unseen":
        held = cfg.heldout_combos()
        if not held:
            raise ValueError("the 'unseen' split needs held-out combinations (SceneConfig.heldout)")
        combos[int(rng.integers(n))] = held[int(rng.integers(len(held)))]
    order = rng.permutation(n)
    pos = _sample_positions(rng, n, cfg)
    objs = tuple(SceneObject(combos[i][0], combos[i][1], *pos[k]) for k, i in enumerate(order))
    return Scene(objs, cfg.image_size, float(cfg.radius))


def shape_label(scene: Scene) -> int:
    """A coarse image-classification label: the most frequent shape (ties -> first in SHAPES).

    Used to pre-train a classifier whose logits keep "which class" and drop colours and positions,
    the lecture's argument for captioning from penultimate features instead of logits.
    """
    counts: Counter[Any] = Counter(o.shape for o in scene.objects)
    return max(range(len(SHAPES)), key=lambda i: (counts[SHAPES[i]], -i))
