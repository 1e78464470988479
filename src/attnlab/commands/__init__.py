"""Command-line sub-commands, one module per family (lm, translate, vision, ...), and
``experiments`` for the lecture's claims measured across families.

Each module exposes ``register(groups)`` where ``groups`` holds the argparse sub-parser
collections ``"top"`` (``attnlab <verb>``), ``"train"`` (``attnlab train <task>``) and
``"experiment"`` (``attnlab experiment <name>``). Every parser sets ``func(args) -> int``.

``attnlab eval RUN_DIR`` is shared: a family registers an evaluator for its model kinds with
:func:`register_evaluator`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from attnlab.errors import RunDirError

EVALUATORS: dict[str, Callable[[argparse.Namespace], int]] = {}


def register_evaluator(kind: str, fn: Callable[[argparse.Namespace], int]) -> None:
    """``attnlab eval`` on a run of model ``kind`` calls ``fn(args)``."""
    EVALUATORS[kind] = fn


def add_eval_parser(top) -> None:
    p = top.add_parser(
        "eval",
        help="evaluate a trained run on its held-out split",
        description="Evaluate a run directory: loss/perplexity for language models, "
        "accuracy for classifiers, exact match/BLEU for translation.",
    )
    p.add_argument("run_dir", help="run directory written by 'attnlab train'")
    p.add_argument(
        "--weights",
        choices=["last", "best"],
        default="best",
        help="which checkpoint to evaluate (default: best, falling back to last)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="examples per batch (default 32)")
    p.add_argument(
        "--max-batches", type=int, default=None, help="evaluate only the first N batches"
    )
    p.set_defaults(func=_run_eval)


def _run_eval(args: argparse.Namespace) -> int:
    from attnlab.runs import read_config

    kind = read_config(args.run_dir)["kind"]
    if kind not in EVALUATORS:
        raise RunDirError(f"no evaluator for model kind {kind!r}; known: {sorted(EVALUATORS)}")
    return EVALUATORS[kind](args)
