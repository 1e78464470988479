"""The explorer inline in a notebook: ``attnlab.explore.show(model, inputs)``.

    from attnlab.explore import show
    show(model, idx)                              # in Jupyter: the explorer under the cell
    show(model, (src, src_mask, tgt_in), tokens={"src": [...], "tgt": [...]})
    show(model, idx).save("page.html")            # the same page as a file

``show`` runs the model once under :func:`attnlab.attention.capture_attention` (any attnlab model,
no run directory needed), builds the same payload as ``attnlab explore`` (one view per kind of
attention: self-attention per stack, cross-attention), with the per-head diagnostics, and returns
an object whose ``_repr_html_`` is the page in a sandboxed ``<iframe srcdoc>``: self-contained,
nothing fetched from anywhere (the page's Content-Security-Policy forbids every request).

Shape legend: B batch (only row ``index`` is shown), T tokens.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnlab.attention.capture import capture_attention
from attnlab.errors import UserError
from attnlab.explore.heads import add_head_rows
from attnlab.explore.page import render_page
from attnlab.explore.payload import check_size, group_layers, head_dim_of, make_view
from attnlab.fileio import atomic_write_text
from attnlab.inspect.families import causal_stacks
from attnlab.inspect.hooks import run_model

__all__ = ["Shown", "show"]


class Shown:
    """The explorer page for one input; Jupyter displays it through :meth:`_repr_html_`."""

    def __init__(self, payload: dict, height: int = 900) -> None:
        self.payload = payload
        self.height = height
        self.html = render_page(payload)

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" sandbox="allow-scripts" '
            f'style="width:100%;height:{self.height}px;border:1px solid #ddd"></iframe>'
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the page as a self-contained HTML file."""
        atomic_write_text(path, self.html)


def _labels(tokens: Any, key: str, n: int) -> list[str]:
    if isinstance(tokens, dict):
        tokens = tokens.get(key)
    if tokens is None or len(tokens) != n:
        return [str(i) for i in range(n)]
    return [str(t) for t in tokens]


def show(
    model: nn.Module,
    inputs: Any,
    *,
    tokens: Sequence[str] | dict[str, Sequence[str]] | None = None,
    index: int = 0,
    title: str | None = None,
    height: int = 900,
) -> Shown:
    """The explorer for ``model`` on ``inputs`` (a tensor or a tuple of the forward's arguments).

    Args:
        tokens: labels of the positions (default their numbers); for an encoder–decoder a dict
            ``{"src": [...], "tgt": [...]}``.
        index: which row of the batch to show.
        title: the page's input line (default the model's class).
        height: the inline frame's height in pixels.

    Raises:
        UserError: a model that recorded no attention, or a page too large to hold.
    """

    def row(x: Any) -> Any:  # the batch row ``index`` (every tensor argument has B first)
        return x[index : index + 1] if isinstance(x, torch.Tensor) and x.dim() > 0 else x

    one = tuple(row(x) for x in inputs) if isinstance(inputs, tuple) else row(inputs)
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), capture_attention(model, scores=True) as maps:
            run_model(model, one)
    finally:
        model.train(was)
    causal = causal_stacks(model)

    def classify(stack: str, attn: str, name: str) -> str:
        return f"{stack or 'model'} {'cross-attention' if attn == 'cross_attn' else attn}"

    groups = group_layers(maps, classify)
    if not groups:
        raise UserError(f"{type(model).__name__} recorded no attention for this input")
    views = []
    for view_id, layers in groups.items():
        w = layers[0].weights  # (H, Tq, Tk)
        stack = view_id.split(" ", 1)[0]
        cross = "cross" in view_id
        queries = _labels(tokens, "tgt" if stack == "decoder" or cross else "src", w.shape[-2])
        keys = _labels(tokens, "src" if cross or stack == "encoder" else "tgt", w.shape[-1])
        if not isinstance(tokens, dict):
            queries, keys = _labels(tokens, "", w.shape[-2]), _labels(tokens, "", w.shape[-1])
        is_causal = stack in causal and not cross
        views.append(
            make_view(
                view_id.replace(" ", "-"),
                view_id,
                layers,
                queries=queries,
                keys=keys,
                note="Row i: what position i attends to" + (" (causal)." if is_causal else "."),
                rollout=w.shape[-2] == w.shape[-1] and not cross,
                head_dim=head_dim_of(model, layers[0].name),
                query=w.shape[-2] - 1,
            )
        )
    check_size(views)
    payload = {
        "version": 1,
        "kind": type(model).__name__,
        "run": "(in memory)",
        "question": None,
        "family": "notebook",
        "input": title or f"{type(model).__name__} on one input",
        "summary": [f"{len(views)} views, {sum(len(v['layers']) for v in views)} layers"],
        "image": None,
        "views": views,
    }
    return Shown(add_head_rows(payload, model), height=height)
