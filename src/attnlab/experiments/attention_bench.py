"""Attention backends measured: time and peak memory against sequence length, and long context.

Every measurement runs in a **fresh subprocess** so that one case's allocations cannot hide or
inflate another's. Peak memory is the extra memory the case needed beyond its inputs:

- CUDA: ``torch.cuda.max_memory_allocated()`` minus what was allocated before the case.
- CPU: the process's resident-set high-water mark (Linux ``VmHWM``) minus the resident size just
  before the case. The high-water mark is reset first (``/proc/self/clear_refs``) so imports do
  not count; where that is impossible we fall back to ``ru_maxrss`` (an upper bound). RSS counts
  every byte the allocator touched, tensors and workspace alike, which is what decides whether a
  run fits in RAM.

Shape legend: B batch, H heads, N sequence length, d head dim.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.config import BlockConfig
from attnlab.config.base import Config
from attnlab.experiments.sparse_bench import bench_attention_fn, estimate_extra_gb
from attnlab.layers.builders import build_block
from attnlab.plotting import pyplot
from attnlab.runs import atomic_write_text

__all__ = [
    "BenchConfig",
    "run_benchmark",
    "estimate_gb",
    "markdown_table",
    "plot_results",
    "measure_case",
    "block_memory",
    "lm_attention_memory_formula",
]

DEFAULT_BACKENDS = ("math", "tiled", "sdpa", "window", "linear", "block_sparse")
DEFAULT_NS = (512, 1024, 2048, 4096, 8192, 16384)


@dataclass
class BenchConfig(Config):
    """What to measure.

    Attributes:
        ns: sequence lengths N.
        backends: attention backends (``math``, ``tiled``, ``sdpa``, ``window``, ``linear``,
            ``block_sparse``...), and ``linformer`` (random E, F; non-causal only).
        batch, heads, head_dim: B, H, d.
        causal: causal attention (the language-model case).
        modes: ``fwd`` (no autograd) and/or ``fwdbwd`` (forward + backward of ``out.sum()``).
        options: per-backend options, e.g. ``{"window": {"window": 256}}``.
        max_gb: skip a case whose estimated memory exceeds this many GB.
        threads: torch threads in each subprocess (None: torch's default).
        device: ``cpu`` or ``cuda``.
        min_time: keep repeating a case until this many seconds were timed (at most ``max_reps``).
        max_reps: repetitions after the warm-up run; the median is reported.
        dtype: ``float32`` or ``bfloat16``.
    """

    ns: tuple[int, ...] = DEFAULT_NS
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    causal: bool = True
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    options: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "window": {"window": 256},
            "linear": {"feature_map": "elu"},
            "block_sparse": {"pattern": "longformer", "window": 256, "global_tokens": [0]},
            "linformer": {"k": 256},
        }
    )
    max_gb: float = 12.0
    threads: int | None = None
    device: str = "cpu"
    min_time: float = 1.0
    max_reps: int = 5
    dtype: str = "float32"


def estimate_gb(backend: str, n: int, cfg: BenchConfig, mode: str) -> float:
    """A-priori memory estimate (GB) of one case, used only to skip cases that cannot fit.

    ``math`` peaks at ~3 N×N fp32 tensors per head in the forward (scores, masked scores,
    softmax) and ~3.5 with autograd (measured: 3.0 and 3.1 at N=4096, B=1, H=8); the boolean
    causal mask adds N² bytes. The other backends are O(N): we count their inputs, outputs and gradients
    plus a tile/band/chunk term.
    """
    extra = estimate_extra_gb(backend, n, cfg, mode)
    if extra is not None:
        return extra
    bh = cfg.batch * cfg.heads
    elem = 2 if cfg.dtype == "bfloat16" else 4
    linear_part = 8 * bh * n * cfg.head_dim * elem
    if backend == "math":
        copies = 3 if mode == "fwd" else 3.5
        return (copies * bh * n * n * elem + n * n + linear_part) / 1e9
    if backend == "window":
        w = cfg.options.get("window", {}).get("window", 256)
        return (4 * bh * n * (2 * w + 32) * elem + linear_part) / 1e9
    return 2 * linear_part / 1e9


def measure_case(spec: dict) -> dict:
    """Run one case in *this* process and return its timings and peak memory (see module doc)."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    n, b, h, d = spec["n"], spec["batch"], spec["heads"], spec["head_dim"]
    backward = spec["mode"] == "fwdbwd"
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(b, h, n, d, generator=gen, device=device, dtype=dtype).requires_grad_(backward)
        for _ in range(3)
    )

    attend, params = bench_attention_fn(spec, q, k, v, backward)

    def step() -> None:
        with torch.set_grad_enabled(backward):
            out = attend()
            if backward:
                out.sum().backward()
                for t in (q, k, v, *params):
                    t.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()

    base = _memory_now(device)
    _reset_peak(device)
    t0 = time.perf_counter()
    step()  # warm-up (also reaches the case's peak)
    times = [time.perf_counter() - t0]
    timed = 0.0
    reps: list[float] = []
    while len(reps) < spec["max_reps"] and (timed < spec["min_time"] or not reps):
        if times[0] > 4 * spec["min_time"] and reps:
            break
        t0 = time.perf_counter()
        step()
        reps.append(time.perf_counter() - t0)
        timed += reps[-1]
    peak = _memory_peak(device) - base
    return {
        "time_s": statistics.median(reps),
        "peak_bytes": max(peak, 0),
        "reps": len(reps),
        "memory_method": _memory_method(device),
    }


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


_HWM_RESET = False


def _reset_peak(device) -> None:
    global _HWM_RESET

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux ≥ 4.0)
        _HWM_RESET = True
    except OSError:
        _HWM_RESET = False


def _memory_now(device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(device)
    kb = _status_kb("VmRSS")
    return 0 if kb is None else kb * 1024


def _memory_peak(device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    kb = _status_kb("VmHWM") if _HWM_RESET else None
    if kb is None:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb * 1024


def _memory_method(device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    return "VmHWM after clear_refs" if _HWM_RESET else "ru_maxrss"


def _run_subprocess(spec: dict, timeout: float | None = None) -> dict:
    """Run :func:`measure_case` (or another worker) in a fresh Python process."""
    env = dict(os.environ)
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = str(spec["threads"])
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab.experiments.attention_bench", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:  # the exception line of the traceback says what went wrong
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return {"error": tail[0] if tail else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_benchmark(cfg: BenchConfig, progress=None) -> list[dict]:
    """Measure every (backend, N, mode) of ``cfg``; one subprocess per case.

    Args:
        cfg: what to measure.
        progress: optional callable ``progress(row)`` called after each case.

    Returns:
        One dict per case: backend, n, mode, and ``time_s``/``peak_bytes`` or ``skipped``/``error``.
    """
    rows = []
    for n in cfg.ns:
        for backend in cfg.backends:
            for mode in cfg.modes:
                row: dict[str, Any] = {"backend": backend, "n": n, "mode": mode}
                need = estimate_gb(backend, n, cfg, mode)
                if need > cfg.max_gb:
                    row["skipped"] = f"skipped (would need {need:.3g} GB)"
                else:
                    spec = {
                        "n": n,
                        "backend": backend,
                        "mode": mode,
                        "batch": cfg.batch,
                        "heads": cfg.heads,
                        "head_dim": cfg.head_dim,
                        "causal": cfg.causal,
                        "options": cfg.options.get(backend, {}),
                        "threads": cfg.threads,
                        "device": cfg.device,
                        "dtype": cfg.dtype,
                        "min_time": cfg.min_time,
                        "max_reps": cfg.max_reps,
                    }
                    row.update(_run_subprocess(spec))
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def _cell(row: dict | None, key: str) -> str:
    if row is None:
        return "–"
    if "skipped" in row:
        return row["skipped"]
    if "error" in row:
        return "error"
    if key == "time_s":
        return f"{row['time_s'] * 1e3:,.1f}"
    return f"{row['peak_bytes'] / 2**20:,.1f}"


def markdown_table(rows: list[dict], cfg: BenchConfig) -> str:
    """Four markdown tables (fwd/fwd+bwd × time/memory), backends as columns, N as rows."""
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    ns = sorted({r["n"] for r in rows})
    index = {(r["backend"], r["n"], r["mode"]): r for r in rows}
    dev = cfg.device + (f", {cfg.threads} thread(s)" if cfg.threads else "")
    lines = [
        f"B={cfg.batch}, H={cfg.heads}, d={cfg.head_dim}, {cfg.dtype}, "
        f"{'causal' if cfg.causal else 'non-causal'}, {dev}; options {cfg.options}",
        "",
    ]
    titles = {
        ("fwd", "time_s"): "forward time (ms)",
        ("fwdbwd", "time_s"): "forward+backward time (ms)",
        ("fwd", "peak_bytes"): "forward peak memory (MiB)",
        ("fwdbwd", "peak_bytes"): "forward+backward peak memory (MiB)",
    }
    for (mode, key), title in titles.items():
        if mode not in cfg.modes:
            continue
        lines += [
            f"**{title}**",
            "",
            "| N | " + " | ".join(backends) + " |",
            "|---:|" + "---:|" * len(backends),
        ]
        for n in ns:
            cells = [_cell(index.get((b, n, mode)), key) for b in backends]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _ratios(index, ns, cfg)
    return "\n".join(lines)


def _ratios(index: dict, ns: list[int], cfg: BenchConfig) -> list[str]:
    """Headline ratios: tiled vs sdpa time, math vs tiled memory."""
    out = []
    for n in ns:
        parts = []
        for mode in cfg.modes:
            t, s, m = (index.get((b, n, mode)) for b in ("tiled", "sdpa", "math"))
            if _ok(t) and _ok(s):
                parts.append(f"{mode}: tiled/sdpa time {t['time_s'] / s['time_s']:.2f}×")
            if _ok(t) and _ok(m) and t["peak_bytes"] > 0:
                parts.append(f"{mode}: math/tiled memory {m['peak_bytes'] / t['peak_bytes']:.1f}×")
            for name in ("block_sparse", "linformer"):
                r = index.get((name, n, mode))
                if _ok(r) and _ok(m) and r["peak_bytes"] > 0:
                    parts.append(
                        f"{mode}: math/{name} time {m['time_s'] / r['time_s']:.2f}×, "
                        f"memory {m['peak_bytes'] / r['peak_bytes']:.1f}×"
                    )
        if parts:
            out.append(f"- N={n}: " + "; ".join(parts))
    return (["**ratios**", ""] + out + [""]) if out else []


def _ok(row: dict | None) -> bool:
    return row is not None and "time_s" in row


def plot_results(rows: list[dict], path: str | Path, cfg: BenchConfig) -> Path:
    """Log-log plot: time and peak memory against N, one line per backend, per mode."""
    plt = pyplot()

    modes = list(cfg.modes)
    fig, axes = plt.subplots(2, len(modes), figsize=(5.5 * len(modes), 8), squeeze=False)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    for j, mode in enumerate(modes):
        for i, (key, label, unit) in enumerate(
            [("time_s", "time", 1e3), ("peak_bytes", "peak memory", 1 / 2**20)]
        ):
            ax = axes[i][j]
            for b in backends:
                pts = sorted(
                    (r["n"], r[key] * unit)
                    for r in rows
                    if r["backend"] == b and r["mode"] == mode and _ok(r)
                )
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=b)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ns = sorted({r["n"] for r in rows if r["mode"] == mode})
            ax.set_xticks(ns, [f"{n:,}" for n in ns])  # 512, 1,024 ... rather than 2⁹, 2¹⁰
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
            ax.set_xlabel("sequence length N")
            ax.set_ylabel("ms" if key == "time_s" else "MiB")
            ax.set_title(f"{'forward' if mode == 'fwd' else 'forward+backward'} {label}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
    fig.suptitle(f"attention backends, B={cfg.batch} H={cfg.heads} d={cfg.head_dim} ({cfg.device})")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_results(rows: list[dict], cfg: BenchConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write ``attention.json``, ``attention.md`` and ``attention.png`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "json": out_dir / "attention.json",
        "table": out_dir / "attention.md",
        "plot": out_dir / "attention.png",
    }
    atomic_write_text(files["json"], json.dumps({"config": asdict(cfg), "rows": rows}, indent=1))
    atomic_write_text(files["table"], markdown_table(rows, cfg) + "\n")
    plot_results(rows, files["plot"], cfg)
    return files


# ----------------------------------------------------------------------------------------------
# long context: one Transformer block, and the whole-model formula


def lm_attention_memory_formula(
    *,
    n_layers: int,
    n_heads: int,
    seq_len: int,
    batch: int = 1,
    backend: str = "math",
    checkpointing: bool = False,
    d_model: int = 64,
    bytes_per_elem: int = 4,
) -> dict[str, float]:
    """Estimate the attention-score memory (GB) of training a decoder LM.

    ``math`` keeps two N×N fp32 tensors per head per layer for the backward (the softmax output
    and the masked weights that multiply V) plus about one more while a layer's backward runs
    (calibrated: one gpt2-small block at N=4096 measured 2.46 GiB against 2.44 GiB predicted).
    With checkpointing only one layer's tensors exist at a time (the one being recomputed); the
    exact O(N) backends (``tiled``, ``sdpa`` on CPU) keep no N×N tensor at all. Activations that
    are O(N·d) (≈ 16·d_model values per token per layer without checkpointing, d_model with it)
    are added to both.

    Returns:
        ``{"scores_gb", "activations_gb", "total_gb"}``.
    """
    n2 = batch * n_heads * seq_len * seq_len * bytes_per_elem
    if backend == "math":
        kept_layers = 1 if checkpointing else n_layers
        scores = 2 * n2 * kept_layers + n2
    else:
        scores = 0.0
    per_token = (1 if checkpointing else 16) * d_model * bytes_per_elem
    acts = batch * seq_len * per_token * n_layers
    return {
        "scores_gb": scores / 1e9,
        "activations_gb": acts / 1e9,
        "total_gb": (scores + acts) / 1e9,
    }


def _measure_block(spec: dict) -> dict:
    """Forward+backward of one Transformer block at (1, seq_len, d_model), peak memory."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    torch.manual_seed(0)
    block_cfg = BlockConfig(
        d_model=spec["d_model"],
        n_heads=spec["n_heads"],
        activation="gelu",
        position="none",
        backend=spec["backend"],
        backend_options=spec.get("options", {}),
    )
    block = build_block(block_cfg, device=device)
    x = torch.randn(
        spec["batch"], spec["seq_len"], spec["d_model"], device=device, requires_grad=True
    )
    base = _memory_now(device)
    _reset_peak(device)
    t0 = time.perf_counter()
    block(x, is_causal=True).sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {
        "time_s": elapsed,
        "peak_bytes": max(_memory_peak(device) - base, 0),
        "memory_method": _memory_method(device),
    }


def block_memory(
    *,
    seq_len: int = 4096,
    d_model: int = 512,
    n_heads: int = 8,
    backends: tuple[str, ...] = ("math", "tiled", "sdpa"),
    batch: int = 1,
    threads: int | None = None,
    device: str = "cpu",
    options: dict[str, dict[str, Any]] | None = None,
) -> list[dict]:
    """Measured peak memory of one block's forward+backward per backend (fresh subprocesses).

    ``options`` holds per-backend options, e.g. ``{"window": {"window": 256}}``.
    """
    rows = []
    for backend in backends:
        spec = {
            "worker": "block",
            "seq_len": seq_len,
            "d_model": d_model,
            "n_heads": n_heads,
            "backend": backend,
            "options": (options or {}).get(backend, {}),
            "batch": batch,
            "threads": threads,
            "device": device,
        }
        rows.append({"backend": backend, "seq_len": seq_len, **_run_subprocess(spec)})
    return rows


def _worker_main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    result = _measure_block(spec) if spec.get("worker") == "block" else measure_case(spec)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # the subprocess entry point of run_benchmark / block_memory
    sys.exit(_worker_main(sys.argv[1:]))
