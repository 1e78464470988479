"""Generated scenes for captioning and VQA, in the spirit of Sort-of-CLEVR.

A scene is a few coloured shapes (circle, square, triangle) at random non-overlapping positions,
drawn on a small square image. Everything about a scene is known, so its captions and the answers to
its questions are computed from the layout, not annotated:

* captions: ``"a red circle left of a blue square"``, ``"two green triangles"``, a left-to-right
  listing, and a two-sentence caption whose sentences are joined by ``"."`` — the full stop is an
  ordinary word, the decoder's ``<end>`` token is what ends the sequence;
* questions with answers from a fixed vocabulary, by type:
  non-relational ``colour`` / ``shape`` / ``position`` of a named object, and relational
  ``closest`` / ``farthest`` / ``count`` / ``left_of``.

A question is only asked when its answer is unambiguous: named objects are unique in the scene, and
distances and left/right comparisons that decide an answer differ by at least ``margin`` pixels.

Splits: ``train`` and ``val`` scenes never contain the held-out colour–shape combinations; every
``unseen`` scene contains at least one, so a model that composes "red" and "triangle" can be told
apart from one that memorised the pairs it saw.

The module also holds the word vocabulary (with ``<unk>`` for out-of-vocabulary question words),
image reading for the command line, and the two training tasks (:class:`CaptionTask`,
:class:`VQATask`) implementing the trainer's Task protocol.

Shape legend: B batch, H = W image size, L token length, N scenes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.errors import UserError

__all__ = [
    "COLOURS",
    "SHAPES",
    "QUESTION_TYPES",
    "NON_RELATIONAL",
    "RELATIONAL",
    "NUMBER_WORDS",
    "SceneConfig",
    "SceneObject",
    "Scene",
    "QA",
    "generate_scene",
    "render_scene",
    "scene_captions",
    "scene_questions",
    "SceneSet",
    "Vocab",
    "build_vocab",
    "answer_list",
    "mentioned_objects",
    "read_scene_image",
    "images_to_tensor",
    "shape_label",
    "CaptionTask",
    "VQATask",
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
BACKGROUND = (20, 20, 20)
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
NON_RELATIONAL = ("colour", "shape", "position")
RELATIONAL = ("closest", "farthest", "count", "left_of")
QUESTION_TYPES = NON_RELATIONAL + RELATIONAL
SPLITS = {"train": 0, "val": 1, "unseen": 2}


@dataclass
class SceneConfig:
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

    FAVOURITE = {"circle": "yellow", "square": "blue", "triangle": "green"}

    def __post_init__(self) -> None:
        self.colours = tuple(self.colours)
        self.shapes = tuple(self.shapes)
        self.heldout = tuple(self.heldout)
        if self.radius is None:
            self.radius = self.image_size / 8
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if not 1 <= self.min_objects <= self.max_objects:
            raise ValueError(
                f"need 1 <= min_objects <= max_objects, got min_objects="
                f"{self.min_objects}, max_objects={self.max_objects}"
            )
        if self.max_objects >= len(NUMBER_WORDS):
            raise ValueError(f"max_objects must be < {len(NUMBER_WORDS)}, got {self.max_objects}")
        unknown = [c for c in self.colours if c not in COLOURS]
        if unknown:
            raise ValueError(f"unknown colours {unknown}; known: {list(COLOURS)}")
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown:
            raise ValueError(f"unknown shapes {unknown}; known: {list(SHAPES)}")
        for combo in self.heldout:
            parts = combo.split()
            if len(parts) != 2 or parts[0] not in self.colours or parts[1] not in self.shapes:
                raise ValueError(
                    f"held-out combination {combo!r} must be 'colour shape' from "
                    f"colours {self.colours} and shapes {self.shapes}"
                )
        if len(self.seen_combos()) == 0:
            raise ValueError("every colour-shape combination is held out; nothing to train on")
        # Non-overlap: centres at least 2r + 2 apart, inside a border of r + 1.
        cell = 2 * self.radius + 2
        free = self.image_size - 2 * (self.radius + 1)
        if free <= 0 or (free // cell + 1) ** 2 < self.max_objects:
            raise ValueError(
                f"{self.max_objects} objects of radius {self.radius} do not fit in a "
                f"{self.image_size}x{self.image_size} image"
            )
        for name in ("duplicate_prob", "colour_bias"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    def combos(self) -> list[tuple[str, str]]:
        return [(c, s) for c in self.colours for s in self.shapes]

    def heldout_combos(self) -> list[tuple[str, str]]:
        return [tuple(h.split()) for h in self.heldout]  # type: ignore[misc]

    def seen_combos(self) -> list[tuple[str, str]]:
        held = set(self.heldout_combos())
        return [cs for cs in self.combos() if cs not in held]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["colours"], d["shapes"], d["heldout"] = (
            list(self.colours),
            list(self.shapes),
            list(self.heldout),
        )
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SceneConfig:
        return cls(**d)


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
    """A layout: objects, image size and shape radius."""

    objects: tuple[SceneObject, ...]
    image_size: int
    radius: float

    def render(self) -> np.ndarray:
        return render_scene(self)


@dataclass(frozen=True)
class QA:
    """A question, its answer and its type (one of :data:`QUESTION_TYPES`)."""

    qtype: str
    question: str
    answer: str


# ----------------------------------------------------------------------------------------------
# generation and rendering


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


def _shape_mask(shape: str, x: float, y: float, r: float, size: int) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] + 0.5  # pixel centres
    if shape == "circle":
        return (xx - x) ** 2 + (yy - y) ** 2 <= r**2
    if shape == "square":
        h = 0.85 * r  # about the circle's area
        return (np.abs(xx - x) <= h) & (np.abs(yy - y) <= h)
    if shape == "triangle":  # apex up, base at y + r
        return (yy >= y - r) & (yy <= y + r) & (np.abs(xx - x) <= (yy - (y - r)) / 2)
    raise ValueError(f"unknown shape {shape!r}")


def render_scene(scene: Scene) -> np.ndarray:
    """Draw ``scene`` as an RGB ``uint8`` array ``(H, W, 3)`` on a dark background."""
    s = scene.image_size
    img = np.empty((s, s, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    for o in scene.objects:
        img[_shape_mask(o.shape, o.x, o.y, scene.radius, s)] = COLOURS[o.colour]
    return img


# ----------------------------------------------------------------------------------------------
# captions


def _plural(shape: str) -> str:
    return shape + "s"


def _relation(a: SceneObject, b: SceneObject) -> str:
    """Where ``a`` is relative to ``b``, along the axis with the larger displacement."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _group_phrase(n: int, colour: str, shape: str) -> str:
    if n == 1:
        return f"{_article(colour)} {colour} {shape}"
    return f"{NUMBER_WORDS[n]} {colour} {_plural(shape)}"


def scene_captions(scene: Scene) -> list[str]:
    """All reference captions of ``scene`` (deterministic order).

    * a listing, left to right: "a red circle , a blue square and two green triangles";
    * per pair of objects of different kinds, one relation: "a red circle left of a blue square";
    * for each repeated kind: "two green triangles";
    * a two-sentence caption "<first pair caption> . <first count caption>" when both exist.
    """
    objs = sorted(scene.objects, key=lambda o: o.x)
    counts = Counter((o.colour, o.shape) for o in objs)
    groups: list[tuple[str, str]] = []
    for o in objs:  # left to right by first appearance
        if (o.colour, o.shape) not in groups:
            groups.append((o.colour, o.shape))
    phrases = [_group_phrase(counts[g], *g) for g in groups]
    listing = phrases[0] if len(phrases) == 1 else " , ".join(phrases[:-1]) + " and " + phrases[-1]
    caps = [listing]
    pairs = []
    for i, a in enumerate(objs):
        for b in objs[i + 1 :]:
            if a.name != b.name:
                pairs.append(
                    f"{_group_phrase(1, a.colour, a.shape)} {_relation(a, b)} "
                    f"{_group_phrase(1, b.colour, b.shape)}"
                )
    count_caps = [_group_phrase(n, *g) for g, n in counts.items() if n > 1]
    caps += pairs + count_caps
    if pairs and count_caps:
        caps.append(f"{pairs[0]} . {count_caps[0]}")
    return list(dict.fromkeys(caps))  # unique, order kept


_COMBO_RE = re.compile(r"\b(" + "|".join(COLOURS) + r") (" + "|".join(SHAPES) + r")s?\b")


def mentioned_objects(caption: str) -> list[tuple[str, str]]:
    """The ``(colour, shape)`` pairs a caption names ("two green triangles" -> green triangle)."""
    return [(m.group(1), m.group(2)) for m in _COMBO_RE.finditer(caption)]


# ----------------------------------------------------------------------------------------------
# questions


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
        if abs(o.x - centre) >= margin:
            qs.append(
                QA(
                    "position",
                    f"is the {o.name} on the left or the right ?",
                    "left" if o.x < centre else "right",
                )
            )
        if abs(o.y - centre) >= margin:
            qs.append(
                QA(
                    "position",
                    f"is the {o.name} at the top or the bottom ?",
                    "top" if o.y < centre else "bottom",
                )
            )

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
            QA("count", f"how many {_plural(shape)} are there ?", NUMBER_WORDS[shape_counts[shape]])
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


def shape_label(scene: Scene) -> int:
    """A coarse image-classification label: the most frequent shape (ties -> first in SHAPES).

    Used to pre-train a classifier whose logits keep "which class" and drop colours and positions,
    the lecture's argument for captioning from penultimate features instead of logits.
    """
    counts = Counter(o.shape for o in scene.objects)
    return max(range(len(SHAPES)), key=lambda i: (counts[SHAPES[i]], -i))


# ----------------------------------------------------------------------------------------------
# vocabulary


# Words (any alphabet, so "café" is one unknown word, not "caf" + "é"), numbers, punctuation marks.
_TOKEN_RE = re.compile(r"[^\W\d_]+|\d+|[^\w\s]")
_ALIASES = {
    "color": "colour",
    "colors": "colours",
    "leftmost": "left",
    "nearest": "closest",
    "furthest": "farthest",
}


def tokenize(text: str) -> list[str]:
    """Lower-case words and punctuation marks: "What colour?" -> ["what", "colour", "?"]."""
    return [_ALIASES.get(t, t) for t in _TOKEN_RE.findall(text.lower())]


class Vocab:
    """Word vocabulary shared by captions and questions, with the special tokens.

    ``<pad>`` 0, ``<unk>`` 1, ``<start>`` 2, ``<end>`` 3, then the words. ``<end>`` ends a
    caption; the full stop ``"."`` is an ordinary word (a caption may hold two sentences).
    """

    PAD, UNK, START, END = 0, 1, 2, 3
    SPECIALS = ("<pad>", "<unk>", "<start>", "<end>")

    def __init__(self, words: list[str], answers: list[str]) -> None:
        self.itos = list(self.SPECIALS) + [w for w in words if w not in self.SPECIALS]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.answers = list(answers)
        self.answer_index = {a: i for i, a in enumerate(self.answers)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Token ids of ``text`` and the words that were not in the vocabulary (mapped to <unk>)."""
        ids, unknown = [], []
        for w in tokenize(text):
            if w in self.stoi:
                ids.append(self.stoi[w])
            else:
                ids.append(self.UNK)
                unknown.append(w)
        return ids, unknown

    def encode_caption(self, text: str) -> list[int]:
        """``<start> words <end>``; a caption word outside the vocabulary is a bug, not input."""
        ids, unknown = self.encode(text)
        if unknown:
            raise ValueError(f"caption {text!r} has words outside the vocabulary: {unknown}")
        return [self.START] + ids + [self.END]

    def decode(self, ids) -> str:
        """Words of ``ids`` up to (not including) ``<end>``, skipping ``<start>``/``<pad>``."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.END:
                break
            if i in (self.PAD, self.START):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else "<unk>")
        return " ".join(out)

    def to_dict(self) -> dict:
        return {"words": self.itos, "answers": self.answers}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        return cls(list(d["words"]), list(d["answers"]))

    def save(self, path: str | Path) -> None:
        from attnlab.fileio import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise UserError(f"no vocabulary file {path}") from None
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(f"vocabulary file {path} is corrupted: {err}") from None


def build_vocab() -> Vocab:
    """The closed vocabulary of every caption and question the generator can produce."""
    words: list[str] = []
    templates = [
        "a an , and . left right of above below the is on or at top bottom",
        "what colour shape object objects closest farthest to from how many are there ?",
    ]
    for t in templates:
        words += t.split()
    words += list(COLOURS) + list(SHAPES) + [_plural(s) for s in SHAPES] + list(NUMBER_WORDS)
    words += ["yes", "no"]
    return Vocab(list(dict.fromkeys(words)), answer_list())


# ----------------------------------------------------------------------------------------------
# images


def images_to_tensor(images: np.ndarray) -> Tensor:
    """``uint8 (N, H, W, 3)`` or ``(H, W, 3)`` -> ``float (N, 3, H, W)`` in [0, 1]."""
    t = torch.from_numpy(np.array(images, dtype=np.uint8))  # a writable copy
    if t.dim() == 3:
        t = t.unsqueeze(0)
    # contiguous: a channels-last view hangs or crashes oneDNN's convolution backward on some
    # CPUs (seen on AMD EPYC with torch 2.13)
    return t.permute(0, 3, 1, 2).float().div_(255.0).contiguous()  # (N, 3, H, W)


def read_scene_image(path: str | Path, image_size: int) -> Tensor:
    """Read an RGB image file as ``(1, 3, H, W)`` floats, checking it is ``image_size`` square.

    Raises:
        UserError: the file is missing, not an image, or of the wrong size.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.exists():
        raise UserError(f"image file {str(path)!r} does not exist")
    if not path.is_file():
        raise UserError(f"{str(path)!r} is not an image file")
    try:
        with Image.open(path) as im:
            # The header gives the size: a wrong-sized (or huge) image is refused undecoded.
            if im.size != (image_size, image_size):
                raise UserError(
                    f"image {str(path)!r} is {im.size[0]}x{im.size[1]} pixels; this model "
                    f"was trained on {image_size}x{image_size} scenes "
                    f"(write one with 'attnlab scene --out DIR --image-size {image_size}')"
                )
            arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as err:
        raise UserError(f"cannot read {str(path)!r} as an image: {err}") from None
    return images_to_tensor(arr)


# ----------------------------------------------------------------------------------------------
# datasets and tasks


class SceneSet:
    """``n`` scenes of one split, generated once from ``(seed, split)``.

    Attributes:
        scenes: the layouts; images: ``uint8 (N, H, W, 3)``; captions: reference captions per
        scene; questions: every unambiguous :class:`QA` per scene.
    """

    def __init__(self, cfg: SceneConfig, split: str, n: int, seed: int = 0) -> None:
        if n < 1:
            raise ValueError(f"need at least one scene, got n={n}")
        rng = np.random.default_rng([seed, SPLITS[split]] if split in SPLITS else None)
        self.config, self.split = cfg, split
        self.scenes = [generate_scene(rng, cfg, split) for _ in range(n)]
        self.images = np.stack([s.render() for s in self.scenes])  # (N, H, W, 3)
        self.captions = [scene_captions(s) for s in self.scenes]
        self.questions = [scene_questions(s, cfg.margin) for s in self.scenes]

    def __len__(self) -> int:
        return len(self.scenes)

    def caption_set(self) -> set[str]:
        return {c for caps in self.captions for c in caps}


def _rng(seed: int, split: str, step: int, rank: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, SPLITS[split], step, rank])


def _pad(seqs: list[list[int]], pad: int = Vocab.PAD) -> Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


@dataclass
class _TaskBase:
    scene: SceneConfig = field(default_factory=SceneConfig)
    n_train: int = 4000
    n_val: int = 300
    n_unseen: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.scene, dict):
            self.scene = SceneConfig.from_dict(self.scene)
        self.vocab = build_vocab()
        self._sets: dict[str, SceneSet] = {}

    def sets(self, split: str) -> SceneSet:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
        if split not in self._sets:
            n = {"train": self.n_train, "val": self.n_val, "unseen": self.n_unseen}[split]
            self._sets[split] = SceneSet(self.scene, split, n, self.seed)
        return self._sets[split]

    def _share(self, batch_size: int, world: int) -> int:
        if batch_size % world:
            raise ValueError(f"batch_size {batch_size} is not divisible by world size {world}")
        return batch_size // world

    def config_dict(self) -> dict:
        return {
            "name": self.name,
            "scene": self.scene.to_dict(),
            "n_train": self.n_train,
            "n_val": self.n_val,
            "n_unseen": self.n_unseen,
            "seed": self.seed,
        }

    def save_artifacts(self, run_dir: Path) -> None:
        self.vocab.save(Path(run_dir) / "vocab.json")

    def count(self, batch) -> int:
        return int(batch["images"].shape[0])


@dataclass
class CaptionTask(_TaskBase):
    """Image -> caption, teacher forcing with cross-entropy over ``<start> words <end>``.

    Each training example is a scene and one of its reference captions, drawn at random. The model
    is called as ``model(images (B, 3, H, W), tokens_in (B, L)) -> logits (B, L, V)``.
    """

    name = "caption"
    eval_scenes: int = 64

    def _batch(self, sset: SceneSet, idx, rng) -> dict:
        caps = [sset.captions[i][rng.integers(len(sset.captions[i]))] for i in idx]
        tokens = _pad([self.vocab.encode_caption(c) for c in caps])  # (B, L)
        return {"images": images_to_tensor(sset.images[idx]), "tokens": tokens}

    def get_batch(self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1):
        sset = self.sets(split)
        rng = _rng(self.seed, split, step, rank)
        idx = rng.integers(len(sset), size=self._share(batch_size, world))
        return self._batch(sset, idx, rng)

    def loss(self, model, batch, cfg) -> tuple[Tensor, dict[str, float]]:
        from attnlab.tasks.losses import cross_entropy

        tokens = batch["tokens"]
        logits = model(batch["images"], tokens[:, :-1])  # (B, L-1, V)
        target = tokens[:, 1:].masked_fill(tokens[:, 1:] == Vocab.PAD, -100)
        loss = cross_entropy(logits, target, label_smoothing=getattr(cfg, "label_smoothing", 0.0))
        with torch.no_grad():
            ok = target != -100
            acc = ((logits.argmax(-1) == target) & ok).sum() / ok.sum().clamp(min=1)
        return loss, {"acc": float(acc)}

    def eval_batches(self, batch_size: int, n_batches: int):
        sset = self.sets("val")
        for b in range(n_batches):
            rng = _rng(self.seed, "val", b)
            idx = (np.arange(batch_size) + b * batch_size) % len(sset)
            yield self._batch(sset, idx, rng)

    def evaluate(self, model) -> dict[str, float]:
        """Greedy captions of some validation scenes: BLEU and how often named objects exist."""
        from attnlab.models.caption import caption_metrics

        sset = self.sets("val")
        n = min(self.eval_scenes, len(sset))
        m = caption_metrics(model, self.vocab, sset, range(n), beam_size=1)
        return {"bleu": m["bleu"], "object_precision": m["object_precision"]}


@dataclass
class VQATask(_TaskBase):
    """(image, question) -> answer class, cross-entropy over the fixed answer list.

    A training example is a scene, a question type drawn uniformly among the types the scene
    supports, then one question of that type. The model is called as
    ``model(images (B, 3, H, W), questions (B, L), lengths (B,)) -> logits (B, n_answers)``.
    """

    name = "vqa"
    eval_per_type: int = 100

    def _batch(self, sset: SceneSet, pairs: list[tuple[int, QA]]) -> dict:
        qids = [self.vocab.encode(qa.question)[0] for _, qa in pairs]
        return {
            "images": images_to_tensor(sset.images[[i for i, _ in pairs]]),
            "questions": _pad(qids),  # (B, L)
            "lengths": torch.tensor([len(q) for q in qids]),
            "answers": torch.tensor([self.vocab.answer_index[qa.answer] for _, qa in pairs]),
            "qtypes": torch.tensor([QUESTION_TYPES.index(qa.qtype) for _, qa in pairs]),
        }

    def _sample(
        self, sset: SceneSet, rng, n: int, qtype: str | None = None
    ) -> list[tuple[int, QA]]:
        out = []
        while len(out) < n:
            i = int(rng.integers(len(sset)))
            qs = sset.questions[i]
            types = sorted({q.qtype for q in qs}) if qtype is None else [qtype]
            t = types[int(rng.integers(len(types)))]
            pool = [q for q in qs if q.qtype == t]
            if pool:
                out.append((i, pool[int(rng.integers(len(pool)))]))
        return out

    def get_batch(self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1):
        sset = self.sets(split)
        rng = _rng(self.seed, split, step, rank)
        return self._batch(sset, self._sample(sset, rng, self._share(batch_size, world)))

    def loss(self, model, batch, cfg) -> tuple[Tensor, dict[str, float]]:
        from attnlab.tasks.losses import cross_entropy

        logits = model(batch["images"], batch["questions"], batch["lengths"])  # (B, A)
        loss = cross_entropy(
            logits, batch["answers"], label_smoothing=getattr(cfg, "label_smoothing", 0.0)
        )
        acc = (logits.argmax(-1) == batch["answers"]).float().mean()
        return loss, {"acc": float(acc)}

    def eval_pairs(self, split: str = "val", per_type: int | None = None) -> list[tuple[int, QA]]:
        """A fixed, type-balanced evaluation set: ``per_type`` questions of each type the split
        has (a few scenes may not support every type)."""
        sset = self.sets(split)
        present = {q.qtype for qs in sset.questions for q in qs}
        rng = _rng(self.seed + 7919, split, 0)
        pairs = []
        for t in QUESTION_TYPES:
            if t in present:
                pairs += self._sample(sset, rng, per_type or self.eval_per_type, qtype=t)
        return pairs

    def eval_batches(self, batch_size: int, n_batches: int):
        sset = self.sets("val")
        pairs = self.eval_pairs()
        for b in range(n_batches):
            chunk = pairs[b * batch_size : (b + 1) * batch_size]
            if not chunk:
                break
            yield self._batch(sset, chunk)

    def answer_frequency_baseline(
        self,
        split: str = "val",
        *,
        by: str = "answer",
        per_type: int | None = None,
        n_samples: int = 4000,
    ) -> float:
        """Accuracy of answering from training answer frequencies alone, on the fixed,
        type-balanced evaluation set the models are scored on.

        Args:
            split: the evaluation split.
            by: ``"answer"``: always the single most frequent training answer; ``"type"``: the
                most frequent answer of the question's type; ``"question"``: the most frequent
                answer to the very same question text (falling back to the overall one) — about
                the best any image-blind answerer can do, so a model that beats it reads the image.
            per_type: size of the evaluation set, as in :meth:`eval_pairs` (pass the models').
            n_samples: training questions counted.

        Raises:
            ValueError: ``by`` is not one of the three.
        """
        keys = {
            "answer": lambda qa: None,
            "type": lambda qa: qa.qtype,
            "question": lambda qa: qa.question,
        }
        if by not in keys:
            raise ValueError(f"unknown baseline by={by!r}; choose from {list(keys)}")
        key = keys[by]
        rng = _rng(self.seed + 1, "train", 0)
        sample = self._sample(self.sets("train"), rng, n_samples)
        overall = Counter(qa.answer for _, qa in sample).most_common(1)[0][0]
        counts: dict[Any, Counter] = {}
        for _, qa in sample:
            counts.setdefault(key(qa), Counter())[qa.answer] += 1
        pairs = self.eval_pairs(split, per_type)
        hits = 0
        for _, qa in pairs:
            seen = counts.get(key(qa))
            hits += qa.answer == (seen.most_common(1)[0][0] if seen else overall)
        return hits / len(pairs)

    @torch.no_grad()
    def accuracy_by_type(
        self, model, split: str = "val", per_type: int | None = None, batch_size: int = 256
    ) -> dict[str, float]:
        """Accuracy per question type (and ``"all"``) on the fixed evaluation set of ``split``."""
        sset = self.sets(split)
        pairs = self.eval_pairs(split, per_type)
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        correct: Counter = Counter()
        total: Counter = Counter()
        for b in range(0, len(pairs), batch_size):
            chunk = pairs[b : b + batch_size]
            batch = self._batch(sset, chunk)
            logits = model(
                batch["images"].to(device),
                batch["questions"].to(device),
                batch["lengths"].to(device),
            )
            hit = (logits.argmax(-1).cpu() == batch["answers"]).tolist()
            for (_, qa), h in zip(chunk, hit):
                correct[qa.qtype] += h
                total[qa.qtype] += 1
        model.train(was_training)
        out = {t: correct[t] / total[t] for t in QUESTION_TYPES if total[t]}
        out["all"] = sum(correct.values()) / max(1, sum(total.values()))
        return out

    def evaluate(self, model) -> dict[str, float]:
        acc = self.accuracy_by_type(model, per_type=min(self.eval_per_type, 50))
        return {"val_acc": acc["all"]}
