"""Training curves: ``plot_curves(metrics.jsonl, loss.png)``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from attnlab.fileio import atomic_save
from attnlab.plotting import pyplot

__all__ = ["plot_curves", "read_metrics", "smoothing_floor"]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl file (blank lines skipped)."""
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def smoothing_floor(epsilon: float, vocab: int) -> float:
    """The smallest cross-entropy a model can reach against label-smoothed targets: the entropy
    of the target distribution (``1 - ε + ε/V`` on the true token, ``ε/V`` on each other one).

    Args:
        epsilon: the label smoothing ε in [0, 1).
        vocab: the number of classes V (output vocabulary).
    """
    if epsilon <= 0 or vocab < 2:
        return 0.0
    other = epsilon / vocab
    true = 1.0 - epsilon + other
    return -(true * math.log(true) + (vocab - 1) * other * math.log(other))


def _run_settings(metrics_path: Path) -> dict:
    """The run's config.json beside its metrics (empty when there is none)."""
    path = metrics_path.parent / "config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def plot_curves(
    metrics_jsonl_path: str | os.PathLike, png_path: str | os.PathLike, *, title: str | None = None
) -> None:
    """Plot training loss and validation loss against the optimizer step, as a PNG.

    Training records are those with ``loss``, validation records those with ``val_loss`` (the
    layout :func:`attnlab.train.train` writes). The y axis is logarithmic when the loss spans
    more than a factor of 10; the step axis has thousands separators. From the run's config.json
    (when there is one beside the metrics): the validation legend says how many batches a
    validation reads (``eval_batches``; ``attnlab eval`` reads the whole split), and a dashed line
    marks the floor label smoothing puts under the loss. A note says so when the last validation
    loss is below the last training loss. The PNG is written atomically.

    Raises:
        FileNotFoundError: if the metrics file does not exist.
    """
    plt = pyplot()

    records = read_metrics(metrics_jsonl_path)
    settings = _run_settings(Path(metrics_jsonl_path))
    train_cfg, model_cfg = settings.get("train") or {}, settings.get("model") or {}
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        if train:
            ax.plot(*zip(*train), label="train (per step)", linewidth=1.0, alpha=0.8)
        if val:
            n = train_cfg.get("eval_batches")
            what = f"validation ({n} batch{'es' if n != 1 else ''})" if n else "validation"
            # only at the evaluated steps (markers): nothing is drawn before the first one
            ax.plot(*zip(*val), "o-", label=what, linewidth=1.5, markersize=4)
        eps = float(train_cfg.get("label_smoothing") or 0.0)
        vocab = model_cfg.get("tgt_vocab_size") or model_cfg.get("vocab_size")
        if eps > 0 and vocab and (train or val):
            floor = smoothing_floor(eps, int(vocab))
            ax.axhline(floor, color="grey", linestyle="--", linewidth=1.0)
            ax.annotate(
                f"label smoothing {eps:g} floor: {floor:.2f}",
                (0.01, floor),
                xycoords=("axes fraction", "data"),
                xytext=(0, 3),
                textcoords="offset points",
                fontsize=8,
                color="grey",
            )
        if train and val and val[-1][1] < train[-1][1]:
            ax.text(
                0.99,
                0.98,
                "validation below training: dropout / augmentation act only in training,\n"
                "or the held-out split is easier",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=8,
                color="grey",
            )
        values = [v for _, v in train + val if v > 0]
        if values and max(values) / min(values) > 10:
            ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:,.0f}"))
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
