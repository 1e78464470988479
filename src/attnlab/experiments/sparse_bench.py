"""Benchmark pieces for sparse and low-rank attention: the Linformer case and its measured error.

``block_sparse`` is an ordinary backend and is timed like the others. Linformer has learned
parameters (E, F), so it is not a backend: the benchmark times ``softmax(Q (E K)ᵀ/√d) (F V)`` with
random projections under the name ``linformer`` (non-causal only), and :func:`linformer_error`
measures how far it is from full attention:

- ``random``: E, F ~ N(0, 1/k) (the module's initialisation, a Johnson–Lindenstrauss projection);
- ``fitted``: E, F after ``fit_steps`` Adam steps minimising the squared error to full attention on
  fresh inputs of the same kind, measured on held-out inputs.

Two kinds of input: ``iid`` (q, k, v i.i.d. Gaussian: no structure, the attention matrix is not
low rank) and ``smooth`` (each channel Gaussian-smoothed noise along the sequence, width N/32: the
attention matrix varies slowly with the key position, so it is close to low rank, the situation
Linformer's paper reports for trained models). Errors are relative, ‖Δ‖/‖full‖; 1.0 is what
predicting zeros would give.

Shape legend: B batch, H heads, N sequence length, d head dim, k projected rows.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.attention import scaled_dot_product_attention
from attnlab.attention import scaled_dot_product_attention as attend
from attnlab.fileio import atomic_write_text

__all__ = [
    "BENCH_ONLY_BACKENDS",
    "bench_attention_fn",
    "estimate_extra_gb",
    "linformer_error",
    "linformer_error_table",
    "run_linformer_errors",
]

#: names ``attnlab bench attention`` accepts besides the registered backends
BENCH_ONLY_BACKENDS = ("linformer",)
DEFAULT_LINFORMER_K = 256


def estimate_extra_gb(backend: str, n: int, cfg: Any, mode: str) -> float | None:
    """A-priori memory (GB) of the backends this module adds, or None for the others.

    ``block_sparse`` keeps a few N×N boolean masks (pattern, combined mask) besides O(N·d)
    tensors; ``linformer`` has (N × k) scores.
    """
    bh = cfg.batch * cfg.heads
    elem = 2 if cfg.dtype == "bfloat16" else 4
    linear_part = 8 * bh * n * cfg.head_dim * elem
    if backend == "block_sparse":
        return (3 * n * n * max(cfg.batch, 1) + 2 * linear_part) / 1e9
    if backend == "linformer":
        k = cfg.options.get("linformer", {}).get("k", DEFAULT_LINFORMER_K)
        return (4 * bh * n * k * elem + 2 * linear_part) / 1e9
    return None


def bench_attention_fn(spec: dict, q, k, v, backward: bool) -> tuple[Callable[[], Any], list]:
    """The attention call a benchmark case times: ``(attend, extra parameters)``.

    Raises:
        ValueError: Linformer asked for causal attention or for more rows than the sequence.
    """
    options = dict(spec["options"])
    if spec["backend"] != "linformer":
        return (
            lambda: scaled_dot_product_attention(
                q, k, v, is_causal=spec["causal"], backend=spec["backend"], **options
            ),
            [],
        )
    if spec["causal"]:
        raise ValueError("linformer is non-causal (its projection mixes the future): --non-causal")
    n, rows = q.shape[-2], options.get("k", DEFAULT_LINFORMER_K)
    if rows > n:
        raise ValueError(f"linformer k={rows} exceeds the sequence length N={n}")
    gen = torch.Generator(device=q.device).manual_seed(1)
    E, F = (
        (
            torch.randn(rows, n, generator=gen, device=q.device, dtype=q.dtype) / math.sqrt(rows)
        ).requires_grad_(backward)
        for _ in range(2)
    )
    inner = options.get("inner", "sdpa")
    return (lambda: scaled_dot_product_attention(q, E @ k, F @ v, backend=inner)), [E, F]


def _inputs(kind: str, b: int, h: int, n: int, d: int, gen):
    if kind == "iid":
        return [torch.randn(b, h, n, d, generator=gen) for _ in range(3)]
    if kind != "smooth":
        raise ValueError(f"unknown input kind {kind!r}; choose 'iid' or 'smooth'")
    width = max(n // 32, 1)
    t = torch.arange(-2 * width, 2 * width + 1, dtype=torch.float32)
    kernel = torch.exp(-0.5 * (t / width) ** 2)
    kernel = (kernel / kernel.norm()).view(1, 1, -1)  # unit gain on white noise
    out = []
    for _ in range(3):
        noise = torch.randn(b * h * d, 1, n + 4 * width, generator=gen)
        x = F.conv1d(noise, kernel)[..., :n]  # (B·H·d, 1, N)
        out.append(x.view(b, h, d, n).transpose(-1, -2).contiguous())  # (B, H, N, d)
    return out


def linformer_error(
    n: int,
    k: int,
    *,
    inputs: str = "iid",
    heads: int = 4,
    head_dim: int = 64,
    batch: int = 4,
    fit_steps: int = 200,
    lr: float = 1e-2,
    seed: int = 0,
) -> dict[str, Any]:
    """Relative error of Linformer against full non-causal attention, random and fitted E, F.

    Returns:
        ``{"n", "k", "inputs", "random", "fitted", "fit_steps", "fit_s"}``.

    Raises:
        ValueError: ``k > n`` or an unknown input kind.
    """
    if not 1 <= k <= n:
        raise ValueError(f"linformer k={k} must be between 1 and the sequence length N={n}")
    gen = torch.Generator().manual_seed(seed)
    test = _inputs(inputs, batch, heads, n, head_dim, gen)
    ref = attend(*test, backend="sdpa")
    E, F = ((torch.randn(k, n, generator=gen) / math.sqrt(k)).requires_grad_() for _ in range(2))

    def error() -> float:
        with torch.no_grad():
            q, key, val = test
            out = attend(q, E @ key, F @ val, backend="sdpa")
            return float((out - ref).norm() / ref.norm())

    random_err = error()
    opt = torch.optim.Adam([E, F], lr=lr)
    t0 = time.perf_counter()
    for _ in range(fit_steps):
        q, key, val = _inputs(inputs, batch, heads, n, head_dim, gen)
        with torch.no_grad():
            target = attend(q, key, val, backend="sdpa")
        loss = (attend(q, E @ key, F @ val, backend="sdpa") - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {
        "n": n,
        "k": k,
        "inputs": inputs,
        "random": random_err,
        "fitted": error(),
        "fit_steps": fit_steps,
        "fit_s": time.perf_counter() - t0,
    }


def linformer_error_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of :func:`linformer_error` results."""
    lines = [
        "**Linformer relative error ‖Δ‖/‖full‖ (non-causal; 1.0 = no better than zeros)**",
        "",
        "| inputs | N | k | random E, F | fitted E, F | fit steps |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['inputs']} | {r['n']} | {r['k']} | {r['random']:.3f} | {r['fitted']:.3f} "
            f"| {r['fit_steps']} |"
        )
    return "\n".join(lines) + "\n"


def run_linformer_errors(
    ns: Iterable[int],
    k: int,
    out: str | Path,
    *,
    heads: int,
    head_dim: int,
    fit_steps: int,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, Path]]:
    """:func:`linformer_error` for each N and input kind; the table, written with the rows.

    Args:
        ns: sequence lengths N; k: projected rows.
        out: the directory of ``linformer_error.md`` and ``linformer_error.json``.
        threads: CPU threads for torch (None: torch's).
        progress: called with one line per measured row.

    Returns:
        ``(table, {"linformer_table": path, "linformer_json": path})``.
    """
    if threads:
        torch.set_num_threads(threads)
    rows = []
    for n in ns:
        for inputs in ("iid", "smooth"):
            row = linformer_error(
                n, k, inputs=inputs, heads=heads, head_dim=head_dim, fit_steps=fit_steps
            )
            if progress is not None:
                progress(
                    f"  linformer N={n} k={k} {inputs}: random {row['random']:.3f}, "
                    f"fitted {row['fitted']:.3f} ({row['fit_s']:.0f} s)"
                )
            rows.append(row)
    table = linformer_error_table(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "linformer_table": out / "linformer_error.md",
        "linformer_json": out / "linformer_error.json",
    }
    atomic_write_text(files["linformer_table"], table)
    atomic_write_text(files["linformer_json"], json.dumps(rows, indent=1))
    return table, files
