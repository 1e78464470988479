"""Attention heatmaps: one matrix of weights, query tokens as rows and key tokens as columns.

Tick labels stay readable: horizontal when a row of them fits (slanted otherwise), at a legible
size, and only every k-th one when there are more than :data:`MAX_TICKS` (the axis label says so). Every map has a colour bar (a grid shares one scale and one bar).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from attnlab.runs import atomic_save

__all__ = ["plot_attention", "plot_attention_grid", "MAX_TICKS", "tick_labels"]

#: at most this many tick labels on an axis; longer inputs show every k-th token
MAX_TICKS = 40


def tick_labels(tokens: Sequence[str], limit: int = MAX_TICKS) -> tuple[list[int], list[str], int]:
    """``(positions, labels, k)``: every k-th token, k the smallest step that shows at most
    ``limit`` of them (k = 1: all)."""
    k = max(1, -(-len(tokens) // limit))
    positions = list(range(0, len(tokens), k))
    return positions, [str(tokens[i]) for i in positions], k


def _label_axis(ax, axis: str, tokens: Sequence[str] | None, n: int, name: str, size: int) -> None:
    """Ticks of one axis (``x`` or ``y``) from ``tokens`` (or none), and its label."""
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    label = ax.set_xlabel if axis == "x" else ax.set_ylabel
    if tokens is None or len(tokens) != n:
        setter([])
        label(name)
        return
    positions, labels, k = tick_labels(tokens)
    room = 60 if size >= 9 else 24  # characters a row of labels fits in (figure or one panel)
    long = axis == "x" and len(labels) * max((len(t) for t in labels), default=0) > room
    if axis == "x":
        ax.set_xticks(
            positions,
            labels,
            fontsize=size,
            rotation=45 if long else 0,
            ha="right" if long else "center",
        )
    else:
        ax.set_yticks(positions, labels, fontsize=size)
    label(name if k == 1 else f"{name} (1 in {k} of {n} labelled)")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _grid(w: torch.Tensor, path, rows, cols, title) -> None:
    plt = _plt()
    panels = [*w, w.mean(0)]
    names = [f"head {i}" for i in range(w.shape[0])] + ["mean of the heads"]
    n = len(panels)
    fig, axes = plt.subplots(
        1, n, figsize=(min(3.2 * n + 1, 26), 3.6), squeeze=False, layout="constrained"
    )
    top = float(w.max()) if w.numel() else 1.0
    for ax, p, name in zip(axes[0], panels, names):
        im = ax.imshow(p.numpy(), cmap="viridis", aspect="auto", vmin=0.0, vmax=top)
        ax.set_title(name, fontsize=9)
        _label_axis(ax, "x", cols, p.shape[1], "keys", 7)
        first = ax is axes[0][0]
        _label_axis(ax, "y", rows if first else None, p.shape[0], "queries" if first else "", 7)
    fig.colorbar(im, ax=list(axes[0]), fraction=0.02, pad=0.01, label="attention weight")
    if title:
        fig.suptitle(title, wrap=True)
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
