"""Attention heatmaps: one matrix of weights, query tokens as rows and key tokens as columns.

Tick labels stay readable: horizontal (on the x axis upright where a row would overlap, never
slanted), at 9 pt, spaces and newlines shown as ``␣ ↵`` (:func:`visible`), and only every k-th one
when there are more than :data:`MAX_TICKS` (the axis label says so). Every map has a colour bar
(a grid shares one scale and one bar); a grid of heads is laid out three panels to a row.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from attnlab.plotting import pyplot, save_png
from attnlab.runs import atomic_save

__all__ = ["plot_attention", "plot_attention_grid", "MAX_TICKS", "tick_labels", "visible"]

#: at most this many tick labels on an axis; longer inputs show every k-th token
MAX_TICKS = 40


def tick_labels(tokens: Sequence[str], limit: int = MAX_TICKS) -> tuple[list[int], list[str], int]:
    """``(positions, labels, k)``: every k-th token, k the smallest step that shows at most
    ``limit`` of them (k = 1: all)."""
    k = max(1, -(-len(tokens) // limit))
    positions = list(range(0, len(tokens), k))
    return positions, [str(tokens[i]) for i in positions], k


#: how a token that prints as nothing (or moves the cursor) is labelled
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "": "∅"}


def visible(token: str) -> str:
    """A token as a tick label a person can read: spaces, newlines and tabs as ``␣ ↵ ⇥``
    (a leading space of a longer token too: ``␣the``)."""
    token = str(token)
    if token in VISIBLE:
        return VISIBLE[token]
    return "".join(VISIBLE.get(c, c) if c in "\n\t" else c for c in token).replace(" ", "␣")


def _label_axis(ax, axis: str, tokens: Sequence[str] | None, n: int, name: str, size: int) -> None:
    """Ticks of one axis (``x`` or ``y``) from ``tokens`` (or none), and its label.

    Labels are horizontal; on the x axis, where a row of them would overlap, they stand upright
    (rotated 90°, still read from the bottom), never slanted.
    """
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    label = ax.set_xlabel if axis == "x" else ax.set_ylabel
    if tokens is None or len(tokens) != n:
        setter([])
        label(name)
        return
    positions, labels, k = tick_labels([visible(t) for t in tokens])
    width_in = ax.get_position().width * ax.figure.get_figwidth()  # the axis's width, inches
    per_label = width_in * 72 / max(len(labels), 1)  # points per label
    longest = max((len(t) for t in labels), default=0)
    upright = axis == "x" and longest * size * 0.65 > per_label
    if axis == "x":
        ax.set_xticks(positions, labels, fontsize=size, rotation=90 if upright else 0)
    else:
        ax.set_yticks(positions, labels, fontsize=size, rotation=0)
    label(name if k == 1 else f"{name} (1 in {k} of {n} labelled)")


def _plt():
    plt = pyplot()

    return plt


def plot_attention(
    weights: torch.Tensor,
    path: str | os.PathLike,
    *,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """Write a heatmap of ``weights (n_rows, n_cols)`` to ``path`` (PNG); of ``(H, n_rows,
    n_cols)``, the heads side by side on one colour scale, plus their average as the last panel.

    Args:
        weights: attention weights, rows = queries (e.g. output tokens), cols = keys (source tokens).
        rows, cols: tick labels (tokens); omitted when None or too many to read.
        title: figure title.

    Raises:
        ValueError: ``weights`` is neither 2-D nor 3-D.
    """
    _draw(weights, path, (2, 3), rows, cols, title)


def plot_attention_grid(weights: torch.Tensor, path: str | os.PathLike, **labels) -> None:
    """:func:`plot_attention` of the heads ``weights (H, n_rows, n_cols)`` (3-D only).

    Raises:
        ValueError: ``weights`` is not 3-D.
    """
    _draw(weights, path, (3,), **labels)


def _draw(weights, path, dims: tuple[int, ...], rows=None, cols=None, title=None) -> None:
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() not in dims:
        wanted = " or ".join({2: "2-D (rows, cols)", 3: "3-D (heads, rows, cols)"}[d] for d in dims)
        raise ValueError(f"attention weights to plot must be {wanted}, got {tuple(w.shape)}")
    (_heatmap if w.dim() == 2 else _grid)(w, path, rows, cols, title)


def _heatmap(w: torch.Tensor, path, rows, cols, title) -> None:
    plt = _plt()
    h, wd = w.shape
    fig, ax = plt.subplots(
        figsize=(min(3 + 0.3 * min(wd, MAX_TICKS), 16), min(2 + 0.3 * min(h, MAX_TICKS), 16))
    )
    im = ax.imshow(w.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    _label_axis(ax, "x", cols, wd, "keys (attended to)", 9)
    _label_axis(ax, "y", rows, h, "queries", 9)
    if title:
        ax.set_title(title, wrap=True)
    save_png(fig, path)


def _grid(w: torch.Tensor, path, rows, cols, title) -> None:
    plt = _plt()
    panels = [*w, w.mean(0)]
    names = [f"head {i}" for i in range(w.shape[0])] + ["mean of the heads"]
    n = len(panels)
    n_cols = min(n, 3)
    n_rows = -(-n // n_cols)
    side = min(max(3.2, 0.17 * min(max(w.shape[1:]), MAX_TICKS) + 1.0), 7.0)  # inches a panel
    fig, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(side * n_cols + 1.2, side * n_rows + 0.8),
        squeeze=False,
        layout="constrained",
    )
    top = float(w.max()) if w.numel() else 1.0
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        p = panels[k]
        im = ax.imshow(p.numpy(), cmap="viridis", aspect="auto", vmin=0.0, vmax=top)
        ax.set_title(names[k], fontsize=10)
        bottom, left = k // n_cols == n_rows - 1 or k + n_cols >= n, k % n_cols == 0
        _label_axis(ax, "x", cols, p.shape[1], "keys (attended to)" if bottom else "", 9)
        _label_axis(ax, "y", rows if left else None, p.shape[0], "queries" if left else "", 9)
    fig.colorbar(im, ax=list(axes.flat), fraction=0.02, pad=0.01, label="attention weight")
    if title:
        fig.suptitle(title, wrap=True)
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
