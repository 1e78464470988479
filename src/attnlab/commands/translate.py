"""``attnlab train translate``, ``attnlab translate``, ``attnlab experiment bottleneck``, and eval.

    attnlab train translate --task numbers --lang de --model transformer --out runs/de \
        --max-time 300
    attnlab train translate --config runs/de/config.json --set train.lr=3e-4 --out runs/de2
    attnlab translate runs/de "twenty one" --beam 4 --attention align.png
    attnlab translate runs/de --file sentences.txt
    attnlab eval runs/de
    attnlab experiment bottleneck --max-time 120
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.commands.config_args import resolve_spec, train_flag_keys
from attnlab.commands.flags import add_command, add_flags, at_least_one
from attnlab.errors import UserError
from attnlab.runspec import FAMILIES
from attnlab.runspec.translation import MODEL_KINDS


def register(groups) -> None:
    """Add the translation sub-commands to ``groups`` (see attnlab.commands)."""
    from attnlab.commands import register_evaluator
    from attnlab.commands.config_args import add_config_args, track_explicit
    from attnlab.train import add_train_args

    p = groups["train"].add_parser(
        "translate",
        help="train a translation model (RNN, RNN + attention, Transformer, T5)",
        description="Train an encoder-decoder on generated numbers/dates or a TSV parallel file. "
        "Defaults: transformer = label smoothing 0.1, inverse-square-root schedule with warm-up, "
        "Adam betas (0.9, 0.98); RNNs = cosine schedule, no smoothing.",
    )
    d = p.add_argument_group("data (a --resume reuses the run's data; these may only repeat it)")
    # fmt: off
    add_flags(d, [
        ("--task", ["numbers", "dates", "tsv"], None,
         "numbers (default): English number words -> --lang words; dates: human-written dates -> "
         "ISO; tsv: your own source<TAB>target file (--data)"),
        ("--lang", None, None, "numbers: target language (it, fr, de, ...; default it)"),
        ("--low", int, None, "numbers: smallest number (default 0)"),
        ("--high", int, None, "numbers: largest number; controls source length (default 999999)"),
        ("--n-examples", int, None, "numbers/dates: pairs to generate (default 20000)"),
        ("--data", None, None, "tsv: path of the parallel file"),
        ("--src-level", ["word", "char", "bpe"], None,
         "source vocabulary level (default per task: numbers word, dates char, tsv word)"),
        ("--tgt-level", ["word", "char", "bpe"], None,
         "target vocabulary level (default per task: numbers bpe, dates char, tsv word)"),
        ("--bpe-vocab", int, None, "BPE vocabulary size (default 200)"),
        ("--max-len", int, None, "drop pairs longer than this many tokens (default 64)"),
        ("--keep-case", "store_false", None,
         "do not lower-case the text", {"default": None, "dest": "lowercase"}),
    ])
    # fmt: on
    m = p.add_argument_group("model (a --resume reuses the run's model)")
    # fmt: off
    add_flags(m, [
        ("--model", MODEL_KINDS, None, "model kind (default transformer)"),
        ("--arch", MODEL_KINDS, None, "the same as --model", {"dest": "model"}),
        ("--preset", None, None,
         "model size preset (transformer: tiny, small, vaswani, vaswani-big; t5: tiny, "
         "tiny-v1_1, small, t5-small, t5-base, t5-v1_1-small, t5-v1_1-base; rnn: tiny, small, "
         "base; default: small)"),
        ("--cell", ["gru", "lstm"], None, "RNN cell (default gru)"),
        ("--norm-position", ["pre", "post"], None,
         "transformer: post-norm (paper, default) or pre-norm"),
        ("--position", ["sinusoidal", "learned", "rope", "none"], None,
         "transformer: positions (default sinusoidal)"),
    ])
    # fmt: on
    add_train_args(
        p,
        steps=2000,
        batch_size=64,
        lr=1e-3,
        warmup=200,
        eval_every=250,
        label_smoothing=None,
        schedule=None,
    )
    add_config_args(p)
    track_explicit(p)
    p.set_defaults(func=_run_train)

    # fmt: off
    add_command(
        groups["top"],
        "translate",
        help="translate sentences with a trained run",
        description="Translate sentences (arguments or --file, one per line) with a run made by "
        "'attnlab train translate'; print one translation per line.",
        func=_run_translate,
        flags=[
            ("run_dir", None, None, "run directory"),
            ("text", None, None, "sentence(s) to translate", {"nargs": "*"}),
            ("--file", None, None, "translate every non-empty line of this file ('-' = stdin)"),
            ("--beam", int, 1, "beam width (1 = greedy; default 1)"),
            ("--alpha", float, 0.6,
             "length penalty exponent for beam search (default 0.6; 0 = none)"),
            ("--attention", None, None,
             "write the alignment heatmap of the (single) sentence to PNG "
             "(transformer: head average of --layer, plus PNG-stem.layerN.png per layer)",
             {"metavar": "PNG"}),
            ("--layer", int, -1, "transformer: layer for --attention"),
            ("--weights", ["best", "last"], "best", None),
            ("--allow-unk", "store_true", None,
             "translate sentences with unknown words instead of refusing"),
            ("--batch-size", int, 64, None),
            ("--scores", "store_true", None, "print the score after each line"),
        ],
    )
    add_command(
        groups["experiment"],
        "bottleneck",
        help="fixed-context RNN vs RNN + attention vs Transformer by source length",
        description="Train rnn, rnn-attn and transformer on the numbers task with the same "
        "budget; report exact match and BLEU by source length (table + plot).",
        func=_run_bottleneck,
        flags=[
            ("--out", None, "runs/bottleneck", "output directory"),
            ("--lang", None, "it", None),
            ("--high", int, 10**15 - 1,
             "largest number (sets the longest source: 29 words for the default 10^15 - 1)"),
            ("--rnn-preset", None, "tiny", "size of both RNNs (default tiny)"),
            ("--transformer-preset", None, "tiny", None),
            ("--n-examples", int, 30_000, None),
            ("--max-time", float, None, "seconds of training per model (default: use --steps)"),
            ("--steps", int, 1500, "steps per model (default 1500)"),
            ("--batch-size", int, 64, None),
            ("--device", None, "auto", None),
            ("--seed", int, 0, None),
            ("--overwrite", "store_true", None, None),
            ("--no-progress", "store_false", None, None, {"dest": "progress"}),
        ],
    )
    # fmt: on

    for kind in MODEL_KINDS:
        register_evaluator(kind, _run_eval)


# ----------------------------------------------------------------------------------------------


# flag dest -> "section.key" (see attnlab.commands.config_args); --model is the kind
_FLAG_KEYS = {
    **train_flag_keys(),
    "task": "task.task",
    "lang": "task.lang",
    "low": "task.low",
    "high": "task.high",
    "n_examples": "task.n_examples",
    "data": "task.path",
    "src_level": "task.src_level",
    "tgt_level": "task.tgt_level",
    "bpe_vocab": "task.bpe_vocab_size",
    "max_len": "task.max_len",
    "lowercase": "task.lowercase",
    "preset": "model.preset",
    "cell": "model.cell",
    "norm_position": "model.norm_position",
    "position": "model.position",
}


def _run_train(args: argparse.Namespace) -> int:
    from attnlab.runs import build_run, read_config
    from attnlab.train import check_run_dir, train
    from attnlab.train.stopping import completion

    check_run_dir(args.out, args.resume, args.overwrite)  # before generating the data
    saved = read_config(args.out) if args.resume else None
    spec = resolve_spec(args, FAMILIES["translate"], _FLAG_KEYS, saved, kind=args.model)
    done = completion(args.out, spec.train) if args.resume else None
    if done:  # before the data is generated
        print(done)
        return 0
    model, task = build_run(spec)
    data = task.data
    result = train(model, task, spec.train, args.out, resume=args.resume, overwrite=args.overwrite)
    last = result.history[-1] if result.history else {}
    extra = "".join(f", {k} {last[k]:.3f}" for k in ("val_exact", "val_bleu") if k in last)
    val = "n/a" if result.val_loss is None else f"{result.val_loss:.3f}"
    print(
        f"trained {spec.kind} ({sum(p.numel() for p in model.parameters()):,} parameters) "
        f"for {result.steps} steps in {result.elapsed:.0f}s: train loss "
        f"{result.final_train_loss:.3f}, val loss {val}{extra}"
    )
    print(
        f"run saved in {result.run_dir}; try: attnlab translate {result.run_dir} "
        f'"{data.splits["test"][0][0]}"'
    )
    return 0


def _load(run_dir: str, weights: str):
    from attnlab import runs

    return runs.load(run_dir, weights=weights, kinds=MODEL_KINDS)


def _read_inputs(args: argparse.Namespace) -> list[str]:
    texts = list(args.text)
    if args.file:
        if args.file == "-":
            lines = sys.stdin.read().splitlines()
        else:
            path = Path(args.file)
            if not path.exists():
                raise UserError(f"{path}: no such file")
            if not path.is_file():
                raise UserError(f"{path}: not a file (expected one sentence per line)")
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                raise UserError(f"{path}: not valid UTF-8 text") from None
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise UserError("nothing to translate: give a sentence or --file")
    return texts


def _run_translate(args: argparse.Namespace) -> int:
    from attnlab.data.translation.vocab import UnknownTokens
    from attnlab.metrics.translation import translate_texts

    at_least_one(args, "beam", "batch_size")
    texts = _read_inputs(args)
    if args.attention and len(texts) != 1:
        raise UserError(f"--attention draws one sentence; got {len(texts)}")
    model, vocabs = _load(args.run_dir, args.weights)
    if args.attention:  # refuse before printing anything
        if model.kind == "rnn":
            raise UserError(
                "model kind 'rnn' has no attention to draw (the fixed-context rnn sees only "
                "the final encoder state); use rnn-attn or transformer"
            )
        L = getattr(model.config, "n_dec_layers", 1)
        if not -L <= args.layer < L:
            raise UserError(f"--layer {args.layer} out of range for {L} decoder layer(s)")
    try:
        res = translate_texts(
            model,
            vocabs,
            texts,
            beam=args.beam,
            alpha=args.alpha,
            batch_size=args.batch_size,
            need_weights=bool(args.attention),
            strict=not args.allow_unk,
        )
    except UnknownTokens as err:
        raise UserError(_unknown_hint(err, vocabs.src)) from None
    for r in res:
        print(f"{r.text}\t{r.score:.3f}" if args.scores else r.text)
    if args.attention:
        from attnlab.viz.alignment import plot_alignment

        written = plot_alignment(res[0], args.attention, layer=args.layer)
        more = f" (+ {len(written) - 1} per-layer head grids next to it)" if written[1:] else ""
        print(f"alignment written to {args.attention}{more}")
    return 0


def _unknown_hint(err, vocab) -> str:
    """The unknown-token message, plus what to do: digits for a model of number words, and
    ``--allow-unk``."""
    text = str(err)
    digits = [t for t in err.tokens if any(c.isdigit() for c in t)]
    if digits and not any(any(c.isdigit() for c in t) for t in vocab.itos):
        text += (
            "; this model reads numbers written as words ('twenty one', not '21'): it never "
            "saw a digit"
        )
    return text + "; to translate anyway, reading them as <unk>, add --allow-unk"


def _run_eval(args: argparse.Namespace) -> int:
    from attnlab.tasks.translation import evaluate_heldout

    at_least_one(args, "batch_size", "max_batches")
    model, vocabs = _load(args.run_dir, args.weights)
    res = evaluate_heldout(
        model, vocabs, args.run_dir, batch_size=args.batch_size, max_batches=args.max_batches
    )
    b = "n/a (targets shorter than 4 tokens)" if res["bleu"] is None else f"{res['bleu']:.2f}"
    print(
        f"held-out ({res['n']} sentences, greedy): exact match {res['exact_match']:.4f}, "
        f"BLEU {b}, chrF {res['chrf']:.2f}"
    )
    return 0


def _run_bottleneck(args: argparse.Namespace) -> int:
    from attnlab.commands.config_args import from_args
    from attnlab.experiments.bottleneck import BottleneckConfig, format_table, run_bottleneck

    result = run_bottleneck(from_args(BottleneckConfig, args), args.out, overwrite=args.overwrite)
    print(format_table(result))
    print(f"\n{result['summary']}")
    print(f"table, plot and results.json in {args.out}")
    return 0
