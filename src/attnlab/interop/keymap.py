"""Checkpoint conversion as data: a declarative key map from which both directions are derived.

A :class:`KeyMap` is a list of :class:`Rule` objects, each pairing attnlab names with another
library's names (templates with ``{placeholders}``) and a :class:`Transform` that turns the
tensors of one side into the other's and back::

    Rule("blocks.{i}.attn.qkv.weight",
         ("layer.{i}.query.weight", "layer.{i}.key.weight", "layer.{i}.value.weight"),
         Concat(dim=0))                       # ours = cat(theirs); theirs = split(ours)

``to_theirs(state_dict)`` and ``to_ours(state_dict)`` apply the rules in either direction; tied
copies (a decoder that shares the embedding matrix) are declared once per side, and names that a
side stores but the other has no use for (buffers, a pooler) are declared ``ignore``. Every
source tensor must be claimed by a rule, a tie or an ignore pattern, and every rule instance must
find all its tensors: a map never drops or invents a weight silently.

Placeholders match one name component (``[^.]+``); the same placeholder values bind both sides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnlab.errors import UserError

__all__ = ["Transform", "Identity", "Concat", "Transpose", "Rule", "KeyMap", "check_shapes"]


class Transform:
    """How the tensors of one rule change between the two sides: a pair of inverse maps.

    ``to_theirs(ours, n)`` and ``to_ours(theirs, n)`` take the tensors of one side in the order
    of the rule's templates and return the ``n`` tensors of the other side.
    """

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        raise NotImplementedError

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        raise NotImplementedError


class Identity(Transform):
    """The same tensor on both sides (one name each)."""

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return list(tensors)

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return list(tensors)


@dataclass(frozen=True)
class Concat(Transform):
    """Ours is theirs concatenated along ``dim`` (a fused Q|K|V projection, gate|up).

    Args:
        dim: the concatenation dimension.
        sizes: the size of each of theirs along ``dim`` (None: equal parts; grouped-query
            attention's Q|K|V needs them).
    """

    dim: int = 0
    sizes: tuple[int, ...] | None = None

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [torch.cat(list(tensors), dim=self.dim)]

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        (fused,) = tensors
        if self.sizes is not None:
            return list(fused.split(list(self.sizes), dim=self.dim))
        if fused.shape[self.dim] % n:
            raise ValueError(f"cannot split {tuple(fused.shape)} into {n} equal parts")
        return list(fused.chunk(n, dim=self.dim))


@dataclass(frozen=True)
class Transpose(Transform):
    """Theirs is ours transposed (GPT-2's Conv1D stores ``(in, out)``)."""

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [t.t() for t in tensors]

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [t.t() for t in tensors]


@dataclass(frozen=True)
class Rule:
    """One correspondence: attnlab name template(s), the other side's, and the transform.

    Args:
        ours: one template or several (their tensors in the transform's order).
        theirs: the same for the other library.
        transform: :class:`Identity` by default.
    """

    ours: str | tuple[str, ...]
    theirs: str | tuple[str, ...]
    transform: Transform = field(default_factory=Identity)

    def side(self, name: str) -> tuple[str, ...]:
        t = self.ours if name == "ours" else self.theirs
        return (t,) if isinstance(t, str) else tuple(t)


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _pattern(template: str) -> re.Pattern:
    parts, pos = [], 0
    for m in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[pos : m.start()]))
        parts.append(f"(?P<{m.group(1)}>[^.]+)")
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts) + r"\Z")


class KeyMap:
    """Rules plus ties and ignored names; converts state dicts both ways.

    Args:
        rules: the correspondences.
        tied_ours, tied_theirs: ``copy name -> source name`` of tensors a side stores twice (a
            decoder tied to the embeddings). A copy is filled in on the way into its side and
            left out on the way out of it.
        ignore_ours, ignore_theirs: regular expressions of names a side may hold that have no
            counterpart (non-persistent buffers some versions saved, a pooler attnlab has not).

    Raises:
        ValueError: a rule whose two sides use different placeholders.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        tied_ours: Mapping[str, str] | None = None,
        tied_theirs: Mapping[str, str] | None = None,
        ignore_ours: Iterable[str] = (),
        ignore_theirs: Iterable[str] = (),
    ) -> None:
        self.rules = list(rules)
        for r in self.rules:
            names = [set(_PLACEHOLDER.findall(t)) for t in (*r.side("ours"), *r.side("theirs"))]
            if any(n != names[0] for n in names):
                raise ValueError(f"rule {r}: every template needs the same placeholders")
        self.tied = {"ours": dict(tied_ours or {}), "theirs": dict(tied_theirs or {})}
        self.ignore = {
            "ours": [re.compile(p) for p in ignore_ours],
            "theirs": [re.compile(p) for p in ignore_theirs],
        }
        self._patterns = {
            side: [[_pattern(t) for t in r.side(side)] for r in self.rules]
            for side in ("ours", "theirs")
        }

    def strip(self, state_dict: Mapping[str, Tensor], side: str = "theirs") -> dict[str, Tensor]:
        """``state_dict`` of ``side`` (``ours`` | ``theirs``) without its ignored names and tied
        copies: what the rules must account for."""
        return {
            n: t
            for n, t in state_dict.items()
            if n not in self.tied[side] and not any(p.search(n) for p in self.ignore[side])
        }

    def to_theirs(self, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """attnlab names -> the other library's (its tied copies left out).

        Raises:
            UserError: a tensor no rule, tie or ignore pattern claims, or an incomplete rule.
        """
        return self._convert(state_dict, "ours", "theirs")

    def to_ours(self, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The other library's names -> attnlab's (attnlab's tied copies filled in).

        Raises:
            UserError: a tensor no rule, tie or ignore pattern claims, or an incomplete rule.
        """
        out = self._convert(state_dict, "theirs", "ours")
        for copy, source in self.tied["ours"].items():
            if source in out:
                out[copy] = out[source]
        return out

    def _convert(self, sd: Mapping[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
        groups: dict[tuple[int, tuple], dict[int, Tensor]] = {}
        unclaimed = []
        for name, tensor in self.strip(sd, src).items():
            for r, patterns in enumerate(self._patterns[src]):
                hit = next(
                    ((slot, m) for slot, p in enumerate(patterns) if (m := p.match(name))), None
                )
                if hit is not None:
                    slot, m = hit
                    groups.setdefault((r, tuple(sorted(m.groupdict().items()))), {})[slot] = tensor
                    break
            else:
                unclaimed.append(name)
        if unclaimed:
            raise UserError(
                f"unexpected tensors ({len(unclaimed)}), no rule maps them: "
                + ", ".join(sorted(unclaimed)[:10])
                + (" ..." if len(unclaimed) > 10 else "")
            )
        out: dict[str, Tensor] = {}
        for (r, binding), slots in groups.items():
            rule, values = self.rules[r], dict(binding)
            templates = rule.side(src)
            if len(slots) != len(templates):
                missing = [t.format(**values) for k, t in enumerate(templates) if k not in slots]
                raise UserError(f"missing tensors: {', '.join(missing)}")
            tensors = [slots[k] for k in range(len(templates))]
            targets = rule.side(dst)
            convert = rule.transform.to_theirs if dst == "theirs" else rule.transform.to_ours
            converted = convert(tensors, len(targets))
            for t, x in zip(targets, converted):
                out[t.format(**values)] = x
        return out


def check_shapes(
    expected: Mapping[str, Sequence[int]],
    got: Mapping[str, Sequence[int]],
    *,
    optional: Iterable[str] = (),
    where: str = "the checkpoint",
) -> None:
    """Compare tensor names and shapes with what a model needs, before anything is loaded.

    Args:
        expected: name -> shape the model needs.
        got: name -> shape the checkpoint holds (names already filtered of ignored ones).
        optional: expected names a checkpoint may lack (tied copies).
        where: how to name the checkpoint in the message.

    Raises:
        UserError: listing missing and unexpected names and shape mismatches (both shapes).
    """
    optional = set(optional)
    missing = sorted(set(expected) - set(got) - optional)
    extra = sorted(set(got) - set(expected))
    wrong = sorted(n for n in set(expected) & set(got) if tuple(expected[n]) != tuple(got[n]))
    problems = []
    if wrong:
        problems.append(
            "shape mismatches: "
            + "; ".join(
                f"{n} is {list(got[n])} but the config implies {list(expected[n])}"
                for n in wrong[:10]
            )
        )
    if missing:
        problems.append(f"missing tensors ({len(missing)}): " + ", ".join(missing[:10]))
    if extra:
        problems.append(f"unexpected tensors ({len(extra)}): " + ", ".join(extra[:10]))
    if problems:
        raise UserError(
            f"{where} does not fit its config, nothing was loaded: " + " | ".join(problems)
        )
