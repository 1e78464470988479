"""Per-head diagnostics as heatmaps: one panel per score, blocks as rows, heads as columns.

Shape legend: L blocks (of every stack, self- and cross-attention), H heads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from attnlab.inspect.diagnostics import HeadScores
from attnlab.plotting import pyplot, save_png

__all__ = ["plot_head_scores", "SCORES"]

#: the panels, in order: (HeadScores field, title)
SCORES = [
    ("uniformity", "uniformity (1 = uniform)"),
    ("previous_token", "previous token"),
    ("first_token", "first token (sink)"),
    ("diagonal", "diagonal"),
    ("induction", "induction"),
    ("duplicate_token", "duplicate token"),
    ("loss_delta", "loss change when ablated"),
    ("alignment", "agreement with the alignment"),
]


def plot_head_scores(scores: Sequence[HeadScores], path: str | os.PathLike) -> list[str]:
    """Draw the measured scores of ``scores`` (one panel each) into a PNG at ``path``.

    Degenerate heads (with flags) are marked with a cross.

    Returns:
        The names of the panels drawn.
    """
    plt = pyplot()

    rows = list(dict.fromkeys((s.stack, s.attention, s.layer) for s in scores))
    n_heads = max(s.head for s in scores) + 1
    panels = [(f, t) for f, t in SCORES if any(getattr(s, f) is not None for s in scores)]
    cols = min(4, len(panels))
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(
        n_rows, cols, figsize=(3.2 * cols, 0.45 * len(rows) * n_rows + 1.6 * n_rows), squeeze=False
    )
    labels = [f"{stack}.{layer}" + (" ×" if kind == "cross" else "") for stack, kind, layer in rows]
    for ax, (field, title) in zip(axes.flat, panels):
        grid = np.full((len(rows), n_heads), np.nan)
        for s in scores:
            v = getattr(s, field)
            if v is not None:
                grid[rows.index((s.stack, s.attention, s.layer)), s.head] = v
        signed = field == "loss_delta"
        lim = np.nanmax(np.abs(grid)) if signed and np.isfinite(grid).any() else 1.0
        im = ax.imshow(
            grid,
            cmap="RdBu_r" if signed else "viridis",
            vmin=-lim if signed else 0.0,
            vmax=lim if signed else 1.0,
            aspect="auto",
        )
        for s in scores:
            if s.flags:
                ax.text(
                    s.head,
                    rows.index((s.stack, s.attention, s.layer)),
                    "×",
                    ha="center",
                    va="center",
                    color="red",
                    fontsize=11,
                )
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(n_heads))
        ax.set_xlabel("head", fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=7)
        fig.colorbar(im, ax=ax, shrink=0.8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("attention heads (× degenerate; rows marked × are cross-attention)", fontsize=9)
    save_png(fig, path)
    return [f for f, _ in panels]
