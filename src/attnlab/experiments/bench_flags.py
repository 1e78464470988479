"""``attnlab bench attention`` and ``attnlab bench long-context`` on parsed flags: the flags
checked (named as typed), the :class:`~attnlab.experiments.attention_bench.BenchConfig` built,
and the long-context report as lines (:func:`long_context_report`, measured as it goes).

Thin in turn: the measuring is :mod:`attnlab.experiments.attention_bench` and
:mod:`attnlab.experiments.sparse_bench`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator

import torch

from attnlab.attention import available_backends
from attnlab.attention.core import check_backend
from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.experiments import attention_bench
from attnlab.experiments.attention_bench import BenchConfig, lm_attention_memory_formula
from attnlab.experiments.sparse_bench import BENCH_ONLY_BACKENDS, run_linformer_errors

__all__ = ["bench_config", "check_device", "linformer_errors", "long_context_report", "show_row"]

_POSITIVE = ("batch", "heads", "head_dim", "window", "n_features", "block_q", "block_k")
_POSITIVE += ("block_size", "linformer_k", "fit_steps", "threads", "max_gb", "min_time")


def check_device(device: str) -> None:
    """Refuse ``--device cuda`` without a CUDA device."""
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available to this torch build")


def _positive(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")


def _unknown_backends(backends: list[str], known: list[str]) -> None:
    unknown = sorted(set(backends) - set(known))
    if unknown:
        raise UserError(f"unknown backend(s) {unknown}; choose from {known}")


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


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The flags of ``attnlab bench attention``, checked, as a :class:`BenchConfig`.

    Raises:
        UserError: a value that is not positive, an unknown backend, a missing CUDA device,
            block-sparse options or Linformer settings that do not fit the sequence lengths.
    """
    _positive(args, _POSITIVE)
    for n in args.n:
        if n <= 0:
            raise UserError(f"--n must be positive, got {n}")
    _unknown_backends(args.backends, [*available_backends(), *BENCH_ONLY_BACKENDS])
    check_device(args.device)
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
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)
              if f.init and hasattr(args, f.name)}  # fmt: skip
    return BenchConfig(
        **{
            **fields,
            "ns": tuple(args.n),
            "backends": tuple(args.backends),
            "causal": not args.non_causal,
            "modes": tuple(args.modes),
            "options": {
                "window": {"window": args.window},
                "linear": linear,
                "tiled": tiled,
                "block_sparse": sparse,
                "linformer": {"k": args.linformer_k},
            },
        }
    )


def linformer_errors(args: argparse.Namespace, progress=None) -> tuple[str, dict]:
    """``--linformer-error``: Linformer's error against full attention for each ``--n`` and
    input kind (:func:`~attnlab.experiments.sparse_bench.run_linformer_errors`).

    Returns:
        ``(the table, the files written)``.
    """
    sizes = {k: getattr(args, k) for k in ("heads", "head_dim", "fit_steps", "threads")}
    return run_linformer_errors(args.n, args.linformer_k, args.out, progress=progress, **sizes)


def show_row(row: dict) -> str:
    """One measured case of ``bench attention`` as a progress line."""
    what = (
        row.get("skipped")
        or row.get("error")
        or (f"{row['time_s'] * 1e3:,.1f} ms, peak {row['peak_bytes'] / 2**20:,.1f} MiB")
    )
    return f"  {row['backend']:>7} N={row['n']:<6} {row['mode']:<7} {what}"


def long_context_report(args: argparse.Namespace) -> Iterator[str]:
    """The lines of ``attnlab bench long-context``: the memory formula per backend, with and
    without checkpointing, then (unless ``--no-measure``) one block measured per backend; each
    line as soon as it is known.

    Raises:
        UserError: a value that is not positive, an unknown backend, a missing CUDA device.
    """
    _positive(args, ("seq_len", "batch", "window", "threads"))
    _unknown_backends(args.backends, available_backends())
    overrides = {
        k: getattr(args, k)
        for k in ("n_layers", "n_heads", "d_model")
        if getattr(args, k) is not None
    }
    c = ModelConfig.preset(args.preset, **overrides)
    yield (
        f"{args.preset}: {c.n_layers} layers, {c.n_heads} heads, d_model {c.d_model}; "
        f"batch {args.batch} × {args.seq_len} tokens (fp32)"
    )
    yield (
        f"  {'backend':<8}{'checkpointing':>15}{'N×N scores GB':>15}{'activations GB':>16}"
        f"{'total GB':>10}"
    )
    for backend in args.backends:
        for ckpt in (False, True):
            est = lm_attention_memory_formula(
                n_layers=c.n_layers, n_heads=c.n_heads, seq_len=args.seq_len, batch=args.batch,
                backend=backend, checkpointing=ckpt, d_model=c.d_model,
            )  # fmt: skip
            yield (
                f"  {backend:<8}{'yes' if ckpt else 'no':>15}{est['scores_gb']:>15.2f}"
                f"{est['activations_gb']:>16.2f}{est['total_gb']:>10.2f}"
            )
    yield "  (weights, gradients and AdamW state add 16 bytes per parameter on top)"
    if args.no_measure:
        return
    check_device(args.device)
    yield (
        f"\nmeasured: one block (d_model {c.d_model}, {c.n_heads} heads) forward+backward at "
        f"T={args.seq_len}, batch {args.batch}:"
    )
    for row in attention_bench.block_memory(
        seq_len=args.seq_len, d_model=c.d_model, n_heads=c.n_heads,
        backends=tuple(args.backends), batch=args.batch, threads=args.threads,
        device=args.device, options={"window": {"window": args.window}},
    ):  # fmt: skip
        if "error" in row:
            yield f"  {row['backend']:<8} error: {row['error']}"
        else:
            yield (
                f"  {row['backend']:<8} peak {row['peak_bytes'] / 2**30:6.2f} GiB  "
                f"time {row['time_s']:.1f} s  ({row['memory_method']})"
            )
