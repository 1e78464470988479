"""``attnlab train translate``, ``attnlab translate`` and ``attnlab experiment bottleneck``
(``attnlab eval`` of translation runs is :func:`attnlab.tasks.evaluate.evaluate_translation`).

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

from attnlab import runs
from attnlab.commands.config_args import (
    add_train_parser,
    from_args,
    saved_run,
    start_run,
    train_flag_keys,
    train_started,
)
from attnlab.commands.flags import add_command, at_least_one
from attnlab.errors import UserError
from attnlab.experiments.bottleneck import BottleneckConfig, format_report, run_bottleneck
from attnlab.runspec import FAMILIES
from attnlab.runspec.translation import MODEL_KINDS
from attnlab.tasks.reports import translate_result
from attnlab.tasks.translate_text import (
    check_alignment_request,
    read_sentences,
    translate_sentences,
)
from attnlab.viz.alignment import plot_alignment

TRANSLATE = FAMILIES["translate"]
# flag dest -> "section.key" (see attnlab.commands.config_args); --model is the kind
_FLAG_KEYS = {
    **train_flag_keys(),
    **{k: f"task.{k}" for k in ("task", "lang", "low", "high", "n_examples", "src_level")},
    **{k: f"task.{k}" for k in ("tgt_level", "max_len", "lowercase")},
    "data": "task.path",
    "bpe_vocab": "task.bpe_vocab_size",
    **{k: f"model.{k}" for k in ("preset", "cell", "norm_position", "position")},
}


def _run_train(args: argparse.Namespace) -> int:
    saved = saved_run(args)  # --out checked before the data is generated
    started = start_run(args, TRANSLATE, _FLAG_KEYS, saved, kind=args.model)
    return train_started(args, started, lambda s, m, t, r: translate_result(s.kind, m, t, r))


def _run_translate(args: argparse.Namespace) -> int:
    at_least_one(args, "beam", "batch_size")
    texts = read_sentences(args.text, args.file)
    if args.attention and len(texts) != 1:
        raise UserError(f"--attention draws one sentence; got {len(texts)}")
    model, vocabs = runs.load(args.run_dir, weights=args.weights, kinds=MODEL_KINDS)
    if args.attention:  # refuse before printing anything
        check_alignment_request(model, args.layer)
    res = translate_sentences(
        model, vocabs, texts, beam=args.beam, alpha=args.alpha, batch_size=args.batch_size,
        need_weights=bool(args.attention), strict=not args.allow_unk,
    )  # fmt: skip
    for r in res:
        print(f"{r.text}\t{r.score:.3f}" if args.scores else r.text)
    if args.attention:
        written = plot_alignment(res[0], args.attention, layer=args.layer)
        more = f" (+ {len(written) - 1} per-layer head grids next to it)" if written[1:] else ""
        print(f"alignment written to {args.attention}{more}")
    return 0


def _run_bottleneck(args: argparse.Namespace) -> int:
    result = run_bottleneck(from_args(BottleneckConfig, args), args.out, overwrite=args.overwrite)
    print(format_report(result))
    print(f"table, plot and results.json in {args.out}")
    return 0


# fmt: off
def register(groups) -> None:
    """Add the translation sub-commands to ``groups`` (see attnlab.commands)."""
    add_train_parser(
        groups, "translate", _run_train,
        help="train a translation model (RNN, RNN + attention, Transformer, T5)",
        description="Train an encoder-decoder on generated numbers/dates or a TSV parallel file. "
        "Defaults: transformer = label smoothing 0.1, inverse-square-root schedule with warm-up, "
        "Adam betas (0.9, 0.98); RNNs = cosine schedule, no smoothing.",
        train={"steps": 2000, "batch_size": 64, "lr": 1e-3, "warmup": 200, "eval_every": 250,
               "label_smoothing": None, "schedule": None},
        sections=[
            ("data (a --resume reuses the run's data; these may only repeat it)", [
                ("--task", ["numbers", "dates", "tsv"], None,
                 "numbers (default): English number words -> --lang words; dates: human-written "
                 "dates -> ISO; tsv: your own source<TAB>target file (--data)"),
                ("--lang", None, None, "numbers: target language (it, fr, de, ...; default it)"),
                ("--low", int, None, "numbers: smallest number (default 0)"),
                ("--high", int, None,
                 "numbers: largest number; controls source length (default 999999)"),
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
            ]),
            ("model (a --resume reuses the run's model)", [
                ("--model", MODEL_KINDS, None, "model kind (default transformer)"),
                ("--arch", MODEL_KINDS, None, "the same as --model", {"dest": "model"}),
                ("--preset", None, None,
                 "model size preset (transformer: tiny, small, vaswani, vaswani-big; t5: tiny, "
                 "tiny-v1_1, small, t5-small, t5-base, t5-v1_1-small, t5-v1_1-base; rnn: tiny, "
                 "small, base; default: small)"),
                ("--cell", ["gru", "lstm", "rnn"], None, "RNN cell (default gru; rnn = tanh)"),
                ("--norm-position", ["pre", "post"], None,
                 "transformer: post-norm (paper, default) or pre-norm"),
                ("--position", ["sinusoidal", "learned", "rope", "none"], None,
                 "transformer: positions (default sinusoidal)"),
            ]),
        ],
    )
    add_command(
        groups["top"], "translate", func=_run_translate,
        help="translate sentences with a trained run",
        description="Translate sentences (arguments or --file, one per line) with a run made by "
        "'attnlab train translate'; print one translation per line.",
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
        groups["experiment"], "bottleneck", func=_run_bottleneck,
        help="fixed-context RNN vs RNN + attention vs Transformer by source length",
        description="Train rnn, rnn-attn and transformer on the numbers task with the same "
        "budget; report exact match and BLEU by source length (table + plot).",
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
            ("--variants", "store_true", None, "also train rnn-attn's variants (score, s_0, cell)"),
            ("--device", None, "auto", None),
            ("--seed", int, 0, None),
            ("--overwrite", "store_true", None, None),
            ("--no-progress", "store_false", None, None, {"dest": "progress"}),
        ],
    )
# fmt: on
