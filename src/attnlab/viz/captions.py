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
    fig, axes = plt.subplots(rows, cols, figsize=(2 * cols, 2.1 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    axes.flat[0].imshow(image)
    axes.flat[0].set_title("image", fontsize=9)
    h, w = image.shape[:2]
    for i, label in enumerate(words):
        ax = axes.flat[i + 1]
        ax.imshow(image)
        ax.imshow(
            maps[i].float().cpu().numpy(),
            cmap="magma",
            alpha=0.6,
            extent=(0, w, h, 0),
            interpolation="nearest",
        )
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
