"""``attnlab prepare``: tokenize a corpus of any size into a directory of shards, resumably.

    attnlab prepare --data books/ notes.txt --tokenizer bpe --vocab-size 8192 --out prep/books
    attnlab train lm --data prep/books --preset gpt2-mini --out runs/books

The work is :func:`attnlab.data.prepare.prepare_corpus`; this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys

from attnlab.commands.flags import add_command, pick
from attnlab.data.prepare import BPE_SAMPLE_CHARS, SHARD_TOKENS, prepare_corpus
from attnlab.errors import UserError


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


# fmt: off
def register_prepare(groups) -> None:
    """Add ``attnlab prepare``."""
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
# fmt: on
