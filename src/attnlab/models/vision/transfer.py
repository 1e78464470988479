"""Transfer: start an image classifier from another one's trained weights (pre-train on a large
set, fine-tune on a small one; ``attnlab train image --init-from RUN``).

What is copied: every tensor of the target's ``state_dict`` (parameters and persistent buffers,
e.g. a CNN's batch-norm statistics) from the source, by name, except the classification head
(``head.*``, and a DeiT's ``head_dist.*``) when the two do not score the same classes in the same
order (their configs' ``labels`` and ``num_classes``): then the head keeps its fresh
initialisation, a new head for the new classes. Nothing else is re-initialised, nothing is
resampled: a tensor whose name or shape differs is refused, and the message names the config
fields in which the two models differ (``patch_size 4 there, 2 here``), so a ViT of another
image size or patch size, another width or depth, or another kind of model is refused by name.
A Swin or a CNN without absolute positions holds the same tensors at every image size, so it
transfers across image sizes.

    report = transfer_weights(pretrained, model, source="runs/pretrain")
    print(report.describe())

Shape legend: L classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from attnlab.errors import UserError

__all__ = ["HEAD_PREFIXES", "Transfer", "transfer_weights", "same_classes"]

#: the tensors that score classes: re-initialised when the classes differ
HEAD_PREFIXES = ("head.", "head_dist.")
#: config fields that follow the data's classes, not the architecture
_CLASS_FIELDS = ("num_classes", "labels")


@dataclass
class Transfer:
    """What :func:`transfer_weights` did.

    Attributes:
        source: the source's name in messages (its run directory).
        copied: names of the tensors copied from the source.
        reinitialised: names of the head tensors left at their fresh initialisation.
        values: number of values copied.
        classes: ``(source classes, target classes)`` counts.
    """

    source: str
    copied: list[str] = field(default_factory=list)
    reinitialised: list[str] = field(default_factory=list)
    values: int = 0
    classes: tuple[int, int] = (0, 0)

    def describe(self) -> str:
        """One line: how many tensors came from where, and which head (if any) is new."""
        text = (
            f"initialised from {self.source}: {len(self.copied)} tensors "
            f"({self.values:,} values) copied"
        )
        if self.reinitialised:
            there, here = self.classes
            text += (
                f", a new head ({', '.join(self.reinitialised)} initialised afresh: "
                f"{there} classes there, {here} here)"
            )
        else:
            text += ", the head too (the same classes)"
        return text


def same_classes(source: nn.Module, target: nn.Module) -> bool:
    """Whether two classifiers score the same classes in the same order (labels and count)."""
    a, b = source.config, target.config
    return a.num_classes == b.num_classes and list(a.labels) == list(b.labels)


def _config_differences(source: nn.Module, target: nn.Module) -> list[str]:
    a, b = source.config, target.config
    out = []
    for f in dataclasses.fields(b):
        if f.name in _CLASS_FIELDS or not hasattr(a, f.name):
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            out.append(f"{f.name} {va!r} there, {vb!r} here")
    return out


def _is_head(name: str) -> bool:
    return name.startswith(HEAD_PREFIXES)


def transfer_weights(source: nn.Module, target: nn.Module, *, source_name: str) -> Transfer:
    """Copy ``source``'s weights into ``target`` (in place); see the module docstring.

    Args:
        source: the trained classifier (a ViT, DeiT, Swin or CNN).
        target: the freshly built classifier of the new run.
        source_name: the source in messages (``"runs/pretrain"``).

    Returns:
        What was copied and what was left at its initialisation.

    Raises:
        UserError: another kind of model, or a tensor (outside the head) that one of the two
            lacks or holds in another shape; the message names the source and the config fields
            in which the models differ.
    """
    src_kind = getattr(source, "kind", type(source).__name__)
    dst_kind = getattr(target, "kind", type(target).__name__)
    if src_kind != dst_kind:
        raise UserError(
            f"--init-from {source_name} holds a {src_kind!r} model, this run trains a "
            f"{dst_kind!r}: initialise from a run of the same kind (--model {src_kind})"
        )
    theirs, mine = source.state_dict(), target.state_dict()
    keep_head = same_classes(source, target)
    body = lambda names: {k for k in names if not _is_head(k)}  # noqa: E731
    missing = sorted(body(mine) - body(theirs))
    extra = sorted(body(theirs) - body(mine))
    reshaped = sorted(
        k for k in body(mine) & body(theirs) if tuple(mine[k].shape) != tuple(theirs[k].shape)
    )
    if missing or extra or reshaped:
        what = []
        if reshaped:
            shapes = ", ".join(
                f"{k} {tuple(theirs[k].shape)} there, {tuple(mine[k].shape)} here"
                for k in reshaped[:3]
            )
            what.append(f"tensors of other shapes ({shapes}{', …' if len(reshaped) > 3 else ''})")
        if missing or extra:
            names = (missing + extra)[:3]
            what.append(f"tensors only one of them has ({', '.join(names)}"
                        f"{', …' if len(missing) + len(extra) > 3 else ''})")  # fmt: skip
        diffs = _config_differences(source, target)
        because = f"; the configs differ in: {'; '.join(diffs)}" if diffs else ""
        raise UserError(
            f"--init-from {source_name}: its {src_kind} does not fit this run's: "
            f"{' and '.join(what)}{because}. Build the same architecture (as --set or --config; "
            "the image size too where the model has absolute positions)"
        )
    copy = [k for k in mine if keep_head or not _is_head(k)]
    with torch.no_grad():
        for k in copy:
            mine[k].copy_(theirs[k].to(mine[k].device, mine[k].dtype))
    return Transfer(
        source_name,
        copied=copy,
        reinitialised=[k for k in mine if k not in set(copy)],
        values=sum(mine[k].numel() for k in copy),
        classes=(source.config.num_classes, target.config.num_classes),
    )
