"""``attnlab experiment vqa-bias | caption-retrieval | caption-bptt | caption-features``: the
scene experiments
(registered by :mod:`attnlab.commands.multimodal`; the work is in :mod:`attnlab.experiments`)."""

from __future__ import annotations

import argparse

from attnlab.commands.flags import add_flags

PRESETS = ("tiny", "small")


def register_experiments(experiments) -> None:
    """Add ``vqa-bias``, ``caption-retrieval`` and ``caption-features`` to the
    ``attnlab experiment`` sub-parsers."""
    from attnlab.config.multimodal import VQA_MODELS

    vqa_models = tuple(VQA_MODELS)

    def exp_args(name, help, out, n_train, func):
        e = experiments.add_parser(name, help=help)
        # fmt: off
        add_flags(e, [
            ("--out", None, out, "output directory (default %(default)s)"),
            ("--steps", int, 800, "steps per model (default 800)"),
            ("--max-time", float, None,
             "seconds of training per model (overrides --steps)", {"metavar": "SECONDS"}),
            ("--batch-size", int, 64, "default %(default)s"),
            ("--n-train", int, n_train, "training scenes (default %(default)s)"),
            ("--preset", PRESETS, "tiny", "model size"),
            ("--device", None, "auto", "auto, cpu, cuda or cuda:N"),
            ("--seed", int, 0, None),
            ("--overwrite", "store_true", None, "replace the runs of an earlier --out"),
            ("--no-progress", "store_false", None, None, {"dest": "progress"}),
        ])
        # fmt: on
        e.set_defaults(func=func)
        return e

    e = exp_args(
        "vqa-bias",
        "blind (question-only) vs image-reading VQA accuracy per question type",
        "runs/vqa-bias",
        3000,
        _run_vqa_bias,
    )
    e.add_argument("--models", nargs="+", choices=vqa_models, default=list(vqa_models))
    e.add_argument(
        "--colour-bias",
        type=float,
        default=0.3,
        help="chance an object takes its shape's favourite colour (default 0.3)",
    )
    e = exp_args(
        "caption-retrieval",
        "do captioners compose or retrieve? verbatim training captions and unseen colour-shape "
        "combinations, both captioners",
        "runs/caption-retrieval",
        2000,
        _run_caption_retrieval,
    )
    e.add_argument("--beam", type=int, default=1, help="beam width (default 1: greedy)")
    e.add_argument(
        "--models",
        nargs="+",
        choices=["lstm", "transformer", "prefix"],
        default=["lstm", "transformer"],
        help="captioners (default lstm transformer; prefix: LLaVA-style image tokens in the LM)",
    )
    e.add_argument(
        "--encoder", choices=["cnn", "vit"], default="cnn", help="image encoder (default cnn)"
    )
    e.add_argument("--n-eval", type=int, default=200, help="val and unseen scenes captioned")
    e = exp_args(
        "caption-bptt",
        "LSTM captioner: truncated backpropagation through time vs full, accuracy by position",
        "runs/caption-bptt",
        2000,
        _run_caption_bptt,
    )
    # fmt: off
    add_flags(e, [
        ("--windows", int, [0, 2], "truncation windows in words, 0 = full (default 0 2)",
         {"nargs": "+"}),
        ("--n-eval", int, 200, "val scenes measured"),
    ])
    # fmt: on
    e = exp_args(
        "caption-features",
        "CNN+LSTM captioner from the classifier's logits vs its penultimate features",
        "runs/caption-features",
        2000,
        _run_caption_features,
    )
    # fmt: off
    add_flags(e, [
        ("--pretrain-steps", int, 300,
         "steps training the classifier before it is frozen (default 300)"),
        ("--n-eval", int, 200, "val scenes captioned"),
        ("--encoder-width", int, 64, "classifier width = penultimate feature size (default 64)"),
    ])
    # fmt: on


def _run_vqa_bias(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments import vqa_bias

    cfg = from_args(vqa_bias.VQABiasConfig, args)
    print("VQA accuracy (%) per question type, same budget per model\n")
    print(vqa_bias.format_table(vqa_bias.run(cfg)))
    return 0


def _run_caption_retrieval(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments import caption_retrieval as cr

    cfg = from_args(cr.CaptionRetrievalConfig, args, beam_size=args.beam)
    print("Captioners: composition vs retrieval\n")
    print(cr.format_table(cr.run(cfg)))
    return 0


def _run_caption_bptt(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments import caption_bptt

    cfg = from_args(caption_bptt.CaptionBPTTConfig, args)
    print("LSTM captioner: truncated vs full backpropagation through time\n")
    print(caption_bptt.format_table(caption_bptt.run(cfg)))
    return 0


def _run_caption_features(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments import caption_features as cf

    cfg = from_args(cf.CaptionFeaturesConfig, args)
    print("CNN+LSTM captioner from a frozen classifier: logits vs penultimate features\n")
    print(cf.format_table(cf.run(cfg)))
    return 0
