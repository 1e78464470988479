"""Which layer of a classifier should a captioner read: the logits or the penultimate features?

The lecture argues for the penultimate layer (VGG's FC4096) over the class scores (FC1000): the
logits say "person" and drop the straw hat. Here the classifier is a small CNN pre-trained to
name a scene's majority shape (3 classes); its weights are then frozen and two CNN + LSTM
captioners are trained with the same budget, one initialised from the 3 logits, one from the
penultimate feature vector. Colour words are exactly what the logits were never asked to keep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.config.multimodal import CaptionConfig
from attnlab.experiments.common import undertrained
from attnlab.experiments.scene_runs import (
    SceneExperimentConfig,
    check_fresh,
    pretrain_encoder,
    train_for_experiment,
)
from attnlab.fileio import atomic_write_text
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.tasks.caption import CaptionTask, caption_metrics

__all__ = ["CaptionFeaturesConfig", "run", "format_table"]

ROW = (
    "bleu",
    "object_precision",
    "colour_precision",
    "shape_precision",
    "chance_precision",
    "other_colour_precision",
    "other_shape_precision",
)


@dataclass
class CaptionFeaturesConfig(SceneExperimentConfig):
    """Settings of the experiment (see :class:`SceneExperimentConfig`).

    Attributes:
        pretrain_steps: steps training the classifier before it is frozen.
        encoder_width: the classifier's width, i.e. the penultimate feature size (None: the
            preset's).
        n_eval: validation scenes captioned.
    """

    out: str = "runs/caption-features"
    pretrain_steps: int = 300
    # A wider penultimate layer than the tiny preset's 16 channels: with 16, the shape
    # classifier's features keep little more than its 3 logits (measured: colour precision
    # 66% vs 59%); with 64 the gap is the lecture's (76% vs 60%).
    encoder_width: int | None = 64
    n_eval: int = 200

    def validate(self) -> None:
        super().validate()
        self.positive("pretrain_steps", "encoder_width", "n_eval")


def run(cfg: CaptionFeaturesConfig) -> dict:
    """Pre-train the classifier, train both captioners on its frozen features, measure.

    Returns:
        ``{"classifier_acc": float, "rows": {features: metrics}, "examples": ..., "steps": ...}``,
        also written to ``out/results.json``.
    """
    out = Path(cfg.out)
    check_fresh(out, ["logits", "penultimate"], cfg.overwrite)
    task = CaptionTask(n_train=cfg.n_train, n_val=cfg.n_eval, n_unseen=10, seed=cfg.seed)
    width = {} if cfg.encoder_width is None else {"encoder_width": cfg.encoder_width}

    def captioner(**fields):
        torch.manual_seed(cfg.seed)
        return build_captioner(
            CaptionConfig.preset(
                cfg.preset, arch="lstm", vocab_size=len(task.vocab), **width, **fields
            )
        )

    base = captioner()
    acc = pretrain_encoder(
        base.encoder,
        task.sets("train"),
        cfg.pretrain_steps,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    encoder_state = base.encoder.state_dict()
    results: dict = {"classifier_acc": acc, "rows": {}, "examples": {}, "steps": {}, "seconds": {}}
    for features in ("logits", "penultimate"):
        model = captioner(features=features, freeze_encoder=True)
        model.encoder.load_state_dict(encoder_state)
        res = train_for_experiment(model, task, cfg, out / features)
        m = caption_metrics(model, task.vocab, task.sets("val"), range(cfg.n_eval))
        results["rows"][features] = {k: m[k] for k in ROW}
        results["examples"][features] = m["captions"][:5]
        results["steps"][features], results["seconds"][features] = res.steps, round(res.elapsed, 1)
    results["config"] = {"steps": cfg.steps, "max_time": cfg.max_time}
    results["undertrained"] = undertrained_note(results)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    return results


#: the frozen classifier and both captioners must get shapes right this often before the colour
#: gap between logits and features is read (the documented run: 99-100 %; 3 shapes: chance ~33 %)
SHAPE_SCORE = 0.6


def undertrained_note(results: dict) -> str | None:
    """ "Undertrained … train longer" when the classifier's held-out accuracy or a captioner's
    shape precision is below :data:`SHAPE_SCORE` (shapes survive both feature sources); else
    None."""
    cfg = results.get("config") or {}
    scores = {"classifier accuracy": results["classifier_acc"]}
    scores |= {f"{n} shape precision": r["shape_precision"] for n, r in results["rows"].items()}
    return undertrained(
        scores,
        threshold=SHAPE_SCORE,
        what="the shape score",
        max_time=cfg.get("max_time"),
        steps=None if cfg.get("max_time") else cfg.get("steps"),
        fmt=lambda v: f"{100 * v:.0f} %",
    )


def format_table(results: dict) -> str:
    """Markdown table: one row per feature source."""
    lines = [
        "| captioner reads | BLEU | object precision | colour precision | shape precision |",
        "|---|---|---|---|---|",
    ]
    for name, r in results["rows"].items():
        lines.append(
            f"| {name} | {r['bleu']:.1f} | {100 * r['object_precision']:.0f}% | "
            f"{100 * r['colour_precision']:.0f}% | {100 * r['shape_precision']:.0f}% |"
        )
    chance = next(iter(results["rows"].values()))["chance_precision"]
    steps = ", ".join(
        f"{m} {results['steps'][m]} steps/{results['seconds'][m]}s" for m in results["steps"]
    )
    ex = "\n".join(f"  {m}: " + " | ".join(e[:3]) for m, e in results["examples"].items())
    blind = ", ".join(
        f"{m} colour {100 * r['other_colour_precision']:.0f}% / shape "
        f"{100 * r['other_shape_precision']:.0f}%"
        for m, r in results["rows"].items()
    )
    return (
        "\n".join(lines)
        + (
            f"\n\nthe same captions scored on the other scenes (what ignoring the image gets): {blind}"
            f"\nfrozen classifier (majority shape, 3 classes): held-out accuracy "
            f"{100 * results['classifier_acc']:.0f}%; object precision of a random colour-shape "
            f"pair: {100 * chance:.0f}%\ntraining: {steps}\nexamples:\n{ex}"
        )
        + (f"\n\n{short}" if (short := undertrained_note(results)) else "")
    )
