"""Reliability diagrams: accuracy against confidence, one panel per model.

The data come from :func:`attnlab.metrics.calibration.reliability_bins`; a calibrated model's bars
reach the diagonal, an overconfident model's stay below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from attnlab.metrics.calibration import ReliabilityBin
from attnlab.plotting import pyplot, save_png

__all__ = ["plot_reliability"]


def plot_reliability(
    diagrams: Mapping[str, Sequence[ReliabilityBin]],
    path: str | Path,
    *,
    ece: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Path:
    """Draw one reliability diagram per entry of ``diagrams`` side by side.

    Each panel: bars of the accuracy per confidence bin, the diagonal, the gap to it shaded, and
    the share of predictions per bin as a thin bar along the bottom.

    Args:
        diagrams: label -> the bins of :func:`~attnlab.metrics.calibration.reliability_bins`.
        path: the PNG to write.
        ece: label -> expected calibration error, shown in each panel's title.
        title: figure title.

    Returns:
        ``path``.
    """
    plt = pyplot()

    n = max(1, len(diagrams))
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 3.6), squeeze=False)
    for ax, (label, bins) in zip(axes[0], diagrams.items()):
        total = sum(b.count for b in bins) or 1
        width = bins[0].hi - bins[0].lo if bins else 1.0
        for b in bins:
            if not b.count:
                continue
            ax.bar(b.lo, b.accuracy, width=width, align="edge", color="tab:blue", edgecolor="k")
            lo, hi = sorted((b.accuracy, b.confidence))
            ax.bar(b.lo, hi - lo, bottom=lo, width=width, align="edge", color="tab:red", alpha=0.3)
            ax.bar(b.lo, 0.1 * b.count / total, width=width, align="edge", color="0.3")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence")
        head = label if ece is None or label not in ece else f"{label}: ECE {ece[label]:.3f}"
        ax.set_title(head, fontsize=10)
    axes[0][0].set_ylabel("accuracy (grey: share of predictions ×0.1)")
    if title:
        fig.suptitle(title, fontsize=10)
    save_png(fig, path)
    return Path(path)
