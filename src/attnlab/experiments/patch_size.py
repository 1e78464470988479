"""Patch size, the ViT's key knob: smaller patches mean more tokens and more compute.

An H×W image cut into p×p patches is N = (H/p)·(W/p) tokens. A block's projections and MLP cost
O(N·C²), its attention O(N²·C), so halving p multiplies the tokens by 4 and the attention by 16.
What it buys is resolution: a token describes a smaller piece of the image.

Every patch size trains the same ViT (the ``tiny`` / ``small`` preset, its width and depth) on the
same data with the same optimizer, batch and number of steps; each run records its test accuracy,
tokens per image, training FLOPs and wall-clock seconds. FLOPs are counted by
:class:`torch.utils.flop_counter.FlopCounterMode` on one training step (forward and backward:
matrix products, convolutions and attention; norms, softmax and activations are not counted)
times the steps; :func:`vit_forward_flops` is the same count of the forward pass written out.
With ``max_time`` the steps are sized from every model's measured seconds per step so that all
runs fit ``1 - RESERVE`` of the budget, as in the inductive-bias experiment.

Shape legend: B batch, N patches, T tokens (N + 1 with a class token), C d_model, F FFN width,
Cin channels, p patch size, L classes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config.vision import ViTConfig
from attnlab.experiments import common
from attnlab.experiments.image_sweep import ImageSweepSettings, build_classifier
from attnlab.plotting import pyplot, save_png
from attnlab.tasks.image import ImageClassificationTask, load_task_data
from attnlab.train import TrainConfig, train

__all__ = [
    "PatchSizeSettings",
    "run_patch_size",
    "training_step_flops",
    "vit_forward_flops",
    "tokens_per_image",
]

RESERVE = 0.2


@dataclass
class PatchSizeSettings(ImageSweepSettings):
    """What is compared; the images, the budget (the same for every patch size) and the seeds
    are those of :class:`~attnlab.experiments.image_sweep.ImageSweepSettings`.

    Attributes:
        patch_sizes: at least two, each dividing the image side.
        vit: overrides of the ViT preset (not ``patch_size``).
    """

    patch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    vit: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        super().validate()
        ps = self.patch_sizes
        if len(ps) < 2 or len(set(ps)) != len(ps) or min(ps) < 1:
            raise ValueError(f"give at least two distinct positive patch sizes, got {ps}")
        self.patch_sizes = sorted(ps)
        if "patch_size" in self.vit:
            raise ValueError("the patch size is what varies: give it in patch_sizes, not vit")


def tokens_per_image(config: ViTConfig) -> int:
    """Patch tokens of one image, ``(H/p)²`` (the class token not counted)."""
    return config.num_patches


def vit_forward_flops(config: ViTConfig, batch: int) -> int:
    """FLOPs (2 per multiply-add) of a plain ViT's forward pass over ``batch`` images, counting
    what :class:`FlopCounterMode` counts: the patch projection, per block Q/K/V and output
    projections, QKᵀ and AV, the MLP, and the head.

        patches 2·B·N·C·Cin·p²;  per block 2·B·T·(3C² + C²) + 2·2·B·T²·C + 2·2·B·T·C·F;
        head 2·B·C·L
    """
    c = config
    N, C, F = c.num_patches, c.d_model, c.ffn_hidden or 4 * c.d_model
    T = N + (1 if c.pooling == "cls" else 0)
    patches = 2 * batch * N * C * c.in_channels * c.patch_size**2
    block = 2 * batch * T * 4 * C * C + 4 * batch * T * T * C + 4 * batch * T * C * F
    return patches + c.n_layers * block + 2 * batch * C * c.num_classes


def training_step_flops(model: torch.nn.Module, task: Any, batch_size: int) -> int:
    """FLOPs of one training step (forward and backward of the task's loss on one batch),
    counted by :class:`torch.utils.flop_counter.FlopCounterMode`; gradients are cleared after."""
    device = next(model.parameters()).device
    images, labels = task.get_batch("train", 0, batch_size)
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = task.loss(model, (images.to(device), labels.to(device)), None)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def _build(splits: Any, patch_size: int, overrides: dict[str, Any]) -> torch.nn.Module:
    return build_classifier(
        "vit", splits, {**overrides, "patch_size": patch_size}, named=f"patch size {patch_size}"
    )


def run_patch_size(
    settings: PatchSizeSettings,
    out_dir: str | Path,
    *,
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train one ViT per patch size (and seed) with the same budget; measure accuracy and cost.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a patch size that does not divide the image side (named).

    Returns:
        ``{"settings", "runs": [per run], "table": [per patch size: tokens, params, accuracy mean
        and std, training FLOPs, seconds], "steps", "elapsed", "markdown"}``; ``table.md``, ``results.json``
        and ``patch_size.png`` are written to ``out_dir``.
    """
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    t0 = time.perf_counter()
    budget = common.Budget(settings.max_time) if settings.max_time is not None else None
    splits = load_task_data(settings.data_config(), settings.seeds[0])
    models = {p: _build(splits, p, settings.vit) for p in settings.patch_sizes}  # all fit first
    steps, warmup = settings.steps, settings.warmup
    shared = ("batch_size", "lr", "weight_decay", "device")
    if budget is not None:
        probe = TrainConfig(steps=1, batch_size=settings.batch_size, device=settings.device)
        task = ImageClassificationTask(splits, seed=settings.seeds[0])
        per_set = sum(common.seconds_per_step(m, task, probe, steps=3) for m in models.values())
        seconds = budget.share(len(settings.seeds), reserve=RESERVE * budget.seconds)
        steps = common.steps_within(seconds, per_set, minimum=10)
        warmup = common.warmup_within(steps, settings.warmup)
    runs: list[dict[str, Any]] = []
    for seed in settings.seeds:
        splits = load_task_data(settings.data_config(), seed)
        for p in settings.patch_sizes:
            torch.manual_seed(seed)
            model = _build(splits, p, settings.vit)
            task = ImageClassificationTask(splits, seed=seed)
            cfg = TrainConfig(
                **{name: getattr(settings, name) for name in shared},
                steps=steps,
                warmup_steps=warmup,
                eval_every=steps,
                eval_batches=4,
                seed=seed,
                progress=progress,
            )
            step_flops = training_step_flops(model, task, settings.batch_size)
            t = time.perf_counter()
            train(model, task, cfg, out / "runs" / f"p{p}_s{seed}", overwrite=True)
            seconds = time.perf_counter() - t
            acc, _ = task.test_accuracy(model, device=next(model.parameters()).device)
            runs.append(
                {
                    "patch_size": p,
                    "seed": seed,
                    "tokens": tokens_per_image(model.config),
                    "params": sum(q.numel() for q in model.parameters()),
                    "test_acc": acc,
                    "train_flops": step_flops * steps,
                    "seconds": seconds,
                    "steps": steps,
                }
            )
    table = summarize(runs)
    result = {
        "settings": settings.to_dict(),
        "runs": runs,
        "table": table,
        "steps": steps,
        "n_test": len(splits.test[1]),
    }
    result["elapsed"] = time.perf_counter() - t0  # (write_outputs updates it under a budget)
    md = _table(table)
    notes = (
        f"data={settings.data}, {steps} steps × batch {settings.batch_size} for every patch size, "
        f"lr {settings.lr}, seeds {settings.seeds}; test set {result['n_test']} images; "
        "FLOPs counted by torch.utils.flop_counter (matrix products, convolutions, attention)."
    )
    common.write_outputs(
        out, "Patch size", [md], result, notes, (_plot, "patch_size.png"), budget=budget
    )
    result["markdown"] = md.markdown() + "\n\n" + notes
    return result


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per patch size: tokens, parameters, mean and spread of test accuracy, mean FLOPs and
    seconds of training."""
    rows = []
    for p in sorted({r["patch_size"] for r in runs}):
        mine = [r for r in runs if r["patch_size"] == p]
        accs = [r["test_acc"] for r in mine]
        rows.append(
            {
                "patch_size": p,
                "tokens": mine[0]["tokens"],
                "params": mine[0]["params"],
                "test_acc": statistics.fmean(accs),
                "test_std": statistics.pstdev(accs) if len(accs) > 1 else 0.0,
                "n": len(accs),
                "train_flops": statistics.fmean(r["train_flops"] for r in mine),
                "seconds": statistics.fmean(r["seconds"] for r in mine),
            }
        )
    return rows


def _table(rows: list[dict[str, Any]]) -> common.Table:
    t = common.Table(
        [
            "patch",
            "tokens / image",
            "params",
            "test acc",
            "± (seeds)",
            "training GFLOPs",
            "seconds",
        ],
        formats=["", "", ",", ".3f", ".3f", ".2f", ".0f"],
    )
    for r in rows:
        t.add(
            r["patch_size"],
            r["tokens"],
            r["params"],
            r["test_acc"],
            r["test_std"],
            r["train_flops"] / 1e9,
            r["seconds"],
        )
    return t


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = result["table"]
    p = [r["patch_size"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.errorbar(p, [r["test_acc"] for r in rows], yerr=[r["test_std"] for r in rows], marker="o")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("patch size p")
    a1.set_ylabel("test accuracy")
    a1.set_title("Same steps, every patch size")
    a2.plot(p, [r["train_flops"] / 1e9 for r in rows], marker="o", label="training GFLOPs")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xlabel("patch size p")
    a2.set_ylabel("training GFLOPs")
    ax3 = a2.twinx()
    ax3.plot(p, [r["seconds"] for r in rows], marker="s", color="C1", label="seconds")
    ax3.set_ylabel("wall-clock seconds", color="C1")
    for a, r in zip([a2] * len(rows), rows):
        a.annotate(f"{r['tokens']} tok", (r["patch_size"], r["train_flops"] / 1e9), fontsize=8)
    a1.grid(alpha=0.3)
    a2.grid(alpha=0.3)
    save_png(fig, path)
