"""Encoder-only commands: ``attnlab train mlm``, ``attnlab fill-mask``, ``attnlab eval`` (encoder
runs) and ``attnlab experiment bidirectional``.

    attnlab train mlm --preset tiny --max-time 120 --out runs/mlm
    attnlab fill-mask runs/mlm "def f[MASK]nction(x):" --top-k 5
    attnlab experiment bidirectional --max-time 300 --out runs/bidirectional

The CLI only parses and prints; the work is done by :mod:`attnlab.tasks.mlm` (masking, loss,
``fill_mask``), :mod:`attnlab.models.encoder`, :mod:`attnlab.train` and
:mod:`attnlab.experiments.bidirectional`. Settings merge as for every ``attnlab train KIND``
(:func:`attnlab.runs.resolve`): defaults < ``--config FILE`` < typed flags < ``--set``; the
model section starts from a preset (``tiny`` unless one is named), its vocabulary size comes from
the tokenizer (plus the four specials) and its ``max_seq_len`` is ``task.seq_len``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from attnlab.commands.config_args import resolve_spec, train_flag_keys
from attnlab.commands.flags import add_flags, at_least_one
from attnlab.errors import RunDirError, UserError
from attnlab.runspec import FAMILIES

MLM = FAMILIES["mlm"]
KIND = "encoder_mlm"
#: the flags of ``train mlm`` that are settings -> ``section.key``
_FLAG_KEYS = {
    **train_flag_keys(),
    **{name: f"task.{name}" for name in MLM.task_flags},
    "preset": "model.preset",
    "backend": "model.backend",
}


def _train_mlm(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import resumed_config
    from attnlab.runs import build_run
    from attnlab.train import train
    from attnlab.train.distributed import resolve_device
    from attnlab.train.stopping import completion

    out = Path(args.out)
    saved = resumed_config(args, MLM.kinds, "mlm", "masked-LM")  # before reading the corpus
    spec = resolve_spec(args, MLM, _FLAG_KEYS, saved)
    done = completion(out, spec.train) if saved is not None else None
    if done:  # before the corpus is read
        print(done)
        return 0
    resolve_device(spec.train.device)  # a bad --device: one line, before the corpus
    model, task = build_run(spec)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    if main_rank:
        print(
            f"model {KIND}: {model.num_parameters() / 1e6:.2f}M parameters; data {task.data!r}: "
            f"{task.n_tokens['train']:,} training tokens ({task.tokenizer.type} tokenizer, "
            f"vocab {task.vocab_size} with [PAD] [CLS] [SEP] [MASK])",
            file=sys.stderr,
        )
    result = train(model, task, spec.train, out, resume=args.resume, overwrite=args.overwrite)
    if main_rank:
        last = next((r for r in reversed(result.history) if "val_acc" in r), {})
        acc = f", masked accuracy {last['val_acc']:.1%}" if last.get("val_acc") is not None else ""
        val = "n/a" if result.val_loss is None else f"{result.val_loss:.4f}"
        print(
            f"{result.steps} steps in {result.elapsed:.1f} s: val loss {val}{acc}; run saved in "
            f"{result.run_dir}"
        )
    return 0


def _load_encoder(run_dir: str, weights: str, device: str) -> Any:
    from attnlab.runs import load
    from attnlab.train.distributed import resolve_device

    return load(run_dir, weights=weights, map_location=str(resolve_device(device)), kinds=(KIND,))


def _fill_mask(args: argparse.Namespace) -> int:
    from attnlab.tasks.mlm import check_masked_text, fill_mask

    at_least_one(args, "top_k")
    check_masked_text(args.text)  # before loading the run
    loaded = _load_encoder(args.run_dir, args.weights, args.device)
    for pred in fill_mask(loaded.model, loaded.tokenizer, args.text, top_k=args.top_k):
        cands = "  ".join(f"{tok!r} {p:.3f}" for tok, p in pred.candidates)
        print(f"[MASK] {pred.index + 1} (token {pred.position}): {cands}")
    return 0


def _eval_mlm(args: argparse.Namespace) -> int:
    from attnlab.tasks.mlm import MLMTask

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    loaded = _load_encoder(args.run_dir, args.weights, getattr(args, "device", None) or "cpu")
    if loaded.task.get("type") != "mlm":
        raise RunDirError(f"{str(args.run_dir)!r}: config.json has no masked-LM task")
    task = MLMTask.from_config(loaded.task, loaded.tokenizer)
    res = task.val_metrics(loaded.model, batch_size=args.batch_size, n_batches=args.max_batches)
    print(
        f"{args.run_dir}: val loss {res['loss']:.4f}, masked-token accuracy {res['acc']:.1%} "
        f"({res['predicted']:,} predicted tokens of {task.data!r}, {args.weights} weights)"
    )
    return 0


def _bidirectional(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments.bidirectional import BidirectionalConfig, run_bidirectional

    cfg = from_args(BidirectionalConfig, args, progress=not args.no_progress)
    report = run_bidirectional(cfg, args.out, overwrite=args.overwrite)
    print(report["table"])
    if report.get("summary"):
        print(f"\n{report['summary']}")
    for name, path in report["files"].items():
        print(f"{name}: {path}")
    return 0


# ----------------------------------------------------------------------------------------------
# parsers


def _add_train_parser(groups) -> None:
    from attnlab.commands.config_args import add_config_args, track_explicit
    from attnlab.config import EncoderConfig
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "mlm",
        help="train a BERT-style encoder by masked language modelling on a text corpus",
        description="Masked-LM training (BERT): 15%% of the tokens of each [CLS] ... [SEP] "
        "window are chosen, 80/10/10 replaced by [MASK] / a random token / kept, and predicted "
        "from both sides. Examples: 'attnlab train mlm --preset tiny --max-time 120 --out "
        "runs/mlm'; 'attnlab train mlm --config runs/mlm/config.json --set d_model=128 --out "
        "runs/wider'.",
    )
    # fmt: off
    add_flags(p, [
        ("--data", None, None,
         "'pydoc' (default), 'stdlib' or a path to a text file or folder", {"metavar": "CORPUS"}),
        ("--preset", None, None,
         f"size/style preset (default tiny): {', '.join(EncoderConfig.presets())}"),
        ("--tokenizer", ["char", "bpe"], None, "char (default) or bpe"),
        ("--vocab-size", int, None, "BPE vocabulary size before the specials"),
        ("--seq-len", int, None,
         "tokens per example, [CLS] and [SEP] included = the model's context"),
        ("--max-chars", int, None, "use only the first N characters"),
        ("--mask-prob", float, None, "fraction of tokens predicted (0.15)"),
        ("--backend", None, None, "attention backend (auto, sdpa, math, ...)"),
    ])
    # fmt: on
    add_train_args(p, out="runs/mlm", steps=1000, lr=1e-3, warmup_steps=100)
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_train_mlm)


def _add_fill_mask_parser(groups) -> None:
    p = groups["top"].add_parser(
        "fill-mask",
        help="predict the [MASK] tokens of a text with a masked-LM run",
        description="Print, for every [MASK] in the text, the most probable tokens and their "
        "probabilities under an encoder trained with 'attnlab train mlm'.",
    )
    # fmt: off
    add_flags(p, [
        ("run_dir", None, None, "run directory written by 'attnlab train mlm'"),
        ("text", None, None, 'text with one or more [MASK], e.g. "def f[MASK]nction"'),
        ("--top-k", int, 5, "candidates per mask (default 5)"),
        ("--weights", ["best", "last"], "best", "checkpoint (default best)"),
        ("--device", None, "cpu", "cpu (default), cuda or auto"),
    ])
    # fmt: on
    p.set_defaults(func=_fill_mask)


def _add_experiment_parser(groups) -> None:
    e = groups["experiment"].add_parser(
        "bidirectional",
        help="masked characters inside words: an encoder (both sides) vs a causal LM (left side)",
        description="Train an MLM encoder and a decoder-only LM of equal size for the same "
        "number of steps on the same corpus, then predict the same held-out characters inside "
        "words: the encoder sees the word's both sides, the LM only its left side. Writes "
        "table.md, results.json and bidirectional.png.",
    )
    # fmt: off
    add_flags(e, [
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
        ("--n-eval", int, 2000, "held-out characters scored (2000)"),
        ("--device", None, "auto", "auto (default), cpu or cuda"),
        ("--seed", int, 0, None),
        ("--threads", int, None, "CPU threads (default torch's; 1 on a busy machine)"),
        ("--overwrite", "store_true", None, "replace the results in --out"),
        ("--no-progress", "store_true", None, "no progress bars"),
    ])
    # fmt: on
    e.set_defaults(func=_bidirectional)


def register(groups) -> None:
    """Add ``train mlm``, ``fill-mask``, ``experiment bidirectional`` and the encoder evaluator."""
    from attnlab.commands import register_evaluator

    _add_train_parser(groups)
    _add_fill_mask_parser(groups)
    _add_experiment_parser(groups)
    register_evaluator(KIND, _eval_mlm)
