"""The CLIP-style dual encoder on generated scenes: train it, classify images zero-shot by prompts,
evaluate it, and the experiment against a bag-of-words text tower.

attnlab train clip --out runs/clip --max-time 300
attnlab zero-shot runs/clip scenes/scene_0.png --prompts "a red circle" "a blue square"
attnlab eval runs/clip
attnlab experiment clip --max-time 300

The commands parse and print; the work is done by :mod:`attnlab.tasks.clip`,
:mod:`attnlab.models.multimodal.clip`, :mod:`attnlab.train` and :mod:`attnlab.experiments.clip`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnlab import runs
from attnlab.commands import register_evaluator
from attnlab.commands.config_args import (
    add_config_args,
    from_args,
    resolve_spec,
    track_explicit,
    train_flag_keys,
)
from attnlab.commands.flags import add_command, add_flags
from attnlab.config.overrides import load_config_file
from attnlab.data.scenes import read_scene_image
from attnlab.experiments import clip as clip_experiment
from attnlab.runspec import FAMILIES
from attnlab.tasks.clip import ClipTask, check_prompts, class_prompts
from attnlab.train import add_train_args, check_run_dir, train
from attnlab.train.stopping import completion

KINDS = ("clip",)
PRESETS = ("tiny", "small")
_KEYS = {
    "preset": "model.preset",
    "text": "model.text.arch",
    "image_size": "task.scene.image_size",
    "n_train": "task.n_train",
    "n_val": "task.n_val",
    "caption": "task.caption",
}


def register(groups) -> None:
    """``attnlab train clip``, ``attnlab zero-shot``, ``attnlab experiment clip``, the evaluator."""
    p = groups["train"].add_parser(
        "clip",
        help="train a CLIP-style dual encoder on generated scenes and their captions",
        description="Image tower (ViT) + text tower (Transformer encoder, or a bag of words), "
        "projected into one space, trained with the symmetric contrastive loss and a learned "
        "temperature. Reports zero-shot accuracy by prompts and retrieval recall.",
    )
    # fmt: off
    add_flags(p, [
        ("--preset", PRESETS, "tiny", "model size (default tiny: CPU minutes)"),
        ("--text", ["transformer", "bow"], "transformer",
         "text tower: a causal Transformer pooled at <end> (CLIP) or a bag of words"),
        ("--caption", ["random", "listing"], "random",
         "training caption of a scene: any reference caption, or the listing of its objects"),
        ("--image-size", int, 32, "scene side in pixels (default 32)"),
        ("--n-train", int, 4000, "training scenes (default 4000)"),
        ("--n-val", int, 300, "validation scenes (default 300)"),
    ])
    # fmt: on
    add_train_args(p, steps=1500, batch_size=64, lr=2e-3, warmup=50, eval_every=250)
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_run_train)
    add_command(
        groups["top"],
        name="zero-shot",
        help="classify images by text prompts with a trained dual encoder",
        description="Each image takes the prompt whose text embedding is closest to its image "
        "embedding (the scaled cosine similarity, softmax over the prompts). Without --prompts, "
        "every colour-shape combination ('a red circle', ...).",
        flags=[
            ("run_dir", None, None, "a run of 'attnlab train clip'"),
            (
                "image",
                None,
                None,
                "image file(s); other sizes are resized to the model's",
                {"nargs": "+"},
            ),
            ("--prompts", None, None, "the classes as texts", {"nargs": "+"}),
            ("--top", int, 3, "also show the N most likely prompts (default 3)"),
            ("--weights", ["best", "last"], "best", "best (default) or last checkpoint"),
        ],
        func=_run_zero_shot,
    )
    e = groups["experiment"].add_parser(
        "clip",
        help="dual encoder: Transformer vs bag-of-words text tower, zero-shot and retrieval",
    )
    # fmt: off
    add_flags(e, [
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
    ])
    # fmt: on
    e.set_defaults(func=_run_experiment)
    register_evaluator("clip", _run_eval)


def _run_experiment(args: argparse.Namespace) -> int:
    cfg = from_args(clip_experiment.ClipExperimentConfig, args)
    print("Dual encoder on scenes: text towers at the same budget\n")
    print(clip_experiment.format_table(clip_experiment.run(cfg)))
    return 0


def _run_train(args: argparse.Namespace) -> int:
    saved = Path(args.out) / "config.json"
    base = None
    if args.resume and not args.config and saved.is_file():
        runs.check_resumable(args.out)  # config.json against the weights, before building
        base = load_config_file(saved)
    spec = resolve_spec(args, FAMILIES["clip"], {**_KEYS, **train_flag_keys()}, base)
    done = completion(args.out, spec.train) if args.resume else None
    if done:
        print(done)
        return 0
    model, task = runs.build_run(spec)
    check_run_dir(args.out, args.resume, args.overwrite)
    result = train(model, task, spec.train, args.out, resume=args.resume, overwrite=args.overwrite)
    res = task.evaluate_splits(model)
    n = sum(p.numel() for p in model.parameters())
    zs, zu, r = res["zero-shot val"], res["zero-shot unseen"], res["retrieval val"]
    print(
        f"trained clip ({model.config.text.arch} text tower, {n:,} parameters) for "
        f"{result.steps} steps in {result.elapsed:.0f}s: train loss "
        f"{result.final_train_loss:.3f}; zero-shot {zs['accuracy']:.1%} (unseen combinations "
        f"{zu['accuracy']:.1%}, chance {zs['chance']:.1%}); recall@1 image->text "
        f"{r['i2t@1']:.1%}, text->image {r['t2i@1']:.1%} (chance {r['chance@1']:.1%})"
    )
    print(f"run saved in {result.run_dir}; try: attnlab eval {result.run_dir}")
    return 0


def _run_zero_shot(args: argparse.Namespace) -> int:
    loaded = runs.load(args.run_dir, weights=args.weights, kinds=KINDS)
    model, vocab = loaded.model, loaded.tokenizer
    task = ClipTask.for_run(loaded.task, loaded.run_dir)
    prompts = args.prompts or class_prompts(task.config.scene)
    ids = check_prompts(vocab, prompts)
    size = model.config.image_size
    images = torch.cat([read_scene_image(path, size) for path in args.image])
    with torch.no_grad():
        probs = model(images, ids).softmax(-1)  # (B, K)
    for path, row in zip(args.image, probs, strict=True):
        top = row.topk(max(1, min(args.top, len(prompts))))
        best = prompts[int(top.indices[0])]
        print(f"{path}: {best}" if len(args.image) > 1 else best)
        if args.top > 1:
            alts = ", ".join(f"{prompts[int(i)]} {float(p):.2f}" for p, i in zip(*top))
            print(f"  ({alts})", file=sys.stderr)
    return 0


def _run_eval(args: argparse.Namespace) -> int:
    loaded = runs.load(args.run_dir, weights=args.weights, kinds=KINDS)
    task = ClipTask.for_run(loaded.task, loaded.run_dir)
    for name, m in task.evaluate_splits(loaded.model).items():
        if name.startswith("zero-shot"):
            print(
                f"{name}: accuracy {m['accuracy']:.1%} over {m['n']} single-object scenes "
                f"(chance {m['chance']:.1%})"
            )
        else:
            print(
                f"{name}: "
                + ", ".join(
                    f"recall@{k} image->text {m[f'i2t@{k}']:.1%}, text->image "
                    f"{m[f't2i@{k}']:.1%} (chance {m[f'chance@{k}']:.1%})"
                    for k in (1, 5)
                )
            )
    return 0
