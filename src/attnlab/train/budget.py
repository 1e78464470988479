"""The budget rule's old import path: it lives in :mod:`attnlab.runspec.budget` now, next to the
run description that applies it (:func:`attnlab.runs.build_run`)."""

from attnlab.runspec.budget import *  # noqa: F401,F403
from attnlab.runspec.budget import __all__  # noqa: F401
