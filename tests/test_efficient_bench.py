"""The attention benchmark: cases run in subprocesses, oversized cases are skipped with the
estimate, results land as table + JSON + plot; the long-context formula scales as stated."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.experiments.attention_bench import (
    BenchConfig,
    estimate_gb,
    lm_attention_memory_formula,
    markdown_table,
)


def test_math_estimate_is_quadratic_and_others_linear():
    cfg = BenchConfig()
    for backend in ("math", "tiled", "linear"):
        small, big = (
            estimate_gb(backend, 4096, cfg, "fwdbwd"),
            estimate_gb(backend, 8192, cfg, "fwdbwd"),
        )
        assert big / small == pytest.approx(4 if backend == "math" else 2, rel=0.05)
    # the brief's number: 8·16384²·4 bytes of scores per copy
    assert estimate_gb("math", 16384, cfg, "fwd") > 3 * 8 * 16384**2 * 4 / 1e9


def test_long_context_formula():
    math_ = lm_attention_memory_formula(n_layers=12, n_heads=12, seq_len=4096, backend="math")
    ckpt = lm_attention_memory_formula(
        n_layers=12, n_heads=12, seq_len=4096, backend="math", checkpointing=True
    )
    tiled = lm_attention_memory_formula(
        n_layers=12, n_heads=12, seq_len=4096, backend="tiled", checkpointing=True
    )
    n2 = 12 * 4096**2 * 4 / 1e9
    assert math_["scores_gb"] == pytest.approx((2 * 12 + 1) * n2)
    assert ckpt["scores_gb"] == pytest.approx(3 * n2)
    assert tiled["scores_gb"] == 0 and tiled["total_gb"] < ckpt["total_gb"]


@pytest.mark.slow
def test_bench_cli_measures_skips_and_writes_files(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(
        [
            "bench",
            "attention",
            "--n",
            "64",
            "--backends",
            "math",
            "tiled",
            "--modes",
            "fwd",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--threads",
            "1",
            "--min-time",
            "0.01",
            "--max-gb",
            "0.0001",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads((out / "attention.json").read_text())
    rows = {r["backend"]: r for r in data["rows"]}
    assert rows["math"]["skipped"].startswith("skipped (would need")
    assert rows["tiled"]["time_s"] > 0 and rows["tiled"]["peak_bytes"] >= 0
    assert (out / "attention.png").stat().st_size > 0
    table = (out / "attention.md").read_text()
    assert "| 64 |" in table and "skipped (would need" in table
    assert "skipped" in capsys.readouterr().out


def test_markdown_table_ratios():
    cfg = BenchConfig(ns=(8192,), backends=("math", "tiled", "sdpa"), modes=("fwdbwd",))
    rows = [
        {"backend": "math", "n": 8192, "mode": "fwdbwd", "time_s": 4.0, "peak_bytes": 400},
        {"backend": "tiled", "n": 8192, "mode": "fwdbwd", "time_s": 2.0, "peak_bytes": 20},
        {"backend": "sdpa", "n": 8192, "mode": "fwdbwd", "time_s": 1.0, "peak_bytes": 10},
    ]
    table = markdown_table(rows, cfg)
    assert "tiled/sdpa time 2.00×" in table and "math/tiled memory 20.0×" in table


def test_bench_rejects_bad_arguments(capsys, monkeypatch):
    assert main(["bench", "attention", "--n", "0"]) == 2
    assert main(["bench", "attention", "--backends", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--n must be positive" in err and "unknown backend" in err
    assert main(["bench", "long-context", "--preset", "tiny", "--backends", "tiled", "nope"]) == 2
    assert main(["bench", "long-context", "--preset", "tiny", "--window", "0"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend(s) ['nope']" in err and "--window must be positive" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only machine
    assert main(["bench", "attention", "--n", "64", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_long_context_cli_prints_the_formula(capsys):
    rc = main(
        [
            "bench",
            "long-context",
            "--preset",
            "tiny",
            "--n-layers",
            "16",
            "--n-heads",
            "16",
            "--d-model",
            "256",
            "--seq-len",
            "4096",
            "--no-measure",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    expected = lm_attention_memory_formula(n_layers=16, n_heads=16, seq_len=4096, d_model=256)
    assert f"{expected['scores_gb']:.2f}" in out and "tiled" in out
