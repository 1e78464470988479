"""benchmarks/pydoc_score.py: the nanoGPT comparison's and the speedrun's score of a run directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.cli import main

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from pydoc_score import pydoc_task, score_run  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pydoc") / "run"
    argv = ["train", "lm", "--data", "pydoc", "--max-chars", "20000", "--steps", "2",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    return out


def test_a_run_is_scored_on_the_held_out_windows_with_its_last_weights(run):
    """Each non-overlapping 64-character window of the held-out split, each of its 64 next
    characters, averaged: computed here window by window."""
    model = attnlab.load(run, weights="last").model.eval()
    split = pydoc_task(max_chars=20000).splits["val"]
    val = torch.as_tensor(split[: len(split)].astype("int64"))
    losses = []
    with torch.no_grad():
        for w in range((len(val) - 1) // 64):
            x, y = val[w * 64 : w * 64 + 64], val[w * 64 + 1 : w * 64 + 65]
            losses.append(F.cross_entropy(model(x[None])[0], y))
    assert score_run(str(run)) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)


def test_the_command_line_prints_each_runs_score_and_refuses_other_data(run, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "pydoc_score.py"), str(run)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    name, nats = proc.stdout.strip().split("\t")
    assert name == str(run) and float(nats) == pytest.approx(score_run(str(run)), abs=1e-4)
    other = tmp_path / "tiny"
    argv = ["train", "lm", "--data", "stdlib", "--max-chars", "20000", "--steps", "1",
            "--no-progress", "--out", str(other)]  # fmt: skip
    assert main(argv) == 0
    with pytest.raises(SystemExit, match="not a character-level pydoc run"):
        score_run(str(other))
