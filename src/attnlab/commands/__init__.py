"""Command-line sub-commands, one module per family (lm, translate, vision, ...), and
``experiments`` for the lecture's claims measured across families.

Each module exposes ``register(groups)`` where ``groups`` holds the argparse sub-parser
collections ``"top"`` (``attnlab <verb>``), ``"train"`` (``attnlab train <task>``) and
``"experiment"`` (``attnlab experiment <name>``). Every parser sets ``func(args) -> int``.

``attnlab eval RUN_DIR`` is shared: a run of a family of :data:`attnlab.runspec.FAMILIES` is
loaded and scored by its evaluator in :data:`attnlab.tasks.evaluate.EVALUATORS`; another family
registers one for its model kinds with :func:`register_evaluator`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from attnlab import runs
from attnlab.commands.flags import add_command
from attnlab.errors import RunDirError
from attnlab.runspec import FAMILIES
from attnlab.tasks.evaluate import EVALUATORS as TASK_EVALUATORS
from attnlab.train.distributed import resolve_device

EVALUATORS: dict[str, Callable[[argparse.Namespace], int]] = {}
#: model kind -> its family, for the families with an evaluator in tasks/evaluate.py
_FAMILY_OF = {kind: name for name in TASK_EVALUATORS for kind in FAMILIES[name].kinds}


def register_evaluator(kind: str, fn: Callable[[argparse.Namespace], int]) -> None:
    """``attnlab eval`` on a run of model ``kind`` calls ``fn(args)``."""
    EVALUATORS[kind] = fn


def add_eval_parser(top) -> None:
    # fmt: off
    add_command(top, "eval", func=_run_eval, help="evaluate a trained run on its held-out split",
        description="Evaluate a run directory: loss/perplexity for language models, "
        "accuracy for classifiers, exact match/BLEU for translation.", flags=[
        ("run_dir", None, None, "run directory written by 'attnlab train'"),
        ("--weights", ["last", "best"], "best",
         "which checkpoint to evaluate (default: best, falling back to last)"),
        ("--batch-size", int, 32, "examples per batch (default 32)"),
        ("--max-batches", int, None, "evaluate only the first N batches"),
    ])
    # fmt: on


def _run_eval(args: argparse.Namespace) -> int:
    kind = runs.read_config(args.run_dir)["kind"]
    if kind in EVALUATORS:
        return EVALUATORS[kind](args)
    if kind not in _FAMILY_OF:
        known = sorted({*EVALUATORS, *_FAMILY_OF})
        raise RunDirError(f"no evaluator for model kind {kind!r}; known: {known}")
    family = _FAMILY_OF[kind]
    device = str(resolve_device("auto" if family == "lm" else "cpu"))  # (an LM: a GPU if any)

    def load():
        return runs.load(args.run_dir, weights=args.weights, map_location=device, kinds=(kind,))

    evaluate = TASK_EVALUATORS[family]
    print("\n".join(evaluate(load, batch_size=args.batch_size, max_batches=args.max_batches)))
    return 0
