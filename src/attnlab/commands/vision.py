"""Vision commands: ``attnlab train image``, ``attnlab classify`` and ``attnlab samples``
(``attnlab eval`` of vit/deit/swin/cnn runs is :func:`attnlab.tasks.evaluate.evaluate_image`; the
vision experiments: :mod:`attnlab.commands.vision_experiments`).

The CLI parses and prints; the work is in :mod:`attnlab.data.images`, :mod:`attnlab.tasks.image`,
:mod:`attnlab.tasks.classify`, :mod:`attnlab.models.vision`, :mod:`attnlab.train`,
:mod:`attnlab.tasks.distill`, :mod:`attnlab.viz.vision` and :mod:`attnlab.viz.samples`.
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
from attnlab.commands.flags import add_command, at_least_one
from attnlab.errors import RunDirError, UserError
from attnlab.models.vision.transfer import transfer_weights
from attnlab.runs import load
from attnlab.runspec import FAMILIES
from attnlab.runspec.image_flags import AUGMENT, DATA_FLAGS, FLAG_KEYS, TRAIN_SECTIONS
from attnlab.runspec.vision import VISION_KINDS
from attnlab.tasks.classify import classify_file
from attnlab.tasks.distill import Teacher
from attnlab.tasks.image import ImageClassificationTask
from attnlab.tasks.reports import image_result, image_start
from attnlab.viz.samples import write_samples
from attnlab.viz.vision import plot_vit_attention


def _train_image(args: argparse.Namespace) -> int:
    saved = saved_run(args)  # --out checked before the data is read
    if args.augment is not None:
        args.augment = AUGMENT[args.augment]
    for name in ("data_path", "teacher", "init_from"):
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    kind = args.model if "model" in explicit_dests(args) else None
    started = start_run(
        args, FAMILIES["image"], {**train_flag_keys(), **FLAG_KEYS}, saved, kind=kind
    )
    return train_started(args, started, lambda s, m, t, r: image_result(m, t, r), before=_start)


def _start(spec, model, task) -> None:
    source, init, note = spec.task.teacher, spec.task.init_from, ""
    if source:
        task.use_teacher(Teacher.from_run(load(source, kinds=VISION_KINDS), source))
    if init and spec.resume is None:  # (a resumed run's checkpoint holds its weights)
        note = "; " + transfer_weights(load(init, kinds=VISION_KINDS).model, model,
                                       source_name=init).describe()  # fmt: skip
    print(image_start(spec.kind, model, task) + note
          + (f"; {spec.task.distillation} distillation from {source}" if source else ""))  # fmt: skip


def _classify(args: argparse.Namespace) -> int:
    at_least_one(args, "top_k")
    model, settings = run = load(args.run_dir, weights=args.weights, kinds=VISION_KINDS)
    if args.attention and run.kind not in ("vit", "deit"):
        raise UserError(
            f"--attention draws ViT/DeiT class-token attention; this run is {run.kind!r}"
        )
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


# fmt: off
def register(groups) -> None:
    """Add the vision commands."""
    add_train_parser(
        groups, "image", _train_image,
        help="train an image classifier (ViT, DeiT, Swin or CNN)",
        description="Train a ViT, DeiT, Swin Transformer or residual CNN on digits, generated "
        "shapes, a folder of images, CIFAR-10 or MNIST. Example: attnlab train image --data digits "
        "--model vit --out runs/vit-digits; a DeiT distils from a trained run: --model deit "
        "--teacher runs/cnn-digits. Every setting also comes from --config FILE (a run's "
        "config.json reproduces the run) and --set KEY=VALUE (model.d_model=96, train.lr=3e-4, "
        "task.train_fraction=0.5).",
        train={"steps": 300, "batch_size": 64, "lr": 1e-3, "warmup": 30, "eval_every": 100,
               "weight_decay": 0.05},
        sections=[("data", DATA_FLAGS), *TRAIN_SECTIONS],
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
             "ViT/DeiT only: write class-token attention and attention rollout "
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
# fmt: on
