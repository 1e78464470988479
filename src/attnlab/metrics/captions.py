"""Scores of generated captions against the scenes they describe, and VQA accuracy by group.

Captions of generated scenes can be checked against the layout: which named objects exist, which
colours and shapes, whether a caption is a verbatim training caption (retrieval), whether a
held-out colour–shape combination is named (composition).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from attnlab.data.scenes import SceneSet, mentioned_objects

__all__ = ["score_captions", "accuracy_by_group"]


def score_captions(
    hyps: list[str],
    sset: SceneSet,
    indices: Iterable[int],
    *,
    train_captions: set[str] | None = None,
) -> dict[str, Any]:
    """Score captions ``hyps`` of scenes ``indices`` of a :class:`~attnlab.data.scenes.SceneSet`.

    Returns a dict with
        ``bleu``: corpus BLEU (sacrebleu) against all reference captions of each scene;
        ``object_precision``: fraction of named (colour, shape) objects present in the scene;
        ``colour_precision`` / ``shape_precision``: the same for the colour / shape word alone;
        ``chance_precision``: object precision of a caption naming a uniformly random combination;
        ``named``: how many (colour, shape) objects the captions name (the denominator of the
            precisions);
        ``other_object_precision`` / ``other_colour_precision`` / ``other_shape_precision``: the
            same captions scored against the *other* scenes' objects (each caption against every
            other scene, averaged) — what a captioner with the same word habits would score if
            it ignored the image, so the gap to the ``*_precision`` above is what it read there;
        ``exact_match``: fraction of captions equal to one of the scene's own references;
        ``retrieved``: fraction that appear verbatim in ``train_captions`` (when given);
        ``novel_combo``: fraction of scenes where a held-out combination present in the scene
            is named correctly (meaningful on the ``unseen`` split);
        ``captions``: the generated text.

    Raises:
        ValueError: not one caption per scene.
    """
    import sacrebleu  # lazy: ~0.3 s and ~80 modules; only scoring needs it

    indices = list(indices)
    if not indices or len(hyps) != len(indices):
        raise ValueError(f"need one caption per scene, got {len(hyps)} for {len(indices)} scenes")
    refs = [sset.captions[i] for i in indices]
    n_refs = max(len(r) for r in refs)
    ref_streams = [[r[k] if k < len(r) else r[0] for r in refs] for k in range(n_refs)]
    bleu = sacrebleu.corpus_bleu(hyps, ref_streams).score
    held = set(sset.config.heldout_combos())
    n_combos = len(sset.config.colours) * len(sset.config.shapes)
    present = [{(o.colour, o.shape) for o in sset.scenes[i].objects} for i in indices]
    scenes = [(p, {c for c, _ in p}, {s for _, s in p}) for p in present]
    mentioned = [mentioned_objects(h) for h in hyps]
    named = sum(map(len, mentioned))

    def hits(m: list[tuple[str, str]], scene: tuple[set, set, set]) -> list[int]:
        """How many of the objects named in ``m``, their colours and their shapes ``scene``
        (its objects, colours, shapes) holds."""
        objs, colours, shapes = scene
        return [
            sum(cs in objs for cs in m),
            sum(c in colours for c, _ in m),
            sum(s in shapes for _, s in m),
        ]

    n = len(indices)
    own, other = [0.0] * 3, [0.0] * 3
    for k, m in enumerate(mentioned):
        own = [a + b for a, b in zip(own, hits(m, scenes[k]))]
        if m and n > 1:  # this caption against each of the other scenes, averaged
            h = [hits(m, scenes[j]) for j in range(n) if j != k]
            other = [a + sum(col) / (n - 1) for a, col in zip(other, zip(*h))]
    own = [x / named if named else 0.0 for x in own]
    other = [x / named if named else 0.0 for x in other] if n > 1 else [float("nan")] * 3
    chance = sum(len(p) / n_combos for p in present)
    novel_hit = novel_total = 0
    for p, m in zip(present, mentioned):
        if p & held:
            novel_total += 1
            novel_hit += bool(set(m) & p & held)
    out = {
        "bleu": bleu,
        "object_precision": own[0],
        "colour_precision": own[1],
        "shape_precision": own[2],
        "chance_precision": chance / n,
        "named": named,
        "other_object_precision": other[0],
        "other_colour_precision": other[1],
        "other_shape_precision": other[2],
        "exact_match": sum(h in set(r) for h, r in zip(hyps, refs)) / len(hyps),
        "novel_combo": novel_hit / novel_total if novel_total else float("nan"),
        "captions": hyps,
    }
    if train_captions is not None:
        out["retrieved"] = sum(h in train_captions for h in hyps) / len(hyps)
    return out


def accuracy_by_group(
    groups: Sequence[str], hits: Sequence[bool], order: Sequence[str] = ()
) -> dict[str, float]:
    """Accuracy of each group (a VQA question type...) and over all as ``"all"``.

    Args:
        groups: the group of each prediction.
        hits: whether each prediction was right.
        order: groups to list first, in this order (groups without predictions are left out).

    Returns:
        ``{group: accuracy, ..., "all": accuracy}``.
    """
    correct: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for g, h in zip(groups, hits, strict=True):
        correct[g] += bool(h)
        total[g] += 1
    names = [g for g in order if total[g]] + [g for g in total if g not in order]
    out = {g: correct[g] / total[g] for g in names}
    out["all"] = sum(correct.values()) / max(1, sum(total.values()))
    return out
