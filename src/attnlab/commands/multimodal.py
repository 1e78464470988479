"""Captioning and VQA on generated scenes: train, caption, ask, look at the data, experiments.

attnlab scene --out scenes/                      # a sample scene PNG + its captions and Q&A
attnlab train caption --model transformer --out runs/cap --max-time 120
attnlab train caption --config runs/cap/config.json --set n_heads=4 --out runs/cap2
attnlab caption runs/cap scenes/scene_0.png --beam 3 --attention words.png
attnlab train vqa --model lstm-concat --out runs/vqa --max-time 120
attnlab ask runs/vqa scenes/scene_0.png "what colour is the circle?"
attnlab eval runs/vqa
attnlab experiment vqa-bias | caption-retrieval | caption-features

The commands parse and print; the work is done by :mod:`attnlab.tasks.caption`,
:mod:`attnlab.tasks.vqa`, :mod:`attnlab.models.multimodal`, :mod:`attnlab.train` and
:mod:`attnlab.experiments`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnlab.commands.config_args import explicit_dests, resolve_spec, train_flag_keys
from attnlab.commands.flags import add_command, add_flags
from attnlab.errors import UserError
from attnlab.runspec import FAMILIES

CAPTION_KINDS = FAMILIES["caption"].kinds
VQA_KINDS = FAMILIES["vqa"].kinds
WEIGHTS_HELP = "best: the checkpoint with the lowest validation loss (default); last: the final one"
#: --model of 'attnlab train caption' is the captioner's arch
CAPTION_MODELS = ("lstm", "transformer", "prefix")
PRESETS = ("tiny", "small")
#: flags of both train sub-commands -> their settings ("section.key")
_SHARED_KEYS = {
    "image_size": "task.scene.image_size",
    "n_train": "task.n_train",
    "n_val": "task.n_val",
    "colour_bias": "task.scene.colour_bias",
    "preset": "model.preset",
    "encoder": "model.encoder.kind",
}
_CAPTION_KEYS = {
    "model": "model.arch",
    "features": "model.features",
    "freeze_encoder": "model.freeze_encoder",
    "pretrain_steps": "task.pretrain_steps",
}


def register(groups) -> None:
    """Add the multimodal sub-commands to ``groups`` (see attnlab.commands)."""
    from attnlab.commands import register_evaluator
    from attnlab.commands.scene_experiments import register_experiments
    from attnlab.config.multimodal import VQA_MODELS

    p = _train_parser(
        groups,
        "caption",
        help="train an image captioner on generated scenes",
        description="CNN features -> LSTM (--model lstm), image tokens + Transformer decoder "
        "with cross-attention (--model transformer), or image tokens prepended to a "
        "decoder-only LM's words (--model prefix, LLaVA-style), trained on generated scenes.",
        models=CAPTION_MODELS,
        default="transformer",
        lr=2e-3,
        extra=_caption_model_args,
    )
    p.set_defaults(func=_run_train_caption)
    p = _train_parser(
        groups,
        "vqa",
        help="train a visual question answering model on generated scenes",
        description="LSTM question encoder fused with CNN features (concat / product), a "
        "Transformer whose question tokens attend to image tokens, or the blind question-only "
        "model; answers are classes from a fixed list.",
        models=tuple(VQA_MODELS),
        default="lstm-concat",
        lr=3e-3,
        extra=_vqa_model_args,
    )
    p.set_defaults(func=_run_train_vqa)

    for spec in _use_commands():
        add_command(groups["top"], **spec)

    register_experiments(groups["experiment"])
    for kind in CAPTION_KINDS:
        register_evaluator(kind, _run_eval_caption)
    for kind in VQA_KINDS:
        register_evaluator(kind, _run_eval_vqa)


# fmt: off
def _use_commands() -> list[dict]:
    """``attnlab caption``, ``ask`` and ``scene``: their words, flag tables and runners."""
    return [
        {
            "name": "caption",
            "help": "caption an image with a trained captioner",
            "description": "Print a caption for scene images (e.g. from 'attnlab scene'; other "
            "sizes are resized to the model's, as classify does); all images are captioned as "
            "one batch.",
            "flags": [
                ("run_dir", None, None, "a run of 'attnlab train caption'"),
                ("image", None, None, "image file(s); other sizes are resized to the model's "
                 "(as classify does)", {"nargs": "+"}),
                ("--beam", int, 1, "beam width (1 = greedy)"),
                ("--attention", None, None,
                 "transformer: write per-word cross-attention maps of the first image",
                 {"metavar": "PNG"}),
                ("--weights", ["best", "last"], "best", WEIGHTS_HELP),
                ("--no-resize", "store_true", None, "refuse images whose size differs from the "
                 "model's"),
            ],
            "func": _run_caption,
        },
        {
            "name": "ask",
            "help": "ask a trained VQA model a question about an image",
            "description": "Answer a question about a scene image. Words outside the model's "
            "vocabulary are reported and read as <unk>.",
            "flags": [
                ("run_dir", None, None, "a run of 'attnlab train vqa'"),
                ("image", None, None, "image file; another size is resized to the model's"),
                ("question", None, None, 'e.g. "what colour is the circle?"'),
                ("--top", int, 3,
                 "also show the N most likely answers with probabilities on stderr (default 3)"),
                ("--weights", ["best", "last"], "best", WEIGHTS_HELP),
                ("--no-resize", "store_true", None, "refuse an image whose size differs from the "
                 "model's"),
            ],
            "func": _run_ask,
        },
        {
            "name": "scene",
            "help": "write sample generated scenes with their captions and questions",
            "description": "Write scene_K.png (and an 8x enlarged copy), plus scene_K.json / "
            ".txt with the objects, reference captions and every question with its answer.",
            "flags": [
                ("--out", None, None, "output directory (files in it are replaced)",
                 {"required": True}),
                ("--n", int, 1, "how many scenes (default 1)"),
                ("--split", ["train", "val", "unseen"], "val",
                 "unseen: every scene holds a held-out colour-shape combination (default val)"),
                ("--seed", int, 0, None),
                ("--image-size", int, 32, "side in pixels (default 32)"),
            ],
            "func": _run_scene,
        },
    ]
# fmt: on


def _train_parser(groups, name, *, help, description, models, default, lr, extra=None):
    """``attnlab train NAME``: --model, data and model flags, the shared training flags,
    ``--config`` / ``--set``."""
    from attnlab.commands.config_args import add_config_args, track_explicit
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(name, help=help, description=description)
    p.add_argument("--model", choices=models, default=default, help="default %(default)s")
    d = p.add_argument_group("data")
    # fmt: off
    add_flags(d, [
        ("--image-size", int, 32, "scene side in pixels (default 32)"),
        ("--n-train", int, 4000, "training scenes (default 4000)"),
        ("--n-val", int, 300, "validation scenes (default 300)"),
        ("--colour-bias", float, 0.3,
         "chance an object takes its shape's favourite colour (language prior; default 0.3)"),
    ])
    # fmt: on
    m = p.add_argument_group("model")
    m.add_argument(
        "--preset", choices=PRESETS, default="tiny", help="model size (default tiny: CPU minutes)"
    )
    m.add_argument(
        "--encoder",
        choices=["cnn", "vit"],
        default="cnn",
        help="image encoder: residual CNN grid or ViT patches (default cnn)",
    )
    if extra is not None:
        extra(m)
    add_train_args(p, steps=1500, batch_size=64, lr=lr, warmup=50, eval_every=250, weight_decay=0.0)
    add_config_args(p)
    track_explicit(p)
    return p


def _vqa_model_args(m) -> None:
    # fmt: off
    add_flags(m, [
        ("--answers", ["softmax", "choice"], "softmax",
         "softmax: a classifier over the answer list (default); choice: multiple choice, each "
         "answer's word vector scored against the fused image-question feature"),
    ])
    # fmt: on


def _caption_model_args(m) -> None:
    # fmt: off
    add_flags(m, [
        ("--features", ["penultimate", "logits"], "penultimate",
         "--model lstm only: start the LSTM from the encoder's penultimate features (default) or "
         "from its class logits"),
        ("--freeze-encoder", "store_true", None,
         "train only the decoder (use with --pretrain-steps)"),
        ("--pretrain-steps", int, 0,
         "first train the encoder as a majority-shape classifier for N steps (default 0)"),
    ])
    # fmt: on


# ----------------------------------------------------------------------------------------------
# train


def _build(args: argparse.Namespace, family: str, keys: dict[str, str], **fields: Any):
    """The model, task and RunSpec of a train sub-command (None: a resumed run that is complete
    already, which it says). On ``--resume`` without ``--config`` the run's own config.json takes
    the place of the file.

    Args:
        fields: model fields a flag stands for (``--model`` of ``train vqa``: arch and fusion):
            like typed flags when it was typed, like defaults otherwise.
    """
    from attnlab.config.overrides import load_config_file
    from attnlab.runs import build_run, check_resumable
    from attnlab.train.stopping import completion

    saved = Path(args.out) / "config.json"
    base = None
    if args.resume and not args.config and saved.is_file():
        check_resumable(args.out)  # config.json against the weights, before the model is built
        base = load_config_file(saved)
    typed = "model" in explicit_dests(args)
    settings = {f"model.{k}": v for k, v in fields.items()}
    spec = resolve_spec(
        args,
        FAMILIES[family],
        {**keys, **_SHARED_KEYS, **train_flag_keys()},
        base,
        typed=settings if typed else None,
        defaults=None if typed else settings,
    )
    done = completion(args.out, spec.train) if args.resume else None
    if done:  # before the scenes are generated
        print(done)
        return None
    model, task = build_run(spec)
    return model, task, spec.train


def _run_train_caption(args: argparse.Namespace) -> int:
    from attnlab.experiments.scene_runs import pretrain_encoder
    from attnlab.train import check_run_dir, train

    built = _build(args, "caption", _CAPTION_KEYS)
    if built is None:
        return 0
    model, task, cfg = built
    check_run_dir(args.out, args.resume, args.overwrite)
    steps = task.config.pretrain_steps
    if steps > 0 and not args.resume:
        acc = pretrain_encoder(
            model.encoder, task.sets("train"), steps, batch_size=cfg.batch_size, seed=cfg.seed
        )
        print(f"encoder pre-trained as a majority-shape classifier: held-out accuracy {acc:.1%}")
    result = train(model, task, cfg, args.out, resume=args.resume, overwrite=args.overwrite)
    last = result.history[-1] if result.history else {}
    extra = "".join(f", {k} {last[k]:.3f}" for k in ("bleu", "object_precision") if k in last)
    print(
        f"trained caption {model.config.arch} ({_n_params(model):,} parameters) for "
        f"{result.steps} steps in {result.elapsed:.0f}s: train loss "
        f"{result.final_train_loss:.3f}, val loss {_fmt(result.val_loss)}{extra}"
    )
    print(
        f"run saved in {result.run_dir}; try: attnlab scene --out scenes{_size(task)} && "
        f"attnlab caption {result.run_dir} scenes/scene_0.png"
    )
    return 0


def _run_train_vqa(args: argparse.Namespace) -> int:
    from attnlab.config.multimodal import VQA_MODELS
    from attnlab.train import train

    built = _build(args, "vqa", {"answers": "model.answers"}, **VQA_MODELS[args.model])
    if built is None:
        return 0
    model, task, cfg = built
    result = train(model, task, cfg, args.out, resume=args.resume, overwrite=args.overwrite)
    acc = task.accuracy_by_type(model, per_type=50)

    def base(by: str) -> float:
        return task.answer_frequency_baseline(by=by, per_type=50)

    c = model.config
    print(
        f"trained vqa {c.arch}/{c.fusion}{' multiple-choice' if c.answers == 'choice' else ''} "
        f"({_n_params(model):,} parameters) for {result.steps} "
        f"steps in {result.elapsed:.0f}s: train loss {result.final_train_loss:.3f}, val loss "
        f"{_fmt(result.val_loss)}, val accuracy {acc['all']:.1%} (answering from training "
        f"answer frequencies: {base('answer'):.1%} with the most common answer, "
        f"{base('question'):.1%} with each question's)"
    )
    print(
        f"run saved in {result.run_dir}; try: attnlab scene --out scenes{_size(task)} && "
        f'attnlab ask {result.run_dir} scenes/scene_0.png "what colour is the circle?"'
    )
    return 0


def _size(task) -> str:
    size = task.config.scene.image_size
    return "" if size == 32 else f" --image-size {size}"


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


# ----------------------------------------------------------------------------------------------
# inference


def _run_caption(args: argparse.Namespace) -> int:
    import torch

    from attnlab import runs
    from attnlab.data.scenes import Vocab, read_scene_image
    from attnlab.tasks.caption import decode_captions
    from attnlab.viz.captions import plot_word_attention

    if args.beam < 1:
        raise UserError(f"--beam must be >= 1, got {args.beam}")
    model, vocab = runs.load(args.run_dir, weights=args.weights, kinds=CAPTION_KINDS)
    if args.attention and model.kind != "caption_transformer":
        raise UserError(
            "--attention needs the Transformer captioner (the LSTM one has no attention over "
            "the image)"
        )
    size = model.config.image_size
    images = torch.cat(
        [read_scene_image(path, size, resize=not args.no_resize) for path in args.image]
    )  # all read first
    hyps = decode_captions(model, images, beam_size=args.beam, attention=bool(args.attention))
    for k, (path, h) in enumerate(zip(args.image, hyps)):
        ended = bool(h.ids) and h.ids[-1] == Vocab.END
        text = vocab.decode(h.ids)
        print(f"{path}: {text}" if len(args.image) > 1 else text)
        if args.attention and k == 0:
            image = (images[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
            words = text.split() + (["<end>"] if ended else [])
            plot_word_attention(image, words, h.alignment, args.attention)
            print(f"per-word cross-attention maps written to {args.attention}", file=sys.stderr)
    return 0


def _run_ask(args: argparse.Namespace) -> int:
    import torch

    from attnlab import runs
    from attnlab.data.scenes import read_scene_image

    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    model, vocab = runs.load(args.run_dir, weights=args.weights, kinds=VQA_KINDS)
    x = read_scene_image(args.image, model.config.image_size, resize=not args.no_resize)
    ids, unknown = vocab.encode(args.question)
    if not ids:
        raise UserError("the question is empty")
    if len(ids) > model.config.max_len:
        raise UserError(
            f"the question has {len(ids)} tokens; this model reads at most {model.config.max_len}"
        )
    if unknown:
        words = ", ".join(repr(w) for w in dict.fromkeys(unknown))
        print(
            f"notice: unknown word(s) {words} not in the model's vocabulary; read as <unk>, "
            "so the answer may not mean much",
            file=sys.stderr,
        )
    with torch.no_grad():
        logits = model(x, torch.tensor([ids]), torch.tensor([len(ids)]))[0]
    probs = logits.softmax(-1)
    top = probs.topk(max(1, min(args.top, len(vocab.answers))))
    print(vocab.answers[int(top.indices[0])])
    if args.top > 1:
        alts = ", ".join(
            f"{vocab.answers[int(i)]} {float(p):.2f}" for p, i in zip(top.values, top.indices)
        )
        print(f"  ({alts})", file=sys.stderr)
    return 0


def _run_scene(args: argparse.Namespace) -> int:
    from attnlab.data.scenes import SceneConfig, SceneSet

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


# ----------------------------------------------------------------------------------------------
# eval


def _run_eval_caption(args: argparse.Namespace) -> int:
    from attnlab import runs
    from attnlab.tasks.caption import CaptionTask

    loaded = runs.load(args.run_dir, weights=args.weights, kinds=CAPTION_KINDS)
    task = CaptionTask.for_run(loaded.task, loaded.run_dir)
    n = args.max_batches * args.batch_size if args.max_batches else 200
    for split, m in task.evaluate_splits(loaded.model, loaded.tokenizer, n).items():
        print(
            f"{split}: BLEU {m['bleu']:.1f}, object precision {m['object_precision']:.1%} "
            f"(same captions on other scenes {m['other_object_precision']:.1%}, random pair "
            f"{m['chance_precision']:.1%}), verbatim training captions "
            f"{m['retrieved']:.1%}"
            + (f", held-out combination named {m['novel_combo']:.1%}" if split == "unseen" else "")
        )
    return 0


def _run_eval_vqa(args: argparse.Namespace) -> int:
    from attnlab import runs
    from attnlab.tasks.vqa import VQATask

    loaded = runs.load(args.run_dir, weights=args.weights, kinds=VQA_KINDS)
    task = VQATask.for_run(loaded.task, loaded.run_dir)
    per_type = max(1, args.max_batches * args.batch_size // 7) if args.max_batches else 100
    res = task.evaluate_splits(loaded.model, per_type=per_type)
    for split in ("val", "unseen"):
        acc = res[split]
        print(
            f"{split}: accuracy {acc['all']:.1%} — "
            + ", ".join(f"{t} {v:.0%}" for t, v in acc.items() if t != "all")
        )
    print(
        "answer-frequency baselines (val): "
        + ", ".join(f"majority {name} {acc:.1%}" for name, acc in res["baselines"].items())
    )
    return 0
