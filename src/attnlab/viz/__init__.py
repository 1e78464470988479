"""Pictures: attention heatmaps and training curves (matplotlib, Agg backend, PNG files)."""

from attnlab.viz.attention import plot_attention, plot_attention_grid
from attnlab.viz.captions import plot_word_attention
from attnlab.viz.curves import plot_curves

__all__ = ["plot_attention", "plot_attention_grid", "plot_curves", "plot_word_attention"]
