"""Vision commands: ``attnlab train image``, ``attnlab classify``, ``attnlab eval`` for
vit/deit/swin/cnn runs (the vision experiments: :mod:`attnlab.commands.vision_experiments`).

The CLI parses and prints; the work is in :mod:`attnlab.data.images`, :mod:`attnlab.tasks.image`,
:mod:`attnlab.models.vision`, :mod:`attnlab.train` and :mod:`attnlab.viz.vision`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.commands.config_args import explicit_dests, resolve_spec, train_flag_keys
from attnlab.commands.flags import add_flags, at_least_one
from attnlab.commands.image_samples import add_samples_parser
from attnlab.errors import RunDirError, UserError
from attnlab.runspec import FAMILIES
from attnlab.runspec.vision import VISION_KINDS
from attnlab.tasks.distill import Teacher

DATA_CHOICES = ("digits", "shapes", "folder", "cifar10", "mnist")
AUGMENT = {"auto": None, "on": True, "off": False}

#: flags of ``train image`` that are settings, and where they go in config.json
_FLAG_KEYS = {
    **train_flag_keys(),
    "preset": "model.preset",
    "patch_size": "model.patch_size",
    "window_size": "model.window_size",
    "pooling": "model.pooling",
    "position": "model.position",
    **{
        name: f"task.{name}"
        for name in (
            "data",
            "data_path",
            "image_size",
            "channels",
            "shapes_n",
            "shapes_label",
            "train_fraction",
            "augment",
            "teacher",
            "distillation",
            "distill_alpha",
            "distill_temperature",
        )
    },
}


# ----------------------------------------------------------------------------------------------
# attnlab train image


def _train_image(args: argparse.Namespace) -> int:
    from attnlab.runs import build_run, load, read_config
    from attnlab.train import check_run_dir, train
    from attnlab.train.stopping import completion

    check_run_dir(args.out, args.resume, args.overwrite)  # before the data is read
    if args.augment is not None:
        args.augment = AUGMENT[args.augment]
    for name in ("data_path", "teacher"):
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    saved = read_config(args.out) if args.resume else None
    kind = args.model if "model" in explicit_dests(args) else None
    spec = resolve_spec(args, FAMILIES["image"], _FLAG_KEYS, saved, kind=kind)
    done = completion(args.out, spec.train) if args.resume else None
    if done:  # before the data is read
        print(done)
        return 0
    source = spec.task.teacher
    teacher = Teacher.from_run(load(source, kinds=VISION_KINDS), source) if source else None
    model, task = build_run(spec)
    if teacher is not None:
        task.use_teacher(teacher)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{spec.kind}: {n_params:,} parameters; {task.data.name} "
        f"{'×'.join(map(str, task.image_shape))}, {task.num_classes} classes, "
        f"{len(task.train_y)} training images (augment={task.augment})"
        + (f"; {spec.task.distillation} distillation from {source}" if teacher else "")
    )
    res = train(model, task, spec.train, args.out, resume=args.resume, overwrite=args.overwrite)
    device = next(model.parameters()).device
    acc, loss = task.test_accuracy(model, split="val", device=device)
    print(
        f"{res.steps} steps in {res.elapsed:.1f} s; final train loss {res.final_train_loss:.4f}; "
        f"val accuracy {acc:.3f} (loss {loss:.4f}); run saved to {res.run_dir}"
    )
    print(f"test it with: attnlab eval {res.run_dir}")
    return 0


# ----------------------------------------------------------------------------------------------
# attnlab eval / classify


def _eval_image(args: argparse.Namespace) -> int:

    from attnlab.runs import load
    from attnlab.tasks.image import ImageClassificationTask

    if args.batch_size < 1 or (args.max_batches is not None and args.max_batches < 1):
        raise UserError(
            f"--batch-size and --max-batches must be at least 1, got {args.batch_size} and "
            f"{args.max_batches}"
        )
    run = load(args.run_dir, weights=args.weights, kinds=VISION_KINDS)
    task = ImageClassificationTask.for_run(run.task, run.tokenizer)
    res = task.evaluate_split(run.model, batch_size=args.batch_size, max_batches=args.max_batches)
    print(
        f"{run.kind} on {task.data.name} test split: accuracy {res['accuracy']:.4f} "
        f"({res['correct']}/{res['n']}), loss {res['loss']:.4f}; {run.checkpoint}"
    )
    shown = [f"{n}: {a:.3f}" for n, a in zip(task.classes, res["per_class"]) if a is not None]
    print("per class: " + ", ".join(shown))
    return 0


def _classify(args: argparse.Namespace) -> int:
    import torch

    from attnlab.data.images import read_image
    from attnlab.runs import load

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
    c, h, w = settings.image_shape
    image = read_image(args.image, image_size=None if args.no_resize else h, channels=c)
    if args.no_resize and tuple(image.shape[1:]) != (h, w):
        raise UserError(
            f"{args.image}: image is {image.shape[2]}×{image.shape[1]}, the model "
            f"expects {w}×{h} (drop --no-resize to resize it)"
        )
    if args.invert:
        image = 1.0 - image
    notice = settings.polarity_notice(image)
    if notice is not None:
        fix = "drop --invert" if args.invert else "add --invert to classify its negative"
        notice = (
            notice.replace("this image", "its negative (--invert)", 1) if args.invert else notice
        )
        print(f"notice: {notice}; {fix}", file=sys.stderr)
    x = settings.prepare(image[None])
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    print(f"{args.run_dir}: {run.checkpoint}", file=sys.stderr)  # (once the input is accepted)
    k = min(args.top_k, len(settings.classes))
    top = probs.topk(k)
    for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        print(f"{settings.classes[i]:>16s}  {p:.4f}")
    if args.attention:
        from attnlab.viz.vision import plot_vit_attention

        plot_vit_attention(
            model,
            image,
            args.attention,
            normalized=x[0],
            title=f"{Path(args.image).name}: {settings.classes[int(top.indices[0])]}",
        )
        print(f"attention maps written to {args.attention}")
    return 0


# ----------------------------------------------------------------------------------------------
# parsers


def add_data_args(p: argparse.ArgumentParser, *, default: str = "digits") -> None:
    g = p.add_argument_group("data")
    # fmt: off
    add_flags(g, [
        ("--data", DATA_CHOICES, default,
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
    ])
    # fmt: on


def _add_train_image(groups) -> None:
    from attnlab.commands.config_args import add_config_args, track_explicit
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "image",
        help="train an image classifier (ViT, DeiT, Swin or CNN)",
        description="Train a ViT, DeiT, Swin Transformer or residual CNN on digits, generated "
        "shapes, a folder of images, CIFAR-10 or MNIST. Example: attnlab train image --data digits "
        "--model vit --out runs/vit-digits; a DeiT distils from a trained run: --model deit "
        "--teacher runs/cnn-digits. Every setting also comes from --config FILE (a run's "
        "config.json reproduces the run) and --set KEY=VALUE (model.d_model=96, train.lr=3e-4, "
        "task.train_fraction=0.5).",
    )
    add_data_args(p)
    g = p.add_argument_group("model")
    # fmt: off
    add_flags(g, [
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
         "random crop (+ flips where they keep the class); auto = on for images of 16 px or more "
         "(default: auto)"),
    ])
    g = p.add_argument_group("distillation (--model deit)")
    add_flags(g, [
        ("--teacher", None, None,
         "run directory of a trained classifier (e.g. a CNN) of the same image size and classes: "
         "the distillation head learns its predictions", {"metavar": "RUN"}),
        ("--distillation", ("hard", "soft"), "hard",
         "hard: the teacher's arg-max as label; soft: τ²·KL to its temperature-τ softmax "
         "(default: %(default)s)"),
        ("--distill-alpha", float, 0.5,
         "weight of the distillation head's loss, the class head's is 1 − α (default: %(default)s)"),
        ("--distill-temperature", float, 1.0, "τ of soft distillation (default: %(default)s)"),
    ])
    # fmt: on
    add_train_args(
        p, steps=300, batch_size=64, lr=1e-3, warmup=30, eval_every=100, weight_decay=0.05
    )
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_train_image)


def _add_classify(groups) -> None:
    c = groups["top"].add_parser(
        "classify",
        help="top-k classes of an image with a trained image classifier",
        description="Classify one image file with a run from 'attnlab train image'. The image is "
        "converted to the run's channels and resized to its size (unless --no-resize). A model "
        "reads images like those it was trained on (digits: white on black, 8×8); an image of "
        "the opposite brightness gets a notice (--invert classifies its negative). "
        "'attnlab samples RUN' writes test images the run never trained on.",
    )
    # fmt: off
    add_flags(c, [
        ("run_dir", None, None, "run directory written by 'attnlab train image'"),
        ("image", None, None, "image file (PNG, JPEG, ...)"),
        ("--top-k", int, 5, "classes to show (default: %(default)s)"),
        ("--weights", ("best", "last"), "best", None),
        ("--no-resize", "store_true", None, "refuse images whose size differs from the model's"),
        ("--invert", "store_true", None,
         "classify the negative (1 - pixel): a dark drawing on white for a model of white "
         "strokes on black, such as digits"),
        ("--attention", None, None,
         "ViT/DeiT only: write class-token attention and attention rollout "
         "overlaid on the image", {"metavar": "PNG"}),
    ])
    # fmt: on
    c.set_defaults(func=_classify)


def register(groups) -> None:
    """Add the vision commands."""
    from attnlab.commands import register_evaluator

    _add_train_image(groups)
    _add_classify(groups)
    add_samples_parser(groups)
    for kind in VISION_KINDS:
        register_evaluator(kind, _eval_image)
