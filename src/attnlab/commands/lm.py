"""Language-model commands: ``attnlab train lm``, ``attnlab prepare``, ``attnlab generate`` and
``attnlab demo`` (``attnlab eval`` of LM runs is :func:`attnlab.tasks.evaluate.evaluate_lm`).

    attnlab prepare --data books/ notes.txt --tokenizer bpe --vocab-size 8192 --out prep/books
    attnlab train lm --data prep/books --preset gpt2-mini --out runs/books

The CLI only parses and prints; the work is done by :mod:`attnlab.tasks.lm` (corpus, tokenizer,
batches, loss), :mod:`attnlab.data.prepare` (sharded corpora), :mod:`attnlab.models` (models),
:mod:`attnlab.train` (the loop),
:mod:`attnlab.decoding.flags` (generation) and :mod:`attnlab.runs` (loading runs).

How ``attnlab train lm`` merges ``--config``, ``--set`` and its flags, and the budget rule, are
:func:`attnlab.runs.resolve` and :func:`attnlab.runs.build_run` (:mod:`attnlab.runspec`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from attnlab.commands.config_args import (
    add_train_parser,
    explicit_dests,
    resumed_config,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command, pick
from attnlab.config import PRESETS
from attnlab.data.prepare import BPE_SAMPLE_CHARS, SHARD_TOKENS, prepare_corpus
from attnlab.decoding.flags import (
    SAMPLING_FLAGS,
    SPEED_FLAGS,
    check_generate_flags,
    generate_from_flags,
)
from attnlab.demo import DEFAULT_BUDGET, format_report, run_demo
from attnlab.errors import UserError
from attnlab.fast.quant import quantize_int8
from attnlab.interop import load_hf_lm
from attnlab.runs import load, resolve_dtype
from attnlab.runspec import FAMILIES
from attnlab.tasks.evaluate import require_tokenizer
from attnlab.tasks.reports import lm_result, lm_start
from attnlab.train.distributed import resolve_device

LM = FAMILIES["lm"]
LM_KINDS = LM.kinds
#: the flags of ``train lm`` that are settings -> ``section.key``
_FLAG_KEYS = {
    **train_flag_keys(),
    **{name: f"task.{name}" for name in LM.task_flags},
    "preset": "model.preset",
    "backend": "model.backend",
    "checkpointing": "model.activation_checkpointing",
}


def _device(name: str | None) -> str:
    """``auto`` -> cuda if available, else cpu; an unknown or absent device is a UserError."""
    return str(resolve_device(name or "auto"))


def _train_lm(args: argparse.Namespace) -> int:
    saved = resumed_config(args, LM.kinds, "lm", "language-model")  # before reading the corpus
    kind = LM.kind_names[args.arch] if "arch" in explicit_dests(args) else None
    started = start_run(args, LM, _FLAG_KEYS, saved, kind=kind, check_device=True)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 prints
        return train_started(args, started, lambda *_: None)

    def describe(spec, model, task) -> None:
        if spec.choice is not None:  # what the budget rule chose
            print(spec.describe_choice(), file=sys.stderr)
        print(lm_start(model, task), file=sys.stderr)

    return train_started(args, started, lambda s, m, t, r: lm_result(r, s.train.eval_batches),
                         before=describe)  # fmt: skip


def load_lm(run_dir: str | Path, weights: str = "best", device: str = "cpu", **options: Any) -> Any:
    """An LM run with its tokenizer, by :func:`attnlab.runs.load` (``options``: ``dtype``,
    ``quantize``); RunDirError for another kind, a damaged run, or one without a tokenizer."""
    run = load(run_dir, weights=weights, map_location=device, kinds=LM_KINDS, **options)
    return require_tokenizer(run)


def _generate(args: argparse.Namespace) -> int:
    check_generate_flags(args)
    if args.from_hf:
        if args.run_dir:
            raise UserError("give either a run directory or --from-hf DIR, not both")
        dtype = resolve_dtype(args.dtype, args.quantize)
        model, tok = load_hf_lm(args.from_hf, device=_device(args.device), dtype=dtype)
        if args.quantize == "int8":
            quantize_int8(model)
        stop_ids = getattr(model, "hf_config", {}).get("eos_token_id")  # int, list or None
    elif args.run_dir:
        device = _device(args.device)
        loaded = load_lm(args.run_dir, args.weights, device, **pick(args, "dtype", "quantize"))
        model, tok = loaded
        # a run converted from a Hugging Face checkpoint remembers its end-of-text id(s)
        stop_ids = (loaded.config.get("source") or {}).get("eos_token_id")
    else:
        raise UserError("give a run directory (or --from-hf DIR)")
    generate_from_flags(model, tok, args, stop_ids, load_lm)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    sizes = pick(args, "vocab_size", "max_chars", "sample_chars", "shard_tokens")
    for name, value in sizes.items():
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")
    summary = prepare_corpus(args.data, args.out, kind=args.tokenizer, **sizes,
                             **pick(args, "seed", "workers", "overwrite"),
                             progress=not args.no_progress)  # fmt: skip
    if summary.was_complete:
        print("already prepared (use --overwrite to prepare again)", file=sys.stderr)
    elif summary.resumed:
        print(f"resumed: {summary.resumed} document(s) were already done", file=sys.stderr)
    print(summary.describe())
    return 0


def _demo(args: argparse.Namespace) -> int:
    t0 = time.time()
    report = run_demo(
        args.out,
        **pick(args, "budget", "steps", "seed", "val_batches", "threads"),
        device=_device(args.device),
        progress=not args.no_progress,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    print(format_report(report, time.time() - t0))
    return 0


# fmt: off
def register(groups) -> None:
    """Add ``train lm``, ``prepare``, ``generate``, ``demo`` (their evaluator is shared)."""
    add_train_parser(
        groups, "lm", _train_lm,
        help="train a language model (Transformer, Transformer-XL, LSTM or bigram) on a text corpus",
        description="Train a language model on a local corpus (nothing is downloaded). "
        "Without a preset or model keys a Transformer's size, window, batch size, learning rate, "
        "warm-up and optimizer (Muon for the small rows' matrices) come from the budget rule "
        "(the budget, the corpus size and this machine's measured speed; flags you give are "
        "kept; the choice is printed; its smallest row has a token shift, '--set "
        "model.token_shift=false' keeps the choice without it). "
        "Examples: 'attnlab train lm --max-time 90 --out runs/auto'; "
        "'attnlab train lm --preset tiny --steps 200 --out runs/tiny'; "
        "'attnlab train lm --preset llama-mini --tokenizer bpe --max-time 300 --out runs/llama'; "
        "'attnlab train lm --config runs/tiny/config.json --set d_model=128 --out runs/wider'; "
        "continue a run with '--resume --steps 400 --out runs/tiny' (model and data settings "
        "are those saved in the run).",
        train={"out": "runs/lm", "steps": 1000, "lr": 1e-3, "warmup_steps": 50},
        sections=[(None, [
            ("--data", None, None,
             "'pydoc' (CPython's help topics, default), 'stdlib' (the "
             "standard library's .py source), a text file or folder (prepared on the fly into "
             "the cache, streaming), or a directory written by 'attnlab prepare' (= --set "
             "task.data=...)", {"metavar": "CORPUS"}),
            ("--arch", sorted(LM.kind_names), None,
             "model family: transformer (DecoderLM, default), transformer-xl (segments with "
             "memory, read as contiguous streams; --seq-len is the segment, --set mem_len=M the "
             "memory), lstm, conv (causal dilated convolutions) or bigram baselines"),
            ("--preset", None, None,
             "size/style preset (default: a Transformer chosen by the budget rule; the "
             f"baselines' tiny); transformer: {', '.join(sorted(PRESETS))}; "
             "lstm: tiny, small, medium; conv: tiny, small; bigram: tiny; transformer-xl: tiny, "
             "mini "
             "(= --set model.preset=NAME)"),
            ("--tokenizer", ["char", "bpe"], None,
             "character-level (default) or byte-level BPE trained on the corpus"),
            ("--vocab-size", int, None, "BPE vocabulary size (default 512; at least 256)"),
            ("--seq-len", int, None,
             "training window = the model's context length (default: the preset's, or the "
             "budget rule's; transformer-xl: the segment, its max_seq_len = seq-len + mem_len)"),
            ("--max-chars", int, None, "use only the first N characters of the corpus"),
            ("--backend", None, None,
             "attention backend: auto (default), sdpa, math, tiled, window, linear (same as "
             "--set backend=NAME; long contexts: tiled or sdpa)"),
            ("--checkpointing", "store_const", None,
             "activation checkpointing per block: recompute activations in the "
             "backward pass to save memory (same as --set activation_checkpointing=true)",
             {"const": True}),
        ])],
    )
    add_command(groups["top"], "prepare", func=_prepare,
        help="tokenize a corpus of any size into shards for 'attnlab train lm --data DIR'",
        description="Read a corpus (built-in names 'pydoc'/'stdlib', files, folders) as a "
        "stream, train a tokenizer (char: the corpus's characters; bpe: on a seeded sample) and "
        "append the token ids to shard files in --out, in memory that does not grow with the "
        "corpus. Binary, non-UTF-8 and empty files are skipped and counted. Interrupted, the "
        "same command resumes after the documents already done.", flags=[
        ("--data", None, None, "corpus sources",
         {"nargs": "+", "required": True, "metavar": "PATH"}),
        ("--out", None, None, "directory to write (or to resume)", {"required": True}),
        ("--tokenizer", ["char", "bpe"], "char", None),
        ("--vocab-size", int, 512, "BPE vocabulary (default 512)"),
        ("--max-chars", int, None, "use the first N characters only"),
        ("--sample-chars", int, BPE_SAMPLE_CHARS,
         f"characters BPE is trained on, sampled at random (default {BPE_SAMPLE_CHARS:,})"),
        ("--seed", int, 0, "seeds the BPE sample (default 0)"),
        ("--workers", int, -1, "BPE encoding processes (default: one per CPU core; 0: none)"),
        ("--shard-tokens", int, SHARD_TOKENS,
         f"close a shard at the first file end after N tokens (default {SHARD_TOKENS:,})"),
        ("--overwrite", "store_true", None, "start again instead of resuming"),
        ("--no-progress", "store_true", None, "no progress bars"),
    ])
    add_command(
        groups["top"], "generate", func=_generate,
        help="sample text from a trained language model (streams to stdout)",
        description="Continue a prompt with a trained LM run: sampling (greedy with "
        "--temperature 0), or beam search with --beam N (the most probable continuation found "
        "by N beams; --beam 1 is greedy).",
        flags=[
            ("run_dir", None, None, "run directory written by 'attnlab train lm'", {"nargs": "?"}),
            ("--from-hf", None, None,
             "generate with a local Hugging Face GPT-2 / Llama / Mixtral "
             "checkpoint folder instead of a run directory (stops at its end-of-text token)",
             {"metavar": "DIR"}),
            ("--prompt", None, "", "text to continue (default: a new line)"),
            (("-n", "--max-new-tokens"), int, 200, "tokens to generate (default 200)",
             {"dest": "n"}),
            *SAMPLING_FLAGS,
            ("--weights", ["best", "last"], "best",
             "checkpoint to use (default best, falling back to last)"),
            *SPEED_FLAGS,
            ("--device", None, "cpu", "cpu (default), cuda, or auto"),
        ],
    )
    add_command(
        groups["top"], "demo", func=_demo,
        help="train a small Transformer LM on pydoc and compare it with LSTM and bigram "
        "baselines, 45 s each, then at equal tokens (about 3 minutes in all on 2 CPU cores)",
        description="Train a small GPT-style character model on CPython's pydoc topics for a "
        "wall-clock budget (its size, window, batch, learning rate and warm-up chosen for the "
        "budget and this machine's measured speed by the rule of 'attnlab train lm' without a "
        "model), then an LSTM LM and a bigram model for the same wall-clock on the same "
        "batches with the same trainer (3 x 45 s by default); train each model that read more "
        "than the fewest tokens any model reached again for exactly that many (about 3 minutes "
        "in all); print validation losses on the whole held-out split beside the tokens each "
        "model reached and at equal tokens, and a sample; write loss curves and an attention "
        "heatmap into the output directory (overwritten on re-runs).",
        flags=[
            ("--out", None, "runs/demo", "output directory (default runs/demo)"),
            ("--budget", float, DEFAULT_BUDGET,
             "seconds of training for each of the three models, validation included (default "
             "%(default)g)", {"metavar": "SECONDS"}),
            ("--steps", int, None,
             "train every model for exactly this many steps (the same tokens) instead of a "
             "time budget"),
            ("--threads", int, None,
             "CPU threads for the Transformer (default: torch's count or 1, whichever trains "
             "faster at the start; 1 is faster on a busy machine)"),
            ("--seed", int, 0, None),
            ("--val-batches", int, None,
             "measure final losses on N batches of 32 windows (default: all)"),
            ("--device", None, "auto", "auto (default), cpu or cuda"),
            ("--no-progress", "store_true", None, "no progress bars"),
        ],
    )
# fmt: on
