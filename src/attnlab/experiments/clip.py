"""Does the dual encoder's text tower need word order? CLIP with a Transformer text tower against
the same model with a bag-of-words text tower, at the same budget.

Both share the image tower (a ViT), the projections, the learned temperature, the contrastive loss
and the trainer settings; only the text tower differs. Measured on held-out scenes:

* zero-shot accuracy by prompts ("a red circle", one per colour–shape combination) on
  single-object scenes of the ``val`` split and of the ``unseen`` split (held-out combinations),
  against chance (1 / number of prompts);
* recall@1 and @5 image→text and text→image over the listing captions of ``val`` scenes, against
  the exact chance of a random ranking.

A bag of words cannot tell "a red circle and a blue square" from "a blue circle and a red square";
the Transformer can, which is where retrieval should separate them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.config.base import ConfigError
from attnlab.config.clip import ClipConfig
from attnlab.data.scenes import Vocab
from attnlab.experiments.scene_runs import (
    SceneExperimentConfig,
    check_fresh,
    train_for_experiment,
)
from attnlab.fileio import atomic_write_text
from attnlab.models.multimodal.clip import DualEncoder
from attnlab.plotting import pyplot
from attnlab.tasks.clip import ClipTask

__all__ = ["ClipExperimentConfig", "run", "format_table", "TEXT_TOWERS"]

TEXT_TOWERS = ("transformer", "bow")
ROWS = ("zero-shot val", "zero-shot unseen", "i2t@1", "i2t@5", "t2i@1", "t2i@5")


@dataclass
class ClipExperimentConfig(SceneExperimentConfig):
    """Settings of the experiment (see :class:`SceneExperimentConfig`).

    Attributes:
        text_towers: which text towers to train (``transformer``, ``bow``).
        n_eval: held-out scenes of each measurement.
    """

    out: str = "runs/clip-towers"
    lr: float = 2e-3
    n_train: int = 3000
    text_towers: list[str] = field(default_factory=lambda: list(TEXT_TOWERS))
    n_eval: int = 200

    def validate(self) -> None:
        super().validate()
        self.positive("n_eval")
        bad = [t for t in self.text_towers if t not in TEXT_TOWERS]
        if bad or not self.text_towers:
            raise ConfigError(f"text_towers must be some of {list(TEXT_TOWERS)}, got {bad or []}")


def _model(cfg: ClipExperimentConfig, task: ClipTask, text: str) -> DualEncoder:
    config = ClipConfig.preset(
        cfg.preset,
        text={"arch": text, "vocab_size": len(task.vocab), "eos_id": Vocab.END, "pad_id": 0},
        vision={"image_size": task.config.scene.image_size},
    )
    torch.manual_seed(cfg.seed)  # the same image tower and projections for both
    return DualEncoder(config)


def run(cfg: ClipExperimentConfig) -> dict[str, Any]:
    """Train one dual encoder per text tower into ``cfg.out/<tower>`` and measure it.

    Returns:
        ``{"settings", "results": {tower: metrics}, "chance": {...}, "steps": {tower: n}}``, also
        written to ``cfg.out/results.json`` (and a bar chart, ``clip.png``, when matplotlib is
        installed).

    Raises:
        RunDirError: ``cfg.out`` already holds these runs and ``overwrite`` is false.
    """
    check_fresh(cfg.out, list(cfg.text_towers), cfg.overwrite)
    task = ClipTask(n_train=cfg.n_train, n_val=cfg.n_eval, eval_scenes=cfg.n_eval, seed=cfg.seed)
    results, steps, chance = {}, {}, {}
    for text in cfg.text_towers:
        model = _model(cfg, task, text)
        res = train_for_experiment(model, task, cfg, Path(cfg.out) / text)
        m = task.evaluate_splits(model)
        r = m["retrieval val"]
        results[text] = {
            "zero-shot val": m["zero-shot val"]["accuracy"],
            "zero-shot unseen": m["zero-shot unseen"]["accuracy"],
            **{k: r[k] for k in ROWS[2:]},
        }
        chance = {
            "zero-shot": m["zero-shot val"]["chance"],
            "recall@1": r["chance@1"],
            "recall@5": r["chance@5"],
        }
        steps[text] = res.steps
    out = {"settings": cfg.to_dict(), "results": results, "chance": chance, "steps": steps}
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(cfg.out) / "results.json", json.dumps(out, indent=1) + "\n")
    _plot(out, Path(cfg.out) / "clip.png")
    return out


def format_table(result: dict[str, Any]) -> str:
    """A Markdown table: one column per text tower, a chance column, one row per measurement."""
    towers = list(result["results"])
    ch = result["chance"]
    chance = {
        "zero-shot val": ch["zero-shot"],
        "zero-shot unseen": ch["zero-shot"],
        **{r: ch[f"recall@{r[-1]}"] for r in ROWS[2:]},
    }
    lines = [
        "| measurement | " + " | ".join(f"{t} text tower" for t in towers) + " | chance |",
        "|---|" + "---:|" * (len(towers) + 1),
    ]
    for row in ROWS:
        vals = " | ".join(f"{result['results'][t][row]:.1%}" for t in towers)
        lines.append(f"| {row} | {vals} | {chance[row]:.1%} |")
    lines.append("")
    lines.append("steps: " + ", ".join(f"{t} {n}" for t, n in result["steps"].items()))
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()  # (matplotlib is a dependency of attnlab)

    towers = list(result["results"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(towers)
    for k, t in enumerate(towers):
        xs = [i + k * width for i in range(len(ROWS))]
        ax.bar(xs, [result["results"][t][r] for r in ROWS], width, label=f"{t} text tower")
    ch = result["chance"]
    levels = [ch["zero-shot"]] * 2 + [ch["recall@1"], ch["recall@5"]] * 2
    for i, c in enumerate(levels):
        ax.hlines(c, i - 0.1, i + 0.8 - 0.1, colors="k", linestyles="dotted")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ROWS))], ROWS, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy / recall")
    ax.set_title("CLIP on scenes: Transformer vs bag-of-words text tower (dotted: chance)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
