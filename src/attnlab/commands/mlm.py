"""Encoder-only commands: ``attnlab train mlm``, ``attnlab fill-mask`` and ``attnlab experiment
bidirectional`` (``attnlab eval`` of encoder runs is :func:`attnlab.tasks.evaluate.evaluate_mlm`).

    attnlab train mlm --preset tiny --max-time 120 --out runs/mlm
    attnlab fill-mask runs/mlm "def f[MASK]nction(x):" --top-k 5
    attnlab experiment bidirectional --max-time 300 --out runs/bidirectional

The CLI only parses and prints; the work is done by :mod:`attnlab.tasks.mlm` (masking, loss,
``fill_mask``), :mod:`attnlab.models.encoder`, :mod:`attnlab.train` and
:mod:`attnlab.experiments.bidirectional`; settings merge as for every ``attnlab train KIND``.
"""

from __future__ import annotations

import argparse
import os
import sys

from attnlab.commands.config_args import (
    add_train_parser,
    from_args,
    resumed_config,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command, at_least_one
from attnlab.config import EncoderConfig
from attnlab.experiments.bidirectional import BidirectionalConfig, run_bidirectional
from attnlab.runs import load
from attnlab.runspec import FAMILIES
from attnlab.tasks.mlm import check_masked_text, fill_mask
from attnlab.tasks.reports import mlm_result, mlm_start
from attnlab.train.distributed import resolve_device

MLM = FAMILIES["mlm"]
#: the flags of ``train mlm`` that are settings -> ``section.key``
_FLAG_KEYS = {
    **train_flag_keys(),
    **{name: f"task.{name}" for name in MLM.task_flags},
    "preset": "model.preset",
    "backend": "model.backend",
}


def _train_mlm(args: argparse.Namespace) -> int:
    saved = resumed_config(args, MLM.kinds, "mlm", "masked-LM")  # before reading the corpus
    started = start_run(args, MLM, _FLAG_KEYS, saved, check_device=True)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 prints
        return train_started(args, started, lambda *_: None)
    return train_started(args, started, lambda s, m, t, r: mlm_result(r),
                         before=lambda s, m, t: print(mlm_start(m, t), file=sys.stderr))  # fmt: skip


def _fill_mask(args: argparse.Namespace) -> int:
    at_least_one(args, "top_k")
    check_masked_text(args.text)  # before loading the run
    device = str(resolve_device(args.device))
    model, tok = load(args.run_dir, weights=args.weights, map_location=device, kinds=MLM.kinds)
    for pred in fill_mask(model, tok, args.text, top_k=args.top_k):
        cands = "  ".join(f"{tok!r} {p:.3f}" for tok, p in pred.candidates)
        print(f"[MASK] {pred.index + 1} (token {pred.position}): {cands}")
    return 0


def _bidirectional(args: argparse.Namespace) -> int:
    cfg = from_args(BidirectionalConfig, args, progress=not args.no_progress)
    report = run_bidirectional(cfg, args.out, overwrite=args.overwrite)
    print(report["table"])
    if report.get("summary"):
        print(f"\n{report['summary']}")
    print("\n".join(f"{name}: {path}" for name, path in report["files"].items()))
    return 0


# fmt: off
def register(groups) -> None:
    """Add ``train mlm``, ``fill-mask`` and ``experiment bidirectional``."""
    add_train_parser(
        groups, "mlm", _train_mlm,
        help="train a BERT-style encoder by masked language modelling on a text corpus",
        description="Masked-LM training (BERT): 15%% of the tokens of each [CLS] ... [SEP] "
        "window are chosen, 80/10/10 replaced by [MASK] / a random token / kept, and predicted "
        "from both sides. Examples: 'attnlab train mlm --preset tiny --max-time 120 --out "
        "runs/mlm'; 'attnlab train mlm --config runs/mlm/config.json --set d_model=128 --out "
        "runs/wider'.",
        train={"out": "runs/mlm", "steps": 1000, "lr": 1e-3, "warmup_steps": 100},
        sections=[(None, [
            ("--data", None, None,
             "'pydoc' (default), 'stdlib' or a path to a text file or folder",
             {"metavar": "CORPUS"}),
            ("--preset", None, None,
             f"size/style preset (default tiny): {', '.join(EncoderConfig.presets())}"),
            ("--tokenizer", ["char", "bpe"], None, "char (default) or bpe"),
            ("--vocab-size", int, None, "BPE vocabulary size before the specials"),
            ("--seq-len", int, None,
             "tokens per example, [CLS] and [SEP] included = the model's context"),
            ("--max-chars", int, None, "use only the first N characters"),
            ("--mask-prob", float, None, "fraction of tokens predicted (0.15)"),
            ("--backend", None, None, "attention backend (auto, sdpa, math, ...)"),
        ])],
    )
    add_command(
        groups["top"], "fill-mask", func=_fill_mask,
        help="predict the [MASK] tokens of a text with a masked-LM run",
        description="Print, for every [MASK] in the text, the most probable tokens and their "
        "probabilities under an encoder trained with 'attnlab train mlm'.",
        flags=[
            ("run_dir", None, None, "run directory written by 'attnlab train mlm'"),
            ("text", None, None, 'text with one or more [MASK], e.g. "def f[MASK]nction"'),
            ("--top-k", int, 5, "candidates per mask (default 5)"),
            ("--weights", ["best", "last"], "best", "checkpoint (default best)"),
            ("--device", None, "cpu", "cpu (default), cuda or auto"),
        ],
    )
    add_command(
        groups["experiment"], "bidirectional", func=_bidirectional,
        help="masked characters inside words: an encoder (both sides) vs a causal LM (left side)",
        description="Train an MLM encoder and a decoder-only LM of equal size for the same "
        "number of steps on the same corpus, then predict the same held-out characters inside "
        "words: the encoder sees the word's both sides, the LM only its left side. Writes "
        "table.md, results.json and bidirectional.png.",
        flags=[
            ("--out", None, "runs/bidirectional", "output directory"),
            ("--max-time", float, 300.0, "seconds for both models together (300)"),
            ("--steps", int, None, "train each model N steps instead"),
            ("--data", None, "pydoc", "corpus (default pydoc)"),
            ("--max-chars", int, None, "first N characters only"),
            ("--seq-len", int, 32, "context of both models (32)"),
            ("--d-model", int, 64, "width of both models (64)"),
            ("--n-layers", int, 2, "blocks of both models (2)"),
            ("--n-heads", int, 4, "heads of both models (4)"),
            ("--batch-size", int, 32, "examples per step (32)"),
            ("--mask-prob", float, 0.15, "encoder's masking rate (BERT: 0.15)"),
            ("--n-eval", int, 10_000, "held-out characters scored (10000)"),
            ("--device", None, "auto", "auto (default), cpu or cuda"),
            ("--seed", int, 0, None),
            ("--threads", int, None, "CPU threads (default torch's; 1 on a busy machine)"),
            ("--overwrite", "store_true", None, "replace the results in --out"),
            ("--no-progress", "store_true", None, "no progress bars"),
        ],
    )
# fmt: on
