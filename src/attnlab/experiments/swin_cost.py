"""Swin's cost against ViT's by image size: windowed attention is linear in the tokens, global
attention quadratic.

With p×p patches an H×H image is N = (H/p)² tokens. A ViT block costs O(N·C²) in its
projections and MLP and O(N²·C) in QKᵀ and AV: once the N² term dominates, doubling the side
(N × 4) multiplies the cost by up to 16. A Swin block attends inside w×w windows, O(N·w²·C), and
each stage merges 2×2 patches (N / 4, C × 2), so every term is proportional to N: doubling the side
multiplies the cost by 4 (exactly, once every stage's map holds whole windows).

For each image size both models (the ``small`` presets, the same patch size, so the same N
tokens enter the first block) are built untrained and

- their forward FLOPs are counted by :class:`torch.utils.flop_counter.FlopCounterMode` (matrix
  products, convolutions, attention; norms, softmax and activations are not counted), and equal
  the written-out :func:`~attnlab.experiments.patch_size.vit_forward_flops` and
  :func:`swin_forward_flops`;
- the seconds of one forward pass of ``batch`` images are timed (no gradients, the median of
  ``repeats`` after one untimed pass). Times on a loaded machine are noisy: the FLOPs are the
  exact measure of the growth, the times show what it costs here.

Shape legend: B batch, N tokens of the first stage, C width, w window side, L classes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config.base import Config
from attnlab.config.vision import SwinConfig
from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.experiments.patch_size import vit_forward_flops
from attnlab.models.vision.factory import build_image_classifier
from attnlab.plotting import pyplot, save_png
from attnlab.train.distributed import resolve_device

__all__ = ["SwinCostSettings", "swin_forward_flops", "forward_flops", "measure_costs",
           "run_swin_cost"]  # fmt: skip

KINDS = ("vit", "swin")
LABELS = {"vit": "ViT", "swin": "Swin"}
#: the ranges of the settings (a 2-core machine times a 256² ViT of 4×4 patches in seconds)
BOUNDS = {"image_sizes": (8, 512), "patch_size": (1, 64), "batch": (1, 64), "repeats": (1, 50)}


def swin_forward_flops(config: SwinConfig, batch: int) -> int:
    """FLOPs (2 per multiply-add) of a Swin's forward pass over ``batch`` images, counting what
    :class:`FlopCounterMode` counts. Stage s has width C_s, N_s tokens, windows of
    Nw = min(w, side_s)² tokens and an MLP of F_s:

        patches 2·B·N·C·Cin·p²;  per block 2·B·N_s·4·C_s² + 2·2·B·N_s·Nw·C_s + 2·2·B·N_s·C_s·F_s;
        patch merging 2·B·(N_s/4)·4C_s·2C_s;  head 2·B·C_last·L

    Every term but the head is proportional to N at a fixed window: the cost is linear in tokens.
    """
    c = config
    n0 = (c.image_size // c.patch_size) ** 2
    total = 2 * batch * n0 * c.d_model * c.in_channels * c.patch_size**2
    for s, depth in enumerate(c.depths):
        C, side = c.stage_dims[s], c.stage_resolutions[s]
        N, Nw, F = side * side, min(c.window_size, side) ** 2, int(c.mlp_ratio * C)
        total += depth * (
            2 * batch * N * 4 * C * C + 4 * batch * N * Nw * C + 4 * batch * N * C * F
        )
        if s < len(c.depths) - 1:
            total += 2 * batch * (N // 4) * 4 * C * 2 * C
    return total + 2 * batch * c.num_features * c.num_classes


def forward_flops(model: torch.nn.Module, images: torch.Tensor) -> int:
    """FLOPs of ``model(images)`` counted by :class:`FlopCounterMode` (forward only).

    (Counted with autograd on: the counter's module tracker needs the graph.)"""
    counter = FlopCounterMode(display=False)
    with counter:
        model(images)
    return int(counter.get_total_flops())


@dataclass
class SwinCostSettings(Config):
    """What is measured.

    Attributes:
        image_sizes: square sides in pixels, at least two, increasing; each must suit both
            models (a multiple of the patch size and of Swin's windows at every stage).
        patch_size: the patch side of both models (the same N tokens enter the first block).
        batch: images per timed forward pass.
        repeats: timed passes per model and size (the median is reported).
        vit, swin: overrides of the ``small`` presets (not ``patch_size``).
        device: where the passes run.
    """

    image_sizes: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    patch_size: int = 4
    batch: int = 1
    repeats: int = 3
    vit: dict[str, Any] = field(default_factory=dict)
    swin: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"

    def validate(self) -> None:
        super().validate()
        sizes = [int(s) for s in self.image_sizes]
        if len(sizes) < 2 or sorted(set(sizes)) != sizes or sizes[0] < 1:
            raise ValueError(f"image_sizes must be at least two increasing sides, got {sizes}")
        self.image_sizes = sizes
        common.check_bounds(self, BOUNDS)
        if "patch_size" in self.vit or "patch_size" in self.swin:
            raise ValueError("give the patch size of both models as patch_size, not in vit/swin")


def _build(kind: str, side: int, s: SwinCostSettings) -> torch.nn.Module:
    overrides = {**(s.vit if kind == "vit" else s.swin), "patch_size": s.patch_size}
    try:
        model = build_image_classifier(kind, (3, side, side), [f"c{i}" for i in range(10)],
                                       preset="small", overrides=overrides)  # fmt: skip
    except UserError as err:
        raise UserError(f"image size {side}: {err}") from None
    return model.eval()


def _seconds(model: torch.nn.Module, images: torch.Tensor, repeats: int) -> float:
    sync = torch.cuda.synchronize if images.device.type == "cuda" else (lambda: None)
    times = []
    with torch.no_grad():
        model(images)  # (untimed: allocations, kernel choice)
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            model(images)
            sync()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_costs(settings: SwinCostSettings) -> list[dict[str, Any]]:
    """Per image size and model: tokens, parameters, counted and formula FLOPs, seconds.

    Every model is built (and refused, naming the size) before anything is timed.
    """
    s = settings
    device = resolve_device(s.device)
    models = {(side, k): _build(k, side, s) for side in s.image_sizes for k in KINDS}
    rows = []
    for (side, kind), model in models.items():
        images = torch.rand(s.batch, 3, side, side)
        formula = (vit_forward_flops if kind == "vit" else swin_forward_flops)(
            model.config, s.batch
        )
        counted = forward_flops(model, images)
        model.to(device)
        rows.append({"image_size": side, "model": kind, "tokens": (side // s.patch_size) ** 2,
                     "params": sum(p.numel() for p in model.parameters()),
                     "flops": counted, "formula_flops": formula,
                     "seconds": _seconds(model, images.to(device), s.repeats)})  # fmt: skip
        model.to("cpu")
    return rows


def run_swin_cost(
    settings: SwinCostSettings, out_dir: str | Path, *, overwrite: bool = False
) -> dict[str, Any]:
    """Measure both models at every size; write ``table.md``, ``results.json`` and
    ``swin_cost.png`` to ``out_dir``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a size one of the models cannot read (named).

    Returns:
        ``{"settings", "rows": [per size and model], "markdown", "elapsed"}``.
    """
    t0 = time.perf_counter()
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    rows = measure_costs(settings)
    table = _table(rows, settings.image_sizes)
    by = {(r["image_size"], r["model"]): r for r in rows}
    first, last = settings.image_sizes[0], settings.image_sizes[-1]
    growth = {k: by[last, k]["flops"] / by[first, k]["flops"] for k in KINDS}
    tokens = by[last, "vit"]["tokens"] / by[first, "vit"]["tokens"]
    off = [f"{r['model']} {r['image_size']}" for r in rows if r["flops"] != r["formula_flops"]]
    agree = f"differ from the formula at {', '.join(off)}" if off else "each equals the formula"
    notes = (
        f"Both models untrained, 'small' presets with {settings.patch_size}×"
        f"{settings.patch_size} patches; FLOPs of one forward pass of {settings.batch} "
        f"image(s) counted by torch.utils.flop_counter ({agree}); "
        f"seconds: median of {settings.repeats} forward passes on {resolve_device(settings.device)}. "
        f"From {first} to {last} px the tokens grow ×{tokens:g}: ViT FLOPs ×{growth['vit']:.1f}, "
        f"Swin FLOPs ×{growth['swin']:.1f} (linear would be ×{tokens:g}, quadratic ×{tokens**2:g})."
    )
    result = {"settings": settings.to_dict(), "rows": rows, "growth": growth, "tokens": tokens}
    result["elapsed"] = time.perf_counter() - t0
    common.write_outputs(out, "Swin's cost against ViT's", [table], result, notes,
                         (_plot, "swin_cost.png"))  # fmt: skip
    result["markdown"] = table.markdown() + "\n\n" + notes
    return result


def _table(rows: list[dict[str, Any]], sizes: list[int]) -> common.Table:
    t = common.Table(
        ["image", "tokens", "ViT GFLOPs", "ViT ×", "Swin GFLOPs", "Swin ×", "ViT ms",
         "Swin ms", "ViT / Swin FLOPs"],
        formats=["", ",", ".3f", ".1f", ".3f", ".1f", ".1f", ".1f", ".1f"],
    )  # fmt: skip
    by = {(r["image_size"], r["model"]): r for r in rows}
    for i, side in enumerate(sizes):
        v, w = by[side, "vit"], by[side, "swin"]
        prev = sizes[i - 1] if i else None
        grow = {k: by[side, k]["flops"] / by[prev, k]["flops"] if prev else None for k in KINDS}
        t.add(
            f"{side}×{side}", v["tokens"], v["flops"] / 1e9, grow["vit"], w["flops"] / 1e9,
            grow["swin"], v["seconds"] * 1e3, w["seconds"] * 1e3, v["flops"] / w["flops"],
        )  # fmt: skip
    return t


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for kind in KINDS:
        mine = [r for r in result["rows"] if r["model"] == kind]
        n = [r["tokens"] for r in mine]
        a1.plot(n, [r["flops"] / 1e9 for r in mine], marker="o", label=LABELS[kind])
        a2.plot(n, [r["seconds"] * 1e3 for r in mine], marker="o", label=LABELS[kind])
    for a, what in ((a1, "forward GFLOPs"), (a2, "ms per forward")):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("tokens (first stage)")
        a.set_ylabel(what)
        a.grid(alpha=0.3)
        a.legend()
    a1.set_title("FLOPs: ViT ~N², Swin ~N")
    a2.set_title("Time per forward pass")
    save_png(fig, path)
