"""Do captioners compose or retrieve?

The lecture notes that early CNN + RNN captioners, trained on small data, often behave like a
nearest-neighbour lookup: the sentence is fluent because it was copied from a similar training
image. Two measurements tell composition from retrieval here:

* ``retrieved``: the fraction of generated captions that appear verbatim among the training
  captions (high for both composition and retrieval on in-distribution scenes, since the captions
  are templated — it is the contrast with the next column that matters);
* ``novel combo``: on the ``unseen`` split, every scene holds a colour–shape combination never
  seen in training ("red triangle"); the fraction of scenes whose caption names it correctly.
  A pure retriever scores 0 by construction; a composing model can name it.

Both captioners (CNN + LSTM, patch tokens + Transformer decoder) get the same budget; a
nearest-neighbour baseline (the caption of the closest training image in pixel space) is the
retrieval reference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from attnlab.config.base import ConfigError
from attnlab.config.multimodal import CaptionConfig
from attnlab.data.scenes import SceneSet
from attnlab.experiments.common import undertrained
from attnlab.experiments.scene_runs import (
    SceneExperimentConfig,
    check_fresh,
    train_for_experiment,
)
from attnlab.fileio import atomic_write_text
from attnlab.metrics.captions import score_captions
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.tasks.caption import CaptionTask, caption_metrics

__all__ = ["CaptionRetrievalConfig", "run", "format_table", "nearest_neighbour_captions"]

METRICS = ("bleu", "retrieved", "exact_match", "object_precision", "novel_combo")
CAPTIONERS = {
    "lstm": "cnn+lstm",
    "transformer": "patches+transformer",
    "prefix": "image tokens+prefix LM",  # LLaVA-style: no cross-attention
}


@dataclass
class CaptionRetrievalConfig(SceneExperimentConfig):
    """Settings of the experiment (see :class:`SceneExperimentConfig`).

    Attributes:
        models: captioner architectures (``lstm``, ``transformer``, ``prefix``: the image tokens
            prepended to a decoder-only LM, against ``transformer``'s cross-attention).
        encoder: every captioner's image encoder (``cnn`` grid or ``vit`` patches).
        n_eval: val and unseen scenes captioned.
        beam_size: beam width of the captions (1: greedy).
    """

    out: str = "runs/caption-retrieval"
    models: list[str] = field(default_factory=lambda: ["lstm", "transformer"])
    encoder: Literal["cnn", "vit"] = "cnn"
    n_eval: int = 200
    beam_size: int = 1

    def validate(self) -> None:
        super().validate()
        if not self.models or any(m not in CAPTIONERS for m in self.models):
            raise ConfigError(f"models {self.models} must be among {list(CAPTIONERS)}")
        if self.beam_size < 1:
            raise ConfigError(f"beam_size (--beam) must be >= 1, got {self.beam_size}")
        self.positive("n_eval")


def nearest_neighbour_captions(train: SceneSet, query: SceneSet, indices) -> list[str]:
    """For each query scene, the first caption of the training scene nearest in pixel space."""
    a = train.images.reshape(len(train), -1).astype(np.float32)  # (N, H·W·3)
    out = []
    for i in indices:
        d = ((a - query.images[i].reshape(-1).astype(np.float32)) ** 2).sum(1)
        out.append(train.captions[int(d.argmin())][0])
    return out


def run(cfg: CaptionRetrievalConfig) -> dict:
    """Train the captioners, caption ``n_eval`` val and unseen scenes, measure.

    Returns:
        ``{"rows": {name: {"val": metrics, "unseen": metrics}}, "examples": {...}, "steps": ...}``,
        also written to ``out/results.json``.
    """
    out = Path(cfg.out)
    check_fresh(out, cfg.models, cfg.overwrite)
    task = CaptionTask(n_train=cfg.n_train, n_val=cfg.n_eval, n_unseen=cfg.n_eval, seed=cfg.seed)
    train_set = task.sets("train")
    train_caps = train_set.caption_set()
    idx = range(cfg.n_eval)
    results: dict = {"rows": {}, "examples": {}, "steps": {}, "seconds": {}}
    for arch in cfg.models:
        name = CAPTIONERS[arch]
        torch.manual_seed(cfg.seed)
        model = build_captioner(
            CaptionConfig.preset(
                cfg.preset, arch=arch, vocab_size=len(task.vocab), encoder=cfg.encoder
            )
        )
        res = train_for_experiment(model, task, cfg, out / arch)
        results["steps"][name], results["seconds"][name] = res.steps, round(res.elapsed, 1)
        row = {}
        for split in ("val", "unseen"):
            m = caption_metrics(
                model,
                task.vocab,
                task.sets(split),
                idx,
                beam_size=cfg.beam_size,
                train_captions=train_caps,
            )
            row[split] = {k: m[k] for k in METRICS}
            results["examples"].setdefault(name, {})[split] = m["captions"][:5]
        results["rows"][name] = row
    row = {}
    for split in ("val", "unseen"):
        sset = task.sets(split)
        hyps = nearest_neighbour_captions(train_set, sset, idx)
        m = score_captions(hyps, sset, idx, train_captions=train_caps)
        row[split] = {k: m[k] for k in METRICS}
    results["rows"]["nearest neighbour (pixels)"] = row
    results["config"] = {"steps": cfg.steps, "max_time": cfg.max_time}
    results["undertrained"] = undertrained_note(results)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    return results


#: every captioner must name this share of the objects in val scenes correctly before its
#: retrieval is read (the documented runs: 53-91 %; the same captions on other scenes: ~22 %)
VAL_OBJECT_PRECISION = 0.35


def undertrained_note(results: dict) -> str | None:
    """ "Undertrained … train longer" when a trained captioner's val object precision is below
    :data:`VAL_OBJECT_PRECISION` (it has not learnt to describe scenes at all); else None."""
    cfg = results.get("config") or {}
    return undertrained(
        {n: results["rows"][n]["val"]["object_precision"] for n in results["steps"]},
        threshold=VAL_OBJECT_PRECISION,
        what="object precision on val scenes",
        max_time=cfg.get("max_time"),
        steps=None if cfg.get("max_time") else cfg.get("steps"),
        fmt=lambda v: f"{100 * v:.0f} %",
    )


def format_table(results: dict) -> str:
    """Markdown table: one row per captioner, val and unseen-split columns (percentages)."""
    lines = [
        "| captioner | val BLEU | val retrieved | val obj. prec. | unseen BLEU | "
        "unseen retrieved | unseen obj. prec. | unseen novel combo named |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["rows"].items():
        v, u = r["val"], r["unseen"]
        lines.append(
            f"| {name} | {v['bleu']:.1f} | {100 * v['retrieved']:.0f}% | "
            f"{100 * v['object_precision']:.0f}% | {u['bleu']:.1f} | "
            f"{100 * u['retrieved']:.0f}% | {100 * u['object_precision']:.0f}% | "
            f"{100 * u['novel_combo']:.0f}% |"
        )
    steps = ", ".join(
        f"{m} {results['steps'][m]} steps/{results['seconds'][m]}s" for m in results["steps"]
    )
    ex = "\n".join(
        f"  {m} (unseen): " + " | ".join(e["unseen"][:3]) for m, e in results["examples"].items()
    )
    text = "\n".join(lines) + f"\n\ntraining: {steps}\nexamples:\n{ex}"
    short = undertrained_note(results)
    return text if short is None else f"{text}\n\n{short}"
