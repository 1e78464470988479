"""Alignment heatmaps of a translation: output tokens as rows, source tokens as columns.

Shape legend: L decoder layers, H heads, T output tokens (``<end>`` included), S source tokens.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from attnlab.metrics.translation import Translation
from attnlab.viz import attention as viz

__all__ = ["plot_alignment", "wrap_title"]


def wrap_title(*parts: str, n_cols: int) -> str:
    """Wrap a heatmap title to roughly the figure's width (it grows with the number of columns)."""
    width = 28 + 3 * n_cols
    return "\n".join(line for p in parts for line in textwrap.wrap(p, width))


def plot_alignment(translation: Translation, path: str | Path, *, layer: int = -1) -> list[Path]:
    """Draw the alignment ``(L, H, T, S)`` of one translation.

    Bahdanau's α (L = H = 1) is one heatmap. For the Transformer, ``path`` gets the head average
    of decoder layer ``layer``, and ``<stem>.layer<i><suffix>`` one grid of heads per layer.

    Args:
        translation: a translation decoded with its alignment (``need_weights=True``).
        path: the PNG to write.
        layer: the decoder layer of the head-average heatmap.

    Returns:
        The paths written, ``path`` first.

    Raises:
        ValueError: the translation has no alignment.
    """
    r = translation
    a = r.alignment
    if a is None:
        raise ValueError("this translation has no alignment (decode with need_weights=True)")
    L = a.shape[0]
    src, out = r.source, f"→ {r.text}"
    labels = dict(rows=r.out_tokens, cols=r.src_tokens)
    if L == 1 and a.shape[1] == 1:  # rnn-attn: Bahdanau's α
        viz.plot_attention(
            a[0, 0], path, title=wrap_title(src, out, n_cols=len(r.src_tokens)), **labels
        )
        return [Path(path)]
    title = wrap_title(src, out, f"(layer {layer % L}, head average)", n_cols=len(r.src_tokens))
    viz.plot_attention(a[layer].mean(0), path, title=title, **labels)
    written = [Path(path)]
    stem = Path(path)
    for i in range(L):
        p = stem.with_name(f"{stem.stem}.layer{i}{stem.suffix or '.png'}")
        viz.plot_attention_grid(a[i], p, title=f"cross-attention, layer {i}", **labels)
        written.append(p)
    return written
