"""Language-model commands: ``attnlab train lm``, ``attnlab generate``, ``attnlab eval`` (LM runs)
and ``attnlab demo``.

The CLI only parses and prints; the work is done by :mod:`attnlab.tasks.lm` (corpus, tokenizer,
batches, loss), :mod:`attnlab.models` (models), :mod:`attnlab.train` (the loop) and
:mod:`attnlab.runs` (loading runs).

How ``attnlab train lm`` merges ``--config``, ``--set`` and its flags, and the budget rule, are
:func:`attnlab.runs.resolve` and :func:`attnlab.runs.build_run` (:mod:`attnlab.runspec`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from attnlab.commands.config_args import explicit_dests, resolve_spec, train_flag_keys
from attnlab.commands.flags import add_flags
from attnlab.commands.lm_speculative import (
    check_speculative_flags,
    load_draft,
    report_speculation,
    speculative_settings,
)
from attnlab.decoding.text import beam_text, encode_prompt, stop_list, stream_sample
from attnlab.errors import RunDirError, UserError
from attnlab.runspec import FAMILIES
from attnlab.runspec.lm_xl import xl_task

LM = FAMILIES["lm"]
LM_KINDS = LM.kinds
#: the flags of ``train lm`` that are settings -> ``section.key``
_FLAG_KEYS = {
    **train_flag_keys(),
    **{
        name: f"task.{name}" for name in ("data", "tokenizer", "vocab_size", "seq_len", "max_chars")
    },
    "preset": "model.preset",
    "backend": "model.backend",
    "checkpointing": "model.activation_checkpointing",
}


def _device(name: str | None) -> str:
    """``auto`` -> cuda if available, else cpu; an unknown or absent device is a UserError."""
    from attnlab.train.distributed import resolve_device

    return str(resolve_device(name or "auto"))


# ----------------------------------------------------------------------------------------------
# attnlab train lm


def _train_lm(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import resumed_config
    from attnlab.runs import build_run
    from attnlab.train import train
    from attnlab.train.distributed import resolve_device
    from attnlab.train.stopping import completion

    out = Path(args.out)
    saved = resumed_config(args, LM.kinds, "lm", "language-model")  # before reading the corpus
    kind = LM.kind_names[args.arch] if "arch" in explicit_dests(args) else None
    spec = resolve_spec(args, LM, _FLAG_KEYS, saved, kind=kind)
    done = completion(out, spec.train) if saved is not None else None
    if done:  # before the corpus is read
        print(done)
        return 0
    resolve_device(spec.train.device)  # a bad --device: one line, before the corpus
    model, task = build_run(spec)  # the budget rule chooses when no model is named
    main_rank = int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 prints
    if main_rank and spec.choice is not None:
        print(spec.describe_choice(), file=sys.stderr)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if main_rank:
        skipped = (task.prepared.manifest["skipped"] if task.prepared else {}).items()
        skipped_s = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in skipped if n)
        print(
            f"model {model.kind}: {n_params / 1e6:.2f}M parameters; data {task.data!r}: "
            f"{task.n_tokens['train']:,} training tokens "
            f"({task.tokenizer.type} tokenizer, vocab {task.vocab_size})"
            + (f"; files skipped: {skipped_s}" if skipped_s else ""),
            file=sys.stderr,
        )
    result = train(model, task, spec.train, out, resume=args.resume, overwrite=args.overwrite)
    if main_rank:
        _print_result(result, spec.train.eval_batches)
    return 0


def _print_result(result, eval_batches: int) -> None:
    val = result.val_loss
    ppl = f" (perplexity {math.exp(val):.2f})" if val is not None and val < 50 else ""
    val_s = "n/a" if val is None else f"{val:.4f}"
    train_s = "n/a" if result.final_train_loss is None else f"{result.final_train_loss:.4f}"
    print(
        f"{result.steps} steps in {result.elapsed:.1f} s: train loss {train_s}, "
        f"val loss {val_s}{ppl} on {eval_batches} validation batch{'' if eval_batches == 1 else 'es'} ('attnlab eval' "
        f"reads the whole split); run saved in {result.run_dir}"
    )


# ----------------------------------------------------------------------------------------------
# attnlab generate


def _check_sampling(args: argparse.Namespace) -> None:
    """The sampling options, in the command line's words, before anything is loaded or printed
    (the library checks them too, but only once the prompt is already on the screen)."""
    if args.temperature is not None and not args.temperature >= 0:
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1] (1 = off), got {args.top_p}")


def _generate(args: argparse.Namespace) -> int:
    import torch

    if args.n < 0:
        raise UserError(f"-n must be >= 0, got {args.n}")
    _check_sampling(args)
    if args.beam is not None:
        sampling = [
            flag
            for flag, value in (
                ("--temperature", args.temperature),
                ("--top-k", args.top_k),
                ("--top-p", args.top_p),
            )
            if value is not None
        ]
        if sampling:
            raise UserError(
                "--beam searches for the most probable continuation and takes no sampling "
                f"options ({', '.join(sampling)}): drop them or --beam"
            )
        if args.beam < 1:
            raise UserError(f"--beam must be >= 1, got {args.beam}")
        if args.no_cache:
            raise UserError("--beam decodes with the model's cache; drop --no-cache")
    if args.compile and args.no_cache:
        raise UserError("--compile decodes over the KV cache; drop --no-cache")
    if args.compile and args.beam is not None:
        raise UserError("--compile is for sampling and greedy decoding; drop it or --beam")
    check_speculative_flags(args)
    if args.from_hf:
        if args.run_dir:
            raise UserError("give either a run directory or --from-hf DIR, not both")
        from attnlab.interop import load_hf_lm
        from attnlab.runs import resolve_dtype

        dtype = resolve_dtype(args.dtype, args.quantize)
        model, tok = load_hf_lm(args.from_hf, device=_device(args.device), dtype=dtype)
        if args.quantize == "int8":
            from attnlab.fast.quant import quantize_int8

            quantize_int8(model)
        stop_ids = getattr(model, "hf_config", {}).get("eos_token_id")  # int, list or None
    elif args.run_dir:
        loaded = load_lm(
            args.run_dir,
            args.weights,
            _device(args.device),
            dtype=args.dtype,
            quantize=args.quantize,
        )
        model, tok = loaded
        # a run converted from a Hugging Face checkpoint remembers its end-of-text id(s)
        stop_ids = (loaded.config.get("source") or {}).get("eos_token_id")
    else:
        raise UserError("give a run directory (or --from-hf DIR)")
    ids = encode_prompt(tok, args.prompt)
    ctx = model.config.max_seq_len
    if len(ids) > ctx:
        raise UserError(
            f"the prompt is {len(ids)} tokens long but the model's context is {ctx} "
            "tokens; shorten the prompt"
        )
    idx = torch.tensor([ids], device=next(model.parameters()).device)
    if args.dtype or args.quantize or args.compile:  # the fast paths, on request only
        from attnlab.fast import for_decoding  # (the dtype and int8 were applied by the loader)

        model = for_decoding(model)  # --compile: generate's compiled static-cache step
    args.draft_model = load_draft(args, model, tok, load_lm) if args.draft else None
    if args.beam is not None:
        text = beam_text(model, tok, idx, args, stop_list(stop_ids))
        sys.stdout.write(args.prompt + text + "\n")
        sys.stdout.flush()
        return 0
    spec = speculative_settings(args)  # {} unless --draft or --prompt-lookup
    stream_sample(model, tok, idx, args, stop_list(stop_ids), **spec)
    if spec:
        report_speculation(spec["stats"])
    return 0


# ----------------------------------------------------------------------------------------------
# attnlab eval (LM kinds)


def load_lm(
    run_dir: str | Path,
    weights: str = "best",
    device: str = "cpu",
    *,
    dtype: str | None = None,
    quantize: str | None = None,
) -> Any:
    """Load an LM run through :func:`attnlab.runs.load` (``weights`` best falls back to last).

    Raises:
        RunDirError: not an LM run, damaged, or without a tokenizer.
    """
    from attnlab.runs import load

    loaded = load(
        run_dir,
        weights=weights,
        map_location=device,
        dtype=dtype,
        quantize=quantize,
        kinds=LM_KINDS,
    )
    if loaded.tokenizer is None:
        raise RunDirError(
            f"{str(run_dir)!r} has no tokenizer.json, so text cannot be turned into tokens (a run "
            "converted from a Hugging Face folder without one); copy the checkpoint's "
            "tokenizer.json into it"
        )
    return loaded


def _eval_lm(args: argparse.Namespace) -> int:
    from attnlab.tasks.lm import LMTask

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_batches is not None and args.max_batches < 1:
        raise UserError(f"--max-batches must be >= 1, got {args.max_batches}")
    loaded = load_lm(args.run_dir, args.weights, _device(getattr(args, "device", None)))
    if loaded.task.get("type") != "lm":
        raise RunDirError(
            f"{str(args.run_dir)!r}: config.json has no language-modelling task, so there is no "
            "held-out split to evaluate (a run converted from a Hugging Face folder that attnlab "
            "did not export)"
        )
    task = xl_task(loaded.kind, LMTask.from_config(loaded.task, loaded.tokenizer))
    res = task.val_loss(loaded.model, batch_size=args.batch_size, n_batches=args.max_batches)
    print(
        f"{args.run_dir}: val loss {res['loss']:.4f}, perplexity {res['perplexity']:.3f} "
        f"({res['tokens']:,} tokens of {task.data!r}: "
        f"{'the whole validation split' if args.max_batches is None else f'{args.max_batches} batches'}"
        f"; {loaded.checkpoint})"
    )
    return 0


# ----------------------------------------------------------------------------------------------
# attnlab demo


def _demo(args: argparse.Namespace) -> int:
    from attnlab.demo import run_demo

    t0 = time.time()
    report = run_demo(
        args.out,
        budget=args.budget,
        steps=args.steps,
        seed=args.seed,
        device=_device(args.device),
        progress=not args.no_progress,
        val_batches=args.val_batches,
        threads=args.threads,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    same = (
        f"{report['budget']:.0f} s of training each"
        if report["budget"] is not None
        else f"{report['models'][0]['steps']} steps each"
    )
    print()
    print(
        f"Validation loss of the final models on the whole held-out pydoc split (the plot's "
        f"stars; its circles read 4 batches during training); {same}, the same batches of "
        f"{report['batch_size']} windows of {report['seq_len']} characters "
        f"({report['tokenizer']} tokenizer):"
    )
    print(f"  {'model':<32}{'params':>10}{'tokens':>12}{'val loss':>10}{'ppl':>9}{'time':>8}")
    for row in report["models"]:
        print(
            f"  {row['name']:<32}{row['params']:>10,}{row['tokens']:>12,}{row['val_loss']:>10.4f}"
            f"{math.exp(row['val_loss']):>9.2f}{row['time']:>7.0f}s"
        )
    print()
    print(f"Sample (temperature {report['temperature']}):")
    print(report["sample"])
    print()
    for name, path in report["files"].items():
        print(f"{name}: {path}")
    print(f"demo finished in {time.time() - t0:.0f} s")
    return 0


# ----------------------------------------------------------------------------------------------
# parsers


def _add_train_lm_parser(groups) -> None:
    from attnlab.commands.config_args import add_config_args, track_explicit
    from attnlab.config import PRESETS
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "lm",
        help="train a language model (Transformer, Transformer-XL, LSTM or bigram) on a text corpus",
        description="Train a language model on a local corpus (nothing is downloaded). "
        "Without a preset or model keys a Transformer's size, window, batch size, learning rate "
        "and warm-up come from the budget rule (the budget, the corpus size and this machine's "
        "measured speed; flags you give are kept; the choice is printed). "
        "Examples: 'attnlab train lm --max-time 90 --out runs/auto'; "
        "'attnlab train lm --preset tiny --steps 200 --out runs/tiny'; "
        "'attnlab train lm --preset llama-mini --tokenizer bpe --max-time 300 --out runs/llama'; "
        "'attnlab train lm --config runs/tiny/config.json --set d_model=128 --out runs/wider'; "
        "continue a run with '--resume --steps 400 --out runs/tiny' (model and data settings "
        "are those saved in the run).",
    )
    # fmt: off
    add_flags(p, [
        ("--data", None, None,
         "'pydoc' (CPython's help topics, default), 'stdlib' (the "
         "standard library's .py source), a text file or folder (prepared on the fly into the "
         "cache, streaming), or a directory written by 'attnlab prepare' (= --set task.data=...)",
         {"metavar": "CORPUS"}),
        ("--arch", sorted(LM.kind_names), None,
         "model family: transformer (DecoderLM, default), transformer-xl (segments with memory, "
         "read as contiguous streams; --seq-len is the segment, --set mem_len=M the memory), "
         "lstm or bigram baselines"),
        ("--preset", None, None,
         "size/style preset (default: a Transformer chosen by the budget rule; the "
         f"baselines' tiny); transformer: {', '.join(sorted(PRESETS))}; "
         "lstm: tiny, small, medium; bigram: tiny; transformer-xl: tiny, mini "
         "(= --set model.preset=NAME)"),
        ("--tokenizer", ["char", "bpe"], None,
         "character-level (default) or byte-level BPE trained on the corpus"),
        ("--vocab-size", int, None, "BPE vocabulary size (default 512; at least 256)"),
        ("--seq-len", int, None,
         "training window = the model's context length (default: the preset's, or the budget "
         "rule's; transformer-xl: the segment, its max_seq_len = seq-len + mem_len)"),
        ("--max-chars", int, None, "use only the first N characters of the corpus"),
        ("--backend", None, None,
         "attention backend: auto (default), sdpa, math, tiled, window, linear (same as --set "
         "backend=NAME; long contexts: tiled or sdpa)"),
        ("--checkpointing", "store_const", None,
         "activation checkpointing per block: recompute activations in the "
         "backward pass to save memory (same as --set activation_checkpointing=true)",
         {"const": True}),
    ])
    # fmt: on
    add_train_args(p, out="runs/lm", steps=1000, lr=1e-3, warmup_steps=50)
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_train_lm)


def _add_generate_parser(groups) -> None:
    g = groups["top"].add_parser(
        "generate",
        help="sample text from a trained language model (streams to stdout)",
        description="Continue a prompt with a trained LM run: sampling (greedy with "
        "--temperature 0), or beam search with --beam N (the most probable continuation found "
        "by N beams; --beam 1 is greedy).",
    )
    # fmt: off
    add_flags(g, [
        ("run_dir", None, None, "run directory written by 'attnlab train lm'", {"nargs": "?"}),
        ("--from-hf", None, None,
         "generate with a local Hugging Face GPT-2 / Llama / Mixtral "
         "checkpoint folder instead of a run directory (stops at its end-of-text token)",
         {"metavar": "DIR"}),
        ("--prompt", None, "", "text to continue (default: a new line)"),
    ])
    # fmt: on
    g.add_argument(
        "-n",
        "--max-new-tokens",
        dest="n",
        type=int,
        default=200,
        help="tokens to generate (default 200)",
    )
    # fmt: off
    add_flags(g, [
        ("--temperature", float, None, "sampling temperature; 0 = greedy (default 0.8)"),
        ("--top-k", int, None, "sample among the k likeliest tokens"),
        ("--top-p", float, None, "nucleus sampling threshold (0, 1]"),
        ("--beam", int, None,
         "beam search with N beams instead of sampling; prints the best beam "
         "(the prompt and the new tokens must fit in the context)", {"metavar": "N"}),
        ("--stop", None, None, "stop when this text is generated"),
        ("--seed", int, 0, "random seed for sampling (default 0)"),
        ("--weights", ["best", "last"], "best",
         "checkpoint to use (default best, falling back to last)"),
        ("--dtype", ["float32", "bfloat16"], None,
         "parameter and activation dtype (default float32; bfloat16 with --quantize): bfloat16 "
         "halves the bytes read per token, about 2x faster batch-1 decoding on a CPU"),
        ("--quantize", ["int8"], None,
         "weight-only int8 linear layers (per-channel scales, output head included): a quarter "
         "of fp32's bytes; logits within about 1-4 %% of fp32's"),
        ("--compile", "store_true", None,
         "decode over a static KV cache with a torch.compile'd step (CUDA graphs on a GPU); the "
         "first run compiles for tens of seconds on a CPU, so it pays for long outputs"),
        ("--draft", None, None,
         "speculative decoding: a smaller LM run with the same tokenizer drafts tokens that "
         "the model checks several at a time (greedy output equals plain greedy decoding; "
         "sampling keeps the model's distribution exactly)", {"metavar": "DRAFT_RUN"}),
        ("--speculate", int, None,
         "the most tokens drafted per round (default 5); each round drafts 0..K, chosen from "
         "the recent acceptance rate unless --no-adapt", {"metavar": "K"}),
        ("--prompt-lookup", int, None,
         "speculative decoding without a draft model: propose the tokens that followed the "
         "latest earlier occurrence of the last n-gram (n = N..1) of the context",
         {"metavar": "N"}),
        ("--no-adapt", "store_true", None, "draft exactly K tokens every round"),
        ("--draft-dtype", ["float32", "bfloat16"], None,
         "the draft's dtype (without it and --draft-quantize: the model's --dtype/--quantize)"),
        ("--draft-quantize", ["int8"], None, "quantise the draft's linear layers to int8"),
        ("--no-cache", "store_true", None, "recompute the context every step"),
        ("--no-stream", "store_true", None, "print only when finished"),
        ("--device", None, "cpu", "cpu (default), cuda, or auto"),
    ])
    # fmt: on
    g.set_defaults(func=_generate)


def _add_demo_parser(groups) -> None:
    from attnlab.demo import DEFAULT_BUDGET

    d = groups["top"].add_parser(
        "demo",
        help="train a small Transformer LM on pydoc and compare it with LSTM and bigram "
        "baselines, 60 s each (about 4 minutes in all on 2 CPU cores)",
        description="Train a small GPT-style character model on CPython's pydoc topics for a "
        "wall-clock budget (its size, window, batch, learning rate and warm-up chosen for the "
        "budget and this machine's measured speed by the rule of 'attnlab train lm' without a "
        "model), then an LSTM LM and a bigram model for the same wall-clock on the same "
        "batches with the same trainer (3 x 60 s by default, about 4 minutes in all with the "
        "evaluation); print validation losses beside the tokens each model reached, and a "
        "sample; write loss curves and an attention heatmap into the output directory "
        "(overwritten on re-runs).",
    )
    # fmt: off
    add_flags(d, [
        ("--out", None, "runs/demo", "output directory (default runs/demo)"),
        ("--budget", float, DEFAULT_BUDGET,
         "seconds of training for each of the three models, validation included (default "
         "%(default)g)", {"metavar": "SECONDS"}),
        ("--steps", int, None,
         "train every model for exactly this many steps (the same tokens) instead of a time "
         "budget"),
        ("--threads", int, None,
         "CPU threads for the Transformer (default: torch's count or 1, whichever trains faster "
         "at the start; 1 is faster on a busy machine)"),
        ("--seed", int, 0, None),
        ("--val-batches", int, None,
         "measure final losses on N batches of 32 windows (default: all)"),
        ("--device", None, "auto", "auto (default), cpu or cuda"),
        ("--no-progress", "store_true", None, "no progress bars"),
    ])
    # fmt: on
    d.set_defaults(func=_demo)


def register(groups) -> None:
    """Add ``train lm``, ``prepare``, ``generate``, ``demo`` and the LM evaluators."""
    from attnlab.commands import register_evaluator
    from attnlab.commands.lm_prepare import register_prepare

    _add_train_lm_parser(groups)
    register_prepare(groups)
    _add_generate_parser(groups)
    _add_demo_parser(groups)
    for kind in LM_KINDS:
        register_evaluator(kind, _eval_lm)
