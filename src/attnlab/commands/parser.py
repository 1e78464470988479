"""The argument parser of every ``attnlab`` command and sub-command.

``attnlab`` builds all its parsers from :class:`Parser` (``cli.py`` passes it as
``add_subparsers(parser_class=Parser)``, and nested sub-command groups inherit it), so three rules
hold everywhere, without code in the commands:

- a flag means exactly what is typed: abbreviations are off (``--step`` is not ``--steps``);
- a mistake is reported by the sub-command that did not understand it, with that sub-command's
  usage (``attnlab train lm: error: ...``), not the top-level one;
- an unknown flag or sub-command name that is close to a known one gets a suggestion:
  ``unrecognized arguments: --stpes 100 (did you mean --steps?)``.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

__all__ = ["Parser", "suggest"]


def suggest(word: str, known: Sequence[str]) -> str | None:
    """The known word closest to ``word`` (a typo or an abbreviation), or None.

    Args:
        word: what was typed (``--stpes``; ``--stpes=100`` is compared without its value).
        known: the valid words (option strings or sub-command names).
    """
    word = word.split("=", 1)[0]
    prefixed = [k for k in known if k.startswith(word)] if len(word) > 3 else []
    if len(prefixed) == 1:  # an abbreviation of exactly one flag
        return prefixed[0]
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


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
        message = f"unrecognized arguments: {' '.join(extras)}"
        options = [s for s in self._option_string_actions if s.startswith("--")]
        hints = []
        for word in extras:
            if word.startswith("--"):
                close = suggest(word, options)
                if close is not None and close not in hints:
                    hints.append(close)
        if hints:
            message += f" (did you mean {' or '.join(hints)}?)"
        return message

    def _check_value(self, action: argparse.Action, value) -> None:
        """An unknown sub-command or choice: the argparse message plus the closest valid one."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            choices = [str(c) for c in action.choices or ()]
            close = suggest(str(value), choices) if isinstance(value, str) else None
            if close is None:
                raise
            raise argparse.ArgumentError(action, f"{err.message} (did you mean {close}?)") from None
