"""Command-line sub-commands, one module per family (lm, translate, vision, ...), and
``experiments`` for the lecture's claims measured across families.

Each module exposes ``register(groups)`` where ``groups`` holds the argparse sub-parser
collections ``"top"`` (``attnlab <verb>``), ``"train"`` (``attnlab train <task>``) and
``"experiment"`` (``attnlab experiment <name>``). Every parser sets ``func(args) -> int``.

``attnlab eval RUN_DIR`` is shared: every family of :data:`attnlab.runspec.FAMILIES` with an
evaluator in :data:`attnlab.tasks.evaluate.EVALUATORS` is evaluated by it; another family
registers its own for its model kinds with :func:`register_evaluator`.
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
#: where ``attnlab eval`` puts a family's model (the others: the CPU)
_EVAL_DEVICE = {"lm": "auto"}


def register_evaluator(kind: str, fn: Callable[[argparse.Namespace], int]) -> None:
    """``attnlab eval`` on a run of model ``kind`` calls ``fn(args)``."""
    EVALUATORS[kind] = fn


def family_evaluator(family: str) -> Callable[[argparse.Namespace], int]:
    """``attnlab eval`` for a family of :data:`~attnlab.runspec.FAMILIES`: its run loaded, scored
    by :data:`attnlab.tasks.evaluate.EVALUATORS`, the lines printed."""

    def run(args: argparse.Namespace) -> int:
        device = str(resolve_device(_EVAL_DEVICE.get(family, "cpu")))
        kinds = FAMILIES[family].kinds

        def load():
            return runs.load(args.run_dir, weights=args.weights, map_location=device, kinds=kinds)

        lines = TASK_EVALUATORS[family](
            load, batch_size=args.batch_size, max_batches=args.max_batches
        )
        print("\n".join(lines))
        return 0

    return run


for _name in TASK_EVALUATORS:
    for _kind in FAMILIES[_name].kinds:
        register_evaluator(_kind, family_evaluator(_name))


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
    if kind not in EVALUATORS:
        raise RunDirError(f"no evaluator for model kind {kind!r}; known: {sorted(EVALUATORS)}")
    return EVALUATORS[kind](args)
