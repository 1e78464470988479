"""Errors that mean "the user asked for something that cannot work" (not a bug in attnlab).

The CLI prints these as one clear line and exits with status 2; library callers can catch them.
``UserError`` subclasses ``ValueError`` so code that already expects ``ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = ["UserError", "RunDirError"]


class UserError(ValueError):
    """Bad input: a config value, a file, a shape, a path. The message names the problem."""


class RunDirError(UserError):
    """A run directory that is missing, corrupted, foreign, or would be overwritten."""
