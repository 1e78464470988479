"""Vision commands: ``attnlab train image``, ``attnlab classify``, ``attnlab samples`` and
``attnlab experiment inductive-bias`` (``attnlab eval`` of vit/swin/cnn runs is
:func:`attnlab.tasks.evaluate.evaluate_image`).

The CLI parses and prints; the work is in :mod:`attnlab.data.images`, :mod:`attnlab.tasks.image`,
:mod:`attnlab.tasks.classify`, :mod:`attnlab.models.vision`, :mod:`attnlab.train`,
:mod:`attnlab.viz.vision`, :mod:`attnlab.viz.samples` and :mod:`attnlab.experiments.inductive_bias`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.commands.config_args import (
    add_train_parser,
    explicit_dests,
    saved_run,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command, add_flags, at_least_one
from attnlab.errors import RunDirError, UserError
from attnlab.experiments.inductive_bias import format_table, run_inductive_bias, settings_from_flags
from attnlab.runs import load
from attnlab.runspec import FAMILIES
from attnlab.runspec.vision import VISION_KINDS
from attnlab.tasks.classify import classify_file
from attnlab.tasks.image import ImageClassificationTask
from attnlab.tasks.reports import image_result, image_start
from attnlab.viz.samples import write_samples
from attnlab.viz.vision import plot_vit_attention

DATA_CHOICES = ("digits", "shapes", "folder", "cifar10", "mnist")
AUGMENT = {"auto": None, "on": True, "off": False}

#: flags of ``train image`` that are settings, and where they go in config.json
_FLAG_KEYS = {
    **train_flag_keys(),
    **{k: f"model.{k}" for k in ("preset", "patch_size", "window_size", "pooling", "position")},
    **{k: f"task.{k}" for k in ("data", "data_path", "image_size", "channels", "shapes_n")},
    **{k: f"task.{k}" for k in ("shapes_label", "train_fraction", "augment")},
}


def _train_image(args: argparse.Namespace) -> int:
    saved = saved_run(args)  # --out checked before the data is read
    if args.augment is not None:
        args.augment = AUGMENT[args.augment]
    if args.data_path:
        args.data_path = str(Path(args.data_path).resolve())
    kind = args.model if "model" in explicit_dests(args) else None
    started = start_run(args, FAMILIES["image"], _FLAG_KEYS, saved, kind=kind)
    return train_started(args, started, lambda s, m, t, r: image_result(m, t, r),
                         before=lambda s, m, t: print(image_start(s.kind, m, t)))  # fmt: skip


def _classify(args: argparse.Namespace) -> int:
    at_least_one(args, "top_k")
    model, settings = run = load(args.run_dir, weights=args.weights, kinds=VISION_KINDS)
    if args.attention and run.kind != "vit":
        raise UserError(f"--attention draws ViT class-token attention; this run is {run.kind!r}")
    if settings is None:
        raise RunDirError(
            f"{args.run_dir!r} lacks labels.json (classes, image shape, normalisation): it was "
            "converted from a checkpoint; write one to classify with it"
        )
    pred = classify_file(model, settings, args.image, top_k=args.top_k,
                         resize=not args.no_resize, invert=args.invert)  # fmt: skip
    if pred.notice is not None:
        print(pred.notice, file=sys.stderr)
    print(f"{args.run_dir}: {run.checkpoint}", file=sys.stderr)  # (once the input is accepted)
    print("\n".join(f"{name:>16s}  {p:.4f}" for name, p in pred.top))
    if args.attention:
        title = f"{Path(args.image).name}: {pred.top[0][0]}"
        plot_vit_attention(model, pred.image, args.attention, normalized=pred.normalized,
                           title=title)  # fmt: skip
        print(f"attention maps written to {args.attention}")
    return 0


def _samples(args: argparse.Namespace) -> int:
    at_least_one(args, "n", "scale")
    run = load(args.run_dir, kinds=VISION_KINDS)
    if run.tokenizer is None or not run.task:
        raise UserError(f"{args.run_dir!r} does not say which data it was trained on")
    task = ImageClassificationTask.for_run(run.task, run.tokenizer)
    images, labels = task.data.test
    written = write_samples(images, labels, task.classes, Path(args.out), args.n, args.scale)
    print(
        f"wrote {len(written)} test images of {task.data.name} ({run.tokenizer.describe()}) to "
        f"{args.out}; try: attnlab classify {args.run_dir} {written[0]}"
    )
    return 0


def _inductive_bias(args: argparse.Namespace) -> int:
    settings = settings_from_flags(args)
    result = run_inductive_bias(
        settings, args.out, progress=not args.no_progress, overwrite=args.overwrite
    )
    print(format_table(result))
    print(f"\n{len(result['runs'])} runs in {result['elapsed']:.0f} s; table, JSON and plot in "
          f"{args.out}")  # fmt: skip
    return 0


# fmt: off
_DATA_FLAGS = [
    ("--data", DATA_CHOICES, "digits",
     "digits: scikit-learn's 8×8 digits; shapes: generated coloured shapes; folder: class "
     "sub-folders of images; cifar10 / mnist: files you downloaded (default: %(default)s)"),
    ("--data-path", None, None,
     "folder / CIFAR-10 batches / MNIST IDX files location", {"metavar": "PATH"}),
    ("--image-size", int, None,
     "square side in pixels: folder images are resized to it (default 32), shapes are drawn "
     "at it (default 32), digits/cifar10/mnist keep their size unless it is given"),
    ("--channels", (1, 3), 3,
     "channels for folder images (default: %(default)s)", {"type": int}),
    ("--shapes-n", int, 3000, "number of generated shapes (default: %(default)s)"),
    ("--shapes-label", ("shape", "colour", "both"), "shape",
     "what a shapes class is (default: %(default)s)"),
]


def register(groups) -> None:
    """Add the vision commands."""
    add_train_parser(
        groups, "image", _train_image,
        help="train an image classifier (ViT, Swin or CNN)",
        description="Train a ViT, Swin Transformer or residual CNN on digits, generated shapes, a "
        "folder of images, CIFAR-10 or MNIST. Example: attnlab train image --data digits "
        "--model vit --out runs/vit-digits. Every setting also comes from --config FILE (a run's "
        "config.json reproduces the run) and --set KEY=VALUE (model.d_model=96, train.lr=3e-4, "
        "task.train_fraction=0.5).",
        train={"steps": 300, "batch_size": 64, "lr": 1e-3, "warmup": 30, "eval_every": 100,
               "weight_decay": 0.05},
        sections=[("data", _DATA_FLAGS), ("model", [
            ("--model", VISION_KINDS, "vit",
             "architecture (default: %(default)s, or the kind in --config)"),
            ("--preset", None, None, "model preset (default: tiny for ≤16 px images, small above)"),
            ("--patch-size", int, None, "ViT/Swin patch size"),
            ("--window-size", int, None, "Swin window size"),
            ("--pooling", ("cls", "mean"), None, "ViT pooling"),
            ("--position", ("learned", "sincos"), None, "ViT positions"),
            ("--train-fraction", float, 1.0,
             "use this share of the training split (default: %(default)s)"),
            ("--augment", tuple(AUGMENT), None,
             "random crop (+ flips where they keep the class); auto = on for images of 16 px or "
             "more (default: auto)"),
        ])],
    )
    add_command(
        groups["top"], "classify", func=_classify,
        help="top-k classes of an image with a trained image classifier",
        description="Classify one image file with a run from 'attnlab train image'. The image is "
        "converted to the run's channels and resized to its size (unless --no-resize). A model "
        "reads images like those it was trained on (digits: white on black, 8×8); an image of "
        "the opposite brightness gets a notice (--invert classifies its negative). "
        "'attnlab samples RUN' writes test images the run never trained on.",
        flags=[
            ("run_dir", None, None, "run directory written by 'attnlab train image'"),
            ("image", None, None, "image file (PNG, JPEG, ...)"),
            ("--top-k", int, 5, "classes to show (default: %(default)s)"),
            ("--weights", ("best", "last"), "best", None),
            ("--no-resize", "store_true", None, "refuse images whose size differs from the "
             "model's"),
            ("--invert", "store_true", None,
             "classify the negative (1 - pixel): a dark drawing on white for a model of white "
             "strokes on black, such as digits"),
            ("--attention", None, None,
             "ViT only: write class-token attention and attention rollout "
             "overlaid on the image", {"metavar": "PNG"}),
        ],
    )
    add_command(
        groups["top"], "samples", func=_samples,
        help="write test images of an image run's data as PNG files, to try 'attnlab classify'",
        description="Write images of the test split of the data a run of 'attnlab train image' "
        "was trained on (never seen in training) as PNG files: one per class first, named "
        "CLASS.png (digits: 0.png ... 9.png), then CLASS_INDEX.png, so 'attnlab classify RUN "
        "FILE' has inputs like the training images. (For "
        "caption and VQA runs, 'attnlab scene' draws scenes.)",
        flags=[
            ("run_dir", None, None, "run directory written by 'attnlab train image'"),
            ("--out", None, "samples", "output folder (default: %(default)s)"),
            ("--n", int, 10, "images to write (default: %(default)s)"),
            ("--scale", int, 8, "pixels per image pixel in the PNG (default 8)"),
        ],
    )
    e = add_command(
        groups["experiment"], "inductive-bias", func=_inductive_bias,
        help="CNN vs ViT with the same budget on growing data fractions",
        description="Train a residual CNN and a ViT (similar size, same steps/batch/lr) on "
        "growing fractions of the training set and compare test accuracy (table + plot). "
        "Example: attnlab experiment inductive-bias --max-time 300 --out runs/inductive-bias.",
    )
    add_flags(e.add_argument_group("data"), _DATA_FLAGS)
    add_flags(e, [
        ("--fractions", None, "0.1,0.25,0.5,1",
         "comma-separated training-set fractions, ≥3 (default: %(default)s)"),
        ("--seeds", None, "0", "comma-separated seeds (default: %(default)s)"),
        ("--steps", int, 300, "steps per run (default: %(default)s)"),
        ("--max-time", float, None,
         "wall-clock seconds for the whole experiment, instead of --steps: both models' speed is "
         "measured and every run gets the same steps, as many as fit", {"metavar": "SECONDS"}),
        ("--batch-size", int, 64, None),
        ("--lr", float, 1e-3, None),
        ("--warmup", int, 30, None),
        ("--vit-set", "append", [], None, {"metavar": "KEY=VALUE"}),
        ("--cnn-set", "append", [], None, {"metavar": "KEY=VALUE"}),
        ("--device", None, "auto", None),
        ("--no-progress", "store_true", None, None),
        ("--out", None, "runs/inductive-bias", "output directory (default: %(default)s)"),
        ("--overwrite", "store_true", None, "replace the results of an earlier sweep in --out"),
    ])
# fmt: on
