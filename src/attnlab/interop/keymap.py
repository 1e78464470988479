"""Checkpoint conversion as data: a declarative key map from which both directions are derived.

A :class:`KeyMap` is a list of :class:`Rule` objects, each pairing attnlab names with another
library's names (templates with ``{placeholders}``) and a :class:`Transform` that turns the
tensors of one side into the other's and back::

    Rule("blocks.{i}.attn.qkv.{w}",
         ("layer.{i}.query.{w}", "layer.{i}.key.{w}", "layer.{i}.value.{w}"),
         Concat(dim=0))                       # ours = cat(theirs); theirs = split(ours)

``to_theirs(state_dict)`` and ``to_ours(state_dict)`` apply the rules in either direction; tied
copies (a decoder that shares the embedding matrix) are declared once per side, names that a
side stores but the other has no use for (buffers, a pooler) are declared ``ignore``, and older
names of the other side are declared ``renames`` (old template -> current template). Every source
tensor must be claimed by a rule, a tie or an ignore pattern, and every rule instance must find
all its tensors: a map never drops or invents a weight silently.

Transforms (each a pair of inverse maps; shape legend E experts, I FFN width, C width):

- :class:`Identity`: one tensor, the same on both sides.
- :class:`Transpose`: ``theirs = oursᵀ`` (GPT-2's Conv1D stores ``(in, out)``).
- :class:`Concat`: ``ours = cat(theirs, dim)`` (a fused Q|K|V, with GQA sizes).
- :class:`Stack`: ``ours = stack(each(group) for group in theirs, dim)`` (per-expert weights
  stacked into ``(E, ...)``; ``each`` fuses one expert's tensors, e.g. ``Concat`` of w1 | w3).
- :class:`LeadingOnes`: ours has ``n`` extra leading dimensions of size 1 (a class token
  ``(1, 1, C)`` stored as ``(C,)``).
- :class:`ZeroBias`: theirs also holds a bias that is zero and ours has not.
- :class:`Chain` (composition, applied left to right towards theirs) and :class:`Inverse`
  (the two directions swapped: ours holds the zero bias).

Placeholders match one name component (``[^.]+``); the same placeholder values bind both sides.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnlab.errors import UserError

__all__ = [
    "Transform",
    "Identity",
    "Transpose",
    "Concat",
    "Stack",
    "LeadingOnes",
    "ZeroBias",
    "Chain",
    "Inverse",
    "Rule",
    "KeyMap",
    "check_shapes",
]


class Transform:
    """How the tensors of one rule change between the two sides: a pair of inverse maps.

    ``to_theirs(ours, n)`` and ``to_ours(theirs, n)`` take the tensors of one side in the order
    of the rule's templates and return the ``n`` tensors of the other side. A transform raises
    ``ValueError`` for tensors it cannot convert; the key map names them in a ``UserError``.
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
class Transpose(Transform):
    """Theirs is ours transposed (GPT-2's Conv1D stores ``(in, out)``; a 1-D bias is unchanged)."""

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [t.t() for t in tensors]

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [t.t() for t in tensors]


@dataclass(frozen=True)
class Concat(Transform):
    """Ours is theirs concatenated along ``dim`` (a fused Q|K|V projection, gate|up).

    Args:
        dim: the concatenation dimension.
        sizes: the size of each of theirs along ``dim`` (None: ``n`` equal parts; grouped-query
            attention's Q|K|V needs them).
    """

    dim: int = 0
    sizes: tuple[int, ...] | None = None

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [torch.cat(list(tensors), dim=self.dim)]

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        (fused,) = tensors
        if self.sizes is not None:
            if sum(self.sizes) != fused.shape[self.dim]:
                raise ValueError(f"cannot split {list(fused.shape)} into {list(self.sizes)}")
            return list(fused.split(list(self.sizes), dim=self.dim))
        if fused.shape[self.dim] % n:
            raise ValueError(f"cannot split {list(fused.shape)} into {n} equal parts")
        return list(fused.chunk(n, dim=self.dim))


@dataclass(frozen=True)
class Stack(Transform):
    """Ours stacks ``n`` groups of theirs along a new ``dim`` (one group per expert).

    Theirs are taken in order, ``len(theirs) // n`` per group; ``each`` turns one group into the
    one tensor stacked (and back).

    Args:
        dim: the new dimension in ours.
        n: how many groups (experts); None: one tensor per group.
        each: the transform of one group (default: the tensor itself).
    """

    dim: int = 0
    n: int | None = None
    each: Transform = field(default_factory=Identity)

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        groups = self.n or len(tensors)
        if len(tensors) % groups:
            raise ValueError(f"{len(tensors)} tensors do not form {groups} equal groups")
        k = len(tensors) // groups
        parts = [self.each.to_ours(list(tensors[g * k : (g + 1) * k]), 1)[0] for g in range(groups)]
        return [torch.stack(parts, dim=self.dim)]

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        (stacked,) = tensors
        parts = stacked.unbind(self.dim)
        groups = self.n or n
        if len(parts) != groups or n % groups:
            raise ValueError(
                f"{list(stacked.shape)} does not hold {groups} groups along {self.dim}"
            )
        return [t for p in parts for t in self.each.to_theirs([p], n // groups)]


@dataclass(frozen=True)
class LeadingOnes(Transform):
    """Ours is theirs with ``n`` leading dimensions of size 1 (``(C,)`` <-> ``(1, 1, C)``)."""

    n: int = 1

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [t.reshape((1,) * self.n + tuple(t.shape)) for t in tensors]

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        out = []
        for t in tensors:
            if tuple(t.shape[: self.n]) != (1,) * self.n:
                raise ValueError(f"{list(t.shape)} does not start with {self.n} dimension(s) of 1")
            out.append(t.reshape(t.shape[self.n :]))
        return out


@dataclass(frozen=True)
class ZeroBias(Transform):
    """Theirs holds ours plus a bias (last of theirs) that must be zero: ``(out,)`` of the first.

    A bias-free attnlab layer written where the other library always has a bias (GPT-2), or,
    through :class:`Inverse`, a zero bias of attnlab's single ``bias`` switch that the other
    side's checkpoint leaves out (Llama with attention biases but no MLP biases).
    """

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return [*tensors, tensors[0].new_zeros(tensors[0].shape[0])]

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        *rest, bias = tensors
        if bias.device.type != "meta" and bias.any():  # meta: shapes only, no values
            raise ValueError("the bias is not zero, so the other side cannot leave it out")
        return rest


@dataclass(frozen=True)
class Chain(Transform):
    """Transforms applied in turn: left to right towards theirs, right to left towards ours.

    ``n`` reaches every step; give :class:`Concat` its ``sizes`` when it is not the last step.
    """

    steps: tuple[Transform, ...]

    def __init__(self, *steps: Transform) -> None:
        object.__setattr__(self, "steps", tuple(steps))

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        for step in self.steps:
            tensors = step.to_theirs(tensors, n)
        return tensors

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        for step in reversed(self.steps):
            tensors = step.to_ours(tensors, n)
        return tensors


@dataclass(frozen=True)
class Inverse(Transform):
    """``transform`` with its two directions swapped."""

    transform: Transform

    def to_theirs(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return self.transform.to_ours(tensors, n)

    def to_ours(self, tensors: list[Tensor], n: int) -> list[Tensor]:
        return self.transform.to_theirs(tensors, n)


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


def _same_placeholders(templates: Iterable[str], what: object) -> None:
    names = [set(_PLACEHOLDER.findall(t)) for t in templates]
    if any(n != names[0] for n in names):
        raise ValueError(f"{what}: every template needs the same placeholders")


class KeyMap:
    """Rules plus ties, ignored names and older names; converts state dicts both ways.

    Args:
        rules: the correspondences.
        tied_ours, tied_theirs: ``copy name -> source name`` of tensors a side stores twice (a
            decoder tied to the embeddings). A copy is filled in on the way into its side and
            left out on the way out of it (as ``save_pretrained`` does).
        ignore_ours, ignore_theirs: regular expressions of names a side may hold that have no
            counterpart (non-persistent buffers some versions saved, a pooler attnlab has not).
        renames: ``old template -> current template`` of the other side's names in older
            releases; names are renamed before anything else when read.

    Raises:
        ValueError: a rule or rename whose two sides use different placeholders.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        tied_ours: Mapping[str, str] | None = None,
        tied_theirs: Mapping[str, str] | None = None,
        ignore_ours: Iterable[str] = (),
        ignore_theirs: Iterable[str] = (),
        renames: Mapping[str, str] | None = None,
    ) -> None:
        self.rules = list(rules)
        for r in self.rules:
            _same_placeholders((*r.side("ours"), *r.side("theirs")), r)
        self.renames = [(_pattern(old), new) for old, new in (renames or {}).items()]
        for old, new in (renames or {}).items():
            _same_placeholders((old, new), f"rename {old!r}")
        self.tied = {"ours": dict(tied_ours or {}), "theirs": dict(tied_theirs or {})}
        self.ignore = {
            "ours": [re.compile(p) for p in ignore_ours],
            "theirs": [re.compile(p) for p in ignore_theirs],
        }
        self._patterns = {
            side: [[_pattern(t) for t in r.side(side)] for r in self.rules]
            for side in ("ours", "theirs")
        }

    def ignored(self, name: str, side: str = "theirs") -> bool:
        """Whether ``side`` (``ours`` | ``theirs``) may hold ``name`` with no counterpart."""
        return any(p.search(name) for p in self.ignore[side])

    def current_name(self, name: str) -> str:
        """A name of theirs under its current spelling (the first matching rename applied)."""
        for pattern, new in self.renames:
            if m := pattern.match(name):
                return new.format(**m.groupdict())
        return name

    def canonical(self, names: Iterable[str]) -> dict[str, str]:
        """``current name -> name as given`` for the names of theirs the rules must account for:
        older names renamed; ignored names and tied copies left out.

        Raises:
            UserError: two names that are the same tensor (an old and a current spelling).
        """
        out: dict[str, str] = {}
        for name in names:
            current = self.current_name(name)
            if current in self.tied["theirs"] or self.ignored(current):
                continue
            if current in out:
                raise UserError(f"{out[current]!r} and {name!r} are both {current!r}")
            out[current] = name
        return out

    def strip(self, state_dict: Mapping[str, Tensor], side: str = "theirs") -> dict[str, Tensor]:
        """``state_dict`` of ``side`` without its ignored names and tied copies (and, for theirs,
        under the current names): what the rules must account for."""
        if side == "theirs":
            return {c: state_dict[n] for c, n in self.canonical(state_dict).items()}
        return {
            n: t
            for n, t in state_dict.items()
            if n not in self.tied["ours"] and not self.ignored(n, "ours")
        }

    def to_theirs(self, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """attnlab names -> the other library's (its tied copies left out).

        Raises:
            UserError: a tensor no rule, tie or ignore pattern claims, an incomplete rule, or
                tensors a transform cannot convert (named).
        """
        return self._convert(self.strip(state_dict, "ours"), "ours", "theirs")

    def to_ours(self, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The other library's names (current or older) -> attnlab's (tied copies filled in).

        Raises:
            UserError: as :meth:`to_theirs`.
        """
        out = self._convert(self.strip(state_dict, "theirs"), "theirs", "ours")
        for copy, source in self.tied["ours"].items():
            if source in out:
                out[copy] = out[source]
        return out

    def _convert(self, sd: Mapping[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
        groups: dict[tuple[int, tuple], dict[int, Tensor]] = {}
        unclaimed = []
        for name, tensor in sd.items():
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
            sources = [t.format(**values) for t in rule.side(src)]
            if len(slots) != len(sources):
                missing = [s for k, s in enumerate(sources) if k not in slots]
                raise UserError(f"missing tensors: {', '.join(missing)}")
            targets = [t.format(**values) for t in rule.side(dst)]
            convert = rule.transform.to_theirs if dst == "theirs" else rule.transform.to_ours
            try:
                converted = convert([slots[k] for k in range(len(sources))], len(targets))
            except (ValueError, RuntimeError) as err:
                raise UserError(
                    f"cannot convert {', '.join(sources)} into {', '.join(targets)}: {err}"
                ) from None
            out.update(zip(targets, converted, strict=True))
        return out


def check_shapes(
    expected: Mapping[str, Sequence[int]],
    got: Mapping[str, Sequence[int]],
    *,
    given_names: Mapping[str, str] | None = None,
    optional: Collection[str] = (),
    what: str = "the checkpoint's tensors",
    source: str = "the checkpoint",
) -> None:
    """Compare tensor names and shapes with what a model needs, before anything is loaded.

    Args:
        expected: name -> shape the model needs.
        got: name -> shape the checkpoint holds (current names, ignored ones left out).
        given_names: current name -> the name in the checkpoint, for the messages.
        optional: expected names a checkpoint may lack.
        what: the subject of the message (``the weights in 'dir'``).
        source: where the tensors are (``the file``).

    Raises:
        UserError: listing shape mismatches (both shapes, the checkpoint's name), missing
            tensors (with the shape the config implies) and unexpected ones.
    """
    given = dict(given_names or {})
    missing = sorted(set(expected) - set(got) - set(optional))
    extra = sorted(given.get(n, n) for n in set(got) - set(expected))
    wrong = sorted(n for n in set(expected) & set(got) if tuple(expected[n]) != tuple(got[n]))
    problems = []
    if wrong:
        problems.append(
            "shape mismatches: "
            + "; ".join(
                f"{given.get(n, n)} has shape {list(got[n])} in {source} but the config "
                f"implies {list(expected[n])}"
                for n in wrong[:10]
            )
            + (f" (and {len(wrong) - 10} more)" if len(wrong) > 10 else "")
        )
    if missing:
        problems.append(
            f"missing tensors ({len(missing)}): "
            + ", ".join(f"{n} {list(expected[n])}" for n in missing[:10])
            + (" ..." if len(missing) > 10 else "")
        )
    if extra:
        problems.append(
            f"unexpected tensors ({len(extra)}): "
            + ", ".join(extra[:10])
            + (" ..." if len(extra) > 10 else "")
        )
    if problems:
        raise UserError(
            f"{what} do not match the config, nothing was loaded: " + " | ".join(problems)
        )
