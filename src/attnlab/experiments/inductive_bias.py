"""Inductive bias: a CNN, a ViT and a DeiT trained with the same budget on growing shares of the
data.

The lecture's claim: convolutions build in locality and translation equivariance, a ViT has to
learn its spatial structure from data, so on small datasets the CNN wins and the gap narrows (and
eventually reverses, at JFT-300M scale) as data grows. Here both models get the same optimizer,
schedule, batch size and number of steps, with similar parameter counts, on fractions of one
training set, and are scored on the same full test split.

The DeiT row asks whether distillation hands the CNN's inductive bias to a Transformer: a ViT of
the same size with a distillation token (:class:`~attnlab.models.vision.DeiT`), trained on the
same images with the CNN just trained on them (same fraction and seed) as its teacher. It sees no
image the CNN did not see; only the CNN's predictions are new to it. ``closed`` in the table is
the share of the CNN − ViT gap the DeiT closes, ``(DeiT − ViT) / (CNN − ViT)``.

The number of steps is ``steps``, or, with a wall-clock budget ``max_time`` for the whole
experiment, as many as fit: both models' seconds per step are measured first, and every run
(both models, every fraction and seed) gets the same steps, sized so that all of them together
take ``1 - RESERVE`` of the budget (the rest is kept for loading, scoring and the plot).

``run_inductive_bias`` returns a table and writes ``results.json`` (updated after every run),
``table.md`` and ``inductive_bias.png`` (test accuracy against training-set size, one line per
model). The test split is the same for every fraction (it changes with the seed).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import RunDirError
from attnlab.experiments import common
from attnlab.experiments.image_sweep import DATA_FIELDS, ImageSweepSettings, build_classifier
from attnlab.fileio import atomic_write_text
from attnlab.plotting import pyplot, save_png
from attnlab.tasks.distill import Teacher
from attnlab.tasks.image import ImageClassificationTask, load_task_data
from attnlab.train import TrainConfig, train

__all__ = [
    "DATA_FIELDS",
    "InductiveBiasSettings",
    "run_inductive_bias",
    "summarize",
    "write_results",
    "format_table",
]


#: share of ``max_time`` kept for loading data, scoring every run and writing the plot
RESERVE = 0.2
#: the smallest CNN − ViT gap of which the table gives the share the DeiT closes
MIN_GAP = 0.02
#: the models the experiment can compare, in training order (a DeiT's teacher is the CNN)
MODELS = ("cnn", "vit", "deit")
LABELS = {"cnn": "residual CNN", "vit": "ViT", "deit": "DeiT (distilled from the CNN)"}


@dataclass
class InductiveBiasSettings(ImageSweepSettings):
    """What is compared; the images, the budget (identical for every model; ``max_time``
    overrides ``steps``, see the module docstring) and the seeds (the data subset, init and
    batch order change with them) are those of
    :class:`~attnlab.experiments.image_sweep.ImageSweepSettings`.

    Attributes:
        fractions: shares of the training split, at least three, increasing.
        models: which of ``cnn``, ``vit``, ``deit`` to train (a DeiT needs the CNN, its teacher).
        vit, cnn, deit: overrides of the ``tiny`` (≤ 16 px) or ``small`` presets.
        distillation, distill_alpha, distill_temperature: the DeiT's loss (as for
            :class:`~attnlab.config.vision.ImageTaskConfig`).
        augment: random crops for every model (None: the task's default, off for 8×8 digits);
            with it the teacher labels views of the images it never saw.
    """

    fractions: list[float] = field(default_factory=lambda: [0.1, 0.25, 0.5, 1.0])
    models: list[str] = field(default_factory=lambda: list(MODELS))
    vit: dict[str, Any] = field(default_factory=dict)
    cnn: dict[str, Any] = field(default_factory=dict)
    deit: dict[str, Any] = field(default_factory=dict)
    distillation: str = "hard"
    distill_alpha: float = 0.5
    distill_temperature: float = 1.0
    augment: bool | None = None

    def validate(self) -> None:
        super().validate()
        fr = [float(f) for f in self.fractions]
        if len(fr) < 3:
            raise ValueError(f"give at least three data fractions, got {fr}")
        if any(not 0 < f <= 1 for f in fr) or sorted(fr) != fr or len(set(fr)) != len(fr):
            raise ValueError(f"fractions must be increasing values in (0, 1], got {fr}")
        self.fractions = fr
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models or len(set(self.models)) != len(self.models):
            raise ValueError(
                f"models must be distinct names among {list(MODELS)}, got {self.models}"
            )
        if "deit" in self.models and "cnn" not in self.models:
            raise ValueError("the DeiT distils from the CNN: models must include cnn with deit")
        self.models = [m for m in MODELS if m in self.models]  # the CNN trains before its student
        if self.distillation not in ("hard", "soft"):
            raise ValueError(f"distillation must be 'hard' or 'soft', got {self.distillation!r}")

    def task(self, kind: str, splits: Any, seed: int, fraction: float, teacher=None):
        """The image task of one run; a DeiT's distils from ``teacher`` (the trained CNN)."""
        kw = dict(seed=seed, train_fraction=fraction, augment=self.augment)
        if kind != "deit":
            return ImageClassificationTask(splits, **kw)
        distil = ("distillation", "distill_alpha", "distill_temperature")
        config = self.data_config().replace(**{k: getattr(self, k) for k in distil})
        task = ImageClassificationTask(splits, config=config, **kw)
        # the CNN trained on this very subset: the same classes and normalisation as the student
        task.use_teacher(Teacher(teacher, task.settings, "the CNN"))
        return task


def _build(kind: str, splits, overrides: dict[str, Any]):
    """The ``tiny`` (≤ 16 px) or ``small`` preset of ``kind`` sized for the data.

    Raises:
        UserError: an override that is not a config field, or sizes that do not fit (the message
            names the ``--vit-set`` / ``--cnn-set`` flag).
    """
    return build_classifier(kind, splits, overrides, named=f"--{kind}-set")


def run_inductive_bias(
    settings: InductiveBiasSettings,
    out_dir: str | Path,
    *,
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train both models on every fraction (and seed) and measure test accuracy.

    Args:
        settings: see :class:`InductiveBiasSettings`.
        out_dir: where the per-run directories and the summary files go.
        progress: show the trainer's progress bars.
        overwrite: replace the results of an earlier sweep in ``out_dir``.

    Raises:
        RunDirError: ``out_dir`` already holds results and ``overwrite`` is not set.

    Returns:
        ``{"settings", "runs": [per-run dicts], "table": [per fraction: n_train, each model's
        mean and std accuracy, gaps], "params": {kind: n}, "steps" (of every run), "elapsed"}``.
    """
    out = Path(out_dir)
    if (out / "results.json").exists() and not overwrite:
        raise RunDirError(
            f"{str(out)!r} already holds inductive-bias results; pass --overwrite to replace them"
        )
    t0 = time.perf_counter()
    budget = common.Budget(settings.max_time) if settings.max_time is not None else None
    runs: list[dict[str, Any]] = []
    params: dict[str, int] = {}
    n_test = 0
    steps, warmup = settings.steps, settings.warmup
    shared = ("batch_size", "lr", "weight_decay", "device")
    for seed in settings.seeds:
        splits = load_task_data(settings.data_config(), seed)
        if not runs:  # every model must build before anything is trained
            models = {k: _build(k, splits, getattr(settings, k)) for k in settings.models}
            if budget is not None:
                steps, warmup = _steps_within_budget(settings, budget, splits, models)
        for frac in settings.fractions:
            trained: dict[str, Any] = {}
            for kind in settings.models:
                torch.manual_seed(seed)
                model = _build(kind, splits, getattr(settings, kind))
                params[kind] = sum(p.numel() for p in model.parameters())
                task = settings.task(kind, splits, seed, frac, teacher=trained.get("cnn"))
                cfg = TrainConfig(
                    **{name: getattr(settings, name) for name in shared},
                    steps=steps,
                    warmup_steps=warmup,
                    eval_every=steps,
                    eval_batches=4,
                    seed=seed,
                    progress=progress,
                )
                t = time.perf_counter()
                res = train(
                    model, task, cfg, out / "runs" / f"{kind}_f{frac:g}_s{seed}", overwrite=True
                )
                trained[kind] = model
                device = next(model.parameters()).device
                acc, loss = task.test_accuracy(model, device=device)
                train_acc, _ = task.test_accuracy(model, split="train", device=device)
                runs.append(
                    {
                        "model": kind,
                        "fraction": frac,
                        "seed": seed,
                        "n_train": len(task.train_y),
                        "test_acc": acc,
                        "test_loss": loss,
                        "train_acc_full_split": train_acc,
                        "final_train_loss": res.final_train_loss,
                        "steps": steps,
                        "seconds": time.perf_counter() - t,
                    }
                )
                n_test = len(splits.test[1])
                write_results(
                    settings, runs, params, n_test, time.perf_counter() - t0, out, final=False
                )
    return write_results(settings, runs, params, n_test, time.perf_counter() - t0, out)


def _steps_within_budget(
    settings: InductiveBiasSettings, budget: common.Budget, splits: Any, models: dict[str, Any]
) -> tuple[int, int]:
    """The steps (and warm-up) of every run so that all runs fit ``budget``.

    Every model's seconds per step are measured on the full training split (the DeiT's with the
    untrained CNN as its teacher: its step includes the teacher's forward pass); every run gets
    the same steps, ``(1 - RESERVE)`` of what is left divided by the runs' summed step times.
    """
    seed = settings.seeds[0]
    probe_cfg = TrainConfig(
        steps=1, batch_size=settings.batch_size, device=settings.device, progress=False
    )
    per_pair = sum(
        common.seconds_per_step(
            m, settings.task(k, splits, seed, 1.0, teacher=models.get("cnn")), probe_cfg, steps=5
        )
        for k, m in models.items()
    )
    n_pairs = len(settings.seeds) * len(settings.fractions)
    seconds = budget.share(n_pairs, reserve=RESERVE * budget.seconds)
    steps = common.steps_within(seconds, per_pair, minimum=10)
    return steps, common.warmup_within(steps, settings.warmup)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fraction: training images, mean and spread of each model's test accuracy, the gaps
    (``gap`` = CNN − ViT; with a DeiT, ``deit_gap`` = CNN − DeiT and ``closed`` = the share of
    the CNN − ViT gap the DeiT closes, None for a gap under ``MIN_GAP``).

    Works on a partial set of runs (a fraction missing the CNN or the ViT is left out).
    """
    table = []
    for frac in sorted({r["fraction"] for r in runs}):
        row: dict[str, Any] = {"fraction": frac}
        for kind in MODELS:
            accs = [r["test_acc"] for r in runs if r["model"] == kind and r["fraction"] == frac]
            if accs:
                row[f"{kind}_acc"] = statistics.fmean(accs)
                row[f"{kind}_std"] = statistics.pstdev(accs) if len(accs) > 1 else 0.0
                row[f"{kind}_n"] = len(accs)
        if "cnn_acc" not in row or "vit_acc" not in row:
            continue
        row["n_train"] = min(r["n_train"] for r in runs if r["fraction"] == frac)
        row["gap"] = row["cnn_acc"] - row["vit_acc"]
        if "deit_acc" in row:
            row["deit_gap"] = row["cnn_acc"] - row["deit_acc"]
            gap = row["gap"]
            closes = gap >= MIN_GAP  # (a share of a gap within the noise means nothing)
            row["closed"] = (row["deit_acc"] - row["vit_acc"]) / gap if closes else None
        table.append(row)
    return table


def write_results(
    settings: InductiveBiasSettings,
    runs: list[dict[str, Any]],
    params: dict[str, int],
    n_test: int,
    elapsed: float,
    out: Path,
    *,
    final: bool = True,
) -> dict[str, Any]:
    """Write results.json (after every run, so an interrupted sweep keeps what it measured) and,
    when ``final``, table.md and the plot. Returns the result dict."""
    result = {
        "settings": settings.__dict__,
        "runs": runs,
        "table": summarize(runs),
        "params": params,
        "steps": runs[0]["steps"] if runs else settings.steps,  # (sized by max_time when given)
        "n_test": n_test,
        "elapsed": elapsed,
        "complete": final,
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(result, indent=1))
    if final:
        atomic_write_text(out / "table.md", format_table(result) + "\n")
        _plot(result, out / "inductive_bias.png")
    return result


#: both models must reach this test accuracy with the most images before the gap is read
#: (ten classes: chance is 0.1; the README's runs reach 0.95-0.99)
MIN_ACCURACY = 0.5


def format_table(result: dict[str, Any]) -> str:
    """A markdown table: fraction, training images, each model's test accuracy, the gaps."""
    s = result["settings"]
    p = result["params"]
    kinds = [k for k in MODELS if any(f"{k}_acc" in r for r in result["table"])] or ["cnn", "vit"]
    deit = "deit" in kinds
    sizes = "; ".join(f"{LABELS[k].split(' (')[0]} {p.get(k, 0):,} params" for k in kinds)
    distil = (
        f"; DeiT: {s.get('distillation', 'hard')} distillation, α {s.get('distill_alpha', 0.5)}"
        if deit
        else ""
    )
    lines = [
        f"data={s['data']}, {result.get('steps', s['steps'])} steps × batch {s['batch_size']}, "
        f"lr {s['lr']}, seeds {s['seeds']}; {sizes}; test set {result['n_test']} images{distil}",
        "",
        "| fraction | train images | CNN test acc | ViT test acc |"
        + (" DeiT test acc |" if deit else "")
        + " CNN − ViT |"
        + (" CNN − DeiT | gap closed |" if deit else ""),
        "|---:|---:|---:|---:|"
        + ("---:|" if deit else "")
        + "---:|"
        + ("---:|---:|" if deit else ""),
    ]

    def fmt(r: dict, k: str) -> str:
        acc, std, n = r[k + "_acc"], r[k + "_std"], r[k + "_n"]
        return f"{acc:.3f} ± {std:.3f} (n={n})" if n > 1 else f"{acc:.3f}"

    for r in result["table"]:
        cells = [f"{r['fraction']:g}", str(r["n_train"]), fmt(r, "cnn"), fmt(r, "vit")]
        if deit:
            cells.append(fmt(r, "deit") if "deit_acc" in r else "–")
        cells.append(f"{r['gap']:+.3f}")
        if deit:
            closed = r.get("closed")
            cells.append(f"{r['deit_gap']:+.3f}" if "deit_gap" in r else "–")
            cells.append(f"{closed:.0%}" if closed is not None else "–")
        lines.append("| " + " | ".join(cells) + " |")
    if result["table"]:  # the gap between two models that have not learnt digits is noise
        most = result["table"][-1]
        short = common.undertrained(
            {k: most[f"{k}_acc"] for k in kinds if f"{k}_acc" in most},
            threshold=MIN_ACCURACY,
            what=f"test accuracy with the most training images ({most['n_train']})",
            max_time=s.get("max_time"),
            steps=s.get("steps") if s.get("max_time") is None else None,
        )
        if short is not None:
            lines += ["", short]
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = result["table"]
    n = [r["n_train"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for kind, label in LABELS.items():
        if not rows or f"{kind}_acc" not in rows[0]:
            continue
        acc = [r[f"{kind}_acc"] for r in rows]
        err = [r[f"{kind}_std"] for r in rows]
        ax.errorbar(
            [x * (1.03 if kind == "deit" else 1.0) for x in n],  # (apart from the ViT's bars)
            acc,
            yerr=err,
            marker="o",
            capsize=3,
            label=f"{label} ({result['params'].get(kind, 0):,} params)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("training images")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Same budget, growing data ({result['settings']['data']})")
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, path)
