"""``attnlab bench attention`` and ``attnlab bench long-context``: efficient attention, measured.

Thin wrappers over :mod:`attnlab.experiments.attention_bench`: parse, call the library, print.
"""

from __future__ import annotations

import argparse

from attnlab.commands.flags import add_flags
from attnlab.errors import UserError


def register(groups) -> None:
    """Add ``bench attention`` and ``bench long-context`` (creating ``attnlab bench`` if needed)."""
    if "bench" not in groups:
        bench = groups["top"].add_parser(
            "bench", help="measure speed and memory (attention backends, long context)"
        )
        groups["bench"] = bench.add_subparsers(
            dest="bench", metavar="<what>", required=True, parser_class=type(bench)
        )
    sub = groups["bench"]

    from attnlab.experiments.attention_bench import DEFAULT_BACKENDS, DEFAULT_NS

    p = sub.add_parser(
        "attention",
        help="time and peak memory of attention backends against sequence length",
        description="Forward and forward+backward time and peak memory of the attention backends "
        "for a range of sequence lengths, each case in a fresh subprocess; writes attention.md "
        "(tables), attention.json and attention.png (log-log plot) to --out. Example: 'attnlab "
        "bench attention --n 512 1024 2048 --backends math tiled sdpa'.",
    )
    # fmt: off
    add_flags(p, [
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
    # fmt: on
    p.set_defaults(func=run_attention_bench)

    lc = sub.add_parser(
        "long-context",
        help="memory of training at a long context: formula and one measured block",
        description="Estimate the attention memory of training a decoder LM preset at --seq-len "
        "with each backend, with and without activation checkpointing, and measure one "
        "Transformer block's forward+backward peak memory (fresh subprocess per backend).",
    )
    # fmt: off
    add_flags(lc, [
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
    lc.set_defaults(func=run_long_context)


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available to this torch build")


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise UserError(f"{name} must be positive, got {value}")


def run_attention_bench(args: argparse.Namespace) -> int:
    """``attnlab bench attention``: run, print the tables, write the files."""
    from attnlab.attention import available_backends
    from attnlab.attention.core import check_backend
    from attnlab.commands.config_args import from_args
    from attnlab.experiments.attention_bench import BenchConfig, run_benchmark, save_results
    from attnlab.experiments.sparse_bench import BENCH_ONLY_BACKENDS

    for name in (
        "batch",
        "heads",
        "head_dim",
        "window",
        "n_features",
        "block_q",
        "block_k",
        "block_size",
        "linformer_k",
        "fit_steps",
        "threads",
        "max_gb",
        "min_time",
    ):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    for n in args.n:
        _positive("--n", n)
    known = [*available_backends(), *BENCH_ONLY_BACKENDS]
    unknown = sorted(set(args.backends) - set(known))
    if unknown:
        raise UserError(f"unknown backend(s) {unknown}; choose from {known}")
    _check_device(args.device)
    sparse = _block_sparse_options(args)
    try:
        check_backend("block_sparse", sparse)
    except ValueError as err:
        raise UserError(str(err)) from None
    for g in args.global_tokens:
        if g >= min(args.n):
            raise UserError(f"--global-tokens: index {g} is outside the sequence N={min(args.n)}")
    if "linformer" in args.backends and not args.non_causal:
        raise UserError(
            "linformer is non-causal (its projection mixes the future): add --non-causal"
        )
    if args.linformer_k > min(args.n) and ("linformer" in args.backends or args.linformer_error):
        raise UserError(f"--linformer-k {args.linformer_k} exceeds the shortest N={min(args.n)}")
    tiled = {k: v for k, v in (("block_q", args.block_q), ("block_k", args.block_k)) if v}
    linear = {"feature_map": args.feature_map}
    if args.feature_map == "favor":
        linear["n_features"] = args.n_features
    cfg = from_args(
        BenchConfig,
        args,
        ns=tuple(args.n),
        backends=tuple(args.backends),
        causal=not args.non_causal,
        modes=tuple(args.modes),
        options={
            "window": {"window": args.window},
            "linear": linear,
            "tiled": tiled,
            "block_sparse": sparse,
            "linformer": {"k": args.linformer_k},
        },
    )

    def show(row: dict) -> None:
        what = (
            row.get("skipped")
            or row.get("error")
            or (f"{row['time_s'] * 1e3:,.1f} ms, peak {row['peak_bytes'] / 2**20:,.1f} MiB")
        )
        print(f"  {row['backend']:>7} N={row['n']:<6} {row['mode']:<7} {what}", flush=True)

    rows = run_benchmark(cfg, progress=show)
    files = save_results(rows, cfg, args.out)
    print()
    print(files["table"].read_text())
    if args.linformer_error:
        files.update(_linformer_errors(args))
    for name, path in files.items():
        print(f"{name}: {path}")
    return 0


def _block_sparse_options(args: argparse.Namespace) -> dict:
    opts: dict = {
        "pattern": args.pattern,
        "block_size": args.block_size,
        "global_tokens": list(args.global_tokens),
    }
    if args.pattern == "longformer":
        opts["window"] = args.window
    else:
        opts.update(window_blocks=args.window_blocks, random_blocks=args.random_blocks)
    return opts


def _linformer_errors(args: argparse.Namespace) -> dict:
    """Measure Linformer's error for each N and input kind; print and save the table."""
    from attnlab.experiments.sparse_bench import run_linformer_errors

    sizes = {name: getattr(args, name) for name in ("heads", "head_dim", "fit_steps", "threads")}
    table, files = run_linformer_errors(
        args.n, args.linformer_k, args.out, progress=lambda line: print(line, flush=True), **sizes
    )
    print()
    print(table)
    return files


def run_long_context(args: argparse.Namespace) -> int:
    """``attnlab bench long-context``: formula per backend, then one measured block."""
    from attnlab.attention import available_backends
    from attnlab.config import ModelConfig
    from attnlab.experiments.attention_bench import block_memory, lm_attention_memory_formula

    for name in ("seq_len", "batch", "window", "threads"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    unknown = sorted(set(args.backends) - set(available_backends()))
    if unknown:
        raise UserError(f"unknown backend(s) {unknown}; choose from {available_backends()}")
    overrides = {
        k: v
        for k, v in (
            ("n_layers", args.n_layers),
            ("n_heads", args.n_heads),
            ("d_model", args.d_model),
        )
        if v is not None
    }
    c = ModelConfig.preset(args.preset, **overrides)
    print(
        f"{args.preset}: {c.n_layers} layers, {c.n_heads} heads, d_model {c.d_model}; "
        f"batch {args.batch} × {args.seq_len} tokens (fp32)"
    )
    print(
        f"  {'backend':<8}{'checkpointing':>15}{'N×N scores GB':>15}{'activations GB':>16}"
        f"{'total GB':>10}"
    )
    for backend in args.backends:
        for ckpt in (False, True):
            est = lm_attention_memory_formula(
                n_layers=c.n_layers,
                n_heads=c.n_heads,
                seq_len=args.seq_len,
                batch=args.batch,
                backend=backend,
                checkpointing=ckpt,
                d_model=c.d_model,
            )
            print(
                f"  {backend:<8}{'yes' if ckpt else 'no':>15}{est['scores_gb']:>15.2f}"
                f"{est['activations_gb']:>16.2f}{est['total_gb']:>10.2f}"
            )
    print("  (weights, gradients and AdamW state add 16 bytes per parameter on top)")
    if args.no_measure:
        return 0
    _check_device(args.device)
    print(
        f"\nmeasured: one block (d_model {c.d_model}, {c.n_heads} heads) forward+backward at "
        f"T={args.seq_len}, batch {args.batch}:"
    )
    for row in block_memory(
        seq_len=args.seq_len,
        d_model=c.d_model,
        n_heads=c.n_heads,
        backends=tuple(args.backends),
        batch=args.batch,
        threads=args.threads,
        device=args.device,
        options={"window": {"window": args.window}},
    ):
        if "error" in row:
            print(f"  {row['backend']:<8} error: {row['error']}")
        else:
            print(
                f"  {row['backend']:<8} peak {row['peak_bytes'] / 2**30:6.2f} GiB  "
                f"time {row['time_s']:.1f} s  ({row['memory_method']})"
            )
    return 0
