"""Training curves: ``plot_curves(metrics.jsonl, loss.png)`` (the trainer draws them; see
:mod:`attnlab.train.curves`)."""

from attnlab.train.curves import plot_curves, read_metrics

__all__ = ["plot_curves", "read_metrics"]
