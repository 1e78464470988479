"""The flags of ``attnlab experiment inductive-bias`` and ``patch-size`` as their settings, and
the lines they print: comma lists of numbers, ``--vit-set KEY=VALUE`` items, the summary line;
and, as data (:data:`EXPERIMENTS`), the whole flag tables of ``vit-data`` and ``swin-cost``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnlab.config.overrides import parse_overrides
from attnlab.errors import UserError
from attnlab.experiments.inductive_bias import InductiveBiasSettings, format_table
from attnlab.experiments.inductive_bias import run_inductive_bias as _run_inductive_bias
from attnlab.experiments.patch_size import PatchSizeSettings
from attnlab.experiments.patch_size import run_patch_size as _run_patch_size
from attnlab.experiments.swin_cost import SwinCostSettings, run_swin_cost
from attnlab.experiments.vit_data import ViTDataSettings, run_vit_data

__all__ = [
    "numbers",
    "model_overrides",
    "inductive_bias",
    "patch_size",
    "vit_data",
    "swin_cost",
    "EXPERIMENTS",
]

AUGMENT = {"auto": None, "on": True, "off": False}


def numbers(text: str, kind: type, flag: str) -> list:
    """``"0.1,0.25"`` -> ``[0.1, 0.25]``. Raises UserError naming ``flag`` on a non-number."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def model_overrides(items: list[str], flag: str) -> dict[str, Any]:
    """``--vit-set d_model=96`` items -> ``{"d_model": 96}`` (the one ``--set`` value parser).

    Raises:
        UserError: an item that sets another section than ``model``.
    """
    out = {}
    for key, value in parse_overrides(items).items():
        section, _, name = key.partition(".")
        if section != "model":
            raise UserError(f"{flag} sets model fields (KEY=VALUE), got {key!r}")
        out[name] = value
    return out


def _settings(cls: type, args: Any, **extra: Any) -> Any:
    named = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
             if f.init and hasattr(args, f.name)}  # fmt: skip
    return cls(**{**named, **extra})


def _summary(result: dict[str, Any], out: str) -> str:
    return (
        f"\n{len(result['runs'])} runs in {result['elapsed']:.0f} s; table, JSON and plot in {out}"
    )


def _run_and_report(run, settings: Any, args: Any, table=lambda result: result["markdown"]) -> str:
    """Run an image sweep with the shared output flags; its table and summary line."""
    result = run(settings, args.out, progress=not args.no_progress, overwrite=args.overwrite)
    return table(result) + "\n" + _summary(result, args.out)


def inductive_bias(args: Any) -> str:
    """Run the sweep the flags describe; its table and summary line."""
    settings = _settings(
        InductiveBiasSettings, args,
        fractions=numbers(args.fractions, float, "--fractions"),
        seeds=numbers(args.seeds, int, "--seeds"),
        models=[m.strip() for m in args.models.split(",") if m.strip()],
        augment=AUGMENT[args.augment],
        **{k: model_overrides(getattr(args, f"{k}_set"), f"--{k}-set")
           for k in ("vit", "cnn", "deit")},
    )  # fmt: skip
    return _run_and_report(_run_inductive_bias, settings, args, table=format_table)


def patch_size(args: Any) -> str:
    """Run the patch sizes the flags describe; its table and summary line."""
    settings = _settings(
        PatchSizeSettings, args,
        patch_sizes=numbers(args.patch_sizes, int, "--patch-sizes"),
        seeds=numbers(args.seeds, int, "--seeds"),
        vit=model_overrides(args.vit_set, "--vit-set"),
    )  # fmt: skip
    return _run_and_report(_run_patch_size, settings, args)


def vit_data(args: Any) -> str:
    """Run the data sweep (and transfer rows) the flags describe; its table and summary."""
    settings = _settings(
        ViTDataSettings, args,
        sizes=numbers(args.sizes, int, "--sizes"),
        finetune_sizes=numbers(args.finetune_sizes, int, "--finetune-sizes"),
        seeds=numbers(args.seeds, int, "--seeds"),
        models=[m.strip() for m in args.models.split(",") if m.strip()],
        augment=AUGMENT[args.augment],
        **{k: model_overrides(getattr(args, f"{k}_set"), f"--{k}-set") for k in ("vit", "cnn")},
    )  # fmt: skip
    return _run_and_report(run_vit_data, settings, args)


def swin_cost(args: Any) -> str:
    """Measure the costs the flags describe; the table and where it was written."""
    settings = _settings(
        SwinCostSettings, args,
        image_sizes=numbers(args.image_sizes, int, "--image-sizes"),
        **{k: model_overrides(getattr(args, f"{k}_set"), f"--{k}-set") for k in ("vit", "swin")},
    )  # fmt: skip
    result = run_swin_cost(settings, args.out, overwrite=args.overwrite)
    return (
        result["markdown"]
        + f"\n\nmeasured in {result['elapsed']:.0f} s; table, JSON and plot in {args.out}"
    )


def _set(kind: str) -> tuple:
    return (f"--{kind}-set", "append", [], f"a {kind} config field (repeatable)",
            {"metavar": "KEY=VALUE"})  # fmt: skip


# fmt: off
_VIT_DATA_FLAGS = [
    ("--sizes", None, "1000,3000,10000,30000,100000",
     "comma-separated training-set sizes, ≥2, increasing (default: %(default)s)"),
    ("--image-size", int, 16, "side of the generated images (default: %(default)s)"),
    ("--label", ("shape", "colour", "both"), "both",
     "the class of the sweep and of fine-tuning (default: %(default)s, 12 classes)"),
    ("--pretrain-label", ("shape", "colour", "both"), "shape",
     "the class of pre-training on all training images (default: %(default)s)"),
    ("--finetune-sizes", None, "1000",
     "sizes (among --sizes) at which the pre-trained models are fine-tuned; '' for none "
     "(default: %(default)s)"),
    ("--n-val", int, 1000, "validation images (default: %(default)s)"),
    ("--n-test", int, 2000, "test images, the same for every size (default: %(default)s)"),
    ("--models", None, "cnn,vit", "which of cnn, vit to train (default: %(default)s)"),
    ("--steps", int, 1000, "steps of every run: equal steps, not epochs (default: %(default)s)"),
    ("--batch-size", int, 64, None),
    ("--lr", float, 1e-3, None),
    ("--warmup", int, 30, None),
    ("--seeds", None, "0", "comma-separated seeds (default: %(default)s)"),
    ("--augment", ("auto", "on", "off"), "auto",
     "random crops and flips for every run; auto = on for images of 16 px or more"),
    _set("vit"), _set("cnn"),
    ("--device", None, "auto", None),
    ("--no-progress", "store_true", None, None),
    ("--out", None, "runs/vit-data", "output directory (default: %(default)s)"),
    ("--overwrite", "store_true", None, "replace what --out holds"),
]
_SWIN_COST_FLAGS = [
    ("--image-sizes", None, "32,64,128,256",
     "comma-separated image sides, ≥2, increasing (default: %(default)s)"),
    ("--patch-size", int, 4, "patch side of both models (default: %(default)s)"),
    ("--batch", int, 1, "images per timed forward pass (default: %(default)s)"),
    ("--repeats", int, 3, "timed passes per model and size; the median is shown "
     "(default: %(default)s)"),
    _set("vit"), _set("swin"),
    ("--device", None, "auto", None),
    ("--out", None, "runs/swin-cost", "output directory (default: %(default)s)"),
    ("--overwrite", "store_true", None, "replace what --out holds"),
]
#: ``(name, runner, {"help", "description"}, flag rows)`` of the experiments registered as data
EXPERIMENTS = [
    ("vit-data", vit_data, dict(
        help="CNN vs ViT on 10³…10⁵ generated shapes (equal steps), and pre-trained then "
        "fine-tuned",
        description="Train a residual CNN and a ViT with the same steps/batch/lr on growing "
        "numbers of generated shape images (the test set fixed) and read where the ViT meets or "
        "passes the CNN; then pre-train both on all training images (another label) and "
        "fine-tune on the smallest set (the weights copied as by 'train image --init-from'). "
        "Table + plot. Example: attnlab experiment vit-data --out runs/vit-data."),
     _VIT_DATA_FLAGS),
    ("swin-cost", swin_cost, dict(
        help="Swin vs ViT cost by image size: counted FLOPs and time per forward (linear vs "
        "quadratic)",
        description="Build a ViT and a Swin (the 'small' presets, the same patch size) for "
        "several image sizes; count their forward FLOPs (torch.utils.flop_counter) and time a "
        "forward pass. Swin's windowed attention grows linearly with the tokens, the ViT's "
        "global attention quadratically. Example: attnlab experiment swin-cost --out "
        "runs/swin-cost."),
     _SWIN_COST_FLAGS),
]
# fmt: on
