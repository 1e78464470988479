"""``attnlab experiment NAME``: the lecture's claims as measurements (issue 14's experiments).

    attnlab experiment exposure-bias --max-time 300 --out runs/exposure-bias
    attnlab experiment label-smoothing --max-time 300 --out runs/label-smoothing
    attnlab experiment extrapolation --max-time 240 --out runs/extrapolation
    attnlab experiment norm-placement --max-time 240 --out runs/norm-placement
    attnlab experiment warmup --max-time 240 --out runs/warmup

Every experiment here takes ``--max-time SECONDS`` for the whole experiment (it splits the budget
over its runs) or ``--steps N`` per run (repeatable), writes ``table.md``, ``results.json`` and a
plot into ``--out`` (refusing a directory that holds files unless ``--overwrite``), and prints the
table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register", "add_experiment_args"]


def add_experiment_args(p: argparse.ArgumentParser, *, name: str, max_time: float) -> None:
    """The flags every experiment shares: budget, output directory, device, seed, progress."""
    g = p.add_argument_group("budget and output")
    g.add_argument(
        "--max-time",
        type=float,
        default=max_time,
        metavar="SECONDS",
        help="wall-clock seconds for the whole experiment, split over its runs "
        "(default %(default)s)",
    )
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help="train every run for exactly N steps instead of fitting --max-time (repeatable)",
    )
    g.add_argument("--out", default=f"runs/{name}", help="output directory (default %(default)s)")
    g.add_argument("--overwrite", action="store_true", help="replace what --out already holds")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-progress", dest="progress", action="store_false")


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in _split(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None


def register(groups) -> None:
    """Add the experiments of this module to ``groups["experiment"]`` (see attnlab.commands)."""
    e = groups["experiment"].add_parser(
        "exposure-bias",
        help="teacher forcing vs scheduled sampling: loss on own predictions, EM by length",
        description="Train rnn-attn and transformer on the numbers task with teacher forcing and "
        "with scheduled sampling (the gold-token probability decays linearly, exponentially or "
        "by inverse sigmoid), from the same initial weights for an equal share of the budget "
        "(or --steps each). Report the "
        "held-out NLL of the references under teacher forcing and when the decoder reads its "
        "own greedy predictions, the gap, and greedy exact match by output length.",
    )
    add_experiment_args(e, name="exposure-bias", max_time=300.0)
    e.add_argument(
        "--models",
        type=_split,
        default=("rnn-attn", "transformer"),
        help="comma-separated kinds (default rnn-attn,transformer)",
    )
    e.add_argument(
        "--decays",
        type=_split,
        default=("linear", "exponential", "inverse_sigmoid"),
        help="comma-separated scheduled-sampling decays (default all three)",
    )
    e.add_argument(
        "--half-at",
        type=float,
        default=0.5,
        help="fraction of each run at which the gold probability reaches 1/2 (default 0.5)",
    )
    e.add_argument("--lang", default="it")
    e.add_argument("--high", type=int, default=10**6 - 1, help="largest number (default 999999)")
    e.add_argument("--n-examples", type=int, default=20_000)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--max-test", type=int, default=1000, help="held-out pairs scored")
    e.set_defaults(func=_run_exposure_bias)

    s = groups["experiment"].add_parser(
        "label-smoothing",
        help="label smoothing 0 / 0.1 / 0.2: accuracy, NLL, calibration (reliability diagram)",
        description="Train one translation model per label-smoothing value on a small numbers "
        "data set (same initial weights, equal shares of the budget) and report held-out token "
        "accuracy, NLL, "
        "expected calibration error with a reliability diagram, and exact match.",
    )
    add_experiment_args(s, name="label-smoothing", max_time=300.0)
    s.add_argument(
        "--epsilons",
        type=_floats,
        default=(0.0, 0.1, 0.2),
        help="comma-separated smoothing values (default 0,0.1,0.2)",
    )
    s.add_argument("--model", choices=["rnn", "rnn-attn", "transformer"], default="transformer")
    s.add_argument("--preset", default="tiny")
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--lang", default="it")
    s.add_argument("--high", type=int, default=10**6 - 1)
    s.add_argument("--n-examples", type=int, default=2000, help="pairs generated (default 2000)")
    s.add_argument(
        "--held-out",
        type=float,
        default=0.9,
        help="fraction held out, half validation, half test (default 0.9: 200 training pairs, "
        "on which an unsmoothed model becomes overconfident, and 900 test pairs)",
    )
    s.add_argument("--batch-size", type=int, default=32)
    s.add_argument("--n-bins", type=int, default=15, help="confidence bins (default 15)")
    s.add_argument("--max-test", type=int, default=1000)
    s.set_defaults(func=_run_label_smoothing)
    _register_lm(groups)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in _split(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, got {text!r}"
        ) from None


def _experiment(run, config_cls: type, args: argparse.Namespace, **extra) -> int:
    """Check the shared flags, build ``config_cls`` from the flags, run it and print its table."""
    from attnlab.commands.config_args import from_args
    from attnlab.errors import UserError
    from attnlab.experiments.common import TABLE_FILE

    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise UserError(f"--threads must be at least 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    run(from_args(config_cls, args, **extra), args.out, overwrite=args.overwrite)
    print((Path(args.out) / TABLE_FILE).read_text(encoding="utf-8").rstrip())
    print(f"\ntable.md, results.json and the plot are in {args.out}")
    return 0


def _run_exposure_bias(args: argparse.Namespace) -> int:
    from attnlab.experiments.exposure_bias import ExposureBiasConfig, run_exposure_bias

    return _experiment(run_exposure_bias, ExposureBiasConfig, args)


def _run_label_smoothing(args: argparse.Namespace) -> int:
    from attnlab.experiments.label_smoothing import LabelSmoothingConfig, run_label_smoothing

    return _experiment(run_label_smoothing, LabelSmoothingConfig, args)


# ----------------------------------------------------------------------------------------------
# the language-model experiments


def _register_lm(groups) -> None:
    x = groups["experiment"].add_parser(
        "extrapolation",
        help="learned / sinusoidal / RoPE / ALiBi positions: trained at L, evaluated at L, 2L, 4L",
        description="Train one DecoderLM per position scheme on windows of --context L "
        "characters of a built-in corpus (same seed, the same steps, fitted into --max-time), "
        "then score the same held-out text cut into windows of L, 2L and 4L: mean loss and loss "
        "by position (plot). A learned table of L rows cannot read past L: its cells say "
        "'n/a: table has L rows'.",
    )
    add_experiment_args(x, name="extrapolation", max_time=240.0)
    x.add_argument(
        "--positions",
        type=_split,
        default=("learned", "sinusoidal", "rope", "alibi"),
        help="comma-separated schemes (default learned,sinusoidal,rope,alibi)",
    )
    x.add_argument("--context", type=int, default=64, help="training window L (default 64)")
    x.add_argument(
        "--lengths",
        type=_ints,
        default=(1, 2, 4),
        help="evaluated lengths as multiples of L (default 1,2,4)",
    )
    _lm_model_args(x, lr=2e-3)
    x.add_argument(
        "--eval-windows",
        type=int,
        default=128,
        help="held-out windows of the longest length scored (default 128)",
    )
    x.set_defaults(func=_run_extrapolation)

    n = groups["experiment"].add_parser(
        "norm-placement",
        help="post-norm vs pre-norm by depth, with and without warm-up: divergence, final "
        "loss, per-layer gradient norms at initialisation",
        description="Train DecoderLMs with post-norm and pre-norm blocks at several depths at "
        "one learning rate (AdamW, constant after the warm-up, no gradient clipping), each "
        "without and with a linear warm-up (same seed, the same steps, "
        "fitted into --max-time). Report whether training diverged (a non-finite loss, a loss "
        "that blew up: rose more than 1 nat above the first step's, or a loss that ended no "
        "lower than it started), the final training loss, and the gradient "
        "norm of every block's parameters at initialisation.",
    )
    add_experiment_args(n, name="norm-placement", max_time=240.0)
    n.add_argument(
        "--depths",
        type=_ints,
        default=(2, 6, 12),
        help="comma-separated layer counts "
        "(default 2,6,12; the issue's 24 fits a larger --max-time)",
    )
    n.add_argument(
        "--warmup-frac",
        type=float,
        default=0.2,
        help="linear warm-up as a fraction of each run, for the warmed-up runs (default 0.2)",
    )
    _lm_model_args(n, lr=1e-2, context=32)
    n.set_defaults(func=_run_norm_placement)

    w = groups["experiment"].add_parser(
        "warmup",
        help="Adam with and without linear warm-up across peak learning rates: how often early "
        "training diverges, and the loss reached",
        description="Train a DecoderLM (AdamW, no gradient clipping) at each peak learning "
        "rate, with and without a linear warm-up (constant rate afterwards), over several seeds "
        "(--seed, --seed+1, ...), for the same steps (fitted "
        "into --max-time). Report how many seeds diverged (a non-finite loss, a loss that blew "
        "up: rose more than 1 nat above the first step's, or a loss that ended no lower than "
        "it started) and the final training loss.",
    )
    add_experiment_args(w, name="warmup", max_time=240.0)
    w.add_argument(
        "--lrs",
        type=_floats,
        default=(1e-2, 3e-2, 1e-1, 3e-1),
        help="comma-separated peak learning rates (default 0.01,0.03,0.1,0.3)",
    )
    w.add_argument("--seeds", type=int, default=3, help="seeds per setting (default 3)")
    w.add_argument(
        "--warmup-frac",
        type=float,
        default=0.2,
        help="linear warm-up as a fraction of each run (default 0.2)",
    )
    w.add_argument("--n-layers", type=int, default=4, help="depth (default 4)")
    w.add_argument(
        "--norm",
        choices=["post", "pre"],
        default="post",
        help="norm placement of the blocks (default post, the original Transformer's)",
    )
    _lm_model_args(w, lr=None, context=32)
    w.set_defaults(func=_run_warmup)


def _lm_model_args(p: argparse.ArgumentParser, *, lr: float | None, context: int | None = None):
    g = p.add_argument_group("model and data")
    g.add_argument("--preset", default="tiny", help="DecoderLM preset (default tiny)")
    g.add_argument("--d-model", type=int, default=None, help="model width (default: the preset's)")
    if context is not None:
        g.add_argument(
            "--context", type=int, default=context, help=f"training window (default {context})"
        )
    if lr is not None:
        g.add_argument(
            "--lr", type=float, default=lr, help="peak learning rate (default %(default)s)"
        )
    g.add_argument("--batch-size", type=int, default=16, help="windows per step (default 16)")
    g.add_argument("--data", default="pydoc", help="corpus, read by characters (default pydoc)")
    g.add_argument("--max-chars", type=int, default=None, help="use only the first N characters")
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's, all cores; 1 is much faster on a busy machine)",
    )


def _run_extrapolation(args: argparse.Namespace) -> int:
    from attnlab.experiments.extrapolation import ExtrapolationConfig, run_extrapolation

    return _experiment(run_extrapolation, ExtrapolationConfig, args)


def _run_norm_placement(args: argparse.Namespace) -> int:
    from attnlab.experiments.norm_placement import NormPlacementConfig, run_norm_placement

    return _experiment(run_norm_placement, NormPlacementConfig, args)


def _run_warmup(args: argparse.Namespace) -> int:
    from attnlab.experiments.warmup import WarmupConfig, run_warmup

    return _experiment(run_warmup, WarmupConfig, args, norm_position=args.norm)
