"""Per-word attention of a captioner: the image, then one panel per generated word with the map
of where the decoder looked while producing it.

Shape legend: H/W image size, T words (``<end>`` included), Gh/Gw image-token grid.
"""

from __future__ import annotations

import os

import numpy as np
from torch import Tensor

from attnlab.runs import atomic_save
from attnlab.viz.attention import _plt

__all__ = ["plot_word_attention"]


def plot_word_attention(
    image: np.ndarray, words: list[str], maps: Tensor, path: str | os.PathLike
) -> None:
    """Write a figure: the image, then each word's attention map over it (nearest-neighbour
    upsampled from the token grid).

    Args:
        image: ``uint8 (H, W, 3)``.
        words: one label per map (the caption's words, then ``<end>`` when it ended).
        maps: ``(T, Gh, Gw)``, e.g. a decoded caption's ``alignment`` from
            :func:`attnlab.tasks.caption.decode_captions` with ``attention=True``.
        path: PNG to write (atomically).

    Raises:
        ValueError: not one map per word.
    """
    plt = _plt()
    if len(words) != maps.shape[0]:
        raise ValueError(f"{len(words)} words for {maps.shape[0]} attention maps")
    n = len(words) + 1
    cols = min(n, 6)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(2 * cols + 0.8, 2.2 * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat:
        ax.axis("off")
    axes.flat[0].imshow(image)
    axes.flat[0].set_title("image", fontsize=9)
    h, w = image.shape[:2]
    top = float(maps.max()) if maps.numel() else 1.0
    im = None
    for i, label in enumerate(words):
        ax = axes.flat[i + 1]
        ax.imshow(image)
        im = ax.imshow(
            maps[i].float().cpu().numpy(),
            cmap="magma",
            alpha=0.6,
            extent=(0, w, h, 0),
            interpolation="nearest",  # one block per image token: not smoothed
            vmin=0.0,
            vmax=top,
        )
        ax.set_title(f"query: {label!r} (word {i + 1})", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=list(axes.flat), fraction=0.02, pad=0.01, label="attention weight")
    fig.suptitle(
        "where the decoder looked while writing each word (one block per patch)", fontsize=9
    )
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
