"""Captioning and VQA on generated scenes: train, caption, ask, look at the data, experiments.

attnlab scene --out scenes/                      # a sample scene PNG + its captions and Q&A
attnlab train caption --model transformer --out runs/cap --max-time 120
attnlab caption runs/cap scenes/scene_0.png --beam 3 --attention words.png
attnlab train vqa --model lstm-concat --out runs/vqa --max-time 120
attnlab ask runs/vqa scenes/scene_0.png "what colour is the circle?"
attnlab eval runs/vqa
attnlab experiment vqa-bias | caption-retrieval | caption-features
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.errors import UserError

CAPTION_MODELS = ("lstm", "transformer")
WEIGHTS_HELP = "best: the checkpoint with the lowest validation loss (default); last: the final one"
CAPTION_KINDS = ("caption_lstm", "caption_transformer")
VQA_KINDS = ("vqa_lstm", "vqa_transformer")


def register(groups) -> None:
    """Add the multimodal sub-commands to ``groups`` (see attnlab.commands)."""
    from attnlab.commands import register_evaluator
    from attnlab.experiments.vqa_bias import VQA_MODELS
    from attnlab.train import add_train_args

    def data_args(p):
        d = p.add_argument_group("data")
        d.add_argument(
            "--image-size", type=int, default=32, help="scene side in pixels (default 32)"
        )
        d.add_argument("--n-train", type=int, default=4000, help="training scenes (default 4000)")
        d.add_argument("--n-val", type=int, default=300, help="validation scenes (default 300)")
        d.add_argument(
            "--colour-bias",
            type=float,
            default=0.3,
            help="chance an object takes its shape's favourite colour (language "
            "prior; default 0.3)",
        )

    def model_args(p):
        m = p.add_argument_group("model")
        m.add_argument(
            "--preset",
            choices=["tiny", "small"],
            default="tiny",
            help="model size (default tiny: CPU minutes)",
        )
        m.add_argument(
            "--encoder",
            choices=["cnn", "vit"],
            default="cnn",
            help="image encoder: residual CNN grid or ViT patches (default cnn)",
        )
        return m

    p = groups["train"].add_parser(
        "caption",
        help="train an image captioner on generated scenes",
        description="CNN features -> LSTM (--model lstm) or image tokens + Transformer decoder "
        "with cross-attention (--model transformer), trained on generated scenes.",
    )
    p.add_argument("--model", choices=CAPTION_MODELS, default="transformer")
    data_args(p)
    m = model_args(p)
    m.add_argument(
        "--features",
        choices=["penultimate", "logits"],
        default="penultimate",
        help="--model lstm only: start the LSTM from the encoder's penultimate features "
        "(default) or from its class logits",
    )
    m.add_argument(
        "--freeze-encoder",
        action="store_true",
        help="train only the decoder (use with --pretrain-steps)",
    )
    m.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        help="first train the encoder as a majority-shape classifier for N steps (default 0)",
    )
    add_train_args(
        p, steps=1500, batch_size=64, lr=2e-3, warmup=50, eval_every=250, weight_decay=0.0
    )
    p.set_defaults(func=_run_train_caption)

    p = groups["train"].add_parser(
        "vqa",
        help="train a visual question answering model on generated scenes",
        description="LSTM question encoder fused with CNN features (concat / product), a "
        "Transformer whose question tokens attend to image tokens, or the blind question-only "
        "model; answers are classes from a fixed list.",
    )
    p.add_argument("--model", choices=list(VQA_MODELS), default="lstm-concat")
    data_args(p)
    model_args(p)
    add_train_args(
        p, steps=1500, batch_size=64, lr=3e-3, warmup=50, eval_every=250, weight_decay=0.0
    )
    p.set_defaults(func=_run_train_vqa)

    c = groups["top"].add_parser(
        "caption",
        help="caption an image with a trained captioner",
        description="Print a caption for a scene image (PNG of the training size, e.g. from "
        "'attnlab scene').",
    )
    c.add_argument("run_dir", help="a run of 'attnlab train caption'")
    c.add_argument("image", nargs="+", help="image file(s) of the size the model was trained on")
    c.add_argument("--beam", type=int, default=1, help="beam width (1 = greedy)")
    c.add_argument(
        "--attention",
        metavar="PNG",
        help="transformer: write per-word cross-attention maps of the first image",
    )
    c.add_argument("--weights", choices=["best", "last"], default="best", help=WEIGHTS_HELP)
    c.set_defaults(func=_run_caption)

    a = groups["top"].add_parser(
        "ask",
        help="ask a trained VQA model a question about an image",
        description="Answer a question about a scene image. Words outside the model's "
        "vocabulary are reported and read as <unk>.",
    )
    a.add_argument("run_dir", help="a run of 'attnlab train vqa'")
    a.add_argument("image", help="image file of the size the model was trained on")
    a.add_argument("question", help='e.g. "what colour is the circle?"')
    a.add_argument(
        "--top",
        type=int,
        default=3,
        help="also show the N most likely answers with probabilities on stderr (default 3)",
    )
    a.add_argument("--weights", choices=["best", "last"], default="best", help=WEIGHTS_HELP)
    a.set_defaults(func=_run_ask)

    s = groups["top"].add_parser(
        "scene",
        help="write sample generated scenes with their captions and questions",
        description="Write scene_K.png (and an 8x enlarged copy), plus scene_K.json / .txt "
        "with the objects, reference captions and every question with its answer.",
    )
    s.add_argument("--out", required=True, help="output directory (files in it are replaced)")
    s.add_argument("--n", type=int, default=1, help="how many scenes (default 1)")
    s.add_argument(
        "--split",
        choices=["train", "val", "unseen"],
        default="val",
        help="unseen: every scene holds a held-out colour-shape combination (default val)",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--image-size", type=int, default=32, help="side in pixels (default 32)")
    s.set_defaults(func=_run_scene)

    def exp_args(e, out, steps, n_train):
        e.add_argument("--out", default=out, help="output directory (default %(default)s)")
        e.add_argument(
            "--steps", type=int, default=steps, help="steps per model (default %(default)s)"
        )
        e.add_argument(
            "--max-time",
            type=float,
            default=None,
            metavar="SECONDS",
            help="seconds of training per model (overrides --steps)",
        )
        e.add_argument("--batch-size", type=int, default=64, help="default %(default)s")
        e.add_argument(
            "--n-train", type=int, default=n_train, help="training scenes (default %(default)s)"
        )
        e.add_argument("--preset", choices=["tiny", "small"], default="tiny", help="model size")
        e.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
        e.add_argument("--seed", type=int, default=0)
        e.add_argument(
            "--overwrite", action="store_true", help="replace the runs of an earlier --out"
        )
        e.add_argument("--no-progress", dest="progress", action="store_false")

    e = groups["experiment"].add_parser(
        "vqa-bias", help="blind (question-only) vs image-reading VQA accuracy per question type"
    )
    exp_args(e, "runs/vqa-bias", 800, 3000)
    e.add_argument("--models", nargs="+", choices=list(VQA_MODELS), default=list(VQA_MODELS))
    e.add_argument(
        "--colour-bias",
        type=float,
        default=0.3,
        help="chance an object takes its shape's favourite colour (default 0.3)",
    )
    e.set_defaults(func=_run_vqa_bias)
    e = groups["experiment"].add_parser(
        "caption-retrieval",
        help="do captioners compose or retrieve? verbatim training "
        "captions and unseen colour-shape combinations, both captioners",
    )
    exp_args(e, "runs/caption-retrieval", 800, 2000)
    e.add_argument("--beam", type=int, default=1, help="beam width (default 1: greedy)")
    e.add_argument("--n-eval", type=int, default=200, help="val and unseen scenes captioned")
    e.set_defaults(func=_run_caption_retrieval)
    e = groups["experiment"].add_parser(
        "caption-features",
        help="CNN+LSTM captioner from the classifier's logits vs its penultimate features",
    )
    exp_args(e, "runs/caption-features", 800, 2000)
    e.add_argument(
        "--pretrain-steps",
        type=int,
        default=300,
        help="steps training the classifier before it is frozen (default 300)",
    )
    e.add_argument("--n-eval", type=int, default=200, help="val scenes captioned")
    e.add_argument(
        "--encoder-width",
        type=int,
        default=64,
        help="classifier width = penultimate feature size (default 64)",
    )
    e.set_defaults(func=_run_caption_features)

    for kind in CAPTION_KINDS:
        register_evaluator(kind, _run_eval_caption)
    for kind in VQA_KINDS:
        register_evaluator(kind, _run_eval_vqa)


# ----------------------------------------------------------------------------------------------
# train


def _task(cls, args):
    from attnlab.data.scenes import SceneConfig

    scene = SceneConfig(image_size=args.image_size, colour_bias=args.colour_bias)
    return cls(scene=scene, n_train=args.n_train, n_val=args.n_val, n_unseen=100, seed=args.seed)


def _run_train_caption(args: argparse.Namespace) -> int:
    from attnlab.data.scenes import CaptionTask
    from attnlab.models.caption import CaptionConfig, build_captioner, pretrain_encoder
    from attnlab.train import train, train_config_from_args

    if args.pretrain_steps < 0:
        raise UserError(f"--pretrain-steps must be >= 0, got {args.pretrain_steps}")
    cfg = train_config_from_args(args)
    task = _task(CaptionTask, args)
    model = build_captioner(
        CaptionConfig.preset(
            args.preset,
            arch=args.model,
            vocab_size=len(task.vocab),
            image_size=args.image_size,
            encoder=args.encoder,
            features=args.features,
            freeze_encoder=args.freeze_encoder,
        )
    )
    if args.pretrain_steps > 0 and not args.resume:
        acc = pretrain_encoder(
            model.encoder,
            task.sets("train"),
            args.pretrain_steps,
            batch_size=args.batch_size,
            seed=args.seed,
        )
        print(f"encoder pre-trained as a majority-shape classifier: held-out accuracy {acc:.1%}")
    result = train(model, task, cfg, args.out, resume=args.resume, overwrite=args.overwrite)
    last = result.history[-1] if result.history else {}
    extra = "".join(f", {k} {last[k]:.3f}" for k in ("bleu", "object_precision") if k in last)
    print(
        f"trained caption {args.model} ({_n_params(model):,} parameters) for {result.steps} "
        f"steps in {result.elapsed:.0f}s: train loss {result.final_train_loss:.3f}, val loss "
        f"{_fmt(result.val_loss)}{extra}"
    )
    print(
        f"run saved in {result.run_dir}; try: attnlab scene --out scenes{_size(args)} && "
        f"attnlab caption {result.run_dir} scenes/scene_0.png"
    )
    return 0


def _run_train_vqa(args: argparse.Namespace) -> int:
    from attnlab.data.scenes import VQATask
    from attnlab.experiments.vqa_bias import vqa_config_for
    from attnlab.models.vqa import build_vqa
    from attnlab.train import train, train_config_from_args

    cfg = train_config_from_args(args)
    task = _task(VQATask, args)
    model = build_vqa(
        vqa_config_for(
            args.model,
            task.vocab,
            preset=args.preset,
            image_size=args.image_size,
            encoder=args.encoder,
        )
    )
    result = train(model, task, cfg, args.out, resume=args.resume, overwrite=args.overwrite)
    acc = task.accuracy_by_type(model, per_type=50)

    def base(by: str) -> float:
        return task.answer_frequency_baseline(by=by, per_type=50)

    print(
        f"trained vqa {args.model} ({_n_params(model):,} parameters) for {result.steps} steps "
        f"in {result.elapsed:.0f}s: train loss {result.final_train_loss:.3f}, val loss "
        f"{_fmt(result.val_loss)}, val accuracy {acc['all']:.1%} (answering from training "
        f"answer frequencies: {base('answer'):.1%} with the most common answer, "
        f"{base('question'):.1%} with each question's)"
    )
    print(
        f"run saved in {result.run_dir}; try: attnlab scene --out scenes{_size(args)} && "
        f'attnlab ask {result.run_dir} scenes/scene_0.png "what colour is the circle?"'
    )
    return 0


def _size(args) -> str:
    return "" if args.image_size == 32 else f" --image-size {args.image_size}"


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


# ----------------------------------------------------------------------------------------------
# inference


def _load(run_dir: str, weights: str, kinds: tuple[str, ...], what: str):
    from attnlab import runs

    kind = runs.read_config(run_dir)["kind"]
    if kind not in kinds:
        raise UserError(
            f"{run_dir} holds a {kind!r} model, not a {what} model "
            f"(train one with 'attnlab train {what}')"
        )
    name = "best.safetensors" if weights == "best" else "model.safetensors"
    if not (Path(run_dir) / name).exists():
        name = "model.safetensors"
    model, vocab = runs.load(run_dir, weights=name)
    return model, vocab


def _run_caption(args: argparse.Namespace) -> int:
    from attnlab.data.scenes import read_scene_image
    from attnlab.models.caption import (
        beam_decode,
        greedy_decode,
        plot_word_attention,
        word_attention,
    )

    if args.beam < 1:
        raise UserError(f"--beam must be >= 1, got {args.beam}")
    model, vocab = _load(args.run_dir, args.weights, CAPTION_KINDS, "caption")
    if args.attention and model.kind != "caption_transformer":
        raise UserError(
            "--attention needs the Transformer captioner (the LSTM one has no attention over "
            "the image)"
        )
    images = [read_scene_image(path, model.config.image_size) for path in args.image]  # all first
    for k, (path, x) in enumerate(zip(args.image, images)):
        ids = greedy_decode(model, x)[0] if args.beam == 1 else beam_decode(model, x, args.beam)[0]
        text = vocab.decode(ids)
        print(f"{path}: {text}" if len(args.image) > 1 else text)
        if args.attention and k == 0:
            maps = word_attention(model, x[0], ids)
            image = (x[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
            plot_word_attention(image, text.split(), maps, args.attention)
            print(f"per-word cross-attention maps written to {args.attention}", file=sys.stderr)
    return 0


def _run_ask(args: argparse.Namespace) -> int:
    import torch

    from attnlab.data.scenes import read_scene_image

    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    model, vocab = _load(args.run_dir, args.weights, VQA_KINDS, "vqa")
    x = read_scene_image(args.image, model.config.image_size)
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
    import numpy as np
    from PIL import Image

    from attnlab.data.scenes import SceneConfig, SceneSet
    from attnlab.runs import atomic_save, atomic_write_text

    if args.n < 1:
        raise UserError(f"--n must be >= 1, got {args.n}")
    sset = SceneSet(SceneConfig(image_size=args.image_size), args.split, args.n, args.seed)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for k, scene in enumerate(sset.scenes):
        img = sset.images[k]
        atomic_save(
            out / f"scene_{k}.png", lambda tmp, im=img: Image.fromarray(im).save(tmp, format="PNG")
        )
        big = np.kron(img, np.ones((8, 8, 1), dtype=np.uint8))
        atomic_save(
            out / f"scene_{k}_x8.png",
            lambda tmp, im=big: Image.fromarray(im).save(tmp, format="PNG"),
        )
        info = {
            "objects": [
                {"colour": o.colour, "shape": o.shape, "x": round(o.x, 1), "y": round(o.y, 1)}
                for o in scene.objects
            ],
            "captions": sset.captions[k],
            "questions": [
                {"type": q.qtype, "question": q.question, "answer": q.answer}
                for q in sset.questions[k]
            ],
        }
        atomic_write_text(out / f"scene_{k}.json", json.dumps(info, indent=1) + "\n")
        lines = (
            [f"scene_{k}.png ({args.split} split, {len(scene.objects)} objects)", "captions:"]
            + [f"  {c}" for c in sset.captions[k]]
            + ["questions:"]
            + [f"  [{q.qtype}] {q.question} -> {q.answer}" for q in sset.questions[k]]
        )
        atomic_write_text(out / f"scene_{k}.txt", "\n".join(lines) + "\n")
        if k == 0:
            print(
                "\n".join(
                    lines[: 2 + len(sset.captions[k])]
                    + lines[2 + len(sset.captions[k]) : 2 + len(sset.captions[k]) + 9]
                )
            )
    print(f"wrote {args.n} scene(s) to {out} (PNG, x8 PNG, JSON, TXT)")
    return 0


# ----------------------------------------------------------------------------------------------
# eval


def _eval_task(run_dir: str, cls):
    from attnlab.runs import read_config

    d = dict(read_config(run_dir).get("task") or {})
    d.pop("name", None)
    try:
        return cls(**d)
    except TypeError as err:
        raise UserError(f"{run_dir}/config.json: task settings do not fit: {err}") from None


def _run_eval_caption(args: argparse.Namespace) -> int:
    from attnlab.data.scenes import CaptionTask
    from attnlab.models.caption import caption_metrics

    model, vocab = _load(args.run_dir, args.weights, CAPTION_KINDS, "caption")
    task = _eval_task(args.run_dir, CaptionTask)
    n = args.max_batches * args.batch_size if args.max_batches else 200
    train_caps = task.sets("train").caption_set()
    for split in ("val", "unseen"):
        sset = task.sets(split)
        m = caption_metrics(model, vocab, sset, range(min(n, len(sset))), train_captions=train_caps)
        print(
            f"{split}: BLEU {m['bleu']:.1f}, object precision {m['object_precision']:.1%} "
            f"(same captions on other scenes {m['other_object_precision']:.1%}, random pair "
            f"{m['chance_precision']:.1%}), verbatim training captions "
            f"{m['retrieved']:.1%}"
            + (f", held-out combination named {m['novel_combo']:.1%}" if split == "unseen" else "")
        )
    return 0


def _run_eval_vqa(args: argparse.Namespace) -> int:
    from attnlab.data.scenes import VQATask

    model, _ = _load(args.run_dir, args.weights, VQA_KINDS, "vqa")
    task = _eval_task(args.run_dir, VQATask)
    per_type = max(1, args.max_batches * args.batch_size // 7) if args.max_batches else 100
    for split in ("val", "unseen"):
        acc = task.accuracy_by_type(model, split, per_type=per_type)
        print(
            f"{split}: accuracy {acc['all']:.1%} — "
            + ", ".join(f"{t} {v:.0%}" for t, v in acc.items() if t != "all")
        )
    print(
        "answer-frequency baselines (val): "
        + ", ".join(
            f"majority {name} {task.answer_frequency_baseline(by=by, per_type=per_type):.1%}"
            for name, by in (
                ("answer", "answer"),
                ("per type", "type"),
                ("per question", "question"),
            )
        )
    )
    return 0


# ----------------------------------------------------------------------------------------------
# experiments


def _exp_common(args) -> dict:
    return {
        "out": args.out,
        "steps": args.steps,
        "max_time": args.max_time,
        "batch_size": args.batch_size,
        "preset": args.preset,
        "device": args.device,
        "seed": args.seed,
        "overwrite": args.overwrite,
        "progress": args.progress,
        "n_train": args.n_train,
    }


def _run_vqa_bias(args: argparse.Namespace) -> int:
    from attnlab.experiments import vqa_bias

    res = vqa_bias.run(
        vqa_bias.VQABiasConfig(
            models=args.models, colour_bias=args.colour_bias, **_exp_common(args)
        )
    )
    print("VQA accuracy (%) per question type, same budget per model\n")
    print(vqa_bias.format_table(res))
    return 0


def _run_caption_retrieval(args: argparse.Namespace) -> int:
    from attnlab.experiments import caption_retrieval as cr

    res = cr.run(
        cr.CaptionRetrievalConfig(beam_size=args.beam, n_eval=args.n_eval, **_exp_common(args))
    )
    print("Captioners: composition vs retrieval\n")
    print(cr.format_table(res))
    return 0


def _run_caption_features(args: argparse.Namespace) -> int:
    from attnlab.experiments import caption_features as cf

    res = cf.run(
        cf.CaptionFeaturesConfig(
            pretrain_steps=args.pretrain_steps,
            encoder_width=args.encoder_width,
            n_eval=args.n_eval,
            **_exp_common(args),
        )
    )
    print("CNN+LSTM captioner from a frozen classifier: logits vs penultimate features\n")
    print(cf.format_table(res))
    return 0
