"""Training curves: ``plot_curves(metrics.jsonl, loss.png)``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnlab.fileio import atomic_save

__all__ = ["plot_curves", "read_metrics", "load_matplotlib"]


def load_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend (imported on first use: it takes a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl file (blank lines skipped)."""
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def plot_curves(
    metrics_jsonl_path: str | os.PathLike, png_path: str | os.PathLike, *, title: str | None = None
) -> None:
    """Plot training loss and validation loss against the optimizer step, as a PNG.

    Training records are those with ``loss``, validation records those with ``val_loss`` (the
    layout :func:`attnlab.train.train` writes). The y axis is logarithmic when the loss spans
    more than a factor of 10. The PNG is written atomically.

    Raises:
        FileNotFoundError: if the metrics file does not exist.
    """
    plt = load_matplotlib()
    records = read_metrics(metrics_jsonl_path)
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        if train:
            ax.plot(*zip(*train), label="train", linewidth=1.0, alpha=0.8)
        if val:
            ax.plot(*zip(*val), "o-", label="validation", linewidth=1.5, markersize=3)
        values = [v for _, v in train + val if v > 0]
        if values and max(values) / min(values) > 10:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title or Path(metrics_jsonl_path).parent.name or "training")
        if train or val:
            ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
