"""``attnlab bench attention`` and ``attnlab bench long-context``: efficient attention, measured.

Thin wrappers over :mod:`attnlab.experiments.bench_flags` (the flags checked, the config built)
and :mod:`attnlab.experiments.attention_bench`: parse, call the library, print.
"""

from __future__ import annotations

import argparse

from attnlab.commands.flags import add_command
from attnlab.experiments import attention_bench
from attnlab.experiments.attention_bench import DEFAULT_BACKENDS, DEFAULT_NS, save_results
from attnlab.experiments.bench_flags import (
    bench_config,
    linformer_errors,
    long_context_report,
    show_row,
)


def run_attention_bench(args: argparse.Namespace) -> int:
    """``attnlab bench attention``: run, print the tables, write the files."""
    cfg = bench_config(args)
    rows = attention_bench.run_benchmark(cfg, progress=lambda row: print(show_row(row), flush=True))
    files = save_results(rows, cfg, args.out)
    print()
    print(files["table"].read_text())
    if args.linformer_error:  # Linformer's error for each N and input kind
        table, more = linformer_errors(args, progress=lambda line: print(line, flush=True))
        print(f"\n{table}")
        files.update(more)
    for name, path in files.items():
        print(f"{name}: {path}")
    return 0


def run_long_context(args: argparse.Namespace) -> int:
    """``attnlab bench long-context``: formula per backend, then one measured block."""
    for line in long_context_report(args):
        print(line, flush=True)
    return 0


# fmt: off
def register(groups) -> None:
    """Add ``bench attention`` and ``bench long-context`` (creating ``attnlab bench`` if needed)."""
    if "bench" not in groups:
        bench = groups["top"].add_parser(
            "bench", help="measure speed and memory (attention backends, long context)"
        )
        groups["bench"] = bench.add_subparsers(
            dest="bench", metavar="<what>", required=True, parser_class=type(bench)
        )
    add_command(groups["bench"], "attention", func=run_attention_bench,
        help="time and peak memory of attention backends against sequence length",
        description="Forward and forward+backward time and peak memory of the attention backends "
        "for a range of sequence lengths, each case in a fresh subprocess; writes attention.md "
        "(tables), attention.json and attention.png (log-log plot) to --out. Example: 'attnlab "
        "bench attention --n 512 1024 2048 --backends math tiled sdpa'.", flags=[
        ("--n", int, list(DEFAULT_NS),
         f"sequence lengths (default {' '.join(map(str, DEFAULT_NS))})",
         {"nargs": "+", "metavar": "N"}),
        ("--backends", None, list(DEFAULT_BACKENDS),
         f"backends to compare (default {' '.join(DEFAULT_BACKENDS)})", {"nargs": "+"}),
        ("--batch", int, 1, "batch size B (default 1)"),
        ("--heads", int, 8, "heads H (default 8)"),
        ("--head-dim", int, 64, "head width d (default 64)"),
        ("--non-causal", "store_true", None, "bidirectional attention (default: causal)"),
        ("--modes", ["fwd", "fwdbwd"], ["fwd", "fwdbwd"],
         "forward only and/or forward+backward (default both)", {"nargs": "+"}),
        ("--window", int, 256, "window w of 'window' (default 256)"),
        ("--feature-map", ["elu", "favor"], "elu", "feature map of 'linear' (default elu)"),
        ("--n-features", int, 256, "FAVOR+ features (default 256)"),
        ("--pattern", ["longformer", "bigbird"], "longformer",
         "sparse pattern of 'block_sparse' (default longformer: --window plus global tokens)"),
        ("--global-tokens", int, [0], "global token positions of 'block_sparse' (default 0)",
         {"nargs": "*", "metavar": "I"}),
        ("--block-size", int, 64, "tile (and BigBird block) of 'block_sparse'"),
        ("--window-blocks", int, 1, "BigBird window blocks per side"),
        ("--random-blocks", int, 2, "BigBird random blocks (default 2)"),
        ("--linformer-k", int, 256,
         "projected rows k of 'linformer' (random E, F; with --non-causal) (default 256)"),
        ("--linformer-error", "store_true", None, "also measure Linformer's error against full "
         "attention for each N (random and fitted E, F; i.i.d. and smooth inputs) into "
         "linformer_error.md"),
        ("--fit-steps", int, 200, "Adam steps fitting E, F (default 200)"),
        ("--block-q", int, None, "query tile of 'tiled'"),
        ("--block-k", int, None, "key tile of 'tiled'"),
        ("--max-gb", float, 12.0,
         "skip cases estimated to need more memory than this (default 12 GB)"),
        ("--threads", int, None, "torch threads per case (default: torch's default, all cores)"),
        ("--device", ["cpu", "cuda"], "cpu", "default cpu"),
        ("--dtype", ["float32", "bfloat16"], "float32", None),
        ("--min-time", float, 1.0, "seconds of repetitions per case after the warm-up (default 1)"),
        ("--out", None, "benchmarks/results", "output folder (default benchmarks/results)"),
    ])
    add_command(groups["bench"], "long-context", func=run_long_context,
        help="memory of training at a long context: formula and one measured block",
        description="Estimate the attention memory of training a decoder LM preset at --seq-len "
        "with each backend, with and without activation checkpointing, and measure one "
        "Transformer block's forward+backward peak memory (fresh subprocess per backend).",
        flags=[
        ("--seq-len", int, 4096, "sequence length (default 4096)"),
        ("--preset", None, "gpt2-small", "ModelConfig preset for the formula and the measured "
         "block's width/heads (default gpt2-small)"),
        ("--n-layers", int, None, "override the preset's layers"),
        ("--n-heads", int, None, "override the preset's heads"),
        ("--d-model", int, None, "override the preset's width"),
        ("--batch", int, 1, "batch size (default 1)"),
        ("--backends", None, ["math", "tiled", "sdpa"],
         "backends to compare (default math tiled sdpa)", {"nargs": "+"}),
        ("--window", int, 256, "window w of 'window' (default 256)"),
        ("--no-measure", "store_true", None, "formula only"),
        ("--threads", int, None, "torch threads of the measurement"),
        ("--device", ["cpu", "cuda"], "cpu", "default cpu"),
    ])
# fmt: on
