"""matplotlib's ``pyplot`` for PNG files (no display needed), imported on first use."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from attnlab.fileio import atomic_save

__all__ = ["pyplot", "save_png"]


def pyplot():
    """The ``matplotlib.pyplot`` module.

    The Agg backend is chosen only where nothing chose one before: a pyplot already in use or
    ``MPLBACKEND`` (Jupyter's inline backend) is left as it is, so training in a notebook does
    not stop the notebook's own figures from showing.
    """
    import matplotlib  # heavy (about a second): imported only when a figure is drawn

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, as above; after the backend is chosen

    return plt


def save_png(fig, path: str | Path, *, dpi: int = 110) -> None:
    """Lay ``fig`` out tightly, write it to ``path`` as a PNG atomically, and close it."""
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    pyplot().close(fig)
