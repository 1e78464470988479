"""Captioning and VQA on generated scenes: train, caption, ask, look at the data, experiments.

attnlab scene --out scenes/                      # a sample scene PNG + its captions and Q&A
attnlab train caption --model transformer --out runs/cap --max-time 120
attnlab train caption --config runs/cap/config.json --set n_heads=4 --out runs/cap2
attnlab caption runs/cap scenes/scene_0.png --beam 3 --attention words.png
attnlab train vqa --model lstm-concat --out runs/vqa --max-time 120
attnlab ask runs/vqa scenes/scene_0.png "what colour is the circle?"
attnlab eval runs/vqa
attnlab experiment vqa-bias | caption-retrieval | caption-bptt | caption-features

The commands parse and print; the work is done by :mod:`attnlab.tasks.caption`,
:mod:`attnlab.tasks.vqa`, :mod:`attnlab.tasks.scene_use`, :mod:`attnlab.models.multimodal`,
:mod:`attnlab.train` and :mod:`attnlab.experiments`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnlab import runs
from attnlab.commands.config_args import (
    add_train_parser,
    explicit_dests,
    from_args,
    saved_run,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command
from attnlab.config.multimodal import VQA_MODELS
from attnlab.data.scenes import SceneConfig, SceneSet
from attnlab.errors import UserError
from attnlab.experiments import scene_runs
from attnlab.experiments.scene_table import PRESETS, SCENE_EXPERIMENTS, shared_rows
from attnlab.runspec import FAMILIES
from attnlab.tasks.reports import caption_result, vqa_result
from attnlab.tasks.scene_use import answer_question, caption_files
from attnlab.train import check_run_dir
from attnlab.viz.captions import plot_word_attention

CAPTION_KINDS = FAMILIES["caption"].kinds
VQA_KINDS = FAMILIES["vqa"].kinds
WEIGHTS_HELP = "best: the checkpoint with the lowest validation loss (default); last: the final one"
#: the last flags of caption and ask: which checkpoint, and whether another image size is resized
_RUN_IMAGE_ROWS = (
    ("--weights", ["best", "last"], "best", WEIGHTS_HELP),
    ("--no-resize", "store_true", None, "refuse an image whose size differs from the model's"),
)
#: flags of both train sub-commands -> their settings ("section.key")
_SHARED_KEYS = {
    **train_flag_keys(),
    **{k: f"task.{k}" for k in ("n_train", "n_val")},
    **{k: f"task.scene.{k}" for k in ("image_size", "colour_bias")},
    "preset": "model.preset",
    "encoder": "model.encoder.kind",
}
_CAPTION_KEYS = {
    **{k: f"model.{k}" for k in ("features", "freeze_encoder")},
    "model": "model.arch",
    "pretrain_steps": "task.pretrain_steps",
}


def _start(args: argparse.Namespace, family: str, keys: dict[str, str], **fields: Any):
    """:func:`start_run` of a train sub-command; ``fields``: the model fields a flag stands for
    (``--model`` of ``train vqa``: arch and fusion), like typed flags when it was typed, like
    defaults otherwise. On ``--resume`` without ``--config`` the run's config.json is the file."""
    settings = {f"model.{k}": v for k, v in fields.items()}
    given = "typed" if "model" in explicit_dests(args) else "defaults"
    keys = {**keys, **_SHARED_KEYS}
    return start_run(args, FAMILIES[family], keys, saved_run(args, file=True), **{given: settings})


def _run_train_caption(args: argparse.Namespace) -> int:
    def pretrain(spec, model, task) -> None:
        cfg, steps = spec.train, task.config.pretrain_steps
        check_run_dir(args.out, args.resume, args.overwrite)
        if steps > 0 and not args.resume:
            acc = scene_runs.pretrain_encoder(model.encoder, task.sets("train"), steps,
                                   batch_size=cfg.batch_size, seed=cfg.seed)  # fmt: skip
            print(
                f"encoder pre-trained as a majority-shape classifier: held-out accuracy {acc:.1%}"
            )

    started = _start(args, "caption", _CAPTION_KEYS)
    return train_started(args, started, lambda s, m, t, r: caption_result(m, t, r), before=pretrain)


def _run_train_vqa(args: argparse.Namespace) -> int:
    started = _start(args, "vqa", {"answers": "model.answers"}, **VQA_MODELS[args.model])
    return train_started(args, started, lambda s, m, t, r: vqa_result(m, t, r))


def _run_caption(args: argparse.Namespace) -> int:
    if args.beam < 1:
        raise UserError(f"--beam must be >= 1, got {args.beam}")
    model, vocab = runs.load(args.run_dir, weights=args.weights, kinds=CAPTION_KINDS)
    caps = caption_files(model, vocab, args.image, beam=args.beam, attention=bool(args.attention),
                         resize=not args.no_resize)  # fmt: skip
    for path, cap in zip(args.image, caps):
        print(f"{path}: {cap.text}" if len(args.image) > 1 else cap.text)
        if cap.image is not None:
            plot_word_attention(cap.image, cap.words, cap.alignment, args.attention)
            print(f"per-word cross-attention maps written to {args.attention}", file=sys.stderr)
    return 0


def _run_ask(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    model, vocab = runs.load(args.run_dir, weights=args.weights, kinds=VQA_KINDS)
    ans = answer_question(model, vocab, args.image, args.question, top=args.top,
                          resize=not args.no_resize)  # fmt: skip
    if ans.unknown:
        print(ans.notice(), file=sys.stderr)
    print(ans.text)
    if args.top > 1:
        print(f"  ({', '.join(f'{a} {p:.2f}' for a, p in ans.top)})", file=sys.stderr)
    return 0


def _run_scene(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise UserError(f"--n must be >= 1, got {args.n}")
    sset = SceneSet(SceneConfig(image_size=args.image_size), args.split, args.n, args.seed)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    lines = sset.write_samples(out)[0]
    n_caps = len(sset.captions[0])
    print("\n".join(lines[: 2 + n_caps] + lines[2 + n_caps : 2 + n_caps + 9]))
    print(f"wrote {args.n} scene(s) to {out} (PNG, x8 PNG, JSON, TXT)")
    return 0


def _experiment(module, config_cls, title: str, extra=None):
    """``attnlab experiment NAME`` of a scene experiment: its config from the flags, run,
    ``title`` and the table printed."""

    def run(args: argparse.Namespace) -> int:
        cfg = from_args(config_cls, args, **{k: getattr(args, v) for k, v in (extra or {}).items()})
        print(f"{title}\n")
        print(module.format_table(module.run(cfg)))
        return 0

    return run


# fmt: off
def register(groups) -> None:
    """Add the multimodal sub-commands to ``groups`` (see attnlab.commands)."""
    for name, models, default, lr, rows, func, kw in (
        ("caption", ("lstm", "transformer", "prefix"), "transformer", 2e-3, [
            ("--features", ["penultimate", "logits"], "penultimate",
             "--model lstm only: start the LSTM from the encoder's penultimate features "
             "(default) or from its class logits"),
            ("--freeze-encoder", "store_true", None,
             "train only the decoder (use with --pretrain-steps)"),
            ("--pretrain-steps", int, 0,
             "first train the encoder as a majority-shape classifier for N steps (default 0)"),
        ], _run_train_caption, {
            "help": "train an image captioner on generated scenes",
            "description": "CNN features -> LSTM (--model lstm), image tokens + Transformer "
            "decoder with cross-attention (--model transformer), or image tokens prepended to a "
            "decoder-only LM's words (--model prefix, LLaVA-style), trained on generated "
            "scenes."}),
        ("vqa", tuple(VQA_MODELS), "lstm-concat", 3e-3, [
            ("--answers", ["softmax", "choice"], "softmax",
             "softmax: a classifier over the answer list (default); choice: multiple choice, "
             "each answer's word vector scored against the fused image-question feature"),
        ], _run_train_vqa, {
            "help": "train a visual question answering model on generated scenes",
            "description": "LSTM question encoder fused with CNN features (concat / product), a "
            "Transformer whose question tokens attend to image tokens, or the blind "
            "question-only model; answers are classes from a fixed list."}),
    ):
        add_train_parser(groups, name, func, **kw, sections=[
            (None, [("--model", models, default, "default %(default)s")]),
            ("data", [
                ("--image-size", int, 32, "scene side in pixels (default 32)"),
                ("--n-train", int, 4000, "training scenes (default 4000)"),
                ("--n-val", int, 300, "validation scenes (default 300)"),
                ("--colour-bias", float, 0.3,
                 "chance an object takes its shape's favourite colour (language prior; default "
                 "0.3)"),
            ]),
            ("model", [
                ("--preset", PRESETS, "tiny", "model size (default tiny: CPU minutes)"),
                ("--encoder", ["cnn", "vit"], "cnn",
                 "image encoder: residual CNN grid or ViT patches (default cnn)"),
                *rows,
            ]),
        ], train={"steps": 1500, "batch_size": 64, "lr": lr, "warmup": 50, "eval_every": 250,
                  "weight_decay": 0.0})
    top = groups["top"]
    add_command(top, "caption", func=_run_caption,
        help="caption an image with a trained captioner",
        description="Print a caption for scene images (e.g. from 'attnlab scene'; other "
        "sizes are resized to the model's, as classify does); all images are captioned as "
        "one batch.", flags=[
        ("run_dir", None, None, "a run of 'attnlab train caption'"),
        ("image", None, None, "image file(s); other sizes are resized to the model's "
         "(as classify does)", {"nargs": "+"}),
        ("--beam", int, 1, "beam width (1 = greedy)"),
        ("--attention", None, None,
         "transformer: write per-word cross-attention maps of the first image",
         {"metavar": "PNG"}),
        *_RUN_IMAGE_ROWS,
    ])
    add_command(top, "ask", func=_run_ask,
        help="ask a trained VQA model a question about an image",
        description="Answer a question about a scene image. Words outside the model's "
        "vocabulary are reported and read as <unk>.", flags=[
        ("run_dir", None, None, "a run of 'attnlab train vqa'"),
        ("image", None, None, "image file; another size is resized to the model's"),
        ("question", None, None, 'e.g. "what colour is the circle?"'),
        ("--top", int, 3,
         "also show the N most likely answers with probabilities on stderr (default 3)"),
        *_RUN_IMAGE_ROWS,
    ])
    add_command(top, "scene", func=_run_scene,
        help="write sample generated scenes with their captions and questions",
        description="Write scene_K.png (and an 8x enlarged copy), plus scene_K.json / "
        ".txt with the objects, reference captions and every question with its answer.", flags=[
        ("--out", None, None, "output directory (files in it are replaced)",
         {"required": True}),
        ("--n", int, 1, "how many scenes (default 1)"),
        ("--split", ["train", "val", "unseen"], "val",
         "unseen: every scene holds a held-out colour-shape combination (default val)"),
        ("--seed", int, 0, None),
        ("--image-size", int, 32, "side in pixels (default 32)"),
    ])
    for name, help, n_train, run, rows in SCENE_EXPERIMENTS:
        add_command(groups["experiment"], name, func=_experiment(*run), help=help,
                    flags=[*shared_rows(name, n_train), *rows])
# fmt: on
