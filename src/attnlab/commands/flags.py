"""Flag tables: a command's options as rows of data, registered in one loop.

A row is ``(flag, kind, default, help)`` with an optional fifth item, a dict of further
``add_argument`` keywords (``metavar``, ``nargs``, ``dest``...). ``kind`` says what the flag
reads:

- ``None``: a string;
- a list or tuple: one of these choices;
- an action's name (``"store_true"``, ``"store_false"``, ``"append"``...) or an
  ``argparse.Action`` class;
- anything else: the ``type`` callable (``int``, ``float``, a parser of comma lists...).

    add_flags(parser, [
        ("--beam", int, 1, "beam width (1 = greedy)"),
        ("--weights", ["best", "last"], "best", WEIGHTS_HELP),
        ("--overwrite", "store_true", None, "replace what --out already holds"),
    ])
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from attnlab.errors import UserError

__all__ = ["add_command", "add_flags", "at_least_one", "pick"]


def add_flags(parser, rows: Iterable[tuple]) -> None:
    """Register every row of a flag table on ``parser`` (a parser or an argument group).

    Args:
        parser: where the flags go.
        rows: ``(flag, kind, default, help[, keywords])`` rows, in the order ``--help`` lists
            them (``flag`` may be a tuple of names: ``("-n", "--max-new-tokens")``). A ``None`` default of an action or a positional is argparse's own (False for
            ``store_true``).
    """
    for flag, kind, default, text, *more in rows:
        names = flag if isinstance(flag, tuple) else (flag,)  # ("-n", "--max-new-tokens")
        kw: dict[str, Any] = {"help": text}
        if isinstance(kind, (list, tuple)):
            kw["choices"] = kind
        elif isinstance(kind, str) or (
            isinstance(kind, type) and issubclass(kind, argparse.Action)
        ):
            kw["action"] = kind
        elif kind is not None:
            kw["type"] = kind
        if default is not None or ("action" not in kw and names[0].startswith("-")):
            kw["default"] = default  # (argparse marks a '*' positional given one not required)
        if more:
            kw.update(more[0])
        parser.add_argument(*names, **kw)


def add_command(subparsers, name: str, *, func, flags: Iterable[tuple] = (), **kwargs: Any):
    """Add sub-command ``name`` with its flag table, run by ``func(args) -> int``.

    Args:
        subparsers: the sub-command collection (``groups["top"]``, ``groups["experiment"]``).
        name: the sub-command's name.
        func: what runs it.
        flags: its :func:`add_flags` rows.
        **kwargs: ``help``, ``description``... of ``add_parser``.

    Returns:
        The sub-command's parser.
    """
    p = subparsers.add_parser(name, **kwargs)
    add_flags(p, flags)
    p.set_defaults(func=func)
    return p


def pick(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """``{name: args.name}`` for the given flag destinations (keyword arguments of a call)."""
    return {name: getattr(args, name) for name in names}


def at_least_one(args: argparse.Namespace, *names: str) -> None:
    """Refuse a flag below 1 (``--beam 0``), in the order given; ``None`` means not given.

    Raises:
        UserError: ``--NAME must be at least 1, got VALUE`` for the first one below 1.
    """
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
