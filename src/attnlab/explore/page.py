"""The explorer page: one self-contained HTML file (style, script and data inline).

The script (``explorer.js``, the drawing; ``explorer_form.js``, the served page's form) and the
style live in ``attnlab/explore/static/`` and are inlined when the page is built;
the payload is embedded as JSON. A Content-Security-Policy in the page forbids every request
(``connect-src 'none'``, images only from ``data:`` URLs), so the browser itself guarantees that
nothing leaves the file; the served page may talk to its own server only (``connect-src 'self'``).
"""

from __future__ import annotations

import html
import json
import os
from functools import cache
from importlib import resources

from attnlab.fileio import atomic_write_text

__all__ = ["render_page", "write_page"]


@cache
def _static(name: str) -> str:
    return resources.files("attnlab.explore").joinpath("static", name).read_text(encoding="utf-8")


def _json_for_script(value) -> str:
    """JSON that cannot end its ``<script>`` element early (``<`` is escaped everywhere)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(payload: dict | None, *, serve: dict | None = None) -> str:
    """The page's HTML.

    Args:
        payload: what to show (:meth:`attnlab.explore.Explorer.explain`), or None (a served page
            waiting for its first input).
        serve: for the served page: ``{"input": "text" | "image", "question": bool, "max_chars",
            "max_image_bytes"}`` (shows the input form); None for a file.
    """
    title = "attention explorer"
    if payload:
        title = f"{payload.get('kind', '')} · {payload.get('input', '')} — attention explorer"
    config = {"serve": serve}
    # one pass, so that nothing inserted (the data, the script) is searched for placeholders
    parts = {
        "__CONNECT__": "'self'" if serve else "'none'",
        "__TITLE__": html.escape(title[:200]),
        "__CSS__": _static("explorer.css"),
        "__JS__": _static("explorer.js")
        + "\n"
        + _static("explorer_form.js")
        + "\n"
        + _static("heads.js"),
        "__CONFIG__": _json_for_script(config),
        "__DATA__": _json_for_script(payload),
    }
    template = _static("page.html")
    out, pos = [], 0
    while True:
        nxt = min(
            ((template.find(k, pos), k) for k in parts if template.find(k, pos) >= 0),
            default=None,
        )
        if nxt is None:
            out.append(template[pos:])
            return "".join(out)
        at, key = nxt
        out.append(template[pos:at])
        out.append(parts[key])
        pos = at + len(key)


def write_page(payload: dict, path: str | os.PathLike) -> None:
    """Write the self-contained page for ``payload`` to ``path`` (atomically)."""
    atomic_write_text(path, render_page(payload))
