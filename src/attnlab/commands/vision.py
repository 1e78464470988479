"""Vision commands: ``attnlab train image``, ``attnlab classify``, ``attnlab eval`` for vit/swin/cnn
runs, and ``attnlab experiment inductive-bias``.

The CLI parses and prints; the work is in :mod:`attnlab.data.images`, :mod:`attnlab.models`
(vit, swin, cnn), :mod:`attnlab.train`, :mod:`attnlab.viz.vision` and
:mod:`attnlab.experiments.inductive_bias`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from attnlab.errors import RunDirError, UserError

VISION_KINDS = ("vit", "swin", "cnn")
DATA_CHOICES = ("digits", "shapes", "folder", "cifar10", "mnist")


# ----------------------------------------------------------------------------------------------
# helpers shared by the commands


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["d_model=128", "pooling=mean"]`` -> typed dict (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def build_image_model(
    model: str,
    image_shape: tuple[int, int, int],
    classes: list[str],
    *,
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
):
    """A vit / swin / cnn sized for the data: image size, channels and classes come from it.

    The default preset is ``tiny`` for images up to 16 pixels and ``small`` above.

    Raises:
        UserError: unknown model, or a config that does not fit (e.g. patch size not dividing
            the image size; the message names the values).
    """
    from attnlab.models.cnn import CNN_PRESETS, CNNConfig, ResidualCNN
    from attnlab.models.swin import SWIN_PRESETS, SwinConfig, SwinTransformer
    from attnlab.models.vit import VIT_PRESETS, VisionTransformer, ViTConfig

    kinds = {
        "vit": (ViTConfig, VisionTransformer),
        "swin": (SwinConfig, SwinTransformer),
        "cnn": (CNNConfig, ResidualCNN),
    }
    if model not in kinds:
        raise UserError(f"unknown model {model!r}; choose from {', '.join(kinds)}")
    c, h, w = image_shape
    if h != w:
        raise UserError(f"images must be square, got {h}×{w}")
    cfg_cls, model_cls = kinds[model]
    preset = preset or ("tiny" if h <= 16 else "small")
    presets = {"vit": VIT_PRESETS, "swin": SWIN_PRESETS, "cnn": CNN_PRESETS}[model]
    if preset not in presets:
        raise UserError(f"unknown {model} preset {preset!r}; known: {', '.join(presets)}")
    known = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise UserError(
            f"{model} has no config field {', '.join(map(repr, unknown))}; "
            f"its fields: {', '.join(sorted(known))}"
        )
    fields = dict(image_size=h, in_channels=c, num_classes=len(classes), labels=list(classes))
    try:
        cfg = cfg_cls.preset(preset, **{**fields, **(overrides or {})})
    except TypeError as err:
        raise UserError(f"bad --set for {model}: {err}") from None
    except ValueError as err:
        raise UserError(
            f"{model} preset {preset!r} does not fit {h}×{w} images: {err} (--image-size, "
            "--patch-size, --window-size or --set change the sizes)"
        ) from None
    return model_cls(cfg)


def _task_from_args(args: argparse.Namespace, seed: int):
    from attnlab.data.images import ImageClassificationTask, load_image_data

    path = str(Path(args.data_path).resolve()) if args.data_path else None
    source_args = {
        "data_path": path,
        "image_size": args.image_size,
        "channels": args.channels,
        "shapes_n": args.shapes_n,
        "shapes_label": args.shapes_label,
    }
    splits = load_image_data(
        args.data,
        path=path,
        image_size=args.image_size,
        channels=args.channels,
        seed=seed,
        shapes_n=args.shapes_n,
        shapes_label=args.shapes_label,
    )
    augment = None if args.augment == "auto" else args.augment == "on"
    return ImageClassificationTask(
        splits,
        seed=seed,
        train_fraction=args.train_fraction,
        augment=augment,
        source_args=source_args,
    )


def task_from_run_config(task_cfg: dict):
    """Rebuild the classification task (same data, split and normalisation) of a run."""
    from attnlab.data.images import ImageClassificationTask, load_image_data

    if task_cfg.get("name") != "image":
        raise RunDirError(f"not an image-classification run (task {task_cfg.get('name')!r})")
    seed = int(task_cfg.get("seed", 0))
    splits = load_image_data(
        task_cfg["data"],
        path=task_cfg.get("data_path"),
        image_size=task_cfg.get("image_size"),
        channels=task_cfg.get("channels", 3),
        seed=seed,
        shapes_n=task_cfg.get("shapes_n", 3000),
        shapes_label=task_cfg.get("shapes_label", "shape"),
    )
    task = ImageClassificationTask(
        splits, seed=seed, train_fraction=task_cfg.get("train_fraction", 1.0), augment=False
    )
    task.mean, task.std = task_cfg["mean"], task_cfg["std"]  # exactly the training normalisation
    return task


def _load_run(run_dir: str, weights: str = "best"):
    from attnlab.runs import load_model, read_config

    cfg = read_config(run_dir)
    if cfg["kind"] not in VISION_KINDS:
        raise RunDirError(
            f"{run_dir!r} holds a {cfg['kind']!r} model, not an image classifier "
            f"({', '.join(VISION_KINDS)})"
        )
    name = "best.safetensors" if weights == "best" else "model.safetensors"
    if not (Path(run_dir) / name).exists():
        name = "model.safetensors"
    return load_model(run_dir, weights=name), cfg


# ----------------------------------------------------------------------------------------------
# commands


def _train_image(args: argparse.Namespace) -> int:
    from attnlab.train import train, train_config_from_args

    cfg = train_config_from_args(args)
    task = _task_from_args(args, cfg.seed)
    overrides = _parse_overrides(args.set)
    for flag, models in (
        ("patch_size", ("vit", "swin")),
        ("window_size", ("swin",)),
        ("pooling", ("vit",)),
        ("position", ("vit",)),
    ):
        if getattr(args, flag) is None:
            continue
        if args.model not in models:
            raise UserError(
                f"--{flag.replace('_', '-')} applies to --model {' or '.join(models)} only "
                f"(got --model {args.model})"
            )
        overrides[flag] = getattr(args, flag)
    import torch

    torch.manual_seed(cfg.seed)
    model = build_image_model(
        args.model, task.image_shape, task.classes, preset=args.preset, overrides=overrides
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.model}: {n_params:,} parameters; {args.data} "
        f"{'×'.join(map(str, task.image_shape))}, {task.num_classes} classes, "
        f"{len(task.train_y)} training images (augment={task.augment})"
    )
    res = train(model, task, cfg, args.out, resume=args.resume, overwrite=args.overwrite)
    device = next(model.parameters()).device
    acc, loss = task.test_accuracy(model, split="val", device=device)
    print(
        f"{res.steps} steps in {res.elapsed:.1f} s; final train loss {res.final_train_loss:.4f}; "
        f"val accuracy {acc:.3f} (loss {loss:.4f}); run saved to {res.run_dir}"
    )
    print(f"test it with: attnlab eval {res.run_dir}")
    return 0


def _eval_image(args: argparse.Namespace) -> int:
    import torch

    if args.batch_size < 1 or (args.max_batches is not None and args.max_batches < 1):
        raise UserError(
            f"--batch-size and --max-batches must be at least 1, got {args.batch_size} and "
            f"{args.max_batches}"
        )
    model, cfg = _load_run(args.run_dir, args.weights)
    task = task_from_run_config(cfg.get("task", {}))
    x, y = task.data.test
    if args.max_batches is not None:
        x, y = x[: args.max_batches * args.batch_size], y[: args.max_batches * args.batch_size]
    model.eval()
    with torch.no_grad():
        logits = torch.cat(
            [
                model(task.prepare(x[i : i + args.batch_size])).float()
                for i in range(0, len(y), args.batch_size)
            ]
        )
    loss = float(torch.nn.functional.cross_entropy(logits, y))
    pred = logits.argmax(-1)
    acc = float((pred == y).float().mean())
    print(
        f"{cfg['kind']} on {task.data.name} test split: accuracy {acc:.4f} "
        f"({int((pred == y).sum())}/{len(y)}), loss {loss:.4f}"
    )
    per_class = []
    for k, name in enumerate(task.classes):
        m = y == k
        if m.any():
            per_class.append(f"{name}: {float((pred[m] == k).float().mean()):.3f}")
    print("per class: " + ", ".join(per_class))
    return 0


def _classify(args: argparse.Namespace) -> int:
    import torch

    from attnlab.data.images import normalize, read_image

    if args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    model, cfg = _load_run(args.run_dir, args.weights)
    if args.attention and cfg["kind"] != "vit":
        raise UserError(f"--attention draws ViT class-token attention; this run is {cfg['kind']!r}")
    labels_path = Path(args.run_dir) / "labels.json"
    if labels_path.exists():
        info = json.loads(labels_path.read_text())
    else:
        info = cfg.get("task", {})
    try:
        classes, (c, h, w) = info["classes"], info["image_shape"]
        mean, std = info["mean"], info["std"]
    except (KeyError, ValueError):
        raise RunDirError(
            f"{args.run_dir!r} lacks labels.json (classes, image shape, normalisation)"
        ) from None
    image = read_image(args.image, image_size=None if args.no_resize else h, channels=c)
    if args.no_resize and tuple(image.shape[1:]) != (h, w):
        raise UserError(
            f"{args.image}: image is {image.shape[2]}×{image.shape[1]}, the model "
            f"expects {w}×{h} (drop --no-resize to resize it)"
        )
    x = normalize(image[None], mean, std)
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    k = min(args.top_k, len(classes))
    top = probs.topk(k)
    for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        print(f"{classes[i]:>16s}  {p:.4f}")
    if args.attention:
        from attnlab.viz.vision import plot_vit_attention

        plot_vit_attention(
            model,
            image,
            args.attention,
            normalized=x[0],
            title=f"{Path(args.image).name}: {classes[int(top.indices[0])]}",
        )
        print(f"attention maps written to {args.attention}")
    return 0


def _inductive_bias(args: argparse.Namespace) -> int:
    from attnlab.experiments.inductive_bias import (
        InductiveBiasSettings,
        format_table,
        run_inductive_bias,
    )

    try:
        fractions = [float(f) for f in args.fractions.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise UserError(
            f"--fractions/--seeds must be comma-separated numbers, got "
            f"{args.fractions!r} / {args.seeds!r}"
        ) from None
    settings = InductiveBiasSettings(
        data=args.data,
        data_path=args.data_path,
        image_size=args.image_size,
        channels=args.channels,
        shapes_n=args.shapes_n,
        shapes_label=args.shapes_label,
        fractions=fractions,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        seeds=seeds,
        vit=_parse_overrides(args.vit_set),
        cnn=_parse_overrides(args.cnn_set),
        device=args.device,
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


def _add_data_args(p: argparse.ArgumentParser, *, default: str = "digits") -> None:
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        choices=DATA_CHOICES,
        default=default,
        help="digits: scikit-learn's 8×8 digits; shapes: generated coloured shapes; "
        "folder: class sub-folders of images; cifar10 / mnist: files you downloaded "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--data-path",
        default=None,
        metavar="PATH",
        help="folder / CIFAR-10 batches / MNIST IDX files location",
    )
    g.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="square side in pixels: folder images are resized to it (default 32), shapes are "
        "drawn at it (default 32), digits/cifar10/mnist keep their size unless it is given",
    )
    g.add_argument(
        "--channels",
        type=int,
        choices=(1, 3),
        default=3,
        help="channels for folder images (default: %(default)s)",
    )
    g.add_argument(
        "--shapes-n",
        type=int,
        default=3000,
        help="number of generated shapes (default: %(default)s)",
    )
    g.add_argument(
        "--shapes-label",
        choices=("shape", "colour", "both"),
        default="shape",
        help="what a shapes class is (default: %(default)s)",
    )


def register(groups) -> None:
    """Add the vision commands."""
    from attnlab.commands import register_evaluator
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "image",
        help="train an image classifier (ViT, Swin or CNN)",
        description="Train a ViT, Swin Transformer or residual CNN on digits, generated shapes, a "
        "folder of images, CIFAR-10 or MNIST. Example: attnlab train image --data digits "
        "--model vit --out runs/vit-digits",
    )
    _add_data_args(p)
    g = p.add_argument_group("model")
    g.add_argument(
        "--model", choices=VISION_KINDS, default="vit", help="architecture (default: %(default)s)"
    )
    g.add_argument(
        "--preset", default=None, help="model preset (default: tiny for ≤16 px images, small above)"
    )
    g.add_argument("--patch-size", type=int, default=None, help="ViT/Swin patch size")
    g.add_argument("--window-size", type=int, default=None, help="Swin window size")
    g.add_argument("--pooling", choices=("cls", "mean"), default=None, help="ViT pooling")
    g.add_argument("--position", choices=("learned", "sincos"), default=None, help="ViT positions")
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any model config field, e.g. --set d_model=96",
    )
    g.add_argument(
        "--train-fraction",
        type=float,
        default=1.0,
        help="use this share of the training split (default: %(default)s)",
    )
    g.add_argument(
        "--augment",
        choices=("auto", "on", "off"),
        default="auto",
        help="random crop (+ flips where they keep the class); auto = on for "
        "images of 16 px or more (default: %(default)s)",
    )
    add_train_args(
        p, steps=300, batch_size=64, lr=1e-3, warmup=30, eval_every=100, weight_decay=0.05
    )
    p.set_defaults(func=_train_image)

    c = groups["top"].add_parser(
        "classify",
        help="top-k classes of an image with a trained image classifier",
        description="Classify one image file with a run from 'attnlab train image'. The image is "
        "converted to the run's channels and resized to its size (unless --no-resize).",
    )
    c.add_argument("run_dir", help="run directory written by 'attnlab train image'")
    c.add_argument("image", help="image file (PNG, JPEG, ...)")
    c.add_argument("--top-k", type=int, default=5, help="classes to show (default: %(default)s)")
    c.add_argument("--weights", choices=("best", "last"), default="best")
    c.add_argument(
        "--no-resize", action="store_true", help="refuse images whose size differs from the model's"
    )
    c.add_argument(
        "--attention",
        default=None,
        metavar="PNG",
        help="ViT only: write class-token attention and attention rollout overlaid on the image",
    )
    c.set_defaults(func=_classify)

    e = groups["experiment"].add_parser(
        "inductive-bias",
        help="CNN vs ViT with the same budget on growing data fractions",
        description="Train a residual CNN and a ViT (similar size, same steps/batch/lr) on "
        "growing fractions of the training set and compare test accuracy (table + plot).",
    )
    _add_data_args(e)
    e.add_argument(
        "--fractions",
        default="0.1,0.25,0.5,1",
        help="comma-separated training-set fractions, ≥3 (default: %(default)s)",
    )
    e.add_argument("--seeds", default="0", help="comma-separated seeds (default: %(default)s)")
    e.add_argument("--steps", type=int, default=300, help="steps per run (default: %(default)s)")
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--lr", type=float, default=1e-3)
    e.add_argument("--warmup", type=int, default=30)
    e.add_argument("--vit-set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--cnn-set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--device", default="auto")
    e.add_argument("--no-progress", action="store_true")
    e.add_argument(
        "--out", default="runs/inductive-bias", help="output directory (default: %(default)s)"
    )
    e.add_argument(
        "--overwrite", action="store_true", help="replace the results of an earlier sweep in --out"
    )
    e.set_defaults(func=_inductive_bias)

    for kind in VISION_KINDS:
        register_evaluator(kind, _eval_image)
