"""T5 commands: ``attnlab train t5-span``, ``attnlab fill-spans`` and ``attnlab eval`` (span runs).

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
from pathlib import Path

from attnlab.commands import register_evaluator
from attnlab.commands.config_args import (
    add_config_args,
    resolve_spec,
    resumed_config,
    track_explicit,
    train_flag_keys,
)
from attnlab.commands.flags import add_command, add_flags, at_least_one
from attnlab.config.t5 import T5Config
from attnlab.errors import RunDirError, UserError
from attnlab.runs import build_run, load
from attnlab.runspec import FAMILIES
from attnlab.tasks.t5_span import SpanCorruptionTask, fill_spans
from attnlab.train import add_train_args, train
from attnlab.train.distributed import resolve_device
from attnlab.train.stopping import completion

SPAN = FAMILIES["t5-span"]
KIND = "t5_span"
#: the flags of ``train t5-span`` that are settings -> ``section.key``
_FLAG_KEYS = {
    **train_flag_keys(),
    **{name: f"task.{name}" for name in SPAN.task_flags},
    "preset": "model.preset",
}


def _train_span(args: argparse.Namespace) -> int:
    out = Path(args.out)
    saved = resumed_config(args, SPAN.kinds, "t5-span", "span-corruption")  # before the corpus
    spec = resolve_spec(args, SPAN, _FLAG_KEYS, saved)
    done = completion(out, spec.train) if saved is not None else None
    if done:
        print(done)
        return 0
    resolve_device(spec.train.device)  # a bad --device: one line, before the corpus
    model, task = build_run(spec)
    n = sum(p.numel() for p in model.parameters())
    c = task.config
    print(
        f"model t5 ({n / 1e6:.2f}M parameters); data {task.data!r}: {task.n_tokens['train']:,} "
        f"training tokens, vocab {task.vocab_size} with <pad> </s> and {c.n_sentinels} "
        f"sentinels; {c.n_noise} of {c.seq_len} tokens corrupted in {c.n_spans} spans",
        file=sys.stderr,
    )
    result = train(model, task, spec.train, out, resume=args.resume, overwrite=args.overwrite)
    last = next((r for r in reversed(result.history) if "val_acc" in r), {})
    acc = f", target accuracy {last['val_acc']:.1%}" if last.get("val_acc") is not None else ""
    val = "n/a" if result.val_loss is None else f"{result.val_loss:.4f}"
    print(
        f"{result.steps} steps in {result.elapsed:.1f} s: val loss {val}{acc}; run saved in "
        f"{result.run_dir}"
    )
    return 0


def _load(run_dir: str, weights: str, device: str):
    return load(run_dir, weights=weights, map_location=str(resolve_device(device)), kinds=(KIND,))


def _fill_spans(args: argparse.Namespace) -> int:
    at_least_one(args, "beam", "max_len")
    run = _load(args.run_dir, args.weights, args.device)
    print(fill_spans(run.model, run.tokenizer, args.text, beam=args.beam, max_len=args.max_len))
    return 0


def _eval_span(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    run = _load(args.run_dir, args.weights, getattr(args, "device", None) or "cpu")
    if run.task.get("type") != "t5-span":
        raise RunDirError(f"{str(args.run_dir)!r}: config.json has no span-corruption task")
    task = SpanCorruptionTask.from_config(run.task, run.tokenizer)
    res = task.val_metrics(run.model, batch_size=args.batch_size, n_batches=args.max_batches)
    print(
        f"{args.run_dir}: val loss {res['loss']:.4f}, target-token accuracy {res['acc']:.1%} "
        f"({res['predicted']:,} target tokens of {task.data!r}, {args.weights} weights)"
    )
    return 0


def register(groups) -> None:
    """Add ``train t5-span``, ``fill-spans`` and the span runs' evaluator."""
    p = groups["train"].add_parser(
        "t5-span",
        help="pre-train T5 by span corruption on a text corpus",
        description="T5's span corruption: about 15%% of each window's tokens, in spans of mean "
        "length 3, become sentinels <extra_id_i> in the input; the decoder writes each sentinel "
        "and the tokens it hides. Example: 'attnlab train t5-span --preset tiny --max-time 120 "
        "--out runs/t5'. For translation: 'attnlab train translate --arch t5'.",
    )
    # fmt: off
    add_flags(p, [
        ("--data", None, None,
         "'pydoc' (default), 'stdlib' or a path to a text file or folder", {"metavar": "CORPUS"}),
        ("--preset", None, None, f"size/layout preset (default tiny): {', '.join(T5Config.presets())}"),
        ("--tokenizer", ["char", "bpe"], None, "char (default) or bpe"),
        ("--vocab-size", int, None, "BPE vocabulary size before the specials"),
        ("--seq-len", int, None, "tokens per window before corruption"),
        ("--max-chars", int, None, "use only the first N characters"),
        ("--noise-density", float, None, "fraction of tokens corrupted (0.15)"),
        ("--mean-span-length", float, None, "mean corrupted span length (3)"),
    ])
    # fmt: on
    add_train_args(p, out="runs/t5", steps=1000, lr=1e-3, warmup_steps=100)
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_train_span)
    add_command(
        groups["top"],
        "fill-spans",
        help="fill the <extra_id_i> spans of a text with a t5-span run",
        description="Print what a model trained with 'attnlab train t5-span' writes for the "
        "sentinels of the text (beam search): '<extra_id_0> span <extra_id_1> span ...'.",
        func=_fill_spans,
        flags=[
            ("run_dir", None, None, "run directory written by 'attnlab train t5-span'"),
            ("text", None, None, 'text with sentinels, e.g. "def <extra_id_0>(x):"'),
            ("--beam", int, 4, "beam width (default 4; 1 = greedy)"),
            ("--max-len", int, 64, "most output tokens (default 64)"),
            ("--weights", ["best", "last"], "best", "checkpoint (default best)"),
            ("--device", None, "cpu", "cpu (default), cuda or auto"),
        ],
    )
    register_evaluator(KIND, _eval_span)
