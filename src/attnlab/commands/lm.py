"""Language-model commands: ``attnlab train lm``, ``attnlab generate``, ``attnlab eval`` (LM
runs) and ``attnlab demo``.

The CLI only parses and prints; the work is done by :mod:`attnlab.data.corpus` (corpus, tokenizer,
task), :mod:`attnlab.models` (models), :mod:`attnlab.train` (the loop) and
:mod:`attnlab.decoding` (sampling, beam search).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from attnlab.errors import RunDirError, UserError

LM_KINDS = ("decoder_lm", "lstm_lm", "bigram_lm")
ARCHS = {"transformer": "decoder_lm", "lstm": "lstm_lm", "bigram": "bigram_lm"}


# ----------------------------------------------------------------------------------------------
# building models (library-level helpers the commands share)


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["d_model=128", "qk_norm=rmsnorm", "bias=false"]`` -> typed dict (JSON values, Python's
    True/False/None, else str)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        spelled = {"None": None, "none": None, "null": None, "True": True, "False": False}
        try:
            out[key.strip()] = spelled[value] if value in spelled else json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value  # a string; the config checks its type
    return out


def model_config(arch: str, preset: str, overrides: dict[str, Any]):
    """The config object of ``arch`` (transformer | lstm | bigram) from a preset and overrides."""
    from attnlab.config import ModelConfig
    from attnlab.models.rnn_lm import BigramConfig, LSTMConfig

    cls = {"transformer": ModelConfig, "lstm": LSTMConfig, "bigram": BigramConfig}.get(arch)
    if cls is None:
        raise UserError(f"unknown architecture {arch!r}; choose from {sorted(ARCHS)}")
    return cls.preset(preset, **overrides)  # an unknown preset raises, naming the known ones


def build_model(config):
    """The model for a config object."""
    from attnlab.config import ModelConfig
    from attnlab.models.lm import DecoderLM
    from attnlab.models.rnn_lm import LSTMLM, BigramConfig, BigramLM, LSTMConfig

    for cfg_cls, model_cls in (
        (ModelConfig, DecoderLM),
        (LSTMConfig, LSTMLM),
        (BigramConfig, BigramLM),
    ):
        if isinstance(config, cfg_cls):
            return model_cls(config)
    raise TypeError(f"not a language-model config: {type(config).__name__}")


def _lm_run_config(run_dir: str | Path, *, need_task: bool = True) -> dict:
    from attnlab.runs import read_config

    cfg = read_config(run_dir)
    if cfg["kind"] not in LM_KINDS:
        raise RunDirError(
            f"{str(run_dir)!r} holds a {cfg['kind']!r} run, not a language model "
            f"({', '.join(LM_KINDS)})"
        )
    has_task = isinstance(cfg.get("task"), dict) and cfg["task"].get("type") == "lm"
    if need_task and not has_task:  # generation needs no corpus (runs converted from HF have none)
        raise RunDirError(f"{str(run_dir)!r}: config.json has no language-modelling task")
    return cfg


def _load_lm(
    run_dir: str | Path, weights: str = "best", device: str = "cpu", *, need_task: bool = True
):
    """(model, tokenizer, config) of an LM run; ``weights`` best falls back to last."""
    from attnlab.runs import load

    cfg = _lm_run_config(run_dir, need_task=need_task)
    name = "best.safetensors" if weights == "best" else "model.safetensors"
    if not (Path(run_dir) / name).exists():
        name = "model.safetensors"
    model, tok = load(run_dir, weights=name, map_location=device)
    if tok is None:
        raise RunDirError(f"{str(run_dir)!r} has no tokenizer")
    return model, tok, cfg


def _device(name: str | None) -> str:
    """``auto`` -> cuda if available, else cpu; an unknown or absent device is a UserError."""
    from attnlab.train.distributed import resolve_device

    return str(resolve_device(name or "auto"))


# ----------------------------------------------------------------------------------------------
# attnlab train lm


def _train_lm(args: argparse.Namespace) -> int:
    import torch

    from attnlab.data.corpus import LMTask
    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.runs import _find_kind
    from attnlab.train import check_run_dir, train, train_config_from_args

    cfg = train_config_from_args(args)
    out = Path(args.out)
    check_run_dir(out, args.resume, args.overwrite)  # before reading and tokenising the corpus
    if args.resume:
        saved = _lm_run_config(out)
        _check_resume_options(args, saved)
        tokenizer = load_tokenizer(out)
        task = LMTask.from_config(saved["task"], tokenizer)
        model = _find_kind(saved["kind"]).build(saved["model"])
    else:
        overrides = _parse_overrides(args.set)
        if "vocab_size" in overrides:
            raise UserError(
                "the vocabulary size comes from the tokenizer: use --vocab-size (BPE), "
                "not --set vocab_size"
            )
        if args.seq_len is not None and overrides.get("max_seq_len", args.seq_len) != args.seq_len:
            raise UserError(
                f"--seq-len {args.seq_len} and --set max_seq_len={overrides['max_seq_len']} "
                "disagree (they are the same thing: give one)"
            )
        if args.backend is not None:
            overrides["backend"] = args.backend
        if args.checkpointing:
            overrides["activation_checkpointing"] = True
        arch, preset = args.arch or "transformer", args.preset or "tiny"
        base = model_config(arch, preset, overrides)
        seq_len = base.max_seq_len if args.seq_len is None else args.seq_len
        task = LMTask.build(
            args.data or "pydoc",
            tokenizer=args.tokenizer or "char",
            vocab_size=args.vocab_size or 512,
            seq_len=seq_len,
            seed=cfg.seed,
            max_chars=args.max_chars,
        )
        config = model_config(
            arch,
            preset,
            {**overrides, "vocab_size": task.vocab_size, "max_seq_len": seq_len},
        )
        torch.manual_seed(cfg.seed)
        model = build_model(config)
    main_rank = int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 prints
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if main_rank:
        print(
            f"model {model.kind}: {n_params / 1e6:.2f}M parameters; data {task.data!r}: "
            f"{task.config_dict()['n_tokens']['train']:,} training tokens "
            f"({task.tokenizer.type} tokenizer, vocab {task.vocab_size})",
            file=sys.stderr,
        )
    result = train(model, task, cfg, out, resume=args.resume, overwrite=args.overwrite)
    if main_rank:
        _print_result(result)
    return 0


def _check_resume_options(args: argparse.Namespace, saved: dict) -> None:
    """A resume continues the run as saved: refuse model or data options that contradict it."""
    task, kind = saved["task"], saved["kind"]
    diffs = []

    def differs(flag: str, given: Any, stored: Any) -> None:
        if given is not None and given != stored:
            diffs.append(f"{flag} {given!r} (the run has {stored!r})")

    if args.arch is not None:
        differs("--arch", ARCHS[args.arch], kind)
    if args.data is not None and Path(args.data).exists() and Path(task["data"]).exists():
        differs("--data", str(Path(args.data).resolve()), str(Path(task["data"]).resolve()))
    else:
        differs("--data", args.data, task["data"])
    differs("--tokenizer", args.tokenizer, task.get("tokenizer"))
    differs("--seq-len", args.seq_len, task["seq_len"])
    differs("--max-chars", args.max_chars, task.get("max_chars"))
    if args.preset is not None or args.set or args.backend is not None or args.checkpointing:
        overrides = _parse_overrides(args.set)
        if args.backend is not None:
            overrides["backend"] = args.backend
        if args.checkpointing:
            overrides["activation_checkpointing"] = True
        arch = {v: k for k, v in ARCHS.items()}[kind]
        fixed = {k: saved["model"][k] for k in ("vocab_size", "max_seq_len")}
        wanted = json.loads(
            json.dumps(model_config(arch, args.preset or "tiny", {**overrides, **fixed}).to_dict())
        )
        # a preset names every field; without one, only the fields set on this command line
        keys = wanted if args.preset is not None else overrides
        for key in sorted(k for k in keys if wanted[k] != saved["model"].get(k)):
            diffs.append(f"model {key}={wanted[key]!r} (the run has {saved['model'].get(key)!r})")
    if diffs:
        raise UserError(
            f"--resume continues {args.out!r} as it was configured, but "
            + "; ".join(diffs)
            + ". Drop these options, or start a new run (another --out, or --overwrite)"
        )


def _print_result(result) -> None:
    val = result.val_loss
    ppl = f" (perplexity {math.exp(val):.2f})" if val is not None and val < 50 else ""
    val_s = "n/a" if val is None else f"{val:.4f}"
    train_s = "n/a" if result.final_train_loss is None else f"{result.final_train_loss:.4f}"
    print(
        f"{result.steps} steps in {result.elapsed:.1f} s: train loss {train_s}, "
        f"val loss {val_s}{ppl}; run saved in {result.run_dir}"
    )


# ----------------------------------------------------------------------------------------------
# attnlab generate


def _encode_prompt(tok, prompt: str) -> list[int]:
    if prompt:
        return tok.encode(prompt)
    for start in ("\n", " "):
        try:
            ids = tok.encode(start)
        except UserError:
            continue
        if ids:
            return ids
    return [0]


def _generate(args: argparse.Namespace) -> int:
    import torch

    from attnlab.decoding import stream_generate

    if args.n < 0:
        raise UserError(f"-n must be >= 0, got {args.n}")
    stop_ids = None
    if args.from_hf:
        if args.run_dir:
            raise UserError("give either a run directory or --from-hf DIR, not both")
        from attnlab.interop import load_hf_lm

        model, tok = load_hf_lm(args.from_hf, device=_device(args.device))
        stop_ids = getattr(model, "hf_config", {}).get("eos_token_id")  # int, list or None
    elif args.run_dir:
        model, tok, cfg = _load_lm(
            args.run_dir, args.weights, _device(args.device), need_task=False
        )
        # a run converted from a Hugging Face checkpoint remembers its end-of-text id(s)
        stop_ids = (cfg.get("source") or {}).get("eos_token_id")
    else:
        raise UserError("give a run directory (or --from-hf DIR)")
    ids = _encode_prompt(tok, args.prompt)
    ctx = model.config.max_seq_len
    if len(ids) > ctx:
        raise UserError(
            f"the prompt is {len(ids)} tokens long but the model's context is {ctx} "
            "tokens; shorten the prompt"
        )
    gen = torch.Generator(device=next(model.parameters()).device)
    gen.manual_seed(args.seed)
    idx = torch.tensor([ids], device=next(model.parameters()).device)
    stream = not args.no_stream
    out = sys.stdout
    if stream:
        out.write(args.prompt)
        out.flush()
    new: list[int] = []
    shown = text = ""
    for nxt in stream_generate(
        model,
        idx,
        args.n,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        use_cache=not args.no_cache,
        generator=gen,
        stop=stop_ids,
    ):
        if stop_ids is not None and int(nxt[0]) in (
            [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)
        ):
            break  # end of text
        new.append(int(nxt[0]))
        text = tok.decode(new)
        stopped = bool(args.stop) and args.stop in text
        if stopped:
            text = text[: text.index(args.stop)]
        # byte-level BPE can end mid-character: wait for the rest of it before printing
        if stream and (stopped or not text.endswith("\ufffd")):
            out.write(text[len(shown) :])
            out.flush()
            shown = text
        if stopped:
            break
    out.write((text[len(shown) :] if stream else args.prompt + text) + "\n")
    out.flush()
    return 0


# ----------------------------------------------------------------------------------------------
# attnlab eval (LM kinds)


def _eval_lm(args: argparse.Namespace) -> int:
    from attnlab.data.corpus import LMTask

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_batches is not None and args.max_batches < 1:
        raise UserError(f"--max-batches must be >= 1, got {args.max_batches}")
    model, tok, cfg = _load_lm(args.run_dir, args.weights, _device(getattr(args, "device", None)))
    task = LMTask.from_config(cfg["task"], tok)
    res = task.val_loss(model, batch_size=args.batch_size, n_batches=args.max_batches)
    print(
        f"{args.run_dir}: val loss {res['loss']:.4f}, perplexity {res['perplexity']:.3f} "
        f"({res['tokens']:,} tokens of {task.data!r}, {args.weights} weights)"
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
    print()
    print(
        f"Validation loss on held-out pydoc text ({report['tokens']:,} training tokens each, "
        f"{report['tokenizer']} tokenizer):"
    )
    print(f"  {'model':<32}{'params':>10}{'val loss':>10}{'ppl':>9}{'time':>8}")
    for row in report["models"]:
        print(
            f"  {row['name']:<32}{row['params']:>10,}{row['val_loss']:>10.4f}"
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


def register(groups) -> None:
    """Add ``train lm``, ``generate``, ``demo`` and the LM evaluators."""
    from attnlab.commands import register_evaluator
    from attnlab.config import PRESETS
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "lm",
        help="train a language model (Transformer, LSTM or bigram) on a text corpus",
        description="Train a language model on a local corpus (nothing is downloaded). "
        "Examples: 'attnlab train lm --preset tiny --steps 200 --out runs/tiny'; "
        "'attnlab train lm --preset llama-mini --tokenizer bpe --max-time 300 --out runs/llama'; "
        "continue a run with '--resume --steps 400 --out runs/tiny' (model and data options "
        "are those saved in the run).",
    )
    p.add_argument(
        "--data",
        default=None,
        metavar="CORPUS",
        help="'pydoc' (CPython's help topics, default), 'stdlib' (the standard "
        "library's .py source) or a path to a text file or folder",
    )
    p.add_argument(
        "--arch",
        choices=sorted(ARCHS),
        default=None,
        help="model family: transformer (DecoderLM, default), lstm or bigram baselines",
    )
    p.add_argument(
        "--preset",
        default=None,
        help=f"size/style preset (default tiny); transformer: {', '.join(sorted(PRESETS))}; "
        "lstm: tiny, small, medium; bigram: tiny",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model config field, e.g. --set d_model=128 --set "
        "qk_norm=rmsnorm --set position=alibi (repeatable)",
    )
    p.add_argument(
        "--tokenizer",
        choices=["char", "bpe"],
        default=None,
        help="character-level (default) or byte-level BPE trained on the corpus",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="BPE vocabulary size (default 512; at least 256)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="training window = the model's context length (default: the preset's)",
    )
    p.add_argument(
        "--max-chars", type=int, default=None, help="use only the first N characters of the corpus"
    )
    p.add_argument(
        "--backend",
        default=None,
        help="attention backend: auto (default), sdpa, math, tiled, window, linear "
        "(same as --set backend=NAME; long contexts: tiled or sdpa)",
    )
    p.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing per block: recompute activations in the backward "
        "pass to save memory (same as --set activation_checkpointing=true)",
    )
    add_train_args(p, out="runs/lm", steps=1000, lr=1e-3, warmup_steps=50)
    p.set_defaults(func=_train_lm)

    g = groups["top"].add_parser(
        "generate",
        help="sample text from a trained language model (streams to stdout)",
        description="Continue a prompt with a trained LM run. Greedy with --temperature 0.",
    )
    g.add_argument(
        "run_dir", nargs="?", default=None, help="run directory written by 'attnlab train lm'"
    )
    g.add_argument(
        "--from-hf",
        metavar="DIR",
        default=None,
        help="generate with a local Hugging Face GPT-2 / Llama / Mixtral checkpoint folder "
        "instead of a run directory (stops at its end-of-text token)",
    )
    g.add_argument("--prompt", default="", help="text to continue (default: a new line)")
    g.add_argument(
        "-n",
        "--max-new-tokens",
        dest="n",
        type=int,
        default=200,
        help="tokens to generate (default 200)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="sampling temperature; 0 = greedy (default 0.8)",
    )
    g.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold (0, 1]")
    g.add_argument("--stop", default=None, help="stop when this text is generated")
    g.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    g.add_argument(
        "--weights",
        choices=["best", "last"],
        default="best",
        help="checkpoint to use (default best, falling back to last)",
    )
    g.add_argument("--no-cache", action="store_true", help="recompute the context every step")
    g.add_argument("--no-stream", action="store_true", help="print only when finished")
    g.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    g.set_defaults(func=_generate)

    d = groups["top"].add_parser(
        "demo",
        help="train a small Transformer LM on pydoc and compare it with LSTM and bigram "
        "baselines (~3-4 minutes on 2 CPU cores)",
        description="Train a small GPT-style character model on CPython's pydoc topics for a "
        "wall-clock budget, then an LSTM LM and a bigram model on the same number of tokens with "
        "the same trainer; print validation losses and a sample; write loss curves and an "
        "attention heatmap into the output directory (overwritten on re-runs).",
    )
    d.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    d.add_argument(
        "--budget",
        type=float,
        default=140.0,
        help="seconds of Transformer training (default 140); the baselines then "
        "train on the same number of tokens",
    )
    d.add_argument(
        "--steps",
        type=int,
        default=None,
        help="train every model for exactly this many steps instead of a time budget",
    )
    d.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for the Transformer (default: torch's count or 1, whichever trains "
        "faster at the start; 1 is faster on a busy machine)",
    )
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--val-batches",
        type=int,
        default=None,
        help="measure final losses on N batches of 32 windows (default: all)",
    )
    d.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.set_defaults(func=_demo)

    for kind in LM_KINDS:
        register_evaluator(kind, _eval_lm)
