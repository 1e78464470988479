"""Pictures: attention heatmaps and training curves (matplotlib, Agg backend, PNG files)."""

from attnlab.viz.attention import plot_attention

__all__ = ["plot_attention"]
