"""Which config field explains how a model's tensors differ from its weights'.

:func:`explain` looks among a config's integers (:func:`flat_ints`) for a value equal to, or
dividing, a mismatched dimension, or equal to a layer count that differs from the weights', and
keeps a candidate only when a ``meta`` rebuild with the weights' value makes the tensors fit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "Shapes",
    "BuildStopped",
    "DEPTH_FIELD",
    "flat_ints",
    "set_path",
    "top_layers",
    "explain",
]

Shapes = dict[str, tuple[int, ...]]

# config fields that count layers or blocks (n_layer, num_hidden_layers, n_enc_layers, depths[2])
DEPTH_FIELD = re.compile(r"(layers?|depths?)(\[\d+\])?$")
# a layer number in a tensor name: blocks.3.attn..., and nn.LSTM's weight_ih_l3(_reverse)
_INDEX = re.compile(r"\.(\d+)(?=\.|$)|_l(\d+)(?=_reverse$|$)")
# fields that never set a shape (token ids)
_NOT_A_SIZE = re.compile(r"_ids?(\[\d+\])?$")
# meta rebuilds one explanation may try: 32, fewer for models of many tensors (the product
# of rebuilds and tensors stays under _TRIAL_TENSORS), never fewer than 8
_TRIALS, _TRIAL_TENSORS = 32, 8000


# ---- reading a config as integers ---------------------------------------------------------------


def flat_ints(config: Mapping[str, Any], prefix: str = "") -> dict[str, int]:
    """The integer fields of a (nested) config dict: ``{"encoder.n_layers": 2, "depths[1]": 6}``."""
    out: dict[str, int] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            out[path] = value
        elif isinstance(value, Mapping):
            out.update(flat_ints(value, f"{path}."))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, int) and not isinstance(v, bool):
                    out[f"{path}[{i}]"] = v
    return out


def set_path(config: Mapping[str, Any], path: str, value: int) -> dict[str, Any]:
    """A copy of ``config`` with the field at ``path`` (``a.b``, ``depths[1]``) set to ``value``."""
    head, _, rest = path.partition(".")
    m = re.fullmatch(r"(.*)\[(\d+)\]", head)
    out = dict(config)
    if rest:
        out[head] = set_path(config[head], rest, value)
    elif m:
        items = list(config[m.group(1)])
        items[int(m.group(2))] = value
        out[m.group(1)] = items
    else:
        out[head] = value
    return out


def _layer_counts(names: Iterable[str]) -> dict[str, int]:
    """Layer container -> how many numbered entries: ``{"h": 2, "layers.1.blocks": 6}``."""
    seen: dict[str, set[str]] = {}
    for name in names:
        for m in _INDEX.finditer(name):
            seen.setdefault(name[: m.start()], set()).add(m.group(1) or m.group(2))
    return {prefix: len(ids) for prefix, ids in seen.items()}


def top_layers(names: Iterable[str]) -> int:
    """The most numbered entries of a top-level layer container (``h.N``, ``encoder.layers.N``)."""
    counts = _layer_counts(names)
    return max((c for p, c in counts.items() if not _INDEX.search(p)), default=0)


class BuildStopped(BaseException):
    """Raised inside a meta build that creates more tensors or modules than its weights allow.

    A BaseException, so that no ``except Exception`` in a model's constructor swallows it."""


# ---- explaining a difference --------------------------------------------------------------------


def _differences(expected: Mapping[str, Sequence[int]], found: Mapping[str, Sequence[int]]) -> int:
    """How many names are missing, unexpected or of another shape."""
    both = set(expected) & set(found)
    return len(set(expected) ^ set(found)) + sum(
        tuple(expected[n]) != tuple(found[n]) for n in both
    )


def _candidates(
    expected: Mapping[str, Sequence[int]],
    found: Mapping[str, Sequence[int]],
    values: Mapping[str, int],
) -> list[tuple[str, int, int]]:
    """``(field, value, what the weights say)`` that may explain the differences, best first.

    A layer container with ``w`` numbered entries where the weights have ``h`` is explained by
    a field of value ``w`` (layer-count names first). A dimension the config makes ``e`` where
    the weights have ``f`` is explained by a field of value ``e`` (score 2) or of a value ``v``
    dividing ``e`` with ``f`` a multiple of ``e / v`` (score 1: a fused Q|K|V, heads x head
    width), ranked by their summed scores over all tensors.
    """
    out: list[tuple[str, int, int]] = []
    want, have = _layer_counts(expected), _layer_counts(found)
    for prefix in sorted(set(want) | set(have), key=lambda p: (p.count("."), p)):
        w, h = want.get(prefix, 0), have.get(prefix, 0)
        if w != h and w:
            fields = sorted(values, key=lambda f: not DEPTH_FIELD.search(f))
            out += [(f, w, h) for f in fields if values[f] == w]
    scores: dict[tuple[str, int], int] = {}
    probes: set[tuple[str, int]] = set()
    for name in sorted(set(expected) & set(found)):
        e_shape, f_shape = tuple(expected[name]), tuple(found[name])
        if len(e_shape) != len(f_shape):
            continue
        for e, f in zip(e_shape, f_shape):
            if e == f:
                continue
            for field, v in values.items():
                if v > 1 and e % v == 0:  # a probe: its secant may find the value
                    probes.update({(field, 2 * v), (field, v // 2)})
                if v == e:
                    key, score = (field, f), 2
                elif v > 1 and e % v == 0 and f % (e // v) == 0 and f // (e // v) != v:
                    key, score = (field, f // (e // v)), 1
                else:
                    continue
                scores[key] = scores.get(key, 0) + score
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    out += [(field, values[field], should) for (field, should), _ in ranked]
    out += [(field, values[field], should) for field, should in sorted(probes)]
    seen: set[tuple[str, int]] = set()
    return [c for c in out if (c[0], c[2]) not in seen and not seen.add((c[0], c[2]))]


def _secant(
    expected: Mapping[str, Sequence[int]],
    found: Mapping[str, Sequence[int]],
    tried: Mapping[str, Sequence[int]],
    v: int,
    should: int,
) -> int | None:
    """The field value that makes the first differing dimension fit, if that dimension is linear
    in the field: it is ``e`` at ``v`` and ``e2`` at ``should``, the weights have ``f``."""
    for name in sorted(set(expected) & set(found) & set(tried)):
        e_shape, f_shape, t_shape = (tuple(x[name]) for x in (expected, found, tried))
        if not len(e_shape) == len(f_shape) == len(t_shape) or e_shape == f_shape:
            continue
        for e, f, e2 in zip(e_shape, f_shape, t_shape):
            if e != f:
                if e2 == e or ((f - e) * (should - v)) % (e2 - e):
                    return None
                step = v + (f - e) * (should - v) // (e2 - e)
                return step if step > 0 and step not in (v, should) else None
    return None


def explain(
    expected: Mapping[str, Sequence[int]],
    found: Mapping[str, Sequence[int]],
    config: Mapping[str, Any],
    *,
    rebuild: Callable[[Mapping[str, Any]], tuple[Shapes, Shapes]] | None = None,
) -> str | None:
    """The config fields that explain how ``expected`` (from the config) differs from ``found``.

    Args:
        expected: name -> shape the config's model has.
        found: name -> shape the weights hold.
        config: the config dict.
        rebuild: ``config -> (expected, found)``; with it, candidates are tried by rebuilding
            with the weights' value, the one leaving the fewest differences kept, up to three
            fields one after another (a config may lie about width and vocabulary at once),
            and the fields are named only when the last rebuild fits the weights exactly (a
            guess that merely reduces the differences is not named); without it, the
            best-ranked candidates are named.

    Returns:
        ``"config says d_model=4000000; the weights have 64"`` (several joined by ``" | "``),
        or None when no field explains the difference.
    """
    claims: list[str] = []
    trials = max(8, min(_TRIALS, _TRIAL_TENSORS // max(len(expected), 1)))
    left = _differences(expected, found)
    while left and len(claims) < 3:
        values = {f: v for f, v in flat_ints(config).items() if not _NOT_A_SIZE.search(f)}
        candidates = _candidates(expected, found, values)
        if rebuild is None:
            named = set()
            for field, v, should in candidates:
                if v not in named and len(claims) < 3:  # d_model = max_len: one of them
                    named.add(v)
                    claims.append(f"config says {field}={v}; the weights have {should}")
            break
        best = None
        tried: set[tuple[str, int]] = set()
        while candidates and trials and (best is None or best[0]):
            field, v, should = candidates.pop(0)
            if (field, should) in tried:
                continue
            tried.add((field, should))
            trials -= 1
            trial = set_path(config, field, should)
            try:
                e2, f2 = rebuild(trial)
            except (BuildStopped, Exception):  # a value the model refuses: not the explanation
                continue
            n = _differences(e2, f2)
            if n < left and (best is None or n < best[0]):
                best = (n, f"config says {field}={v}; the weights have {should}", trial, e2, f2)
            if n:  # a dimension linear in the field (heads in a fused Q|K|V): its secant
                step = _secant(expected, found, e2, v, should)
                if step is not None:
                    candidates.insert(0, (field, v, step))
        if best is None:
            break
        left, claim, config, expected, found = best
        claims.append(claim)
    if rebuild is not None and left:  # only an explanation that makes every tensor fit
        return None
    return " | ".join(claims) or None
