"""``attnlab samples RUN --out DIR``: test images of an image run's data, as PNG files.

A newcomer's first ``attnlab classify`` needs an input that looks like the training data
(digits are 8×8, white on black); drawing one by hand rarely does. ``samples`` writes images of
the run's own test split (never trained on), named by their class, and prints the command to try
one. The multimodal runs have ``attnlab scene`` for the same purpose.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.commands.flags import add_flags, at_least_one
from attnlab.errors import UserError

__all__ = ["add_samples_parser", "write_samples"]


def add_samples_parser(groups) -> None:
    """Register ``attnlab samples`` in the top-level group."""
    s = groups["top"].add_parser(
        "samples",
        help="write test images of an image run's data as PNG files, to try 'attnlab classify'",
        description="Write images of the test split of the data a run of 'attnlab train image' "
        "was trained on (never seen in training) as PNG files: one per class first, named "
        "CLASS.png (digits: 0.png ... 9.png), then CLASS_INDEX.png, so 'attnlab classify RUN FILE' has inputs like the training images. (For "
        "caption and VQA runs, 'attnlab scene' draws scenes.)",
    )
    # fmt: off
    add_flags(s, [
        ("run_dir", None, None, "run directory written by 'attnlab train image'"),
        ("--out", None, "samples", "output folder (default: %(default)s)"),
        ("--n", int, 10, "images to write (default: %(default)s)"),
        ("--scale", int, 8, "pixels per image pixel in the PNG (default 8)"),
    ])
    # fmt: on
    s.set_defaults(func=_samples)


def write_samples(images, labels, classes: list[str], out: Path, n: int, scale: int) -> list[Path]:
    """Write ``n`` of ``images`` (``(N, C, H, W)`` in [0, 1]) as PNGs: one per class first.

    Returns:
        The files written, in order.
    """
    from PIL import Image

    order: list[int] = []
    for c in range(len(classes)):  # one of each class first, then the rest in order
        hits = (labels == c).nonzero().flatten().tolist()
        order += hits[:1]
    order += [i for i in range(len(labels)) if i not in set(order)]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i in order[:n]:
        arr = (images[i].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
        mode = "L" if arr.shape[2] == 1 else "RGB"
        im = Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)
        if scale > 1:  # (classify resizes back to the model's size)
            im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
        name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in classes[labels[i]])
        first = not any(p.name.startswith(f"{name}.") for p in written)
        path = out / (f"{name}.png" if first else f"{name}_{i:04d}.png")
        im.save(path)
        written.append(path)
    return written


def _samples(args: argparse.Namespace) -> int:
    from attnlab.runs import load
    from attnlab.tasks.image import ImageClassificationTask

    at_least_one(args, "n", "scale")
    run = load(args.run_dir, kinds=("vit", "swin", "cnn"))
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
