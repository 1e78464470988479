"""Errors that mean "the user asked for something that cannot work" (not a bug in attnlab).

The CLI prints these as one clear line and exits with status 2; library callers can catch them.
``UserError`` subclasses ``ValueError`` so code that already expects ``ValueError`` keeps working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["UserError", "RunDirError", "closest", "did_you_mean"]


class UserError(ValueError):
    """Bad input: a config value, a file, a shape, a path. The message names the problem."""


class RunDirError(UserError):
    """A run directory that is missing, corrupted, foreign, or would be overwritten."""


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word closest to ``word`` (a typo, or an abbreviation of exactly one), or None.

    Args:
        word: what was typed (``--stpes``, ``tinyy``, ``alibo``).
        known: the valid words.
    """
    known = [str(k) for k in known]
    prefixed = [k for k in known if k.startswith(word)] if len(word) > 3 else []
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest known word, or ``""`` when none is close."""
    close = closest(str(word), known)
    return f" (did you mean {close}?)" if close is not None else ""
