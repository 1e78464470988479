"""The argument parser of every ``attnlab`` command and sub-command.

``attnlab`` builds all its parsers from :class:`Parser` (``cli.py`` passes it as
``add_subparsers(parser_class=Parser)``, and nested sub-command groups inherit it), so three rules
hold everywhere, without code in the commands:

- a flag means exactly what is typed: abbreviations are off (``--step`` is not ``--steps``);
- a mistake is one line, ``attnlab: error: ...``, found by the sub-command that did not
  understand it (its flags are the ones suggested; the usage block is ``--help``'s job);
- an unknown flag or sub-command name that is close to a known one gets a suggestion:
  ``attnlab: error: unknown flag --stpes (did you mean --steps?)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attnlab.errors import closest

__all__ = ["Parser", "suggest"]


def suggest(word: str, known: Sequence[str]) -> str | None:
    """The known word closest to ``word`` (a typo or an abbreviation), or None.

    Args:
        word: what was typed (``--stpes``; ``--stpes=100`` is compared without its value).
        known: the valid words (option strings or sub-command names).
    """
    return closest(word.split("=", 1)[0], known)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations, erring in the sub-command that failed.

    Args:
        *args, **kwargs: as for ``argparse.ArgumentParser`` (``allow_abbrev`` defaults to False).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """Parse, and reject leftovers here, so the error names this (sub-)command's usage.

        argparse hands a sub-command's unknown arguments back to the top-level parser, which
        would print the top-level usage; every ``attnlab`` parser rejects them itself instead.
        """
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            extras = self._more_positionals(namespace, extras)
        if extras:
            self.error(self._unrecognized(extras))
        return namespace, extras

    def _more_positionals(self, namespace: argparse.Namespace, extras: list[str]) -> list[str]:
        """Words typed after a flag that belong to a list positional (``attnlab translate RUN
        --beam 4 "twenty one"``): argparse reads a positional once, so it leaves them over."""
        many = [
            a
            for a in self._actions
            if not a.option_strings and a.nargs in ("*", "+") and a.dest != argparse.SUPPRESS
        ]
        if len(many) != 1 or any(w.startswith("-") for w in extras):
            return extras
        values = getattr(namespace, many[0].dest, None)
        setattr(namespace, many[0].dest, [*(values or []), *extras])
        return []

    def _unrecognized(self, extras: list[str]) -> str:
        """``unknown flag --stesp (did you mean --steps?)``; words that are not flags (the value
        after an unknown flag is not named) as ``unexpected argument(s)``."""
        flags = [w for w in extras if w.startswith("-") and len(w) > 1]
        if not flags:
            return f"unexpected argument(s): {' '.join(extras)}"
        options = [s for s in self._option_string_actions if s.startswith("--")]
        hints = []
        for word in flags:
            close = suggest(word, options) if word.startswith("--") else None
            if close is not None and close not in hints:
                hints.append(close)
        what = "unknown flag" if len(flags) == 1 else "unknown flags"
        message = f"{what} {' '.join(w.split('=', 1)[0] for w in flags)}"
        if hints:
            return message + f" (did you mean {' or '.join(hints)}?)"
        return message + f" (see '{self.prog} --help')"

    def error(self, message: str):
        """One line on stderr, ``attnlab: error: MESSAGE``, and exit status 2 (argparse would
        print the usage block first: 21 lines for one mistyped flag)."""
        if "did you mean" not in message and "--help" not in message:
            message += f" (see '{self.prog} --help')"
        self.exit(2, f"attnlab: error: {message}\n")

    def print_usage(self, file=None) -> None:  # (argparse calls it before error)
        if file is not sys.stderr:
            super().print_usage(file)

    def _check_value(self, action: argparse.Action, value) -> None:
        """An unknown sub-command or choice: the argparse message plus the closest valid one."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            choices = [str(c) for c in action.choices or ()]
            close = suggest(str(value), choices) if isinstance(value, str) else None
            hint = f" (did you mean {close}?)" if close is not None else ""
            if isinstance(action, argparse._SubParsersAction):  # `attnlab trian`
                known = hint or f"; choose from {', '.join(choices)}"
                raise argparse.ArgumentError(None, f"unknown command {value!r}{known}") from None
            if close is None:
                raise
            raise argparse.ArgumentError(action, f"{err.message}{hint}") from None
