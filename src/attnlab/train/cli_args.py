"""The command-line flags every ``attnlab train <task>`` shares, and their ``TrainConfig``."""

from __future__ import annotations

import argparse
from dataclasses import fields

from attnlab.train.config import AMP_MODES, FSDP_DTYPES, SCHEDULES, STRATEGIES, TrainConfig

__all__ = ["add_train_args", "train_config_from_args"]

# flag-name aliases accepted as defaults: add_train_args(p, warmup=50) == (warmup_steps=50)
_ALIASES = {"warmup": "warmup_steps"}
_RUN_KEYS = {"out", "resume", "overwrite"}


def _clip(text: str) -> float | None:
    if text.lower() in ("none", "off", "0", "0.0"):
        return None
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"--grad-clip must be >= 0, got {text}")
    return value


def add_train_args(parser: argparse.ArgumentParser, **defaults) -> argparse.ArgumentParser:
    """Add the shared training flags to ``parser``.

    Args:
        parser: the sub-command's parser.
        **defaults: the family's defaults, by TrainConfig field name (``steps=2000``,
            ``lr=1e-3``, ``batch_size=16``, ``warmup=50``...) or ``out="runs/lm"``. Without an
            ``out`` default, ``--out`` is required.

    Raises:
        ValueError: for a default that names no flag.
    """
    known = {f.name for f in fields(TrainConfig)} | _RUN_KEYS
    d = {f.name: f.default for f in fields(TrainConfig)}
    for key, value in defaults.items():
        key = _ALIASES.get(key, key)
        if key not in known:
            raise ValueError(f"add_train_args: unknown default {key!r}; known: {sorted(known)}")
        d[key] = value

    g = parser.add_argument_group("training")
    g.add_argument(
        "--out",
        default=d.get("out"),
        required="out" not in d,
        metavar="RUN_DIR",
        help="run directory for config, weights, metrics and loss curve"
        + (" (default: %(default)s)" if "out" in d else ""),
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run saved in --out from its last checkpoint",
    )
    g.add_argument(
        "--overwrite", action="store_true", help="delete the run in --out and start again"
    )
    g.add_argument(
        "--steps",
        type=int,
        default=d["steps"],
        help="optimizer steps (default: %(default)s; ignored with --max-time)",
    )
    g.add_argument(
        "--max-time",
        type=float,
        default=d["max_time"],
        metavar="SECONDS",
        help="train for this many wall-clock seconds instead of --steps; the "
        "learning-rate schedule fits itself to the budget",
    )
    g.add_argument(
        "--batch-size",
        type=int,
        default=d["batch_size"],
        help="global examples per optimizer step (default: %(default)s)",
    )
    g.add_argument(
        "--grad-accum",
        type=int,
        default=d["grad_accum"],
        metavar="N",
        help="split each step into N micro-batches (default: %(default)s)",
    )
    g.add_argument(
        "--lr", type=float, default=d["lr"], help="peak learning rate (default: %(default)s)"
    )
    g.add_argument(
        "--min-lr-ratio",
        type=float,
        default=d["min_lr_ratio"],
        help="cosine floor as a fraction of --lr (default: %(default)s)",
    )
    g.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=d["schedule"],
        help="learning-rate schedule after warm-up (default: %(default)s)",
    )
    g.add_argument(
        "--warmup",
        dest="warmup_steps",
        type=int,
        default=d["warmup_steps"],
        metavar="STEPS",
        help="linear warm-up steps (default: %(default)s)",
    )
    g.add_argument(
        "--warmup-frac",
        type=float,
        default=d["warmup_frac"],
        metavar="FRACTION",
        help="warm-up as a fraction of the run (of the time with --max-time); overrides --warmup",
    )
    g.add_argument(
        "--weight-decay",
        type=float,
        default=d["weight_decay"],
        help="AdamW weight decay (not on norms, biases, embeddings; default: %(default)s)",
    )
    g.add_argument(
        "--grad-clip",
        type=_clip,
        default=d["grad_clip"],
        metavar="NORM",
        help="clip the global gradient norm (0 or none: off; default: %(default)s)",
    )
    g.add_argument(
        "--label-smoothing",
        type=float,
        default=d["label_smoothing"],
        metavar="EPS",
        help="label smoothing of the cross-entropy (default: %(default)s)",
    )
    g.add_argument(
        "--amp",
        choices=AMP_MODES,
        default=d["amp"],
        help="mixed precision: bf16 autocast (default: %(default)s)",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        default=d["compile"],
        help="torch.compile the model for training",
    )
    g.add_argument(
        "--eval-every",
        type=int,
        default=d["eval_every"],
        metavar="STEPS",
        help="validate and checkpoint every STEPS steps and at the end (default: %(default)s)",
    )
    g.add_argument(
        "--eval-batches",
        type=int,
        default=d["eval_batches"],
        metavar="N",
        help="validation batches per evaluation (default: %(default)s)",
    )
    g.add_argument(
        "--log-every",
        type=int,
        default=d["log_every"],
        metavar="STEPS",
        help="steps between metrics.jsonl records (default: %(default)s)",
    )
    g.add_argument("--seed", type=int, default=d["seed"], help="random seed (default: %(default)s)")
    g.add_argument(
        "--device", default=d["device"], help="auto, cpu, cuda or cuda:N (default: %(default)s)"
    )
    g.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=d["progress"],
        help="no progress bar",
    )
    _add_parallel_args(parser, d)
    return parser


def _add_parallel_args(parser: argparse.ArgumentParser, d: dict) -> None:
    g = parser.add_argument_group(
        "several processes (under torchrun --nproc_per_node=N ...; --batch-size stays global)"
    )
    g.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=d["strategy"],
        help="ddp: each process holds the whole model, gradients are averaged; fsdp: "
        "parameters, gradients and optimizer state are sharded over the processes (FSDP2), "
        "checkpoints too (default: %(default)s)",
    )
    g.add_argument(
        "--fsdp-param-dtype",
        choices=("auto", *FSDP_DTYPES),
        default=d["fsdp_param_dtype"],
        help="fsdp: dtype the gathered parameters compute in (auto: bfloat16 with --amp bf16, "
        "else float32; the sharded master weights stay float32; default: %(default)s)",
    )
    g.add_argument(
        "--fsdp-reduce-dtype",
        choices=FSDP_DTYPES,
        default=d["fsdp_reduce_dtype"],
        help="fsdp: dtype of the gradient reduce-scatter (default: %(default)s)",
    )
    g.add_argument(
        "--fsdp-reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        default=d["fsdp_reshard_after_forward"],
        help="fsdp: free each block's gathered parameters after its forward and gather them "
        "again for the backward (ZeRO-3; --no-...: keep them, more memory, less traffic)",
    )


def train_config_from_args(args: argparse.Namespace, **overrides) -> TrainConfig:
    """The :class:`TrainConfig` of parsed flags (``overrides`` win).

    Raises:
        ValueError: for values that do not fit together (from TrainConfig's validation).
    """
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    values.update(overrides)
    return TrainConfig(**values)
