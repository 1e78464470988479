"""The CLIP-style dual encoder on generated scenes: train it, classify images zero-shot by prompts,
evaluate it, and the experiment against a bag-of-words text tower.

attnlab train clip --out runs/clip --max-time 300
attnlab zero-shot runs/clip scenes/scene_0.png --prompts "a red circle" "a blue square"
attnlab eval runs/clip
attnlab experiment clip --max-time 300

The commands parse and print; the work is done by :mod:`attnlab.tasks.clip`,
:mod:`attnlab.tasks.zero_shot`, :mod:`attnlab.tasks.reports`, :mod:`attnlab.tasks.evaluate`
(``attnlab eval``), :mod:`attnlab.train` and :mod:`attnlab.experiments.clip`.
"""

from __future__ import annotations

import argparse
import sys

from attnlab import runs
from attnlab.commands.config_args import (
    add_train_parser,
    from_args,
    saved_run,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command
from attnlab.experiments import clip as clip_experiment
from attnlab.runspec import FAMILIES
from attnlab.tasks.reports import clip_result
from attnlab.tasks.zero_shot import zero_shot_files
from attnlab.train import check_run_dir

PRESETS = ("tiny", "small")
_KEYS = {
    **train_flag_keys(),
    "preset": "model.preset",
    "text": "model.text.arch",
    "image_size": "task.scene.image_size",
    **{k: f"task.{k}" for k in ("n_train", "n_val", "caption")},
}


def _run_train(args: argparse.Namespace) -> int:
    started = start_run(args, FAMILIES["clip"], _KEYS, saved_run(args, file=True))
    return train_started(args, started, lambda s, m, t, r: clip_result(m, t, r),
                         before=lambda s, m, t: check_run_dir(args.out, args.resume,
                                                              args.overwrite))  # fmt: skip


def _run_zero_shot(args: argparse.Namespace) -> int:
    run = runs.load(args.run_dir, weights=args.weights, kinds=FAMILIES["clip"].kinds)
    for path, top in zip(args.image, zero_shot_files(run, args.image, args.prompts, args.top)):
        print(f"{path}: {top[0][0]}" if len(args.image) > 1 else top[0][0])
        if args.top > 1:
            print(f"  ({', '.join(f'{t} {p:.2f}' for t, p in top)})", file=sys.stderr)
    return 0


def _run_experiment(args: argparse.Namespace) -> int:
    cfg = from_args(clip_experiment.ClipExperimentConfig, args)
    print("Dual encoder on scenes: text towers at the same budget\n")
    print(clip_experiment.format_table(clip_experiment.run(cfg)))
    return 0


# fmt: off
def register(groups) -> None:
    """``attnlab train clip``, ``attnlab zero-shot``, ``attnlab experiment clip``."""
    add_train_parser(
        groups, "clip", _run_train,
        help="train a CLIP-style dual encoder on generated scenes and their captions",
        description="Image tower (ViT) + text tower (Transformer encoder, or a bag of words), "
        "projected into one space, trained with the symmetric contrastive loss and a learned "
        "temperature. Reports zero-shot accuracy by prompts and retrieval recall.",
        sections=[(None, [
            ("--preset", PRESETS, "tiny", "model size (default tiny: CPU minutes)"),
            ("--text", ["transformer", "bow"], "transformer",
             "text tower: a causal Transformer pooled at <end> (CLIP) or a bag of words"),
            ("--caption", ["random", "listing"], "random",
             "training caption of a scene: any reference caption, or the listing of its objects"),
            ("--image-size", int, 32, "scene side in pixels (default 32)"),
            ("--n-train", int, 4000, "training scenes (default 4000)"),
            ("--n-val", int, 300, "validation scenes (default 300)"),
        ])],
        train={"steps": 1500, "batch_size": 64, "lr": 2e-3, "warmup": 50, "eval_every": 250},
    )
    add_command(
        groups["top"], "zero-shot", func=_run_zero_shot,
        help="classify images by text prompts with a trained dual encoder",
        description="Each image takes the prompt whose text embedding is closest to its image "
        "embedding (the scaled cosine similarity, softmax over the prompts). Without --prompts, "
        "every colour-shape combination ('a red circle', ...).",
        flags=[
            ("run_dir", None, None, "a run of 'attnlab train clip'"),
            ("image", None, None, "image file(s); other sizes are resized to the model's",
             {"nargs": "+"}),
            ("--prompts", None, None, "the classes as texts", {"nargs": "+"}),
            ("--top", int, 3, "also show the N most likely prompts (default 3)"),
            ("--weights", ["best", "last"], "best", "best (default) or last checkpoint"),
        ],
    )
    add_command(
        groups["experiment"], "clip", func=_run_experiment,
        help="dual encoder: Transformer vs bag-of-words text tower, zero-shot and retrieval",
        flags=[
            ("--out", None, "runs/clip-towers", "output directory (default %(default)s)"),
            ("--steps", int, 800, "steps per model (default 800)"),
            ("--max-time", float, None, "seconds of training per model (overrides --steps)",
             {"metavar": "SECONDS"}),
            ("--batch-size", int, 64, "default %(default)s"),
            ("--lr", float, 2e-3, "default %(default)s"),
            ("--n-train", int, 3000, "training scenes (default %(default)s)"),
            ("--n-eval", int, 200, "held-out scenes per measurement (default %(default)s)"),
            ("--text-towers", None, list(clip_experiment.TEXT_TOWERS), "default: both",
             {"nargs": "+", "choices": clip_experiment.TEXT_TOWERS}),
            ("--preset", PRESETS, "tiny", "model size"),
            ("--device", None, "auto", "auto, cpu, cuda or cuda:N"),
            ("--seed", int, 0, None),
            ("--overwrite", "store_true", None, "replace the runs of an earlier --out"),
            ("--no-progress", "store_false", None, None, {"dest": "progress"}),
        ],
    )
# fmt: on
