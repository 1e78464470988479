"""The vision experiments: ``attnlab experiment inductive-bias`` (CNN, ViT and a DeiT distilled
from the CNN on growing data) and ``attnlab experiment patch-size`` (tokens, FLOPs, time and
accuracy of ViTs with several patch sizes). Flag tables; the work is in
:mod:`attnlab.experiments.inductive_bias` and :mod:`attnlab.experiments.patch_size`.
"""

from __future__ import annotations

import argparse
from typing import Any

from attnlab.commands.config_args import from_args
from attnlab.commands.flags import add_flags
from attnlab.commands.vision import add_data_args
from attnlab.config.overrides import parse_overrides
from attnlab.errors import UserError
from attnlab.experiments.inductive_bias import (
    InductiveBiasSettings,
    format_table,
    run_inductive_bias,
)
from attnlab.experiments.patch_size import PatchSizeSettings, run_patch_size


def _numbers(text: str, kind: type, flag: str) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def _model_overrides(items: list[str], flag: str) -> dict[str, Any]:
    """``--vit-set d_model=96`` items -> ``{"d_model": 96}`` (the one ``--set`` value parser)."""
    out = {}
    for key, value in parse_overrides(items).items():
        section, _, name = key.partition(".")
        if section != "model":
            raise UserError(f"{flag} sets model fields (KEY=VALUE), got {key!r}")
        out[name] = value
    return out


def _inductive_bias(args: argparse.Namespace) -> int:
    settings = from_args(
        InductiveBiasSettings,
        args,
        fractions=_numbers(args.fractions, float, "--fractions"),
        seeds=_numbers(args.seeds, int, "--seeds"),
        models=[m.strip() for m in args.models.split(",") if m.strip()],
        augment={"auto": None, "on": True, "off": False}[args.augment],
        **{
            k: _model_overrides(getattr(args, f"{k}_set"), f"--{k}-set")
            for k in ("vit", "cnn", "deit")
        },
    )
    result = run_inductive_bias(
        settings, args.out, progress=not args.no_progress, overwrite=args.overwrite
    )
    print(format_table(result))
    print(
        f"\n{len(result['runs'])} runs in {result['elapsed']:.0f} s; table, JSON and plot in "
        f"{args.out}"
    )
    return 0


def _patch_size(args: argparse.Namespace) -> int:
    settings = from_args(
        PatchSizeSettings,
        args,
        patch_sizes=_numbers(args.patch_sizes, int, "--patch-sizes"),
        seeds=_numbers(args.seeds, int, "--seeds"),
        vit=_model_overrides(args.vit_set, "--vit-set"),
    )
    result = run_patch_size(
        settings, args.out, progress=not args.no_progress, overwrite=args.overwrite
    )
    print(result["markdown"])
    print(
        f"\n{len(result['runs'])} runs in {result['elapsed']:.0f} s; table, JSON and plot in {args.out}"
    )
    return 0


_BUDGET = [
    ("--steps", int, 300, "steps per run (default: %(default)s)"),
    ("--max-time", float, None,
     "wall-clock seconds for the whole experiment, instead of --steps: every model's speed is "
     "measured and every run gets the same steps, as many as fit", {"metavar": "SECONDS"}),
    ("--batch-size", int, 64, None),
    ("--lr", float, 1e-3, None),
    ("--warmup", int, 30, None),
    ("--seeds", None, "0", "comma-separated seeds (default: %(default)s)"),
    ("--device", None, "auto", None),
    ("--no-progress", "store_true", None, None),
]  # fmt: skip


def _add_inductive_bias(groups) -> None:
    e = groups["experiment"].add_parser(
        "inductive-bias",
        help="CNN vs ViT vs DeiT (distilled from the CNN) with the same budget on growing data",
        description="Train a residual CNN, a ViT and a DeiT (the ViT plus a distillation token, "
        "taught by the CNN just trained on the same images) with the same steps/batch/lr on "
        "growing fractions of the training set and compare test accuracy (table + plot). "
        "Example: attnlab experiment inductive-bias --max-time 300 --out runs/inductive-bias.",
    )
    add_data_args(e)
    # fmt: off
    add_flags(e, [
        ("--fractions", None, "0.1,0.25,0.5,1",
         "comma-separated training-set fractions, ≥3 (default: %(default)s)"),
        ("--models", None, "cnn,vit,deit",
         "which of cnn, vit, deit to train; deit needs cnn (default: %(default)s)"),
        *_BUDGET,
        ("--distillation", ("hard", "soft"), "hard", "the DeiT's loss (default: %(default)s)"),
        ("--distill-alpha", float, 0.5, "weight of the distillation head (default: %(default)s)"),
        ("--distill-temperature", float, 1.0, "τ of soft distillation (default: %(default)s)"),
        ("--augment", ("auto", "on", "off"), "auto",
         "random crops for every model; auto = on for images of 16 px or more (default: auto)"),
        ("--vit-set", "append", [], None, {"metavar": "KEY=VALUE"}),
        ("--cnn-set", "append", [], None, {"metavar": "KEY=VALUE"}),
        ("--deit-set", "append", [], None, {"metavar": "KEY=VALUE"}),
        ("--out", None, "runs/inductive-bias", "output directory (default: %(default)s)"),
        ("--overwrite", "store_true", None, "replace the results of an earlier sweep in --out"),
    ])
    # fmt: on
    e.set_defaults(func=_inductive_bias)


def _add_patch_size(groups) -> None:
    e = groups["experiment"].add_parser(
        "patch-size",
        help="ViTs with several patch sizes, same data and budget: accuracy, tokens, FLOPs, time",
        description="Train the same ViT with several patch sizes on the same data with the same "
        "steps/batch/lr; report test accuracy, tokens per image ((H/p)²), training FLOPs "
        "(counted by torch.utils.flop_counter) and wall-clock seconds (table + plot). Example: "
        "attnlab experiment patch-size --max-time 300 --out runs/patch-size.",
    )
    add_data_args(e)
    # fmt: off
    add_flags(e, [
        ("--patch-sizes", None, "1,2,4,8",
         "comma-separated patch sizes, each dividing the image side (default: %(default)s)"),
        *_BUDGET,
        ("--vit-set", "append", [], None, {"metavar": "KEY=VALUE"}),
        ("--out", None, "runs/patch-size", "output directory (default: %(default)s)"),
        ("--overwrite", "store_true", None, "replace what --out holds"),
    ])
    # fmt: on
    e.set_defaults(func=_patch_size)


def register(groups) -> None:
    """Add the vision experiments."""
    _add_inductive_bias(groups)
    _add_patch_size(groups)
