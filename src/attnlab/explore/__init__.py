"""attnlab.explore: the interactive attention explorer.

``Explorer(run).explain(ExploreInput(text=...))`` gives a JSON-able payload of every attention
layer's weights and raw scores for one input (one small module per family: ``text``, ``mlm``,
``translation``, ``vision``, ``caption``, ``vqa``); ``write_page`` turns it into one
self-contained HTML file; ``make_server`` serves the page on 127.0.0.1 and recomputes it for new
input; ``show(model, inputs)`` renders the page inline in a notebook (no run directory needed).
"""

from attnlab.explore.explorer import ExploreInput, Explorer, family_for
from attnlab.explore.notebook import Shown, show
from attnlab.explore.page import render_page, write_page
from attnlab.explore.server import make_server

__all__ = [
    "ExploreInput",
    "Explorer",
    "Shown",
    "family_for",
    "render_page",
    "write_page",
    "make_server",
    "show",
]
