"""The vision experiments: ``attnlab experiment inductive-bias`` (CNN, ViT, DeiT on growing data),
``patch-size`` (tokens, FLOPs, time, accuracy by patch size), ``vit-data`` and ``swin-cost`` (their
rows: data in :mod:`attnlab.experiments.vision_flags`). Flag tables; the work is in
:mod:`attnlab.experiments.vision_flags`, :mod:`attnlab.experiments.inductive_bias` and
:mod:`attnlab.experiments.patch_size`.
"""

from __future__ import annotations

from attnlab.commands.flags import add_command, add_flags
from attnlab.experiments import vision_flags
from attnlab.runspec.image_flags import DATA_FLAGS


def _printing(run):
    return lambda args: print(run(args)) or 0


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
    e = add_command(
        groups["experiment"],
        "inductive-bias",
        func=_printing(vision_flags.inductive_bias),
        help="CNN vs ViT vs DeiT (distilled from the CNN) with the same budget on growing data",
        description="Train a residual CNN, a ViT and a DeiT (the ViT plus a distillation token, "
        "taught by the CNN just trained on the same images) with the same steps/batch/lr on "
        "growing fractions of the training set and compare test accuracy (table + plot). "
        "Example: attnlab experiment inductive-bias --max-time 300 --out runs/inductive-bias.",
    )
    add_flags(e.add_argument_group("data"), DATA_FLAGS)
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


def _add_patch_size(groups) -> None:
    e = add_command(
        groups["experiment"],
        "patch-size",
        func=_printing(vision_flags.patch_size),
        help="ViTs with several patch sizes, same data and budget: accuracy, tokens, FLOPs, time",
        description="Train the same ViT with several patch sizes on the same data with the same "
        "steps/batch/lr; report test accuracy, tokens per image ((H/p)²), training FLOPs "
        "(counted by torch.utils.flop_counter) and wall-clock seconds (table + plot). Example: "
        "attnlab experiment patch-size --max-time 300 --out runs/patch-size.",
    )
    add_flags(e.add_argument_group("data"), DATA_FLAGS)
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


def register(groups) -> None:
    """Add the vision experiments (vit-data and swin-cost: rows in vision_flags.EXPERIMENTS)."""
    _add_inductive_bias(groups)
    _add_patch_size(groups)
    for name, run, texts, rows in vision_flags.EXPERIMENTS:
        add_flags(add_command(groups["experiment"], name, func=_printing(run), **texts), rows)
