"""Attention heatmaps: one matrix of weights, query tokens as rows and key tokens as columns."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from attnlab.runs import atomic_save

__all__ = ["plot_attention", "plot_attention_grid"]


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
    """Write a heatmap of ``weights (n_rows, n_cols)`` to ``path`` (PNG).

    Args:
        weights: attention weights, rows = queries (e.g. output tokens), cols = keys (source tokens).
        rows, cols: tick labels (tokens); omitted when None or too many to read.
        title: figure title.
    """
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"plot_attention needs a 2-D (rows, cols) matrix, got {tuple(w.shape)}")
    plt = _plt()
    h, wd = w.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * wd, 16), min(1.5 + 0.35 * h, 16)))
    im = ax.imshow(w.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if cols is not None and len(cols) == wd and wd <= 80:
        ax.set_xticks(range(wd), [str(c) for c in cols], rotation=90, fontsize=8)
    if rows is not None and len(rows) == h and h <= 80:
        ax.set_yticks(range(h), [str(r) for r in rows], fontsize=8)
    ax.set_xlabel("keys (attended to)")
    ax.set_ylabel("queries")
    if title:
        ax.set_title(title, wrap=True)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def plot_attention_grid(
    weights: torch.Tensor,
    path: str | os.PathLike,
    *,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """Heads side by side: ``weights (H, n_rows, n_cols)``, plus their average as the last panel."""
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 3:
        raise ValueError(f"plot_attention_grid needs (heads, rows, cols), got {tuple(w.shape)}")
    plt = _plt()
    panels = [*w, w.mean(0)]
    names = [f"head {i}" for i in range(w.shape[0])] + ["mean"]
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(min(3 * n, 24), 3.2), squeeze=False)
    for ax, p, name in zip(axes[0], panels, names):
        ax.imshow(p.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
        ax.set_title(name, fontsize=9)
        if cols is not None and len(cols) == p.shape[1] and p.shape[1] <= 40:
            ax.set_xticks(range(p.shape[1]), [str(c) for c in cols], rotation=90, fontsize=6)
        else:
            ax.set_xticks([])
        if rows is not None and len(rows) == p.shape[0] and p.shape[0] <= 40 and ax is axes[0][0]:
            ax.set_yticks(range(p.shape[0]), [str(r) for r in rows], fontsize=6)
        else:
            ax.set_yticks([])
    if title:
        fig.suptitle(title, wrap=True)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
