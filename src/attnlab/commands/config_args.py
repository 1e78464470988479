"""The flag helpers every ``attnlab train KIND`` shares: :func:`add_train_parser` (a command's
flag tables, the shared training flags, ``--config`` / ``--set``) and :func:`from_args` (a
dataclass from the flags named like its fields). Resolving the flags into a run is
:mod:`attnlab.train.launch` (re-exported here).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from attnlab.commands.flags import add_flags
from attnlab.train import add_train_args, train
from attnlab.train.launch import *  # noqa: F403 (the train commands' helpers, in one place)
from attnlab.train.launch import __all__ as _launch
from attnlab.train.launch import add_config_args, track_explicit

__all__ = [*_launch, "from_args", "add_train_parser", "train_started"]


def from_args(cls: type, args: argparse.Namespace, /, **extra: Any) -> Any:
    """Build the dataclass ``cls`` from the parsed flags whose ``dest`` names one of its fields.

    Fields without a flag keep their defaults; ``extra`` (flags named otherwise, derived
    values) wins over the flags.
    """
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.init and hasattr(args, f.name)
    }
    return cls(**{**values, **extra})


def add_train_parser(
    groups,
    name: str,
    func,
    *,
    sections: Iterable[tuple[str | None, Iterable[tuple]]],
    train: Mapping[str, Any],
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """``attnlab train NAME``: its flag tables, the shared training flags, ``--config`` / ``--set``.

    Args:
        groups: the sub-parser collections (``groups["train"]``).
        name, func: the sub-command and what runs it.
        sections: ``(argument group title or None, flag rows)`` in ``--help``'s order.
        train: the family's defaults for :func:`attnlab.train.add_train_args`.
        **kwargs: ``help``, ``description`` of ``add_parser``.
    """
    p = groups["train"].add_parser(name, **kwargs)
    for title, rows in sections:
        add_flags(p if title is None else p.add_argument_group(title), rows)
    add_train_args(p, **train)
    add_config_args(p)
    p.set_defaults(func=func)
    return track_explicit(p)


def train_started(args: argparse.Namespace, started, report, *, before=None) -> int:
    """Train a run that :func:`start_run` built and print ``report(spec, model, task, result)``.

    Args:
        started: ``(spec, model, task)``, or None (a complete resumed run: nothing to do).
        report: the lines after training (None: print nothing, e.g. on a rank other than 0).
        before: ``before(spec, model, task)``, called before training (to print what is trained).
    """
    if started is None:
        return 0
    spec, model, task = started
    if before is not None:
        before(spec, model, task)
    result = train(model, task, spec.train, args.out, resume=args.resume, overwrite=args.overwrite)
    text = report(spec, model, task, result)
    if text is not None:
        print(text)
    return 0
