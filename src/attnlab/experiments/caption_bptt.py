"""Truncated backpropagation through time against the full ``<start>`` … ``<end>`` backpropagation
the lecture prescribes for the CNN + LSTM captioner.

The image enters the LSTM once, as its initial state h₀, c₀. With full backpropagation every
word's loss reaches back to h₀ and into the image encoder; with a window of k words
(:func:`attnlab.tasks.caption.truncated_logits`) the state is detached every k words, so only the
first k words train the image path and later words learn only from the words before them. The
lecture's reason for full backpropagation — later words depend on the image feature given at the
start — predicts that truncation hurts the later positions most. Measured: teacher-forced
next-word accuracy at each caption position on validation scenes, BLEU and object precision of
greedy captions, all models at the same budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.config.base import ConfigError
from attnlab.config.multimodal import CaptionConfig
from attnlab.experiments.scene_runs import (
    SceneExperimentConfig,
    check_fresh,
    train_for_experiment,
)
from attnlab.fileio import atomic_write_text
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.plotting import pyplot
from attnlab.tasks.caption import CaptionTask, accuracy_by_position, caption_metrics

__all__ = ["CaptionBPTTConfig", "run", "format_table"]


@dataclass
class CaptionBPTTConfig(SceneExperimentConfig):
    """Settings of the experiment (see :class:`SceneExperimentConfig`).

    Attributes:
        windows: truncation windows in words (0: full backpropagation).
        n_eval: validation scenes measured.
    """

    out: str = "runs/caption-bptt"
    windows: list[int] = field(default_factory=lambda: [0, 2])
    n_eval: int = 200

    def validate(self) -> None:
        super().validate()
        self.positive("n_eval")
        if not self.windows or min(self.windows) < 0:
            raise ConfigError(f"windows must be >= 0 (0: full), got {self.windows}")


def _name(window: int) -> str:
    return "full" if window == 0 else f"window-{window}"


def run(cfg: CaptionBPTTConfig) -> dict[str, Any]:
    """Train one LSTM captioner per window into ``cfg.out/<name>`` and measure each.

    Returns:
        ``{"by_position": {name: [acc per position]}, "captions": {name: {bleu,
        object_precision}}, "steps": {name: n}}``, also in ``cfg.out/results.json`` (and the
        plot ``caption_bptt.png`` when matplotlib is installed).
    """
    names = [_name(w) for w in cfg.windows]
    check_fresh(cfg.out, names, cfg.overwrite)
    out: dict[str, Any] = {"by_position": {}, "captions": {}, "steps": {}}
    for w, name in zip(cfg.windows, names, strict=True):
        task = CaptionTask(n_train=cfg.n_train, n_val=cfg.n_eval, seed=cfg.seed, bptt_window=w)
        torch.manual_seed(cfg.seed)
        model = build_captioner(
            CaptionConfig.preset(cfg.preset, arch="lstm", vocab_size=len(task.vocab))
        )
        res = train_for_experiment(model, task, cfg, Path(cfg.out) / name)
        out["steps"][name] = res.steps
        out["by_position"][name] = accuracy_by_position(model, task, cfg.n_eval)
        m = caption_metrics(model, task.vocab, task.sets("val"), range(cfg.n_eval))
        out["captions"][name] = {k: m[k] for k in ("bleu", "object_precision")}
    out["settings"] = cfg.to_dict()
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(cfg.out) / "results.json", json.dumps(out, indent=1) + "\n")
    _plot(out, Path(cfg.out) / "caption_bptt.png")
    return out


def format_table(result: dict[str, Any]) -> str:
    """Markdown: accuracy per position (rows) for each model (columns), then caption scores."""
    names = list(result["by_position"])
    n = min(len(v) for v in result["by_position"].values())
    lines = ["| predicting word | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for t in range(n):
        accs = " | ".join(f"{result['by_position'][m][t]:.1%}" for m in names)
        lines.append(f"| {t + 1} | {accs} |")
    caps = result["captions"]
    lines.append(
        "| greedy BLEU / object precision | "
        + " | ".join(f"{caps[m]['bleu']:.1f} / {caps[m]['object_precision']:.0%}" for m in names)
        + " |"
    )
    lines.append("")
    lines.append("steps: " + ", ".join(f"{m} {s}" for m, s in result["steps"].items()))
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()  # (matplotlib is a dependency of attnlab)

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, accs in result["by_position"].items():
        ax.plot(range(1, len(accs) + 1), accs, marker="o", label=name)
    ax.set_xlabel("caption position (word predicted)")
    ax.set_ylabel("teacher-forced accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("LSTM captioner: full vs truncated BPTT")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
