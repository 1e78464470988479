"""Issue 18, resume: a run stopped by Ctrl-C (SIGINT) or SIGTERM and resumed with nothing but
``attnlab train KIND --resume --out RUN`` ends with the weights of the run left alone, for every
``train`` kind; the message says where it stopped and the exact command; resuming a finished run
says it is complete."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.train import trainer

pytestmark = pytest.mark.slow

STEPS = ["--steps", "6", "--eval-every", "4", "--eval-batches", "1", "--log-every", "1"]
KINDS = {  # tiny settings of every `attnlab train` kind (defaults differ from them on purpose)
    "lm": ["--preset", "tiny", "--set", "d_model=32", "--set", "n_layers=1", "--seq-len", "32"]
    + ["--batch-size", "8", "--max-chars", "20000"],
    "mlm": ["--set", "d_model=32", "--set", "n_layers=1", "--seq-len", "24", "--batch-size", "8"]
    + ["--max-chars", "20000"],
    "translate": ["--preset", "tiny", "--n-examples", "300", "--batch-size", "16"],
    "image": ["--model", "vit", "--batch-size", "16", "--warmup", "1"],
    "caption": ["--n-train", "40", "--n-val", "16", "--batch-size", "8"],
    "vqa": ["--n-train", "40", "--n-val", "16", "--batch-size", "8"],
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def _signal_at(monkeypatch, step: int, signum: int) -> None:
    """Deliver a real ``signum`` to this process when optimizer step ``step`` (0-based) begins."""
    original = trainer._Loop._step

    def step_then_signal(self, i):
        if i == step:
            os.kill(os.getpid(), signum)  # the trainer's handler raises here, mid-step
        return original(self, i)

    monkeypatch.setattr(trainer._Loop, "_step", step_then_signal)


def _weights(run):
    return load_file(str(run / "model.safetensors"))


@pytest.mark.parametrize(
    "kind, signum",
    [
        ("lm", signal.SIGINT),
        ("mlm", signal.SIGTERM),
        ("translate", signal.SIGINT),
        ("image", signal.SIGTERM),
        ("caption", signal.SIGINT),
        ("vqa", signal.SIGTERM),
    ],
)
def test_bare_resume_after_a_signal_gives_the_weights_of_the_run_left_alone(
    kind, signum, tmp_path, monkeypatch, capsys
):
    argv = ["train", kind, *KINDS[kind], *STEPS, "--no-progress"]
    alone, stopped = tmp_path / "alone", tmp_path / "stopped"
    assert main([*argv, "--out", str(alone)]) == 0
    with monkeypatch.context() as patch:
        _signal_at(patch, 3, signum)
        assert main([*argv, "--out", str(stopped)]) == (130 if signum == signal.SIGINT else 143)
    err = capsys.readouterr().err.splitlines()[-1]
    word = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "terminated (SIGTERM)"
    assert err.startswith(f"attnlab: {word} at step 3 of 6; checkpoint saved in {stopped}")
    assert err.endswith(f"resume with: attnlab train {kind} --resume --out {stopped}")

    assert main(["train", kind, "--resume", "--out", str(stopped)]) == 0  # nothing else typed
    a, b = _weights(alone), _weights(stopped)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)

    capsys.readouterr()
    assert main(["train", kind, "--resume", "--out", str(stopped)]) == 0
    out = capsys.readouterr().out
    assert "is already complete: 6 of 6 steps" in out and "a larger --steps" in out


def test_a_run_interrupted_before_its_first_checkpoint_saves_one(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _signal_at(monkeypatch, 1, signal.SIGINT)  # the first checkpoint would be at step 4
    argv = ["train", "image", *KINDS["image"], *STEPS, "--no-progress", "--out", str(run)]
    assert main(argv) == 130
    assert "at step 1 of 6; checkpoint saved" in capsys.readouterr().err
    assert (run / "model.safetensors").is_file() and (run / "state.pt").is_file()


def test_a_timed_run_resumes_to_its_own_budget(tmp_path, monkeypatch, capsys):
    """--max-time: bare --resume spends what is left of the run's budget (not the default
    --steps), and the clock of both sessions together stays inside it."""
    run = tmp_path / "run"
    budget = 8  # seconds: room for a step after the start-up and validation on a busy machine
    argv = ["train", "image", *KINDS["image"], "--max-time", str(budget), "--log-every", "1"]
    # the start-up counts against the budget: import what a first run imports (torch's compiler,
    # matplotlib, scikit-learn: many seconds on a busy machine) before the clock starts
    assert (
        main(["train", "image", *KINDS["image"], "--steps", "1", "--out", str(tmp_path / "w")]) == 0
    )
    with monkeypatch.context() as patch:  # (at the first step: how far a budget gets varies)
        _signal_at(patch, 0, signal.SIGINT)
        assert main([*argv, "--no-progress", "--out", str(run)]) == 130
    assert "at step 0 (" in capsys.readouterr().err  # "(2 s of the 8 s budget)"
    assert main(["train", "image", "--resume", "--out", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())["train"]
    assert saved["max_time"] == budget  # (its own budget, not the default --steps)
    progress = torch.load(run / "state.pt", weights_only=True)["progress"]
    assert progress["step"] >= 1 and progress["elapsed"] <= budget and progress["finished"]
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").open()) if "loss" in r]
    assert steps == list(range(1, progress["step"] + 1))
