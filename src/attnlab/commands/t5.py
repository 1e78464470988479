"""T5 commands: ``attnlab train t5-span`` and ``attnlab fill-spans`` (``attnlab eval`` of span
runs is :func:`attnlab.tasks.evaluate.evaluate_span`).

    attnlab train t5-span --preset tiny --max-time 120 --out runs/t5
    attnlab fill-spans runs/t5 "def <extra_id_0>(self, x):" --beam 4
    attnlab eval runs/t5

(T5 for translation is ``attnlab train translate --arch t5``.) The CLI only parses and prints;
the work is done by :mod:`attnlab.tasks.t5_span` (span corruption, loss, ``fill_spans``),
:mod:`attnlab.models.t5`, :mod:`attnlab.runspec` (the ``t5-span`` family) and
:mod:`attnlab.train`.
"""

from __future__ import annotations

import argparse
import sys

from attnlab.commands.config_args import (
    add_train_parser,
    resumed_config,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command, at_least_one
from attnlab.config.t5 import T5Config
from attnlab.runs import load
from attnlab.runspec import FAMILIES
from attnlab.tasks.reports import span_result, span_start
from attnlab.tasks.t5_span import fill_spans
from attnlab.train.distributed import resolve_device

SPAN = FAMILIES["t5-span"]
#: the flags of ``train t5-span`` that are settings -> ``section.key``
_FLAG_KEYS = {
    **train_flag_keys(),
    **{name: f"task.{name}" for name in SPAN.task_flags},
    "preset": "model.preset",
}


def _train_span(args: argparse.Namespace) -> int:
    saved = resumed_config(args, SPAN.kinds, "t5-span", "span-corruption")  # before the corpus
    started = start_run(args, SPAN, _FLAG_KEYS, saved, check_device=True)
    return train_started(args, started, lambda s, m, t, r: span_result(r),
                         before=lambda s, m, t: print(span_start(m, t), file=sys.stderr))  # fmt: skip


def _fill_spans(args: argparse.Namespace) -> int:
    at_least_one(args, "beam", "max_len")
    device = str(resolve_device(args.device))
    model, tok = load(args.run_dir, weights=args.weights, map_location=device, kinds=SPAN.kinds)
    print(fill_spans(model, tok, args.text, beam=args.beam, max_len=args.max_len))
    return 0


# fmt: off
def register(groups) -> None:
    """Add ``train t5-span`` and ``fill-spans``."""
    add_train_parser(
        groups, "t5-span", _train_span,
        help="pre-train T5 by span corruption on a text corpus",
        description="T5's span corruption: about 15%% of each window's tokens, in spans of mean "
        "length 3, become sentinels <extra_id_i> in the input; the decoder writes each sentinel "
        "and the tokens it hides. Example: 'attnlab train t5-span --preset tiny --max-time 120 "
        "--out runs/t5'. For translation: 'attnlab train translate --arch t5'.",
        train={"out": "runs/t5", "steps": 1000, "lr": 1e-3, "warmup_steps": 100},
        sections=[(None, [
            ("--data", None, None,
             "'pydoc' (default), 'stdlib' or a path to a text file or folder",
             {"metavar": "CORPUS"}),
            ("--preset", None, None,
             f"size/layout preset (default tiny): {', '.join(T5Config.presets())}"),
            ("--tokenizer", ["char", "bpe"], None, "char (default) or bpe"),
            ("--vocab-size", int, None, "BPE vocabulary size before the specials"),
            ("--seq-len", int, None, "tokens per window before corruption"),
            ("--max-chars", int, None, "use only the first N characters"),
            ("--noise-density", float, None, "fraction of tokens corrupted (0.15)"),
            ("--mean-span-length", float, None, "mean corrupted span length (3)"),
        ])],
    )
    add_command(
        groups["top"], "fill-spans", func=_fill_spans,
        help="fill the <extra_id_i> spans of a text with a t5-span run",
        description="Print what a model trained with 'attnlab train t5-span' writes for the "
        "sentinels of the text (beam search): '<extra_id_0> span <extra_id_1> span ...'.",
        flags=[
            ("run_dir", None, None, "run directory written by 'attnlab train t5-span'"),
            ("text", None, None, 'text with sentinels, e.g. "def <extra_id_0>(x):"'),
            ("--beam", int, 4, "beam width (default 4; 1 = greedy)"),
            ("--max-len", int, 64, "most output tokens (default 64)"),
            ("--weights", ["best", "last"], "best", "checkpoint (default best)"),
            ("--device", None, "cpu", "cpu (default), cuda or auto"),
        ],
    )
# fmt: on
