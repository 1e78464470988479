"""``attnlab prepare``: tokenize a corpus of any size into a directory of shards, resumably.

    attnlab prepare --data books/ notes.txt --tokenizer bpe --vocab-size 8192 --out prep/books
    attnlab train lm --data prep/books --preset gpt2-mini --out runs/books

The work is :func:`attnlab.data.prepare.prepare_corpus`; this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys

from attnlab.commands.flags import pick
from attnlab.errors import UserError


def _prepare(args: argparse.Namespace) -> int:
    from attnlab.data.prepare import prepare_corpus

    sizes = pick(args, "vocab_size", "max_chars", "sample_chars", "shard_tokens")
    for name, value in sizes.items():
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")
    summary = prepare_corpus(
        args.data,
        args.out,
        kind=args.tokenizer,
        **sizes,
        **pick(args, "seed", "workers", "overwrite"),
        progress=not args.no_progress,
    )
    m = summary.manifest
    tok = m["tokenizer"]
    done = sum(d["status"] == "done" for d in m["documents"])
    skipped = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in m["skipped"].items() if n)
    if summary.was_complete:
        print("already prepared (use --overwrite to prepare again)", file=sys.stderr)
    elif summary.resumed:
        print(f"resumed: {summary.resumed} document(s) were already done", file=sys.stderr)
    print(
        f"{summary.directory}: {m['n_tokens']:,} tokens ({m['dtype']}) in "
        f"{len(m['shards'])} shard(s) from {done} document(s), {m['n_bytes'] / 1e6:.1f} MB; "
        f"{tok['type']} tokenizer, vocab {tok['vocab_size']}; "
        f"skipped: {skipped or 'none'}; {summary.seconds:.1f} s"
    )
    return 0


def register_prepare(groups) -> None:
    """Add ``attnlab prepare``."""
    from attnlab.data.prepare import BPE_SAMPLE_CHARS, SHARD_TOKENS

    p = groups["top"].add_parser(
        "prepare",
        help="tokenize a corpus of any size into shards for 'attnlab train lm --data DIR'",
        description="Read a corpus (built-in names 'pydoc'/'stdlib', files, folders) as a "
        "stream, train a tokenizer (char: the corpus's characters; bpe: on a seeded sample) and "
        "append the token ids to shard files in --out, in memory that does not grow with the "
        "corpus. Binary, non-UTF-8 and empty files are skipped and counted. Interrupted, the "
        "same command resumes after the documents already done.",
    )
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="corpus sources")
    p.add_argument("--out", required=True, help="directory to write (or to resume)")
    p.add_argument("--tokenizer", choices=["char", "bpe"], default="char")
    p.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary (default 512)")
    p.add_argument("--max-chars", type=int, default=None, help="use the first N characters only")
    p.add_argument(
        "--sample-chars",
        type=int,
        default=BPE_SAMPLE_CHARS,
        help=f"characters BPE is trained on, sampled at random (default {BPE_SAMPLE_CHARS:,})",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the BPE sample (default 0)")
    p.add_argument(
        "--workers",
        type=int,
        default=-1,
        help="BPE encoding processes (default: one per CPU core; 0: none)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=SHARD_TOKENS,
        help=f"close a shard at the first file end after N tokens (default {SHARD_TOKENS:,})",
    )
    p.add_argument("--overwrite", action="store_true", help="start again instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_prepare)
