"""Reference captions of a scene, computed from its layout.

* a listing, left to right: "a red circle , a blue square and two green triangles";
* per pair of objects of different kinds, one relation: "a red circle left of a blue square";
* for each repeated kind: "two green triangles";
* a two-sentence caption "<first pair caption> . <first count caption>" when both exist — the
  full stop is an ordinary word, the decoder's ``<end>`` token is what ends the sequence.
"""

from __future__ import annotations

import re
from collections import Counter

from attnlab.data.scenes.world import COLOURS, NUMBER_WORDS, SHAPES, Scene, SceneObject

__all__ = ["plural", "scene_captions", "mentioned_objects"]


def plural(shape: str) -> str:
    """``circle`` -> ``circles``."""
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
    return f"{NUMBER_WORDS[n]} {colour} {plural(shape)}"


def scene_captions(scene: Scene) -> list[str]:
    """All reference captions of ``scene`` (deterministic order; see the module docstring)."""
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
