"""ViT's appetite for data: a CNN and a ViT trained on 10³ … 10⁵ generated shape images, and the
same models pre-trained on the large set and fine-tuned on a small one.

The lecture's claim: a ViT lacks the CNN's built-in locality and translation equivariance, so it
loses on small data sets and needs far more images (or pre-training on a large set, then
fine-tuning) to meet or pass the CNN. Generated shapes (:func:`~attnlab.data.images.make_shapes`)
give as many images as asked for, so the training set can grow by two orders of magnitude with
the test set fixed.

- **The sweep.** For every training-set size (nested subsets of one generated training split) a
  residual CNN and a ViT of similar parameter counts are trained with the same optimizer, batch
  and **number of steps** (equal steps, not equal epochs: every run sees ``steps × batch_size``
  images, so the small sets are repeated for many epochs and the largest is seen about once),
  and scored on the same test images.
- **Transfer.** Each model is pre-trained on the whole training split labelled by
  ``pretrain_label`` (default: the shape alone, 4 classes), then fine-tuned on each of the
  ``finetune_sizes`` labelled like the sweep (default: shape and colour, 12 classes) with the same
  steps. The weights are copied by :func:`~attnlab.models.vision.transfer.transfer_weights`, the
  code of ``attnlab train image --init-from``: everything but the head, which starts afresh when
  the classes differ. A fine-tuned run has had twice the steps of a run from scratch (pre-training
  plus fine-tuning); its test images were never seen in either.

``run_vit_data`` writes ``table.md``, ``results.json`` and ``vit_data.png`` (test accuracy against
training images, one line per model, fine-tuned points marked).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from attnlab.config.base import Config
from attnlab.data.images import make_shapes, relabel_shapes
from attnlab.experiments import common
from attnlab.experiments.image_sweep import build_classifier
from attnlab.models.vision.transfer import transfer_weights
from attnlab.plotting import pyplot, save_png
from attnlab.tasks.image import ImageClassificationTask
from attnlab.train import TrainConfig, train

__all__ = ["ViTDataSettings", "run_vit_data", "meets", "MODELS", "VIT_DEFAULTS"]

MODELS = ("cnn", "vit")
LABELS = {"cnn": "residual CNN", "vit": "ViT"}
#: the ViT's fields unless ``vit`` sets them: 4×4 patches (16 tokens on 16×16 images)
VIT_DEFAULTS: dict[str, Any] = {"patch_size": 4}
#: both models must reach this test accuracy with the most images before a gap is read
MIN_ACCURACY = 0.5
#: the ranges of the settings (the largest a 2-core machine is allowed to be asked for)
BOUNDS = {"image_size": (8, 64), "n_val": (1, 20_000), "n_test": (1, 20_000),
          "steps": (1, 1_000_000), "batch_size": (1, 4096), "lr": (1e-8, 10.0),
          "warmup": (0, 1_000_000), "weight_decay": (0.0, 10.0), "seeds": (0, 2**31)}  # fmt: skip
#: at most this many images are generated (training, validation and test together)
MAX_IMAGES = 300_000


@dataclass
class ViTDataSettings(Config):
    """What is compared and with which budget.

    Attributes:
        sizes: training-set sizes, at least two, increasing (nested subsets of one split).
        image_size: side of the generated images in pixels.
        label: the class of the sweep and of fine-tuning (``shape``, ``colour`` or ``both``).
        pretrain_label: the class of pre-training (on the whole training split).
        finetune_sizes: the sizes (among ``sizes``) at which pre-trained models are fine-tuned;
            empty: no transfer rows.
        n_val, n_test: validation and test images (the same for every size).
        models: which of ``cnn``, ``vit`` to train.
        steps, batch_size, lr, warmup, weight_decay: the budget of every run (equal steps).
        seeds: one set of runs per seed (images, subsets, init and batch order change with it).
        augment: random crops and flips for every run (None: on for images of 16 px or more).
        vit, cnn: overrides of the ``tiny`` (≤ 16 px) or ``small`` presets (the ViT's on top of
            :data:`VIT_DEFAULTS`).
    """

    sizes: list[int] = field(default_factory=lambda: [1000, 3000, 10_000, 30_000, 100_000])
    image_size: int = 16
    label: Literal["shape", "colour", "both"] = "both"
    pretrain_label: Literal["shape", "colour", "both"] = "shape"
    finetune_sizes: list[int] = field(default_factory=lambda: [1000])
    n_val: int = 1000
    n_test: int = 2000
    models: list[str] = field(default_factory=lambda: list(MODELS))
    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.05
    seeds: list[int] = field(default_factory=lambda: [0])
    augment: bool | None = None
    vit: dict[str, Any] = field(default_factory=dict)
    cnn: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"

    def validate(self) -> None:
        super().validate()
        sizes = [int(s) for s in self.sizes]
        if len(sizes) < 2 or sorted(set(sizes)) != sizes or sizes[0] < 1:
            raise ValueError(f"sizes must be at least two increasing positive counts, got {sizes}")
        self.sizes = sizes
        if any(s not in sizes for s in self.finetune_sizes):
            raise ValueError(
                f"finetune_sizes {self.finetune_sizes} must be among the sizes {sizes}"
            )
        self.finetune_sizes = sorted(set(self.finetune_sizes))
        if not self.seeds:
            raise ValueError("give at least one seed")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models or len(set(self.models)) != len(self.models):
            raise ValueError(
                f"models must be distinct names among {list(MODELS)}, got {self.models}"
            )
        self.models = [m for m in MODELS if m in self.models]
        common.check_bounds(self, BOUNDS)
        if sizes[-1] + self.n_val + self.n_test > MAX_IMAGES:
            raise ValueError(
                f"{sizes[-1]} training + {self.n_val} + {self.n_test} images are more than this "
                f"experiment generates (at most {MAX_IMAGES:,})"
            )

    @property
    def vit_fields(self) -> dict[str, Any]:
        return {**VIT_DEFAULTS, **self.vit}


def _data(settings: ViTDataSettings, seed: int):
    """The images of one seed labelled ``both``: exactly ``sizes[-1]`` training, ``n_val``,
    ``n_test`` images."""
    s = settings
    n = s.sizes[-1] + s.n_val + s.n_test
    splits = make_shapes(n, s.image_size, label="both", seed=seed,
                         val_frac=s.n_val / n, test_frac=s.n_test / n)  # fmt: skip
    return splits


def _build(kind: str, splits, settings: ViTDataSettings) -> torch.nn.Module:
    overrides = settings.vit_fields if kind == "vit" else settings.cnn
    return build_classifier(kind, splits, overrides, named=f"--{kind}-set")


def run_vit_data(
    settings: ViTDataSettings,
    out_dir: str | Path,
    *,
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train every model on every size (and seed), pre-train and fine-tune; score on the test set.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: model overrides that do not build (named by their flag).

    Returns:
        ``{"settings", "runs": [per run: model, size, seed, init ("scratch" / "pretrained"),
        test_acc, epochs, seconds], "table": [per size], "params", "n_test", "steps",
        "summary", "markdown", "elapsed"}``.
    """
    s = settings
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    params: dict[str, int] = {}
    n_test = s.n_test
    for seed in s.seeds:
        both = _data(s, seed)
        splits = relabel_shapes(both, s.label)
        if not runs:  # every model must build before anything is trained
            params = {k: _numel(_build(k, splits, s)) for k in s.models}
        n_train = len(splits.train[1])
        for size in s.sizes:
            for kind in s.models:
                torch.manual_seed(seed)
                model = _build(kind, splits, s)
                runs.append(
                    _run(model, kind, splits, s, seed, size / n_train, out, "scratch", progress)
                )
        if not s.finetune_sizes:
            continue
        pre_splits = relabel_shapes(both, s.pretrain_label)
        for kind in s.models:
            torch.manual_seed(seed)
            source = _build(kind, pre_splits, s)
            pre = _run(source, kind, pre_splits, s, seed, 1.0, out, "pretraining", progress)
            runs.append({**pre, "label": s.pretrain_label})
            for size in s.finetune_sizes:
                torch.manual_seed(seed)
                model = _build(kind, splits, s)
                moved = transfer_weights(source, model, source_name=f"{kind} pre-trained")
                row = _run(
                    model, kind, splits, s, seed, size / n_train, out, "pretrained", progress
                )
                row.update(pretrain_acc=pre["test_acc"], copied=len(moved.copied),
                           reinitialised=moved.reinitialised)  # fmt: skip
                runs.append(row)
    table = summarize(runs, s.models)
    result = {"settings": s.to_dict(), "runs": runs, "table": table, "params": params,
              "n_test": n_test, "steps": s.steps}  # fmt: skip
    result["summary"] = _summary(table, s, n_test)
    md = _table(table, s.models)
    notes = (
        f"Generated shapes {s.image_size}×{s.image_size}, class = {s.label} "
        f"({len(splits.classes)} classes); every run {s.steps} steps × batch {s.batch_size} "
        f"(equal steps: {s.steps * s.batch_size:,} images seen), lr {s.lr}, seeds {s.seeds}; "
        + "; ".join(f"{LABELS[k]} {params[k]:,} params" for k in s.models)
        + f"; test set {n_test} images. Fine-tuned: pre-trained on all {s.sizes[-1]:,} training "
        f"images labelled by {s.pretrain_label}, then fine-tuned on the row's images (head "
        f"{'copied' if s.pretrain_label == s.label else 'new'}), {s.steps} steps each."
    )
    result["elapsed"] = time.perf_counter() - t0
    common.write_outputs(out, "ViT's appetite for data", [md], result, notes,
                         (_plot, "vit_data.png"))  # fmt: skip
    result["markdown"] = md.markdown() + "\n\n" + notes + "\n\n" + result["summary"]
    return result


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _run(model, kind, splits, s: ViTDataSettings, seed, fraction, out, init, progress=False):
    """Train ``model`` on ``fraction`` of the training split; its test accuracy."""
    task = ImageClassificationTask(splits, seed=seed, train_fraction=min(1.0, fraction),
                                   augment=s.augment)  # fmt: skip
    size = len(task.train_y)
    cfg = TrainConfig(batch_size=s.batch_size, lr=s.lr, weight_decay=s.weight_decay,
                      device=s.device, steps=s.steps, warmup_steps=min(s.warmup, s.steps - 1),
                      eval_every=s.steps, eval_batches=4, seed=seed, progress=progress)  # fmt: skip
    t = time.perf_counter()
    train(model, task, cfg, out / "runs" / f"{kind}_{init}_n{size}_s{seed}", overwrite=True)
    acc, loss = task.test_accuracy(model, device=next(model.parameters()).device)
    return {"model": kind, "size": size, "seed": seed, "init": init, "test_acc": acc,
            "test_loss": loss, "epochs": s.steps * s.batch_size / size,
            "seconds": time.perf_counter() - t}  # fmt: skip


def _mean(runs: list[dict], **match: Any) -> float | None:
    accs = [r["test_acc"] for r in runs if all(r[k] == v for k, v in match.items())]
    return sum(accs) / len(accs) if accs else None


def summarize(runs: list[dict[str, Any]], models: list[str]) -> list[dict[str, Any]]:
    """Per size: epochs seen, each model's mean test accuracy from scratch and fine-tuned."""
    table = []
    for size in sorted({r["size"] for r in runs if r["init"] != "pretraining"}):
        row: dict[str, Any] = {"size": size}
        mine = [r for r in runs if r["size"] == size]
        row["epochs"] = mine[0]["epochs"]
        for kind in models:
            row[kind] = _mean(runs, model=kind, size=size, init="scratch")
            row[f"{kind}_ft"] = _mean(runs, model=kind, size=size, init="pretrained")
        table.append(row)
    return table


def meets(a: float, b: float, n: int) -> str:
    """How accuracy ``b`` compares with ``a`` on ``n`` test images: ``"below"``, ``"meets"``
    (within two standard errors of the difference, ``2·√(a(1−a)/n + b(1−b)/n)``) or
    ``"passes"``."""
    se = math.sqrt(max(a * (1 - a) + b * (1 - b), 1e-12) / n)
    if b > a + 2 * se:
        return "passes"
    return "meets" if b >= a - 2 * se else "below"


def _summary(table: list[dict], s: ViTDataSettings, n_test: int) -> str:
    if not ("cnn" in s.models and "vit" in s.models) or not table:
        return ""
    most = table[-1]
    short = common.undertrained(
        {LABELS[k]: most[k] for k in s.models}, threshold=MIN_ACCURACY,
        what=f"test accuracy with the most training images ({most['size']:,})",
        steps=s.steps,
    )  # fmt: skip
    if short is not None:
        return short
    verdicts = [(r["size"], meets(r["cnn"], r["vit"], n_test)) for r in table]
    reached = [size for size, v in verdicts if v != "below"]
    passed = [size for size, v in verdicts if v == "passes"]
    gaps = ", ".join(f"{r['cnn'] - r['vit']:+.3f} at {r['size']:,}" for r in table)
    if passed:
        where = f"the ViT passes the CNN from {passed[0]:,} training images"
    elif reached:
        where = f"the ViT meets the CNN (within 2 standard errors) from {reached[0]:,} images"
    else:
        where = f"the ViT stays below the CNN at every size up to {table[-1]['size']:,} images"
    text = f"Reading: {where}; CNN − ViT: {gaps}."
    ft = [r for r in table if r.get("vit_ft") is not None]
    for r in ft:
        text += (
            f" Fine-tuned at {r['size']:,} images: ViT {r['vit_ft']:.3f} (from scratch "
            f"{r['vit']:.3f})"
            + (f", CNN {r['cnn_ft']:.3f} (from scratch {r['cnn']:.3f})" if r.get("cnn_ft") else "")
            + "."
        )
    return text


def _table(table: list[dict], models: list[str]) -> common.Table:
    cols = ["train images", "epochs seen"]
    fmts = [",", ".1f"]
    for kind in models:
        cols.append(f"{LABELS[kind]} test acc")
        fmts.append(".3f")
    if "cnn" in models and "vit" in models:
        cols.append("CNN − ViT")
        fmts.append("+.3f")
    for kind in models:
        cols.append(f"{LABELS[kind]} fine-tuned")
        fmts.append(".3f")
    t = common.Table(cols, formats=fmts)
    for r in table:
        cells = [r["size"], r["epochs"], *(r[k] for k in models)]
        if "cnn" in models and "vit" in models:
            cells.append(r["cnn"] - r["vit"])
        cells += [r[f"{k}_ft"] for k in models]
        t.add(*cells)
    return t


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = result["table"]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, kind in enumerate(result["settings"]["models"]):
        n = [r["size"] for r in rows]
        ax.plot(n, [r[kind] for r in rows], marker="o", color=f"C{i}",
                label=f"{LABELS[kind]} ({result['params'][kind]:,} params)")  # fmt: skip
        ft = [(r["size"], r[f"{kind}_ft"]) for r in rows if r[f"{kind}_ft"] is not None]
        if ft:
            ax.plot(*zip(*ft), marker="*", markersize=12, linestyle="none", color=f"C{i}",
                    label=f"{LABELS[kind]} pre-trained, fine-tuned")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("training images")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Equal steps ({result['steps']}), growing data (generated shapes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)
