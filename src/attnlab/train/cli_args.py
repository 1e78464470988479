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
    _add_rows(g, _TRAIN_FLAGS, d)
    g = parser.add_argument_group(
        "several processes (under torchrun --nproc_per_node=N ...; --batch-size stays global)"
    )
    _add_rows(g, _PARALLEL_FLAGS, d)
    return parser


# One row a flag: (flag, TrainConfig field, type | choices | action, metavar, help). The default
# is the field's (or the family's, given to add_train_args).
# fmt: off
_TRAIN_FLAGS = (
    ("--steps", "steps", int, None,
     "optimizer steps (default: %(default)s; ignored with --max-time)"),
    ("--max-time", "max_time", float, "SECONDS",
     "train for this many wall-clock seconds instead of --steps; the learning-rate schedule fits "
     "itself to the budget"),
    ("--batch-size", "batch_size", int, None,
     "global examples per optimizer step (default: %(default)s)"),
    ("--grad-accum", "grad_accum", int, "N",
     "split each step into N micro-batches (default: %(default)s)"),
    ("--lr", "lr", float, None,
     "peak learning rate (default: %(default)s)"),
    ("--min-lr-ratio", "min_lr_ratio", float, None,
     "cosine floor as a fraction of --lr (default: %(default)s)"),
    ("--schedule", "schedule", SCHEDULES, None,
     "learning-rate schedule after warm-up (default: %(default)s)"),
    ("--warmup", "warmup_steps", int, "STEPS",
     "linear warm-up steps (default: %(default)s)"),
    ("--warmup-frac", "warmup_frac", float, "FRACTION",
     "warm-up as a fraction of the run (of the time with --max-time); overrides --warmup"),
    ("--weight-decay", "weight_decay", float, None,
     "AdamW weight decay (not on norms, biases, embeddings; default: %(default)s)"),
    ("--grad-clip", "grad_clip", _clip, "NORM",
     "clip the global gradient norm (0 or none: off; default: %(default)s)"),
    ("--label-smoothing", "label_smoothing", float, "EPS",
     "label smoothing of the cross-entropy (default: %(default)s)"),
    ("--amp", "amp", AMP_MODES, None,
     "mixed precision: bf16 autocast (default: %(default)s)"),
    ("--compile", "compile", "store_true", None,
     "torch.compile the model for training"),
    ("--eval-every", "eval_every", int, "STEPS",
     "validate and checkpoint every STEPS steps and at the end (default: %(default)s)"),
    ("--eval-batches", "eval_batches", int, "N",
     "validation batches per evaluation (default: %(default)s)"),
    ("--log-every", "log_every", int, "STEPS",
     "steps between metrics.jsonl records (default: %(default)s)"),
    ("--seed", "seed", int, None,
     "random seed (default: %(default)s)"),
    ("--device", "device", str, None,
     "auto, cpu, cuda or cuda:N (default: %(default)s)"),
    ("--no-progress", "progress", "store_false", None,
     "no progress bar"),
)
_PARALLEL_FLAGS = (
    ("--strategy", "strategy", STRATEGIES, None,
     "ddp: each process holds the whole model, gradients are averaged; fsdp: parameters, "
     "gradients and optimizer state are sharded over the processes (FSDP2), checkpoints too "
     "(default: %(default)s)"),
    ("--fsdp-param-dtype", "fsdp_param_dtype", ("auto", *FSDP_DTYPES), None,
     "fsdp: dtype the gathered parameters compute in (auto: bfloat16 with --amp bf16, else "
     "float32; the sharded master weights stay float32; default: %(default)s)"),
    ("--fsdp-reduce-dtype", "fsdp_reduce_dtype", FSDP_DTYPES, None,
     "fsdp: dtype of the gradient reduce-scatter (default: %(default)s)"),
    ("--fsdp-reshard-after-forward", "fsdp_reshard_after_forward",
     argparse.BooleanOptionalAction, None,
     "fsdp: free each block's gathered parameters after its forward and gather them again for "
     "the backward (ZeRO-3; --no-...: keep them, more memory, less traffic)"),
)
# fmt: on


def _add_rows(group, rows: tuple, d: dict) -> None:
    """Register each ``(flag, field, kind, metavar, help)`` row of a flag table on ``group``."""
    for flag, field, kind, metavar, text in rows:
        kw = {"dest": field, "default": d[field], "help": text}
        if isinstance(kind, tuple):
            kw["choices"] = kind
        elif isinstance(kind, str) or kind is argparse.BooleanOptionalAction:
            kw["action"] = kind
        elif kind is not str:
            kw["type"] = kind
        if metavar:
            kw["metavar"] = metavar
        group.add_argument(flag, **kw)


def train_config_from_args(args: argparse.Namespace, **overrides) -> TrainConfig:
    """The :class:`TrainConfig` of parsed flags (``overrides`` win).

    Raises:
        ValueError: for values that do not fit together (from TrainConfig's validation).
    """
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    values.update(overrides)
    return TrainConfig(**values)
